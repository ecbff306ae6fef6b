"""Issue 28, item 7, with the embedded model: twelve identical concurrent requests on a new
state compute it once (the engine's computed-token counts), and answer as one alone does.
On main each computed all of it: 12 x the whole plan."""

from __future__ import annotations

import asyncio

import pytest

from openjev.core.prompts import PromptCompiler
from openjev.core.readouts import LettersReadout
from openjev.core.types import DecisionRequest, NoulQuestion, State, Turn

pytestmark = pytest.mark.model

STATE = (
    "Hello, I ordered a blue kettle (order 5521) three weeks ago. The tracking page has said "
    "'label created' ever since, and your chat bot keeps telling me to wait. Meanwhile my card "
    "was charged twice for the same order, once on the 3rd and once on the 5th. I would like "
    "the duplicate charge refunded and either the kettle shipped this week or the order "
    "cancelled with a full refund. I have been a customer for six years and this is the first "
    "time anything like this has happened, so I hope you can sort it out quickly. "
) * 2


def test_twelve_identical_cold_requests_compute_their_state_once(embedded):
    compiler = PromptCompiler(embedded.tokenizer, max_labels=26)
    request = DecisionRequest(
        State((Turn("user", STATE),)),
        (("refund", NoulQuestion("Does the customer ask for a refund?")), ("late", NoulQuestion("Is it late?"))),
        cache_namespace="joins-test",
    )
    plan = compiler.compile(request, LettersReadout(compiler.labels.texts, compiler.labels.ids)).plan
    state_tokens = plan.shared_prefix_len
    own = plan.unique_tokens - state_tokens

    async def twelve():
        return await asyncio.gather(*(embedded.engine.run(plan) for _ in range(12)))

    results = asyncio.run(twelve())
    computed = sum(r.computed_tokens for r in results)
    print(f"state {state_tokens} tokens, own {own}: computed {computed} for 12 (alone {plan.unique_tokens})")
    assert state_tokens > 200
    # the state once; the others their own part (the packed root may end a little before
    # the trie's shared prefix: a few tokens each at most)
    assert computed <= plan.unique_tokens + 11 * (own + 8), computed  # main: 12 x unique_tokens
    followers = sorted(r.cached_tokens for r in results)[1:]
    assert all(c >= state_tokens - 8 for c in followers), followers  # the followers: the state from the cache
    first = results[0].branches
    for r in results[1:]:
        for a, b in zip(first, r.branches, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
