import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openjev.core.plan import Branch, Plan

token_lists = st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12)


def _paths(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Reconstruct each branch's tokens by walking from the root to the node it ends at."""
    found: dict[int, tuple[int, ...]] = {}

    def walk(node, prefix):
        here = prefix + node.tokens
        for i in node.ends:
            found[i] = here
        for child in node.children:
            walk(child, here)

    walk(plan.root, ())
    return found


@settings(max_examples=300, deadline=None)
@given(st.lists(token_lists, min_size=1, max_size=10), st.data())
def test_trie_recovers_every_branch_and_counts_each_token_once(seqs, data):
    # shared prefixes are common in real plans: prepend one to make them likely
    common = data.draw(st.lists(st.integers(0, 4), max_size=6))
    seqs = [tuple(common) + tuple(s) for s in seqs]
    plan = Plan.from_branches([Branch(s, (1, 2)) for s in seqs])
    assert _paths(plan) == dict(enumerate(seqs))
    # distinct tokens = number of distinct non-empty prefixes (each trie position once)
    distinct_prefixes = {s[:k] for s in seqs for k in range(1, len(s) + 1)}
    assert plan.unique_tokens == len(distinct_prefixes)
    assert plan.prompt_tokens == sum(len(s) for s in seqs)
    # the root is exactly the longest common prefix
    lcp = 0
    while all(len(s) > lcp for s in seqs) and len({s[lcp] for s in seqs}) == 1:
        lcp += 1
    assert plan.shared_prefix_len == lcp
    # node positions chain: a child starts where its parent ends
    for node in plan.root.walk():
        for child in node.children:
            assert child.start == node.end and child.tokens


def test_identical_branches_end_at_the_same_node():
    plan = Plan.from_branches([Branch((1, 2, 3), (9,)), Branch((1, 2, 3), (9,)), Branch((1, 2, 4), (9,))])
    assert plan.root.tokens == (1, 2) and plan.unique_tokens == 4
    ends = sorted(i for node in plan.root.walk() for i in node.ends)
    assert ends == [0, 1, 2]
    assert plan.root.branch_indices() == [0, 1, 2]


def test_a_parallel_layout_is_checked():
    with pytest.raises(ValueError, match="at least one token after its spans"):
        Branch((1, 2, 3), (0,), parallel=((1, 2), (2, 3)))  # nothing after the spans
    with pytest.raises(ValueError, match="adjacent and non-empty"):
        Branch((1, 2, 3, 4), (0,), parallel=((1, 2), (3, 4)))  # not adjacent
    with pytest.raises(ValueError, match="at least one token before its spans"):
        Branch((1, 2, 3), (0,), parallel=((0, 1), (1, 2)))  # nothing before
    assert Branch((1, 2, 3, 4), (0,), parallel=((1, 2), (2, 3))).share_limit == 1
