"""OpenAI's Decisions API served by a real `openjev serve` (embedded model, float32) and driven
by the official `openai` SDK: `client.decisions.create` sync and async for every question and
input kind, `with_raw_response` headers, the SDK's exception class for each 4xx,
`DecisionsToolRunner` completing runs, `prompt_cache_key` isolation, and float32 parity with
/v1/systemone (the same question on both routes gets the same probabilities)."""

from __future__ import annotations

import asyncio
import math

import httpx
import openai
import pytest
from openai.lib.decisions_tool_runner import AsyncDecisionsToolRunner, DecisionsToolRunner
from openai.types import Decision

from tests.integration.conftest import start_server, stop_server

KEY = "oa-test-key"
LIMITED = "oa-limited-key"
TICKET = "Hi, I was charged twice for order #1234 and I want my money back today."
QUESTIONS = [
    {"type": "predicate", "name": "refund", "instructions": "The customer asks for a refund."},
    {
        "type": "choice",
        "name": "department",
        "instructions": "Which team should handle this?",
        "choices": [
            {"value": "billing", "description": "Payments, charges and refunds"},
            {"value": "technical", "description": "Bugs in the app"},
        ],
    },
    {
        "type": "choice",
        "name": "typed",
        "instructions": [{"type": "input_text", "text": "Is the customer happy?"}],
        # two choices: read in two orders, at least one agrees with the answer, so the default
        # abstain rule (order agreement >= 0.5) never declines it; refusals have their own test
        # typed values come back typed; they must read differently to the model (`true` and
        # `"true"` would read the same: refused, 400, on every route)
        "choices": [{"value": True}, {"value": "no"}],
    },
    {
        "type": "score",
        "instructions": "How urgent is this?",
        # two levels, read in two orders: one of them always agrees with the answer, so the default
        # abstain rule never declines it (three levels can be: the average's pick may be neither's)
        "levels": [{"label": "Routine"}, {"label": "Urgent", "description": "today"}],
    },
]
INPUT_ITEMS = [
    {"role": "developer", "content": "You read support conversations."},
    {"role": "system", "content": [{"type": "input_text", "text": "Answer about the last customer message."}]},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": TICKET, "prompt_cache_breakpoint": {"mode": "explicit"}},
            {"type": "input_json", "data": {"order": 1234, "charges": [59.9, 59.9]}},
        ],
    },
    {
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me check the order."}],
        "phase": "commentary",
    },
    {"type": "function_call", "call_id": "call_1", "name": "lookup_order", "arguments": '{"order": 1234}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "two charges of 59.90 on 2026-11-30"},
    {"type": "custom_tool_call", "call_id": "call_2", "name": "ledger", "namespace": "billing", "input": "1234"},
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "refundable"}]},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot issue refunds myself."}]},
    {"role": "user", "content": "Then who can?"},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openai")
    keys = folder / "keys"
    keys.write_text(f"main:{KEY}\nlimited:{LIMITED} requests_per_min=1\n")
    srv = start_server(folder, "--api-keys-file", str(keys))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
        yield c


def check_answers(decision: Decision) -> None:
    """Types, names and order as asked; typed choice values; usage."""
    assert [a.type for a in decision.answers] == ["predicate", "choice", "choice", "score"]
    assert [a.name for a in decision.answers] == ["refund", "department", "typed", None]
    refund, department, typed, urgency = decision.answers
    assert 0.0 <= refund.probability <= 1.0
    assert [p.value for p in department.probabilities] == ["billing", "technical"]
    assert department.choice in ("billing", "technical")
    values = [p.value for p in typed.probabilities]
    assert values == [True, "no"] and [type(v) for v in values] == [bool, str]
    top = max(typed.probabilities, key=lambda p: p.probability)
    assert typed.choice == top.value and type(typed.choice) is type(top.value)
    for answer in (department, typed):
        assert math.isclose(sum(p.probability for p in answer.probabilities), 1.0, abs_tol=1e-6)
        assert 0.0 <= answer.confidence <= 1.0
    assert [(p.label, p.value) for p in urgency.probabilities] == [("Routine", 0), ("Urgent", 1)]
    assert urgency.score == pytest.approx(sum(p.value * p.probability for p in urgency.probabilities))
    usage = decision.usage
    assert usage.input_tokens > 0 and usage.output_tokens == 0 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.input_tokens_details.cache_write_tokens >= 0


@pytest.mark.parametrize("kind", ["text", "items"])
def test_sync_create_answers_every_question_kind(client, server, kind):
    decision = client.decisions.create(
        model="jev-latest",
        input=TICKET if kind == "text" else INPUT_ITEMS,
        questions=QUESTIONS,
        safety_identifier="end-user-42",
        prompt_cache_options={"mode": "implicit", "ttl": "30m"},
    )
    assert isinstance(decision, Decision) and decision.model == "smollm2-135m-instruct"
    check_answers(decision)


def test_async_create_answers_every_question_kind(server):
    async def main() -> list[Decision]:
        # Two at once: on a loaded machine admission may answer 529 with Retry-After, which the
        # SDK retries (as it should); the default retries stay on here.
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=4, timeout=120) as c:
            return await asyncio.gather(
                c.decisions.create(model="jev-latest", input=TICKET, questions=QUESTIONS),
                c.decisions.create(model="jev-latest", input=INPUT_ITEMS, questions=QUESTIONS),
            )

    for decision in asyncio.run(main()):
        check_answers(decision)


def test_raw_response_carries_the_openjev_headers(client):
    raw = client.decisions.with_raw_response.create(
        model="jev-latest", input=TICKET, questions=QUESTIONS[:1], extra_headers={"x-openjev-rotations": "2"}
    )
    assert raw.status_code == 200
    assert raw.headers["x-openjev-readout"] == "letters;rotations=2"
    for header in ("x-openjev-calibration", "x-openjev-prefix-tokens", "x-typesafe-request-id", "server-timing"):
        assert raw.headers.get(header), header
    assert raw.parse().answers[0].name == "refund"
    assert raw.headers["x-request-id"] == raw.headers["x-typesafe-request-id"]  # the SDK's _request_id
    assert client.decisions.create(model="jev-latest", input=TICKET, questions=QUESTIONS[:1])._request_id


def test_each_4xx_raises_the_sdks_exception_class(client, server):
    ask = {"model": "jev-latest", "input": TICKET, "questions": QUESTIONS[:1]}
    cases = [
        (openai.BadRequestError, {**ask, "questions": [{"type": "choice", "instructions": "x", "choices": []}]}),
        (openai.BadRequestError, {**ask, "extra_body": {"state": TICKET}}),  # a Jev body
        (
            openai.BadRequestError,
            {
                **ask,
                "input": [
                    {"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}
                ],
            },
        ),
        (openai.BadRequestError, {**ask, "extra_headers": {"x-openjev-readout": "tea-leaves"}}),
        (openai.NotFoundError, {**ask, "model": "gpt-6-luna"}),
    ]
    for exc_class, kwargs in cases:
        with pytest.raises(exc_class) as caught:
            client.decisions.create(**kwargs)
        err = caught.value
        assert err.type == "invalid_request_error" and err.body["message"], err.body
        assert err.response.headers.get("x-typesafe-request-id")
    with pytest.raises(openai.BadRequestError) as caught:
        client.decisions.create(**{**ask, "extra_body": {"state": TICKET}})
    assert "/v1/systemone" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.decisions.create(**{**ask, "questions": [{"type": "predicate", "instructions": 5}]})
    assert caught.value.param == "questions[0].instructions"
    assert caught.value.code is None
    # 401: a wrong key
    with openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError) as caught:
            bad.decisions.create(**ask)
    assert caught.value.type == "authentication_error" and caught.value.status_code == 401
    # 429: a key over its own requests/min, with Retry-After
    with openai.OpenAI(base_url=server.url + "/v1", api_key=LIMITED, max_retries=0) as limited:
        limited.decisions.create(**ask)
        with pytest.raises(openai.RateLimitError) as caught:
            limited.decisions.create(**ask)
    assert caught.value.type == "rate_limit_error" and int(caught.value.response.headers["retry-after"]) >= 1
    # 413: a body over --max-body-bytes, refused before it is read whole
    with pytest.raises(openai.APIStatusError) as caught:
        client.decisions.create(**{**ask, "input": "x" * (2 * 1024 * 1024 + 1)})
    assert caught.value.status_code == 413 and caught.value.body["type"] == "invalid_request_error"


def test_tool_runner_completes_a_run(client):
    done: list[str] = []

    def observe():
        return "The ticket was refunded." if done else [{"type": "input_text", "text": "Ticket #1234 is open."}]

    def candidates(observation):
        close = {"id": "finish", "description": "The task is complete: nothing is left to do", "done": True}
        if done:
            return [close]  # only done is left: the runner selects it without asking
        refund = {
            "id": "refund",
            "description": "Refund the duplicate charge",
            "execute": lambda: done.append("refund"),
        }
        return [refund, close]

    runner = DecisionsToolRunner(observe=observe, candidates=candidates, verify=lambda observation: True)
    result = runner.run(client, {"model": "jev-latest", "input": "Resolve the customer's ticket."}, max_steps=4)
    assert result["status"] == "verified"
    assert 1 <= len(result["decisions"]) <= 2
    first = result["decisions"][0].answers[0]
    assert first.name == "next_action" and first.type == "choice" and first.choice in ("refund", "finish")
    assert result["completed_candidate_ids"] == (["refund"] if first.choice == "refund" else [])
    runner.close()


def test_async_tool_runner_completes_a_run(server):
    waited: list[str] = []

    async def observe():
        return "The queue is empty." if waited else "Two tickets are waiting."

    async def candidates(observation):
        stop = {"id": "stop", "description": "Stop: the queue is empty", "done": True}
        if waited:
            return [stop]

        async def wait() -> None:
            waited.append("wait")

        return [{"id": "wait", "description": "Work on the waiting tickets", "execute": wait}, stop]

    async def main():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=120) as c:
            runner = AsyncDecisionsToolRunner(observe=observe, candidates=candidates)
            return await runner.run(c, {"model": "jev-latest", "input": "Keep the queue empty."}, max_steps=3)

    result = asyncio.run(main())
    assert result["status"] == "unverified"  # no verify callback: done is taken as said
    (decision,) = result["decisions"]  # one call: after "wait", only done is left
    assert decision.answers[0].choice in ("wait", "stop")
    assert result["completed_candidate_ids"] == waited


def test_prompt_cache_key_isolates_cache_reuse(client):
    text = "Order #98765: the parcel arrived crushed and two of the three mugs inside were broken. " * 6

    def cached(key: str) -> int:
        d = client.decisions.create(model="jev-latest", input=text, questions=QUESTIONS[:1], prompt_cache_key=key)
        return d.usage.input_tokens_details.cached_tokens

    first = cached("tenant-a")
    assert first == 0
    assert cached("tenant-a") > 0  # the same key reads the state from the cache
    assert cached("tenant-b") == 0  # another key does not
    assert cached("tenant-a") > 0


@pytest.mark.parametrize("kind", ["choice", "score"])
def test_float32_parity_with_systemone(client, server, kind):
    """The same question on both routes, same input and options: the same probabilities."""
    state = f"Parity check ({kind}): the customer writes that the app crashes every time they pay."
    if kind == "choice":
        jev_q = {
            "type": "choice",
            "instructions": "Which team?",
            "criteria": {"billing": "Payments", "technical": None},
        }
        oa_q = {
            "type": "choice",
            "instructions": "Which team?",
            "choices": [{"value": "billing", "description": "Payments"}, {"value": "technical"}],
        }
    else:
        # two levels under the default abstain rule: never declined (see QUESTIONS)
        jev_q = {"type": "score", "instructions": "How upset?", "criteria": ["Calm", "Furious"]}
        oa_q = {
            "type": "score",
            "instructions": "How upset?",
            "levels": [{"label": x} for x in ("Calm", "Furious")],
        }
    headers = {"Authorization": f"Bearer {KEY}"}
    jev = httpx.post(
        server.url + "/v1/systemone",
        json={"model": "jev-latest", "state": state, "questions": {"q": jev_q}},
        headers=headers,
        timeout=120,
    )
    assert jev.status_code == 200, jev.text
    expected = list(jev.json()["answers"]["q"]["probabilities"].values())
    decision = client.decisions.create(model="jev-latest", input=state, questions=[oa_q])
    got = [p.probability for p in decision.answers[0].probabilities]
    worst = max(abs(a - b) for a, b in zip(expected, got, strict=True))
    print(f"parity {kind}: max |p_systemone - p_decisions| = {worst:.3g}")
    assert worst <= 1e-5, (expected, got)


def test_refusals_follow_the_cores_abstain_rule(client, server):
    """The server's default rule (GET /v1/limits) declines a question exactly where the same
    request on /v1/systemone marks its answer `x_abstain`, and where the reading's order
    agreement is below the floor; the other questions of the request are answered. The
    order-agreement floor needs several orders read: both requests ask for 4 rotations (the
    default readout, canonical, reads one order, so that floor declines nothing there)."""
    rotations = {"x-openjev-readout": "letters", "x-openjev-rotations": "4"}
    headers = {"Authorization": f"Bearer {KEY}", **rotations}
    rule = httpx.get(server.url + "/v1/limits", headers=headers, timeout=30).json()["abstain"]
    teams = ["billing", "technical", "shipping", "account", "sales"]
    jev_qs = {
        f"q{i}": {"type": "choice", "instructions": text, "criteria": dict.fromkeys(teams)}
        for i, text in enumerate(["Which team should handle this?", "Which team caused this?", "Who replies?"])
    }
    state = "My parcel never arrived and the app crashes when I try to track it. I paid twice."
    jev = httpx.post(
        server.url + "/v1/systemone",
        json={"model": "jev-latest", "state": state, "questions": jev_qs},
        headers=headers,
        timeout=120,
    ).json()["answers"]
    oa_qs = [
        {"type": "choice", "name": qid, "instructions": q["instructions"], "choices": [{"value": t} for t in teams]}
        for qid, q in jev_qs.items()
    ]
    decision = client.decisions.create(model="jev-latest", input=state, questions=oa_qs, extra_headers=rotations)
    refused = 0
    for answer in decision.answers:
        marked = jev[answer.name]
        below = marked["x_order_agreement"] < rule["min_order_agreement"] or (
            marked["x_label_mass"] < rule["min_label_mass"]
        )
        assert (answer.type == "refusal") == marked.get("x_abstain", False) == below, (answer, marked)
        refused += answer.type == "refusal"
    print(f"refusals: {refused} of {len(oa_qs)} under {rule}")
    # under the default readout every question is read in one order: nothing to disagree
    default = client.decisions.create(model="jev-latest", input=state, questions=oa_qs)
    assert [a.type for a in default.answers] == ["choice"] * len(oa_qs)


def test_langchain_openai_decisions_runnable(server):
    """langchain-openai's OpenAIDecisions (a LangChain runnable over the same SDK) against the
    route: its questions by name come back typed, sync and async, for text and chat input."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai.decisions import Choice, Level, OpenAIDecisions, Predicate, Score

    decisions = OpenAIDecisions(model="jev-latest", api_key=KEY, base_url=server.url + "/v1", max_retries=0)
    questions = {
        "refund": Predicate(instructions="The customer asks for a refund."),
        # two choices: never declined by the default abstain rule (see test_refusals_follow_the_cores_abstain_rule)
        "happy": Choice(instructions="Is the customer happy?", choices={True: None, "true": "says so"}),
        "team": Choice(instructions="Which team?", choices={"billing": None, "technical": None, "shipping": None}),
        "urgency": Score(
            instructions="How urgent is this?", levels=["Routine", Level(label="Urgent", description="today")]
        ),
    }
    chat = [HumanMessage(TICKET), AIMessage("Let me check."), HumanMessage("Please hurry.")]
    for state in (TICKET, chat):
        response = decisions.invoke({"input": state, "questions": questions})
        assert 0.0 <= response.predicates["refund"].probability <= 1.0
        happy = response.choices["happy"]
        assert list(happy.probabilities) == [True, "true"] and happy.choice in happy.probabilities
        assert response.scores["urgency"].legend == {0: "Routine", 1: "Urgent"}
        assert ("team" in response.choices) != ("team" in response.refusals)  # answered or declined, typed either way
    response = asyncio.run(decisions.ainvoke({"input": TICKET, "questions": questions}))
    assert set(response.choices) - {"team"} == {"happy"} and set(response.scores) == {"urgency"}
