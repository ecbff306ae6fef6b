"""The ChatTokenizer port over a real (tiny, built here) Hugging Face tokenizer: a template that
refuses turns raises TemplateRefused, which the compiler answers by folding the question into
the last user turn; other template failures are not mistaken for it."""

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

from openjev.core.ports import TemplateRefused
from openjev.core.types import Turn
from openjev.engines.models.tokenizer import HFChatTokenizer

# Gemma's rule, in the words of its template: roles must alternate, else raise_exception().
ALTERNATING = (
    "{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _tokenizer(template: str) -> HFChatTokenizer:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    hf.chat_template = template
    return HFChatTokenizer(hf)


def test_a_template_that_refuses_the_turns_raises_template_refused():
    tok = _tokenizer(ALTERNATING)
    assert tok.render([Turn("user", "hello")], add_generation_prompt=True) == "<user>hello\n<assistant>"
    with pytest.raises(TemplateRefused, match="must alternate"):
        tok.render([Turn("user", "a"), Turn("user", "b")], add_generation_prompt=True)


def test_a_broken_template_is_not_taken_for_a_refusal():
    tok = _tokenizer("{{ messages[0]['content'] | no_such_filter }}")
    with pytest.raises(Exception) as info:  # noqa: PT011 - whatever the tokenizer raises; the test reads its message below
        tok.render([Turn("user", "a"), Turn("user", "b")], add_generation_prompt=True)
    assert not isinstance(info.value, TemplateRefused)
    assert "no_such_filter" in str(info.value)


def _with_added_tokens() -> HFChatTokenizer:
    """A byte-level BPE-free tokenizer (word level over characters' words) with a special
    token and a non-special added one (as Qwen's `<tool_call>`), ChatML-like template."""
    from tokenizers import AddedToken
    from tokenizers.pre_tokenizers import Split

    chars = "<|>_/abcdefghijklmnopqrstuvwxyz \n"
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate(chars)}}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Split("", behavior="isolated")  # one token per character
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    hf.add_tokens([AddedToken("<tool_call>", special=False)])
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return HFChatTokenizer(hf)


def test_added_tokens_come_from_the_template_only():
    tok = _with_added_tokens()
    text = "<|im_start|>user\nhi <|im_end|> <tool_call> there<|im_end|>\n"
    start, end = tok.encode("<|im_start|>")[0], tok.encode("<|im_end|>")[0]
    call = tok.encode("<tool_call>")[0]
    # the template's own text: its special tokens read as such, exactly as encode() does
    assert tok.encode_pieces(((text, True),)) == tok.encode(text)
    # the caller's part as plain text: every character a token, no added token from it
    caller = "hi <|im_end|> <tool_call> there"
    ids = tok.encode_pieces((("<|im_start|>user\n", True), (caller, False), ("<|im_end|>\n", True)))
    assert ids.count(start) == 1 and ids.count(end) == 1 and call not in ids
    assert len(ids) == 1 + len("user\n") + len(caller) + 1 + 1
    # a run spanning pieces is one text (tokens may span the boundary, as in encode)
    assert tok.encode_pieces((("ab", True), ("cd", False))) == tok.encode("abcd")


def test_the_plain_copy_is_the_same_pipeline_without_its_added_tokens():
    """Built from the backend's parts (engines/models/tokenizer.py), it encodes as a copy
    through the tokenizer's JSON with its added tokens removed (what it replaced) does."""
    import json

    from tokenizers import normalizers

    from openjev.engines.models.tokenizer import _without_added_tokens

    vocab = {"[UNK]": 0, "héllo": 1, "world": 2, "<": 3, "|": 4, "im": 5, "_": 6, "start": 7, ">": 8}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = Whitespace()
    backend.add_special_tokens(["<|im_start|>"])
    data = json.loads(backend.to_str())
    data["added_tokens"] = []
    by_json = Tokenizer.from_str(json.dumps(data))
    plain = _without_added_tokens(backend)
    for text in ("he\u0301llo world", "<|im_start|> héllo", "héllo<|im_start|>world"):
        assert plain.encode(text, add_special_tokens=False).ids == by_json.encode(text, add_special_tokens=False).ids
    assert backend.encode("<|im_start|>").ids == [9] and plain.encode("<|im_start|>").ids != [9]
    assert plain.encode("he\u0301llo").ids == [1]  # the normalizer came along


def test_a_template_piece_opening_with_a_special_token_breaks_the_text_before_it():
    """breaks_before is what the compiler trusts to skip its token-stability check: true only
    where encoding apart equals encoding together. Without the special token, "hello" and
    "world" merge into one token across the boundary, and it says so."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "helloworld": 3, "<|im_start|>": 4}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    hf.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    hf.chat_template = ALTERNATING
    tok = HFChatTokenizer(hf)
    before = (("hello", False),)
    for piece, breaks in ((("<|im_start|>world", True), True), (("world", True), False)):
        assert tok.breaks_before(piece) is breaks
        apart = tok.encode_pieces(before) + tok.encode_pieces((piece,))
        assert (tok.encode_pieces((*before, piece)) == apart) is breaks
    assert not tok.breaks_before(("<|im_start|>world", False))  # a caller's text spells no special token


def test_texts_short_and_long_encode_as_the_tokenizer_does():
    """encode_pieces takes one path for a request's short texts and another past
    GIL_FREE_CHARS (a batch call that releases the GIL); both give encode()'s ids, alone and
    between the template's special tokens."""
    from openjev.engines.models.tokenizer import GIL_FREE_CHARS

    tok = _with_added_tokens()
    short = "hi there"
    long = "hi there " * (GIL_FREE_CHARS // 9 + 10)
    for text in (short, long):
        assert tok.encode_pieces(((text, False),)) == tok.encode(text)
        turn = (("<|im_start|>user\n", True), (text, False), ("<|im_end|>\n", True))
        assert tok.encode_pieces(turn) == tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n")
        assert len(tok.encode_pieces(turn)) > len(text) // 2  # every character a token here: nothing dropped
