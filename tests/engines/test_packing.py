from hypothesis import given, settings
from hypothesis import strategies as st

from openjev.core.plan import Branch, Plan
from openjev.engines.torch.packing import pack

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


def _layout_branch(pre, spans, tail, label=0):
    ids, cuts, at = list(pre), [], len(pre)
    for s in spans:
        cuts.append((at, at + len(s)))
        ids += s
        at += len(s)
    return Branch(tuple(ids + list(tail)), (label,), parallel=tuple(cuts))


def test_parallel_spans_see_the_head_and_themselves_and_the_tail_sees_every_span():
    pre, spans, tail = [1, 2, 3], [[10, 11], [20], [30, 31, 32]], [40, 41]
    shared = Branch((1, 2, 3, 9), (0,))  # a second branch sharing the head
    plan = Plan.from_branches([_layout_branch(pre, spans, tail), shared])
    packed = pack(plan)
    full = packed.visibility(0, len(packed))
    index = {tok: k for k, tok in enumerate(packed.tokens)}
    head = [index[t] for t in pre]
    for span in spans:
        for depth, tok in enumerate(span):
            seen = [k for k in range(len(packed)) if full[index[tok], k]]
            assert seen == head + [index[t] for t in span[: depth + 1]]  # no other span
            assert packed.positions[index[tok]] == len(pre) + depth  # every span starts at the same position
    seen = {packed.tokens[k] for k in range(len(packed)) if full[index[41], k]}
    assert seen == {1, 2, 3, 10, 11, 20, 30, 31, 32, 40, 41}
    longest = max(len(s) for s in spans)
    assert [packed.positions[index[t]] for t in tail] == [len(pre) + longest, len(pre) + longest + 1]
    assert dict(packed.reads)[0] == index[41]
    assert packed.root_len == 3  # only the head is a cacheable prefix


def test_a_lone_parallel_branch_keeps_its_spans_out_of_the_root():
    plan = Plan.from_branches([_layout_branch([1, 2], [[5], [6]], [7])])
    packed = pack(plan)
    assert packed.root_len == 2
    assert len(packed) == plan.unique_tokens == 5


def test_parallel_layouts_are_never_shared_even_when_identical():
    a = _layout_branch([1, 2], [[5], [6]], [7])
    plan = Plan.from_branches([a, a, Branch((1, 2, 5, 6, 7), (0,))])
    packed = pack(plan)
    assert len(packed) == 2 + 3 + 3 + 3  # head shared; each layout leaf and the linear tail on its own
    assert sorted(b for b, _ in packed.reads) == [0, 1, 2]


def test_layouts_on_a_shared_prefix_index_the_whole_sequence_and_stay_unshared():
    # Branches held as a shared prefix plus their own tokens (as the compiler makes them):
    # the spans index the whole sequence, and the trie splits before the first span even
    # where two layout branches' own tokens are identical.
    state = (1, 2, 3)
    own = (4, 5, 6, 7)  # 4: the question head, 5 and 6: one span each, 7: the tail
    spans = ((4, 5), (5, 6))
    a = Branch(own, (0,), state, parallel=spans)
    b = Branch(own, (1,), state, parallel=spans)
    linear = Branch((4, 9), (0,), state)
    assert a.input_ids == (1, 2, 3, 4, 5, 6, 7) and a.share_limit == 4
    plan = Plan.from_branches([a, b, linear])
    assert plan.root.tokens == (1, 2, 3, 4)  # the state and the shared head, nothing past it
    packed = pack(plan)
    assert packed.root_len == 4
    assert len(packed) == 4 + 3 + 3 + 1  # each layout leaf on its own; the linear tail
    full = packed.visibility(0, len(packed))
    for _, read in packed.reads[:2]:  # each layout's tail sees the state, the head and both its spans
        seen = [packed.tokens[k] for k in range(len(packed)) if full[read, k]]
        assert seen == [1, 2, 3, 4, 5, 6, 7]
    five = [k for k, t in enumerate(packed.tokens) if t == 5]
    assert all(packed.positions[k] == 4 for k in five)  # both spans at the first span's position
    assert all(packed.positions[k] == 4 for k, t in enumerate(packed.tokens) if t == 6)
    assert (
        Branch(own, (0,), state, parallel=spans)
        == Branch(state + own, (0,), parallel=spans)
        != a.__class__(own, (0,), state)
    )
