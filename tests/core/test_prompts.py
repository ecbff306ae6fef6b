import pytest

from openjev.core.prompts import PromptCompiler
from openjev.core.types import ChoiceQuestion, DecisionRequest, NoulQuestion, Option, ScoreQuestion, State, Turn
from openjev.core.wording import ANSWER_CUE, letters_text, option_texts
from tests.support.fakes import FakeTokenizer

STATE = State((Turn("user", "My card was charged twice and I want a refund."),))
QUESTIONS = (
    ("refund", NoulQuestion("Does the customer ask for a refund?")),
    ("team", ChoiceQuestion("Which team?", (Option("billing", "Payments and refunds"), Option("tech", None)))),
    ("anger", ScoreQuestion("How angry?", ("Calm", "Annoyed", "Furious"))),
)


def _text_of(tok: FakeTokenizer, ids) -> str:
    inverse = {v: k for k, v in tok.vocab.items()}
    return "".join(inverse[i] for i in ids)


def test_branches_equal_whole_text_encoding_and_share_the_state():
    tok = FakeTokenizer()
    compiler = PromptCompiler(tok, max_labels=255)
    compiled = compiler.compile(DecisionRequest(STATE, QUESTIONS))
    plan = compiled.plan
    assert len(plan.branches) == 3
    state_ids = tok.encode(tok.render(STATE.turns, add_generation_prompt=False))
    assert plan.shared_prefix_len >= len(state_ids)
    for branch in plan.branches:
        text = _text_of(tok, branch.input_ids)
        assert tok.encode(text) == list(branch.input_ids)  # the split is token-stable
        assert text.startswith(tok.render(STATE.turns, add_generation_prompt=False))
        assert text.endswith("<|im_start|>assistant\n" + ANSWER_CUE)
    assert compiled.spans == ((0, 1), (1, 1), (2, 1))
    assert plan.branches[2].label_ids == compiler.labels.ids[:3]


def test_question_ids_never_reach_the_model_and_names_only_without_description():
    tok = FakeTokenizer()
    compiled = PromptCompiler(tok, max_labels=255).compile(DecisionRequest(STATE, (("secret-id-🙂", QUESTIONS[1][1]),)))
    text = _text_of(tok, compiled.plan.branches[0].input_ids)
    assert "secret" not in text
    assert "Payments and refunds" in text and "billing" not in text  # described: name hidden
    assert "B. tech" in text  # null description: the name speaks


def test_options_are_lettered_in_order():
    labels = PromptCompiler(FakeTokenizer(), max_labels=255).labels
    q = ChoiceQuestion(None, tuple(Option(f"opt{i}", None) for i in range(30)))
    text = letters_text(q, range(30), labels.texts)
    assert "A. opt0" in text and "Z. opt25" in text and "AA. opt26" in text and "AD. opt29" in text
    assert "Which option fits best?" in text


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        (NoulQuestion("Refund?"), ["Yes", "No"]),
        (NoulQuestion(None, "asks for money back", None), ["Yes: asks for money back", "No"]),
        (NoulQuestion(None, None, "is happy"), ["Yes", "No: is happy"]),
        (ScoreQuestion(None, ("low", "high")), ["low", "high"]),
    ],
)
def test_option_texts(question, expected):
    assert option_texts(question) == expected


def test_chat_state_is_rendered_as_real_turns():
    tok = FakeTokenizer()
    state = State((Turn("system", "You route tickets."), Turn("user", "Charged twice!"), Turn("assistant", "Sorry.")))
    compiled = PromptCompiler(tok, max_labels=255).compile(DecisionRequest(state, QUESTIONS[:1]))
    text = _text_of(tok, compiled.plan.branches[0].input_ids)
    assert text.startswith("<|im_start|>system\nYou route tickets.<|im_end|>\n<|im_start|>user\nCharged twice!")
    assert "<|im_start|>assistant\nSorry.<|im_end|>\n<|im_start|>user\n" in text


def test_unstable_boundary_falls_back_to_whole_encoding():
    tok = FakeTokenizer(glued=True)  # "…refund.user: Answer…" merges across the turn boundary
    compiler = PromptCompiler(tok, max_labels=30)
    compiled = compiler.compile(DecisionRequest(State((Turn("user", "charged twice"),)), QUESTIONS))
    for branch in compiled.plan.branches:
        assert tok.encode(_text_of(tok, branch.input_ids)) == list(branch.input_ids)


def test_strictly_alternating_template_gets_the_question_in_the_last_user_turn():
    tok = FakeTokenizer(alternating=True)
    compiled = PromptCompiler(tok, max_labels=255).compile(DecisionRequest(STATE, QUESTIONS))
    for branch in compiled.plan.branches:
        text = _text_of(tok, branch.input_ids)
        assert text.count("<|im_start|>user") == 1
        assert text.startswith("<|im_start|>user\nMy card was charged twice and I want a refund.\n\n")
        assert tok.encode(text) == list(branch.input_ids)
    assert compiled.plan.shared_prefix_len > 10  # the state is still shared, found on token ids


class _CountingTokenizer(FakeTokenizer):
    """The fake tokenizer, counting how often each text piece is encoded."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[str] = []

    def encode_pieces(self, pieces):
        self.encoded.append("".join(text for text, _ in pieces))
        return super().encode_pieces(pieces)


def _state_encodings(tok: _CountingTokenizer, state: State) -> int:
    """Encodings of the whole state: its opening words are outside the split check's window."""
    head = state.turns[0].content[:40]
    return sum(1 for text in tok.encoded if head in text)


class _UnsureTokenizer(_CountingTokenizer):
    """The counting fake, claiming no piece ever starts a new run of text."""

    def breaks_before(self, piece) -> bool:
        return False


def test_readings_opening_with_a_special_token_skip_the_token_stability_check():
    """ChatML's question turn opens with <|im_start|>, where every encoding splits: the
    split is stable by construction and its window is not encoded; the plan is the one the
    check would have passed."""
    sure, unsure = _CountingTokenizer(), _UnsureTokenizer()
    plans = []
    for tok in (sure, unsure):
        compiler = PromptCompiler(tok, max_labels=255)
        tok.encoded.clear()
        plans.append(compiler.compile(DecisionRequest(STATE, QUESTIONS)).plan)
    assert plans[0].branches == plans[1].branches
    assert len(unsure.encoded) == len(sure.encoded) + 3  # the window, a reading, and both together


def test_a_state_asked_again_is_encoded_once_per_namespace_with_the_same_ids():
    tok = _CountingTokenizer()
    compiler = PromptCompiler(tok, max_labels=255)
    state = State((Turn("user", "Order 4471: the parcel came late. " + "The box was crushed, and so was I. " * 30),))
    first = compiler.compile(DecisionRequest(state, QUESTIONS[:1]))
    tok.encoded.clear()
    again = compiler.compile(DecisionRequest(state, QUESTIONS[1:]))
    assert _state_encodings(tok, state) == 0  # the state's ids came from the first request
    fresh = PromptCompiler(FakeTokenizer(), max_labels=255)
    fresh._tok.vocab = tok.vocab  # the same ids for the same pieces
    assert again.plan.branches == fresh.compile(DecisionRequest(state, QUESTIONS[1:])).plan.branches
    assert again.plan.branches[0].prefix == first.plan.branches[0].prefix != ()
    tok.encoded.clear()
    compiler.compile(DecisionRequest(state, QUESTIONS[1:], cache_namespace="tenant-b"))
    assert _state_encodings(tok, state) == 1  # another tenant's request encodes it itself


def test_questions_asked_again_of_new_states_are_encoded_once_per_namespace_and_only_once_priced():
    """A question's readings are kept like a state's: asked again of another state in the same
    namespace they are not encoded again, and give the ids a fresh compiler gives; another
    tenant encodes them itself; a request refused by the limits keeps nothing (so its next
    refusal is charged the same work)."""
    from openjev.core.prompts import CompileLimits
    from openjev.errors import TokensExceeded

    def question_encodings(tok: _CountingTokenizer) -> int:
        return sum(1 for text in tok.encoded if "Which team?" in text or "How angry?" in text)

    tok = _CountingTokenizer()
    compiler = PromptCompiler(tok, max_labels=255)
    other = State((Turn("user", "The app crashes when I open my invoices."),))
    compiler.compile(DecisionRequest(STATE, QUESTIONS))
    tok.encoded.clear()
    again = compiler.compile(DecisionRequest(other, QUESTIONS))
    assert question_encodings(tok) == 0
    fresh = PromptCompiler(FakeTokenizer(), max_labels=255)
    fresh._tok.vocab = tok.vocab  # the same ids for the same pieces
    assert again.plan.branches == fresh.compile(DecisionRequest(other, QUESTIONS)).plan.branches
    tok.encoded.clear()
    compiler.compile(DecisionRequest(other, QUESTIONS, cache_namespace="tenant-b"))
    assert question_encodings(tok) > 0  # another tenant's request encodes them itself

    refusing = CompileLimits(max_branch_tokens=1 << 20, max_branches=1000, max_prompt_tokens=60)
    tok = _CountingTokenizer()
    compiler = PromptCompiler(tok, max_labels=255)
    works = []
    for _ in range(2):
        with pytest.raises(TokensExceeded) as refused:
            compiler.compile(DecisionRequest(STATE, QUESTIONS), limits=refusing)
        works.append(refused.value.work_tokens)
    assert works[0] == works[1] > 0  # the second refusal did the same work: nothing was kept


def test_shared_ids_are_bounded_least_recently_used_first():
    from openjev.core.shared_ids import SharedIds

    cache = SharedIds(max_tokens=40)
    cache.put(("", "a"), tuple(range(10)))
    cache.put(("", "b"), tuple(range(10)))
    cache.put(("", "c"), tuple(range(10)))
    assert cache.get(("", "a")) is not None  # a is now the most recent
    cache.put(("", "d"), tuple(range(10)))
    cache.put(("", "e"), tuple(range(10)))  # over 40: the least recent (b) goes
    assert cache.get(("", "b")) is None
    assert [cache.get(("", k)) is not None for k in "acde"] == [True, True, True, True]
    assert cache.tokens == 40
    cache.put(("", "big"), tuple(range(11)))  # over a quarter of the bound: not kept
    assert cache.get(("", "big")) is None and cache.tokens == 40
    cache.put(("", "a"), tuple(range(5)))  # replacing an entry counts its new size
    assert cache.tokens == 35
    assert cache.get(("x", "c")) is None  # another namespace is another key


def test_a_refused_request_leaves_no_state_behind():
    """Kept only once its request passed the limits: a refusal is charged what it read each time."""
    from openjev.core.prompts import CompileLimits
    from openjev.errors import TokensExceeded

    tok = _CountingTokenizer()
    compiler = PromptCompiler(tok, max_labels=255)
    state = State((Turn("user", "Order 5512: refund me now. " + "I waited for weeks and weeks. " * 30),))
    tight = CompileLimits(max_branch_tokens=50, max_branches=64, max_prompt_tokens=10_000)
    for _ in range(2):
        with pytest.raises(TokensExceeded) as refused:
            compiler.compile(DecisionRequest(state, QUESTIONS[:1]), limits=tight)
        assert refused.value.work_tokens > 50  # the state was read, both times
    tok.encoded.clear()
    compiler.compile(DecisionRequest(state, QUESTIONS[:1]))
    assert _state_encodings(tok, state) == 1  # nothing was kept from the refusals
