"""The core's ChatTokenizer port over a Hugging Face tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import jinja2

from openjev.core.ports import TemplateRefused
from openjev.core.types import Turn
from openjev.errors import ModelUnsuitable

# Texts longer than this are encoded through encode_batch, which releases the GIL while the
# Rust tokenizer runs (encode does not): a 400 KB state takes ~0.7 s to encode, and with
# the GIL held the event loop, though the compile runs in a worker thread, would stall as
# long (measured: /health/live waited 0.7 s; with encode_batch the longest gap is ~60 ms).
GIL_FREE_CHARS = 16_384


class HFChatTokenizer:
    def __init__(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ModelUnsuitable("the tokenizer has no chat template: openjev needs an instruct (chat) model")
        self._tok = tokenizer
        # The Rust tokenizer called directly: the same ids as tokenizer(text) (which calls
        # its encode_batch) without the wrapper's per-call overhead and the batch's thread
        # pool, ~5x less time for the short texts of a small request (bench/bench_api.py).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = backend if backend is not None and not getattr(tokenizer, "split_special_tokens", False) else None

    def render(self, turns: Sequence[Turn], *, add_generation_prompt: bool) -> str:
        messages = [{"role": t.role, "content": t.content} for t in turns]
        # enable_thinking=False turns reasoning off in templates that support it (Qwen3 and
        # kin); templates that do not know the variable ignore it.
        try:
            return self._tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=False
            )
        except jinja2.TemplateSyntaxError:  # a broken template: the model's fault, not these turns'
            raise
        except jinja2.TemplateError as exc:  # the template's raise_exception(): it refuses these turns
            raise TemplateRefused(str(exc)) from exc

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            if len(text) > GIL_FREE_CHARS:
                return self._fast.encode_batch([text], add_special_tokens=False)[0].ids
            return self._fast.encode(text, add_special_tokens=False).ids
        return list(self._tok(text, add_special_tokens=False)["input_ids"])
