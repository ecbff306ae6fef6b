"""Giving freed heap memory back to the OS, for the in-process engines (torch/, llamacpp/).

glibc keeps memory that Python, the tokenizer or an engine's working set freed mapped in
the process's heap arenas, so RSS stays at the highest working set ever reached unless
`malloc_trim` returns it. Off glibc (musl, macOS) this is a no-op.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc's malloc_trim(0)): a few ms; call it
    where the engine is idle (after a request, after the load), never inside a hot loop."""
    if _TRIM is not None:
        _TRIM(0)
