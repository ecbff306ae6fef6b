"""The chat template rendered around placeholders, so that caller text stays text.

The template is never rendered over the caller's texts to be searched afterwards (a
caller's text could spell whatever marker were searched for, and so move the prompt's
structure). It is rendered over placeholder contents that only this module writes: the
rendering then holds the template's own text and the placeholders alone, it is split at
the placeholders, and each caller text takes its placeholder's place by position. Every
text a caller sent is therefore a plain piece (`Segments`, template=False), which the
tokenizer encodes as ordinary characters even where they spell a special token
(`ChatTokenizer.encode_pieces`); only the template's own pieces may hold special tokens.

A template that changes a turn's text (Llama's and Gemma's `| trim`) is followed: the
compiler probes it once (`content_rule`) and applies the same change to the caller's text,
so a prompt is the very text the template renders for ordinary turns.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from openjev.core.ports import ChatTokenizer, Segments, TemplateRefused
from openjev.core.types import State, Turn
from openjev.errors import ModelUnsuitable

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")

_SLOT = re.compile("\x00openjev-slot-([0-9]+)\x00")


def slot(i: int) -> str:
    """The placeholder for content i (the state's turns 0..n-1, the question turn n)."""
    return f"\x00openjev-slot-{i}\x00"


def text_of(segments: Segments) -> str:
    return "".join(text for text, _ in segments)


def tail_chars(segments: Segments, n: int) -> Segments:
    """The segments' last `n` characters, as segments (kinds kept)."""
    out: list[tuple[str, bool]] = []
    for text, template in reversed(segments):
        if n <= 0:
            break
        piece = text[-n:]
        out.append((piece, template))
        n -= len(piece)
    return tuple(reversed(out))


def content_rule(tok: ChatTokenizer) -> Callable[[str], str]:
    """What the template does to a turn's text: keep it (most templates) or strip it (`|
    trim`), probed on a placeholder padded with whitespace. A template that does something
    else is rendered with the caller's text kept as it is (logged)."""
    bare = tok.render([Turn("user", slot(0))], add_generation_prompt=True)
    padded = tok.render([Turn("user", " \n" + slot(0) + "\n ")], add_generation_prompt=True)
    if " \n" + slot(0) + "\n " in padded:
        return _keep
    if padded == bare:
        return str.strip
    log.warning("the chat template changes the turns' whitespace in an unknown way; caller text is kept as sent")
    return _keep


def _keep(text: str) -> str:
    return text


@dataclass(frozen=True)
class Frame:
    """A branch's text is prefix + middle + <the question turn's text> + tail.

    `prefix` is the state's own rendering where the template keeps it intact (then a
    rendering of the state alone starts every branch), else empty."""

    prefix: Segments
    middle: Segments
    tail: Segments


def frame(tok: ChatTokenizer, state: State, rule: Callable[[str], str], cue: str) -> Frame:
    """The state's frame; `cue` (plain text) ends the tail. Raises ModelUnsuitable where the
    template drops the question turn, ValueError for a role outside ROLES (the edge allows
    no other: a role is written into the template's own text)."""
    turns = state.turns
    for t in turns:
        if t.role not in ROLES:
            raise ValueError(f"chat role {t.role[:40]!r} is not one of {', '.join(ROLES)}")
    contents = [rule(t.content) for t in turns]
    q = len(turns)
    slotted = [Turn(t.role, slot(i) if t.content else "") for i, t in enumerate(turns)]
    try:
        full = tok.render([*slotted, Turn("user", slot(q))], add_generation_prompt=True)
    except TemplateRefused:
        # Templates that demand strict user/assistant alternation (Gemma's) refuse a
        # second user turn: the question then joins the last user turn.
        if not turns or turns[-1].role != "user":
            raise
        folded = Turn("user", slotted[-1].content + "\n\n" + slot(q))
        full = tok.render([*slotted[:-1], folded], add_generation_prompt=True)
    question = slot(q)
    if full.count(question) != 1:
        raise ModelUnsuitable("the model's chat template dropped or repeated the question turn")
    at = full.index(question)  # `full` holds the template's text and placeholders only
    state_only = tok.render(slotted, add_generation_prompt=False) if turns else ""
    split = len(state_only) if full[:at].startswith(state_only) else 0
    return Frame(
        prefix=_pieces(full[:split], contents),
        middle=_pieces(full[split:at], contents),
        tail=(*_pieces(full[at + len(question) :], contents), (cue, False)),
    )


def _pieces(rendered: str, contents: Sequence[str]) -> Segments:
    """`rendered` (template text and placeholders) with each placeholder replaced by its
    content, as segments: the template's text marked template, the contents plain."""
    out: list[tuple[str, bool]] = []
    at = 0
    for m in _SLOT.finditer(rendered):
        if m.start() > at:
            out.append((rendered[at : m.start()], True))
        i = int(m.group(1))
        if i >= len(contents):
            raise ModelUnsuitable("the model's chat template moved the question turn")
        if contents[i]:
            out.append((contents[i], False))
        at = m.end()
    if at < len(rendered):
        out.append((rendered[at:], True))
    return tuple(out)
