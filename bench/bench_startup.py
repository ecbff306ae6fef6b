"""Start-up time of `openjev serve` with the embedded model: cold (empty weight cache: the
GGUF is dequantised and cached) and warm (cached safetensors), measured to the first
healthy /health, plus the first answer's latency and the server's peak RSS. One JSON line.

    .venv/bin/python bench/bench_startup.py
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import embedded_serve, machine

EXAMPLE = {
    "state": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return -1


def start_once(cache_dir: str) -> dict:
    port = _port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        embedded_serve(port),
        env={**os.environ, "OPENJEV_CACHE_DIR": cache_dir, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        healthy = time.perf_counter() - t0
        t1 = time.perf_counter()
        r = httpx.post(url + "/v1/systemone", json=EXAMPLE, timeout=60)
        r.raise_for_status()
        first = time.perf_counter() - t1
        return {
            "healthy_s": round(healthy, 2),
            "first_answer_ms": round(first * 1000),
            "peak_rss_mb": _peak_rss_mb(proc.pid),
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    with tempfile.TemporaryDirectory() as cache:
        cold = start_once(cache)
        warm = start_once(cache)
    print(
        json.dumps(
            {
                "bench": "startup",
                "machine": machine(),
                "cold": cold,
                "warm": warm,
                "cold_over_warm": round(cold["healthy_s"] / warm["healthy_s"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
