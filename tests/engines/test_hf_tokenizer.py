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
from openjev.engines.hf_tokenizer import HFChatTokenizer

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
