"""A real SGLang-protocol server on CPU as a child process, of one of two kinds:

- "jax": SGLang-JAX (`sgl_jax`), from .venv-sglang-jax (scripts/setup_sglang_jax.sh);
- "torch": the real SGLang 0.5.23 (PyTorch), from .venv-sglang-torch
  (scripts/setup_sglang_torch.sh, with the CPU test shims of tests/sglang_torch/shims).

Shared by tests/sglang (parametrized over the kinds asked for: `enabled_kinds`), tests/scaleout,
bench/bench_sglang.py and bench/bench_sglang_own.py. The server runs in its own process
group; its idle scheduler keeps about a core busy, so always `stop` it.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx

from openjev.engines.http.server_process import ServerProcess
from openjev.errors import EngineUnavailable
from tests.support.net import free_port
from tests.support.processes import paused, track

REPO = Path(__file__).resolve().parents[2]
SGL_JAX_PYTHON = REPO / ".venv-sglang-jax" / "bin" / "python"
SGL_TORCH_PYTHON = REPO / ".venv-sglang-torch" / "bin" / "python"
# JAX's persistent compilation cache for every SGLang-JAX server these tests and benches start,
# kept OUTSIDE the clone so that the next CI run (a clean clone) finds the shapes compiled. It
# keys each entry on the computation, the JAX version and the backend: a stale entry is never
# used, only missed. OPENJEV_JAX_JIT_CACHE= (empty) turns it off.
JIT_CACHE = os.environ.get("OPENJEV_JAX_JIT_CACHE", str(Path.home() / ".cache" / "openjev" / "jax-jit"))
FLAGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "native",
    "--dtype",
    "float32",
    "--disable-precompile",
    "--disable-overlap-schedule",
)


@dataclass(frozen=True)
class Kind:
    """How to run one kind of SGLang-protocol server on this CPU."""

    name: str  # "jax" | "torch": the test ids' suffix
    python: Path
    module: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    opt_in: str  # the environment variable (set to 1) that asks for its suite
    setup: str  # the script that installs it
    jit_cache: bool  # whether it keeps a compilation cache (JAX_COMPILATION_CACHE_DIR)


KINDS = {
    "jax": Kind(
        "jax",
        SGL_JAX_PYTHON,
        "sgl_jax.launch_server",
        FLAGS,
        (("JAX_PLATFORMS", "cpu"),),
        "OPENJEV_SGLANG_JAX",
        "scripts/setup_sglang_jax.sh",
        jit_cache=True,
    ),
    "torch": Kind(
        "torch",
        SGL_TORCH_PYTHON,
        "sglang.launch_server",
        # torch_native attention: no CPU sgl-kernel (tests/sglang_torch/shims); --skip-server-warmup:
        # `start` sends its own first request; CUDA graphs do not exist on CPU.
        (
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--disable-cuda-graph",
            "--skip-server-warmup",
            "--dtype",
            "float32",
        ),
        (("SGLANG_USE_CPU_ENGINE", "1"),),
        "OPENJEV_SGLANG_TORCH",
        "scripts/setup_sglang_torch.sh",
        jit_cache=False,
    ),
}


def enabled_kinds() -> list[str]:
    """The kinds whose suite was asked for (OPENJEV_SGLANG_JAX=1, OPENJEV_SGLANG_TORCH=1)."""
    return [name for name, kind in KINDS.items() if os.environ.get(kind.opt_in) == "1"]


def model_folder(kind: str, root: Path) -> Path:
    """The embedded model's folder as `kind` reads it: SGLang-JAX's transformers 4.57 needs a
    rewritten view (served_folder, under `root`); SGLang 0.5.23's transformers 5 reads the
    converted folder itself."""
    folder = embedded_model_folder()
    return served_folder(folder, root / "model") if kind == "jax" else folder


def sizing_flags(max_running: int, context_length: int, chunk: int) -> tuple[str, ...]:
    """The native backend's prefill attends over max_running * (context_length - 1) padded
    KV slots whatever the batch (its cache_loc is padded to the largest bucket), for up to
    `chunk` query tokens per forward. The defaults (4096 requests, the model's 8192
    context) ask for terabytes and crash the first prefill; keep all three small. The KV
    pool would otherwise be sized from free host RAM (gigabytes)."""
    return (
        "--max-running-requests",
        str(max_running),
        "--context-length",
        str(context_length),
        "--chunked-prefill-size",
        str(chunk),
        "--max-prefill-tokens",
        str(chunk),
        "--max-total-tokens",
        str(2 * max_running * context_length),
    )


def embedded_model_folder() -> Path:
    """The embedded model's converted float32 safetensors folder, created if missing."""
    import torch

    from openjev.config import load_settings
    from openjev.engines.models.converted import load_model_and_tokenizer
    from openjev.engines.models.source import gguf_cache_folder, resolve_source

    source = resolve_source(None)
    cache_dir = load_settings({}, environ={}).served.cache_dir
    folder = gguf_cache_folder(source, cache_dir)
    if not (folder / "model.safetensors").exists():
        load_model_and_tokenizer(source, cache_dir=cache_dir, dtype=torch.float32, device="cpu")
    return folder


def tiny_model_folder(target: Path, hidden: int = 64, seed: int = 0) -> Path:
    """A tiny random model the project generates (for the overhead bench): the embedded
    model's tokenizer and chat template, one Llama layer of `hidden` units with random
    weights (seeded), float32. Its forward costs almost nothing on a CPU, so what a
    request costs beyond it is each route's own work, as on a GPU. Written once into
    `target` (reused when it holds the same sizes)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    source = embedded_model_folder()
    config = json.loads((source / "config.json").read_text())
    sizes = {
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
    }
    stamp = target / ".tiny"
    if stamp.exists() and stamp.read_text() == json.dumps([sizes, seed]):
        return target
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (source / name).exists():
            (target / name).write_bytes((source / name).read_bytes())
    config.update(sizes)
    config.pop("_model_name_or_path", None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"}))
    model.to(torch.float32).save_pretrained(target, safe_serialization=True)
    config_written = json.loads((target / "config.json").read_text())
    config_written["architectures"] = ["LlamaForCausalLM"]
    (target / "config.json").write_text(json.dumps(config_written, indent=2))
    stamp.write_text(json.dumps([sizes, seed]))
    return target


def served_folder(source: Path, target: Path) -> Path:
    """A view of `source` (written by transformers 5) that sglang-jax's transformers 4.57
    reads as intended: the weights and tokenizer.json are symlinked, and two files rewritten.

    - config.json: transformers 5 nests `rope_theta` in `rope_parameters`; 4.57 would
      silently fall back to rope_theta 10000 (SmolLM2 uses 100000), so it is copied up.
    - tokenizer_config.json: the class `TokenizersBackend` does not exist in 4.57; the same
      tokenizer.json loads as `PreTrainedTokenizerFast`.
    """
    target.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(source):
        if name in ("config.json", "tokenizer_config.json") or name.startswith("."):
            continue
        link = target / name
        if not link.exists():
            link.symlink_to(source / name)
    config = json.loads((source / "config.json").read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" not in config and "rope_theta" in rope:
        config["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", "default") not in ("default", None):
        config.setdefault("rope_scaling", rope)
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    (target / "config.json").write_text(json.dumps(config, indent=2))
    tok = json.loads((source / "tokenizer_config.json").read_text())
    if tok.get("tokenizer_class") == "TokenizersBackend":
        tok["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok.pop("backend", None)
    (target / "tokenizer_config.json").write_text(json.dumps(tok, indent=2))
    return target


@dataclass
class SglServer:
    """A running SGLang-protocol child (either kind), started and stopped by openjev's own launcher."""

    url: str
    process: ServerProcess
    log_path: Path
    kind: str = "jax"
    folder: Path | None = None  # what it serves (model_folder), to start it again
    root: Path | None = None  # its scratch folder (logs, the rewritten model view)

    def take_over(self, other: SglServer) -> None:
        """Become `other`, a server started again on this one's port after this one died:
        whoever holds this object (a session fixture) then reaches, and stops, the new one."""
        assert other.url == self.url, (other.url, self.url)
        self.process, self.log_path = other.process, other.log_path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log: {e})"

    def stop(self) -> None:
        self.process.stop(grace_s=20.0)

    def paused(self) -> AbstractContextManager[None]:
        """The server stopped for the block (tests/support/processes.py: paused)."""
        return paused(self.process.process)

    def logged_since(self, mark: int, text: str) -> bool:
        """Whether `text` is in the log past its first `mark` characters."""
        return text in self.log_tail(10**9)[mark:]


def start(
    model_folder: Path,
    log_path: Path,
    *,
    timeout_s: float = 600.0,
    port: int | None = None,
    max_running: int = 8,
    context_length: int = 2048,
    chunk: int = 1024,
    jit_cache: Path | None = None,
    kind: str = "jax",
) -> SglServer:
    """Start a server of `kind` serving `model_folder` (model_folder(kind, ...)) and wait for /health.

    `max_running` must cover the branches a request sends at once (else later ones queue
    and find the prefix cached), `context_length` the longest branch. `jit_cache`: a folder
    for JAX's persistent compilation cache (sgl_jax reads JAX_COMPILATION_CACHE_DIR), so
    that a server started again with the same sizes does not compile every shape anew (JAX
    only; ignored for torch); by default JIT_CACHE.

    Raises RuntimeError with the log's tail if it exits or is not healthy in time.
    """
    spec = KINDS[kind]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **dict(spec.env)})
    cache_dir = str(jit_cache) if jit_cache is not None else JIT_CACHE
    if cache_dir and spec.jit_cache:
        env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
        # every compiled shape, not only those that took over a second (JAX's default)
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = ServerProcess(
        python=str(spec.python),
        model=str(model_folder),
        port=port or free_port(),
        module=spec.module,
        extra_args=(*spec.flags, *sizing_flags(max_running, context_length, chunk)),
        log_path=str(log_path),
        env=env,
        cwd=str(log_path.parent),
    )
    process.start()
    assert process.process is not None
    track(process.process)  # stopped with the test run, however it ends
    server = SglServer(process.url, process, log_path, kind)
    try:
        process.wait_healthy(timeout_s)
    except EngineUnavailable as e:
        server.stop()
        raise RuntimeError(f"{spec.module}: {e}; log tail:\n{server.log_tail()}") from None
    # /health answers before the server's own warm-up request has run (and a bad setting
    # crashes it there): one real request proves the forward pass works.
    try:
        r = httpx.post(
            server.url + "/generate",
            json={
                "input_ids": [1, 2, 3, 4, 5, 6, 7, 8],
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True,
                "logprob_start_len": -1,
                "token_ids_logprob": [9],
            },
            timeout=max(60.0, timeout_s),
        )
        r.raise_for_status()
        r.json()["meta_info"]["output_token_ids_logprobs"][0][0]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
        server.stop()
        raise RuntimeError(
            f"{spec.module} is up but its first /generate failed ({e!r}); log tail:\n{server.log_tail()}"
        ) from None
    return server


def flush_cache(url: str, wait_s: float = 60.0) -> bool:
    """Empty the server's radix cache (True if it did). SGLang refuses while requests run (a
    warm-up right after start, an aborted branch still finishing): ask again until `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.post(url + "/flush_cache", timeout=30.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
