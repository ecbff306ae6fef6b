"""OpenAI's conventions where its clients read them, through the real `openai` SDK on the
app in-process (httpx's ASGI transport, the FakeEngine at the engine seam): the request id
as `x-request-id` (the SDK's `_request_id`, on answers and on errors), and the calling key's
limits as `x-ratelimit-*` headers where the key has limits. (tests/integration/test_openai_sdk.py
runs the SDK against a real server and the embedded model.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from openjev.api.server.conventions import duration
from tests.api.conftest import running_app
from tests.api.test_openai_decisions import VALID

ASK = {k: VALID[k] for k in ("model", "input", "questions")}


def _sdk(client: httpx.AsyncClient, key: str = "key-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://localhost/v1", api_key=key, max_retries=0, http_client=client)


async def test_the_sdk_sees_the_request_id_on_answers_and_errors():
    async with running_app(api_keys=("key-a",)) as (client, _):
        sdk = _sdk(client)
        decision = await sdk.decisions.create(**ASK)
        assert decision._request_id and decision._request_id.startswith("req_")
        raw = await sdk.decisions.with_raw_response.create(**ASK)
        assert raw.headers["x-request-id"] == raw.headers["x-typesafe-request-id"]
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.decisions.create(**{**ASK, "model": "gpt-6-luna"})
        assert caught.value.request_id and caught.value.request_id.startswith("req_")
        assert "x-ratelimit-limit-requests" not in raw.headers  # no limits: no headers
        r = await client.post("/v1/systemone", json={}, headers={"Authorization": "Bearer key-a"})
        assert "x-request-id" not in r.headers  # Jev's clients read x-typesafe-request-id


@pytest.mark.usefixtures("limits_store")
async def test_a_limited_key_sees_what_it_has_left():
    async with running_app(api_keys=("key-a",), key_requests_per_min=5, key_tokens_per_min=100_000) as (client, _):
        sdk = _sdk(client)
        first = await sdk.decisions.with_raw_response.create(**ASK)
        second = await sdk.decisions.with_raw_response.create(**ASK)
        for raw in (first, second):
            assert raw.headers["x-ratelimit-limit-requests"] == "5"
            assert raw.headers["x-ratelimit-limit-tokens"] == "100000"
            assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
        assert int(first.headers["x-ratelimit-remaining-requests"]) == 4
        assert int(second.headers["x-ratelimit-remaining-requests"]) == 3
        assert int(second.headers["x-ratelimit-remaining-tokens"]) < 100_000  # its tokens were taken
        with pytest.raises(openai.BadRequestError):  # refused, but its 60,000 tokens were read: charged
            await sdk.decisions.create(**{**ASK, "input": "seven " * 60_000})
        # the same 360 KB body again: the door reserves 90,000 tokens for it (a quarter of its
        # bytes), more than the key has left: a 429 before it is read (issue 48, item 4)
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.decisions.create(**{**ASK, "input": "seven " * 60_000})
        assert "reserved at the door" in str(caught.value)
        assert int(caught.value.response.headers["x-ratelimit-remaining-tokens"]) < 40_000
        assert caught.value.response.headers["retry-after"]


def test_reset_durations_read_as_openai_writes_them():
    assert [duration(s) for s in (0.25, 1.0, 12.4, 90.0, 0.0)] == ["250ms", "1s", "12s", "1m30s", "0ms"]
