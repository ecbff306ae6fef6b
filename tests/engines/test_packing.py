from hypothesis import given, settings
from hypothesis import strategies as st

from openjev.core.plan import Branch, Plan
from openjev.engines.packing import pack

token_lists = st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(st.lists(token_lists, min_size=1, max_size=8), st.lists(st.integers(0, 3), max_size=5))
def test_each_branch_sees_exactly_its_own_tokens_in_order(seqs, common):
    seqs = [tuple(common) + tuple(s) for s in seqs]
    plan = Plan.from_branches([Branch(s, (0,)) for s in seqs])
    packed = pack(plan)
    assert len(packed) == plan.unique_tokens  # every distinct token once
    assert packed.root_len == plan.shared_prefix_len
    assert sorted(b for b, _ in packed.reads) == list(range(len(seqs)))
    full = packed.visibility(0, len(packed))
    for branch, last in packed.reads:
        seen = [k for k in range(len(packed)) if full[last, k]]
        # what the branch's last token attends to is its own sequence, position by position
        assert tuple(packed.tokens[k] for k in seen) == seqs[branch]
        assert [packed.positions[k] for k in seen] == list(range(len(seqs[branch])))
        # and every token on its path sees exactly its own prefix
        for depth, k in enumerate(seen):
            assert [j for j in range(len(packed)) if full[k, j]] == seen[: depth + 1]


def test_slices_of_the_mask_agree_with_the_whole():
    plan = Plan.from_branches([Branch((1, 2, 3, 4), (0,)), Branch((1, 2, 5), (0,)), Branch((1, 2, 5, 6, 7), (0,))])
    packed = pack(plan)
    full = packed.visibility(0, len(packed))
    for start in range(len(packed)):
        for end in range(start + 1, len(packed) + 1):
            assert packed.visibility(start, end).equal(full[start:end, :end])
