"""The eval data's domain tags follow one rule (openjev.evals.domains), and the loader keeps them."""

from openjev.evals.dataset import load_items
from openjev.evals.domains import GROUPS, domain_of_id


def test_every_item_is_tagged_by_the_rule_and_every_group_is_in_both_splits():
    dev, test = load_items("evals/data/dev.jsonl"), load_items("evals/data/test.jsonl")
    for item in dev + test:
        assert item.domain == domain_of_id(item.id) and item.domain in set(GROUPS.values())
    assert {i.domain for i in dev} == {i.domain for i in test} == set(GROUPS.values())


def test_an_id_outside_the_known_kinds_is_its_own_group():
    assert domain_of_id("sms-005") == "one-liners" and domain_of_id("invoice-7") == "invoice"
