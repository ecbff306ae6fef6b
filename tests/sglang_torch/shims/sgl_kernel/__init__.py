"""CPU TEST SHIM, never shipped: a stand-in for SGLang's `sgl_kernel` (sglang-kernel), installed
only into the test venv .venv-sglang-torch by scripts/setup_sglang_torch.sh.

SGLang 0.5.23 (PyTorch) on CPU imports one function from sgl_kernel unconditionally
(sglang/srt/mem_cache/allocation.py: `assign_req_to_token_pool_cpu`); PyPI has no CPU build of
sgl-kernel. This module implements that one function in plain PyTorch. Every other name
exists only so that imports succeed, and raises NotImplementedError when called: a code path
that needs a real kernel fails loudly instead of computing something else.

It registers no `torch.ops.sgl_kernel` operators, so SGLang's `cpu_has_amx_support()` (which
probes `torch.ops.sgl_kernel.convert_weight_packed`) is False and SGLang uses its pure-PyTorch
CPU paths (torch_native attention, plain norms and activations).
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

__version__ = "0.0.0+openjev-cpu-test-shim"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """For each request i (in order): req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]
    = the next end_offset[i] - start_offset[i] entries of out_cache_loc (the requests' new KV
    slots, concatenated). The semantics of SGLang's Triton kernel `assign_req_to_token_pool`."""
    del pool_len  # a row stride for the kernel; indexing the 2-D tensor makes it implicit
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends, strict=True):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[taken : taken + n].to(req_to_token.dtype)
        taken += n


def _missing(name: str) -> Any:
    def kernel(*args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(f"sgl_kernel.{name}: not in the openjev CPU test shim (no CPU sgl-kernel)")

    kernel.__name__ = name
    return kernel


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # module protocol lookups (__path__, __all__, ...): really absent
        raise AttributeError(name)
    return _missing(name)
