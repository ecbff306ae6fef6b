"""Patch an installed sglang-jax 0.1.0rc0 so that it serves on CPU under Python 3.11.

    python scripts/patch_sglang_jax.py [--venv .venv-sglang-jax]

1. sgl_jax/srt/managers/tokenizer_manager.py declares `class _Communicator[T]` (PEP 695,
   Python >= 3.12): rewritten with typing.Generic / TypeVar.
2. sgl_jax/srt/layers/attention/native_backend.py: the KV pool pads head_dim up to a
   multiple of 128, the native backend pads Q to match, and its output keeps the padding
   (num_heads * 128 columns instead of num_heads * head_dim), which o_proj cannot take for
   models with head_dim < 128 (SmolLM2: 64). The padding is sliced off per head.

Idempotent: a patch already in place is left alone. A file or pattern that is not found
(another sglang-jax version) is an error, never a silent skip. Any Python can run it; it
edits the files inside the venv's site-packages.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Patch:
    name: str
    path: str  # relative to site-packages
    old: str
    new: str


PATCHES = (
    Patch(
        name="PEP 695 generic class -> typing.Generic",
        path="sgl_jax/srt/managers/tokenizer_manager.py",
        old="class _Communicator[T]:\n",
        new=(
            "from typing import Generic, TypeVar  # openjev patch: Python 3.11 has no PEP 695 generics\n"
            "\n"
            'T = TypeVar("T")\n'
            "\n"
            "\n"
            "class _Communicator(Generic[T]):\n"
        ),
    ),
    Patch(
        name="native attention: trim the head_dim alignment padding from the output",
        path="sgl_jax/srt/layers/attention/native_backend.py",
        old=(
            "        # Return full fused KV buffer for this layer so that caller can persist it outside JIT\n"
            "        return attn_output, kv_fused\n"
        ),
        new=(
            "        # openjev patch: the KV pool pads head_dim up to a multiple of 128 and Q is padded\n"
            "        # to match, so the output carries that padding per head; slice it back off.\n"
            "        if attn_output.shape[-1] != layer.q_head_num * layer.v_head_dim:\n"
            "            attn_output = attn_output.reshape(attn_output.shape[0], layer.q_head_num, -1)\n"
            "            attn_output = attn_output[:, :, : layer.v_head_dim].reshape(\n"
            "                attn_output.shape[0], layer.q_head_num * layer.v_head_dim\n"
            "            )\n"
            "\n"
            "        # Return full fused KV buffer for this layer so that caller can persist it outside JIT\n"
            "        return attn_output, kv_fused\n"
        ),
    ),
)


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages/sgl_jax"))
    if not found:
        sys.exit(
            f"patch_sglang_jax: no sgl_jax package under {venv}/lib/python3*/site-packages "
            "(run scripts/setup_sglang_jax.sh)"
        )
    if len(found) > 1:
        sys.exit(f"patch_sglang_jax: several sgl_jax installs under {venv}: {[str(p) for p in found]}")
    return found[0].parent


def apply(root: Path, patch: Patch) -> str:
    """Apply one patch; 'applied' or 'already applied'. Exits with a message if it cannot."""
    path = root / patch.path
    if not path.is_file():
        sys.exit(f"patch_sglang_jax: {patch.name}: {path} not found (another sglang-jax version?)")
    text = path.read_text()
    if patch.new in text:
        return "already applied"
    count = text.count(patch.old)
    if count != 1:
        sys.exit(
            f"patch_sglang_jax: {patch.name}: expected the pattern exactly once in {path}, found it "
            f"{count} times (another sglang-jax version?). Pattern:\n{patch.old}"
        )
    text = text.replace(patch.old, patch.new)
    compile(text, str(path), "exec")  # refuse to leave a broken file behind
    path.write_text(text)
    return "applied"


def main() -> None:
    repo = Path(__file__).resolve().parent.parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=repo / ".venv-sglang-jax")
    args = parser.parse_args()
    root = site_packages(args.venv)
    for patch in PATCHES:
        print(f"[patch_sglang_jax] {patch.path}: {patch.name}: {apply(root, patch)}")


if __name__ == "__main__":
    main()
