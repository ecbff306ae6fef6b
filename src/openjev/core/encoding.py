"""Encoding a compile's texts: the encoder that counts what it encoded (a refusal's cost)
and reuses parts (a batch's part cache, the ids kept from earlier requests of the
namespace), and a reading encoded apart from the shared part, with its parallel layout."""

from __future__ import annotations

from dataclasses import dataclass

from openjev.core.ports import ChatTokenizer, Segments
from openjev.core.shared_ids import SharedIds


class Encoder:
    """Encodes text, counting the tokens it encoded (`work`: what a refusal cost); parts go
    through the optional part cache (text -> ids) shared by a batch's items, then the ids
    kept from earlier requests of the namespace (`known`). `fresh`: the parts encoded here,
    for the compiler to keep once the request passed its limits."""

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        part_cache: dict[str, tuple[int, ...]] | None,
        known: SharedIds | None = None,
        namespace: str = "",
    ) -> None:
        self._tok = tokenizer
        self._cache = part_cache
        self._known = known
        self._namespace = namespace
        self.fresh: dict[str, tuple[int, ...]] = {}
        self.work = 0

    def whole(self, text: Segments) -> tuple[int, ...]:
        ids = tuple(self._tok.encode_pieces(text))
        self.work += len(ids)
        return ids

    def part(self, text: Segments) -> tuple[int, ...]:
        if self._cache is None and self._known is None:
            return self.whole(text)
        key = part_key(text)
        ids = self._cache.get(key) if self._cache is not None else None
        if ids is None and self._known is not None:
            ids = self._known.get((self._namespace, key))
        if ids is None:
            ids = self.fresh[key] = self.whole(text)
        if self._cache is not None:
            self._cache[key] = ids
        return ids


def part_key(text: Segments) -> str:
    """The part cache's key: one string per segments, length-prefixed so that no two
    differ only in where a caller's text ends (a caller may send any character)."""
    return "".join(f"{len(piece)}{'t' if template else 'p'}{piece}" for piece, template in text)


@dataclass(frozen=True)
class Encoded:
    """One reading encoded apart from the shared part. A parallel reading keeps its `lines`
    and `end` (the template's tail) and its `layout`: the lines' spans as offsets into its
    own part (the shared part's length is added when the branch is made)."""

    qid: str
    text: Segments  # what the split-stability check and a whole re-encoding read (a parallel reading's head)
    part: tuple[int, ...]
    label_ids: tuple[int, ...]
    layout: tuple[tuple[int, int], ...] = ()
    lines: tuple[tuple[int, ...], ...] | None = None
    end: tuple[int, ...] = ()

    @classmethod
    def laid_out(
        cls,
        qid: str,
        text: Segments,
        head: tuple[int, ...],
        lines: tuple[tuple[int, ...], ...],
        end: tuple[int, ...],
        label_ids: tuple[int, ...],
    ) -> Encoded:
        part, layout = lay_out(head, lines, end)
        return cls(qid, text, part, label_ids, layout, lines, end)


def lay_out(
    head: tuple[int, ...], lines: tuple[tuple[int, ...], ...], end: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """head + the lines one after another + end, and each line's span in it."""
    spans = []
    at = len(head)
    for line in lines:
        spans.append((at, at + len(line)))
        at += len(line)
    return head + tuple(t for line in lines for t in line) + end, tuple(spans)
