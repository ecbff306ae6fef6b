"""The core's ChatTokenizer port over a Hugging Face tokenizer.

Caller text is text: `encode_pieces` reads special (added) tokens only in the template's
own pieces. It splits those pieces at the added tokens itself (the template's text is the
model's, so searching it is safe) and encodes every run between them, template text and
caller text together, with a copy of the tokenizer that has no added tokens at all (the
same normalizer, pre-tokenizer and model): `<|im_start|>` in a caller's text is then as many
tokens as its characters' ordinary encoding, and for ordinary text the ids equal encode()'s,
which splits at the added tokens first and encodes the runs between them the same way.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import jinja2

from openjev.core.ports import TemplateRefused
from openjev.core.types import Turn
from openjev.errors import ModelUnsuitable

log = logging.getLogger(__name__)

# Texts longer than this are encoded through encode_batch, which releases the GIL while the
# Rust tokenizer runs (encode does not), so a long encode in a worker thread does not stall
# the event loop.
GIL_FREE_CHARS = 16_384


class HFChatTokenizer:
    def __init__(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ModelUnsuitable("the tokenizer has no chat template: openjev needs an instruct (chat) model")
        self._tok = tokenizer
        # The Rust tokenizer called directly: the same ids as tokenizer(text) (which calls
        # its encode_batch) without the wrapper's per-call overhead and the batch's thread pool.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = backend if backend is not None and not getattr(tokenizer, "split_special_tokens", False) else None
        self._plain = _without_added_tokens(backend) if backend is not None else None
        self._added, self._added_ids = _added_tokens(tokenizer)

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

    def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        items: list[str | int] = []  # runs of plain text and the template's added tokens' ids
        run: list[str] = []
        for text, template in pieces:
            at = 0
            if template and self._added is not None:
                for m in self._added.finditer(text):
                    run.append(text[at : m.start()])
                    items += ["".join(run), self._added_ids[str(m.lastgroup)]]
                    run, at = [], m.end()
            run.append(text[at:] if at else text)
        items.append("".join(run))
        texts = [x for x in items if isinstance(x, str) and x]
        encoded = iter(self._encode_plain(texts))
        ids: list[int] = []
        for x in items:
            if isinstance(x, int):
                ids.append(x)
            elif x:
                ids += next(encoded)
        return ids

    def breaks_before(self, piece: tuple[str, bool]) -> bool:
        # encode_pieces ends the run of text before every added token of a template piece
        text, template = piece
        return template and self._added is not None and self._added.match(text) is not None

    def _encode_plain(self, texts: list[str]) -> list[list[int]]:
        """Each text encoded as ordinary characters (no added token recognised)."""
        if not texts:
            return []
        if self._plain is None:  # a slow (Python) tokenizer: its own switch does the same
            out = self._tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
            return [list(ids) for ids in out]
        if sum(len(t) for t in texts) > GIL_FREE_CHARS:
            # encode_batch_fast (tokenizers >= 0.21): the same ids without each Encoding's
            # character offsets: a 90,000-character state 34-50 ms against 47-71 ms
            batch = getattr(self._plain, "encode_batch_fast", self._plain.encode_batch)
            return [e.ids for e in batch(texts, add_special_tokens=False)]
        # Short texts one by one, in this thread: any batch call, even of one text, goes
        # through the thread pool, whose wake-ups cost more CPU than the encoding.
        return [self._plain.encode(t, add_special_tokens=False).ids for t in texts]


def _without_added_tokens(backend):
    """A tokenizer over the same model and pipeline as `backend` (normalizer, pre-tokenizer,
    post-processor, decoder: shared, not copied) with no added tokens: their texts are then
    ordinary text (their ids stay in the vocabulary, which only the template's own pieces can
    reach). Built from the parts: a copy through to_str()/from_str() took 1.1-1.5 s of the
    start on a 150k-token vocabulary, the parts a millisecond (the same ids: tests/engines/
    test_hf_tokenizer.py). No truncation or padding. None where it cannot be made: the
    wrapper's split_special_tokens is used instead."""
    from tokenizers import Tokenizer

    try:
        plain = Tokenizer(backend.model)
        for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
            value = getattr(backend, part)
            if value is not None:
                setattr(plain, part, value)
        return plain
    except Exception as exc:  # noqa: BLE001 - any failure: the slower path below encodes the same
        log.warning("tokenizer copy without added tokens failed (%s): using split_special_tokens", type(exc).__name__)
        return None


def _added_tokens(tokenizer) -> tuple[re.Pattern[str] | None, dict[str, int]]:
    """A pattern matching the tokenizer's added tokens in the template's text (longest first,
    as the tokenizer matches them; with the whitespace a token strips), one named group per
    token, and each group's token id."""
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids: dict[str, int] = {}
    patterns: list[tuple[int, str]] = []
    for token_id, token in decoder.items():
        content = str(getattr(token, "content", token))
        if not content:
            continue
        name = f"t{int(token_id)}"
        ids[name] = int(token_id)
        pattern = re.escape(content)
        if getattr(token, "lstrip", False):
            pattern = r"\s*" + pattern
        if getattr(token, "rstrip", False):
            pattern += r"\s*"
        patterns.append((len(content), f"(?P<{name}>{pattern})"))
    if not patterns:
        return None, ids
    patterns.sort(key=lambda p: -p[0])
    return re.compile("|".join(p for _, p in patterns)), ids
