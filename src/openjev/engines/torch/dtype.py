"""Which torch dtype `--dtype auto` means on this machine.

CUDA: bfloat16. CPU: bfloat16 only where the CPU computes it natively (Intel AMX or
AVX512-BF16, Arm's BF16 extension) AND a start-up probe of a few milliseconds confirms that
a model-shaped matmul really runs faster in bfloat16 than in float32; float32 everywhere
else. The feature check alone is not enough: oneDNN also "supports" bfloat16 on plain
AVX512 by emulation, which is slower than float32, and a CPU may advertise the feature while
the library build in use does not exploit it. The probe alone is not enough either: on a
noisy machine a few milliseconds can mislead, so it only confirms what the features promise.

The two inputs (features, probe) are parameters of `pick_dtype`, so the decision is tested
with both answers of each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from openjev.errors import ConfigError

log = logging.getLogger(__name__)

# /proc/cpuinfo flags that mean native bfloat16 arithmetic: x86 (AMX tiles, AVX512-BF16
# dot products) and aarch64 (the "bf16" feature of Armv8.6).
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# bfloat16 must be at least this much faster in the probe to be chosen: below it the
# precision lost is not worth the time won (and the probe's noise is of this order).
MIN_SPEEDUP = 1.3

_NAMED = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str  # one line for the start-up log


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (x86 `flags`, aarch64 `Features`); empty where unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(flags: Iterable[str]) -> str | None:
    """The first flag that promises native bfloat16, or None."""
    present = set(flags)
    return next((f for f in NATIVE_BF16_FLAGS if f in present), None)


def probe_bf16_speedup(tokens: int = 128, hidden: int = 576, inner: int = 1536, rounds: int = 8) -> float:
    """float32 time / bfloat16 time of one MLP-shaped matmul (the best of `rounds` each).

    The shape is a small model's MLP up-projection over a short prefill; the timed part
    takes a few milliseconds (the first, untimed calls also pay oneDNN's kernel set-up,
    which the model's first forward would pay anyway). Measured on one thread in that
    thread's CPU time, the best of several alternating rounds: wall-clock time on a busy
    machine measured the neighbours (a probe while another process used both cores read
    anywhere from 0.4x to 3.4x), and a multi-threaded matmul waits for its slowest thread.
    What is compared is the per-core kernel (AMX/AVX512-BF16 against float32 FMA).
    """
    gen = torch.Generator().manual_seed(0)
    a32, w32 = torch.randn(tokens, hidden, generator=gen), torch.randn(hidden, inner, generator=gen)
    pairs = {torch.float32: (a32, w32), torch.bfloat16: (a32.bfloat16(), w32.bfloat16())}
    best = {dtype: float("inf") for dtype in pairs}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for a, w in pairs.values():
                a @ w  # first call: kernel selection, allocator, AMX tile permission
            for _ in range(rounds):
                for dtype, (a, w) in pairs.items():
                    t0 = time.thread_time()
                    a @ w
                    best[dtype] = min(best[dtype], time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    return best[torch.float32] / max(best[torch.bfloat16], 1e-9)


def choose_cpu_dtype(flags: Iterable[str], probe: Callable[[], float]) -> DtypeChoice:
    """bfloat16 where the features promise native support and the probe confirms a speed-up."""
    flag = native_bf16(flags)
    if flag is None:
        return DtypeChoice(torch.float32, "float32: the CPU has no native bfloat16 (no amx_bf16/avx512_bf16/bf16 flag)")
    t0 = time.perf_counter()
    speedup = probe()
    ms = (time.perf_counter() - t0) * 1000
    if speedup >= MIN_SPEEDUP:
        return DtypeChoice(
            torch.bfloat16,
            f"bfloat16: the CPU has {flag} and the probe ran {speedup:.1f}x faster than float32 ({ms:.0f} ms)",
        )
    return DtypeChoice(
        torch.float32,
        f"float32: the CPU has {flag} but the probe ran bfloat16 only {speedup:.2f}x "
        f"as fast as float32 (needs {MIN_SPEEDUP}x; {ms:.0f} ms)",
    )


def pick_dtype(
    setting: str,
    device: str,
    *,
    flags: Callable[[], Iterable[str]] = cpu_flags,
    probe: Callable[[], float] = probe_bf16_speedup,
) -> DtypeChoice:
    """The dtype for `--dtype setting` on `device` (ConfigError for an unknown name)."""
    if setting != "auto":
        try:
            return DtypeChoice(_NAMED[setting], f"{setting}: as configured")
        except KeyError:
            raise ConfigError(f"--dtype {setting!r}: expected auto, float32, bfloat16 or float16") from None
    if device.startswith("cuda"):
        return DtypeChoice(torch.bfloat16, "bfloat16: CUDA")
    if device != "cpu":
        return DtypeChoice(torch.float32, f"float32: device {device}")
    return choose_cpu_dtype(flags(), probe)
