"""`--dtype auto`: the decision with each answer of its two inputs faked at the seam."""

import pytest
import torch

from openjev.engines.torch.dtype import MIN_SPEEDUP, choose_cpu_dtype, cpu_flags, pick_dtype, probe_bf16_speedup
from openjev.errors import ConfigError

AMX = {"fpu", "avx512f", "amx_tile", "amx_bf16", "avx512_bf16"}
PLAIN_AVX512 = {"fpu", "avx2", "avx512f", "avx512bw"}  # oneDNN emulates bfloat16 here: slower


class FakeProbe:
    def __init__(self, speedup: float) -> None:
        self.speedup, self.calls = speedup, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.speedup


def test_native_bf16_and_a_faster_probe_choose_bfloat16():
    probe = FakeProbe(2.5)
    choice = pick_dtype("auto", "cpu", flags=lambda: AMX, probe=probe)
    assert choice.dtype == torch.bfloat16 and probe.calls == 1
    assert "amx_bf16" in choice.reason and "2.5x" in choice.reason


def test_native_bf16_but_a_slower_probe_keeps_float32():
    for speedup in (0.6, MIN_SPEEDUP - 0.01):
        choice = pick_dtype("auto", "cpu", flags=lambda: AMX, probe=FakeProbe(speedup))
        assert choice.dtype == torch.float32 and "probe" in choice.reason


def test_no_native_bf16_keeps_float32_without_probing():
    probe = FakeProbe(9.0)  # would say yes: it must not be asked
    choice = pick_dtype("auto", "cpu", flags=lambda: PLAIN_AVX512, probe=probe)
    assert choice.dtype == torch.float32 and probe.calls == 0
    assert pick_dtype("auto", "cpu", flags=frozenset, probe=probe).dtype == torch.float32  # unreadable cpuinfo


def test_arm_bf16_feature_counts_as_native():
    assert choose_cpu_dtype({"fp", "asimd", "bf16"}, FakeProbe(2.0)).dtype == torch.bfloat16


def test_cuda_is_bfloat16_and_explicit_settings_are_kept_without_probing():
    probe = FakeProbe(0.1)
    assert pick_dtype("auto", "cuda:0", flags=lambda: set(), probe=probe).dtype == torch.bfloat16
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        assert pick_dtype(name, "cpu", flags=lambda: AMX, probe=probe).dtype == dtype
    assert probe.calls == 0
    with pytest.raises(ConfigError, match="float64"):
        pick_dtype("float64", "cpu")


def test_cpu_flags_reads_x86_and_arm_cpuinfo(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512f amx_bf16\n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpu_flags(x86) == {"fpu", "avx512f", "amx_bf16"}
    assert cpu_flags(arm) == {"fp", "asimd", "bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_the_real_probe_is_short_and_positive():
    import time

    t0 = time.perf_counter()
    speedup = probe_bf16_speedup()
    # "short": a fraction of a second alone; the bound leaves room for a machine busy with
    # other jobs (it is a bound on start-up cost, not a speed measurement)
    assert speedup > 0 and time.perf_counter() - t0 < 30.0
