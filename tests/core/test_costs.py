"""A request's cost is known and bounded before the work it bounds (issue 16, finding 1).

The compiler encodes the state once, holds every branch as the one shared state tuple
plus its own part, and refuses from arithmetic before building what a limit forbids:
the branch count before any text is rendered; a state of many chat turns before it is
rendered; the state's tokens per branch and times the branch count before any question
is encoded; each question's readings one by one, stopping at the first over a limit."""

from __future__ import annotations

import pytest

from openjev.core.plan import Branch, Plan
from openjev.core.prompts import CompileLimits, PromptCompiler
from openjev.core.readouts import LettersReadout, YesNoReadout
from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Option, State, Turn
from openjev.errors import TokensExceeded
from tests.support.fakes import FakeTokenizer

WIDE = CompileLimits(max_branch_tokens=1 << 30, max_branches=1 << 30, max_prompt_tokens=1 << 40)


class CountingTokenizer(FakeTokenizer):
    """FakeTokenizer that also counts the characters it was asked to encode and render."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.encoded_chars = 0
        self.rendered_turns = 0

    def encode_pieces(self, pieces) -> list[int]:
        self.encoded_chars += sum(len(text) for text, _ in pieces)
        return super().encode_pieces(pieces)

    def render(self, turns, *, add_generation_prompt: bool) -> str:
        self.rendered_turns += len(turns)
        return super().render(turns, add_generation_prompt=add_generation_prompt)


def _setup(**kw):
    tok = CountingTokenizer(**kw)
    compiler = PromptCompiler(tok, max_labels=255)
    tok.encoded_chars = tok.rendered_turns = 0
    return tok, compiler


def _choice(k: int, n: int) -> ChoiceQuestion:
    return ChoiceQuestion(f"Which {k}?", tuple(Option(f"o{i}", None) for i in range(n)))


def _yesno(compiler: PromptCompiler) -> YesNoReadout:
    assert compiler.yes_no is not None
    return YesNoReadout(*compiler.yes_no)


def test_branches_share_one_state_tuple_and_the_trie_equals_that_of_whole_branches():
    _, compiler = _setup()
    state = State((Turn("user", "word " * 500),))
    request = DecisionRequest(state, tuple((f"q{k}", _choice(k, 5)) for k in range(6)))
    plan = compiler.compile(request, _yesno(compiler), WIDE).plan
    assert len(plan.branches) == 30
    shared = plan.branches[0].prefix
    assert len(shared) > 500 and all(b.prefix is shared for b in plan.branches)  # one tuple, not 30 copies
    whole = Plan.from_branches([Branch(b.input_ids, b.label_ids) for b in plan.branches])
    assert whole.root == plan.root  # the same trie, node for node
    assert (whole.unique_tokens, whole.prompt_tokens) == (plan.unique_tokens, plan.prompt_tokens)
    for b in plan.branches:  # each branch is still its whole text's encoding
        assert len(b) == len(b.input_ids) and Branch(b.input_ids, b.label_ids) == b


def test_the_state_is_encoded_once():
    tok, compiler = _setup()
    state_text = "word " * 20_000
    request = DecisionRequest(State((Turn("user", state_text),)), (("q", _choice(0, 4)),))
    compiler.compile(request, LettersReadout(compiler.labels.texts, compiler.labels.ids, rotations=4), WIDE)
    # once for the state; the token-stability check re-encodes a bounded window only
    assert len(state_text) <= tok.encoded_chars < 2 * len(state_text)


def test_too_many_branches_are_refused_before_anything_is_rendered():
    tok, compiler = _setup()
    limits = CompileLimits(max_branch_tokens=1 << 20, max_branches=1000, max_prompt_tokens=1 << 30)
    request = DecisionRequest(State((Turn("user", "x " * 1000),)), tuple((f"q{k}", _choice(k, 255)) for k in range(4)))
    with pytest.raises(TokensExceeded, match=r"the request reads 1020 branches \(limit 1000 per request"):
        compiler.compile(request, _yesno(compiler), limits)
    assert tok.rendered_turns == 0 and tok.encoded_chars == 0


def test_a_state_longer_than_a_branch_is_refused_before_any_question_is_encoded():
    tok, compiler = _setup()
    limits = CompileLimits(max_branch_tokens=5000, max_branches=1 << 20, max_prompt_tokens=1 << 30)
    state = "7 " * 20_000  # 20,000+ tokens with the fake tokenizer
    request = DecisionRequest(State((Turn("user", state),)), tuple((f"q{k}", _choice(k, 255)) for k in range(4)))
    with pytest.raises(
        TokensExceeded,
        match=r"question 'q0': the state and this question take more than \d+ tokens \(limit 5000 per branch\)",
    ) as e:
        compiler.compile(request, _yesno(compiler), limits)
    assert tok.encoded_chars < len(state) + 200  # the state (and its frame), no question
    assert e.value.work_tokens > 20_000  # what the refusal cost, for the caller's key


def test_the_state_times_the_branches_is_refused_before_any_question_is_encoded():
    tok, compiler = _setup()
    limits = CompileLimits(max_branch_tokens=1 << 20, max_branches=1 << 20, max_prompt_tokens=100_000)
    state = "7 " * 1000  # ~1000 tokens x 1020 branches: ~1M tokens of branches in all
    request = DecisionRequest(State((Turn("user", state),)), tuple((f"q{k}", _choice(k, 255)) for k in range(4)))
    with pytest.raises(
        TokensExceeded,
        match=r"the request's 1020 branches take at least \d+ tokens in all.*\(limit 100000 per request\)",
    ):
        compiler.compile(request, _yesno(compiler), limits)
    assert tok.encoded_chars < len(state) + 200


def test_many_empty_turns_are_refused_before_the_state_is_rendered():
    tok, compiler = _setup()
    assert compiler.turn_tokens >= 1
    limits = CompileLimits(max_branch_tokens=32_768, max_branches=4096, max_prompt_tokens=1 << 22)
    turns = tuple(Turn("user", "") for _ in range(66_000))
    request = DecisionRequest(State(turns), (("q", NoulQuestion("Empty?")),))
    with pytest.raises(TokensExceeded, match=r"the state's 66000 chat turns alone take at least \d+ tokens"):
        compiler.compile(request, None, limits)
    assert tok.rendered_turns == 0 and tok.encoded_chars == 0


def test_questions_are_encoded_one_by_one_and_the_first_over_the_limit_stops_the_rest():
    tok, compiler = _setup()
    limits = CompileLimits(max_branch_tokens=1 << 20, max_branches=1 << 20, max_prompt_tokens=20_000)
    huge = ChoiceQuestion("big " * 30_000, (Option("a", None), Option("b", None)))
    request = DecisionRequest(
        State((Turn("user", "hi"),)), (("small", _choice(0, 3)), ("huge", huge), *((f"q{k}", huge) for k in range(50)))
    )
    with pytest.raises(TokensExceeded, match=r"branches take more than \d+ tokens in all.*\(limit 20000 per request\)"):
        compiler.compile(request, _yesno(compiler), limits)
    # yesno reads "huge" once per option: the first reading passes the limit, nothing after it is built
    assert tok.encoded_chars < 2 * len(huge.instructions or "")


def test_a_part_cache_encodes_each_question_once_for_many_states():
    tok, compiler = _setup()
    questions = tuple((f"q{k}", _choice(k, 40)) for k in range(8))
    cache: dict[str, tuple[int, ...]] = {}
    plans = []
    for i in range(2):
        plans.append(
            compiler.compile(DecisionRequest(State((Turn("user", f"state {i}"),)), questions), None, WIDE, cache).plan
        )
        if i == 0:
            first = tok.encoded_chars
    assert tok.encoded_chars - first < first / 4  # the second state paid for its state, not its questions
    fresh = compiler.compile(DecisionRequest(State((Turn("user", "state 1"),)), questions), None, WIDE).plan
    assert [b.input_ids for b in fresh.branches] == [b.input_ids for b in plans[1].branches]


@pytest.mark.parametrize("kw", [{"glued": True}, {"alternating": True}])
def test_templates_that_split_unstably_or_fold_still_give_whole_text_encodings(kw):
    tok, compiler = _setup(**kw)
    state = State((Turn("user", "alpha beta " * 300),))
    request = DecisionRequest(state, tuple((f"q{k}", _choice(k, 3)) for k in range(3)))
    plan = compiler.compile(request, _yesno(compiler), WIDE).plan
    inverse = {v: k for k, v in tok.vocab.items()}
    for b in plan.branches:
        assert tok.encode("".join(inverse[i] for i in b.input_ids)) == list(b.input_ids)
