import pytest

from openjev.core.labels import candidate_labels, verify_labels
from openjev.errors import ModelUnsuitable
from tests.support.fakes import FakeTokenizer


def test_candidates_are_letters_then_pairs():
    c = list(candidate_labels())
    assert c[:3] == ["A", "B", "C"] and c[25] == "Z" and c[26:29] == ["AA", "AB", "AC"]
    assert len(c) == 26 + 26 * 26 and len(set(c)) == len(c)


def test_labels_verified_in_context_and_distinct():
    tok = FakeTokenizer()
    labels = verify_labels(tok.encode, "<|im_start|>assistant\nAnswer:", " ", 255)
    assert len(labels) == 255 and len(set(labels.ids)) == 255
    assert labels.texts[:27] == (*"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "AA")
    # each id is the single token that follows the context
    base = tok.encode("<|im_start|>assistant\nAnswer:")
    assert tok.encode("<|im_start|>assistant\nAnswer: AB") == [*base, labels.ids[labels.texts.index("AB")]]


def test_labels_that_split_are_skipped_in_order():
    tok = FakeTokenizer(split_labels={"C", "AB"})
    labels = verify_labels(tok.encode, "Answer:", " ", 30)
    assert "C" not in labels.texts and "AB" not in labels.texts
    assert labels.texts[:3] == ("A", "B", "D")
    assert labels.texts[26:28] == ("AC", "AD")


def test_model_with_too_few_labels_is_refused():
    tok = FakeTokenizer(split_labels=set(candidate_labels()) - {"A", "B"})
    with pytest.raises(ModelUnsuitable, match="only 2 of the 3"):
        verify_labels(tok.encode, "Answer:", " ", 3)
