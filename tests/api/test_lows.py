"""The lows of issue 48 (item 6), each on every decision route where it concerns one."""

from __future__ import annotations

import pytest

from tests.api.conftest import running_app
from tests.api.test_every_route import EVERY, IDS


@pytest.mark.parametrize("keys", [("key-a", "key-b"), ()], ids=["keys", "no-keys"])
@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_two_authorization_headers_are_a_400(route, keys):
    """The first used to win: a proxy that adds its own header, or a client that sends two,
    would be served as whichever came first."""
    async with running_app(api_keys=keys) as (client, engine):
        headers = [("authorization", "Bearer key-a"), ("authorization", "Bearer key-b"), ("accept", "application/json")]
        r = await client.post(route.path, json=route.body("7 7"), headers=headers)
        assert r.status_code == 400, r.text
        assert "more than one Authorization header" in r.text
        assert engine.plans == []
        one = {"Authorization": "Bearer key-a"} if keys else {}
        status, error, _ = await route.post(client, route.body("7 7"), one)
        assert status == 200, error


def _choice(route, criteria: dict[str, str | None], qids: tuple[str, ...] = ("q",)):
    """`route`'s body asking a choice question (each of `qids`) with `criteria` (name -> what the model reads)."""
    if route.openai:
        choices = [{"value": k, **({"description": v} if v is not None else {})} for k, v in criteria.items()]
        qs = [{"type": "choice", "name": q, "instructions": "Which?", "choices": choices} for q in qids]
        return {"model": "jev-latest", "input": "7 7", "questions": qs}
    one = {
        "model": "jev-latest",
        "state": "7 7",
        "questions": {q: {"type": "choice", "instructions": "Which?", "criteria": criteria} for q in qids},
    }
    return {"requests": [one]} if route.batch else one


TIES = {
    # the issue's: accepted on /v1/systemone, the answer picked by position
    "same-descriptions": ({"a": "yes", "b": "yes"}, "read the same to the model"),
    "zero-width-space-in-a-description": ({"a": "yes", "b": "ye\u200bs"}, "read the same to the model"),
    "compatibility-form": ({"a": "\uff59es", "b": "yes"}, "read the same to the model"),  # fullwidth y
    "names-differ-by-a-zero-width-space": ({"billing": None, "bil\u200bling": None}, "same once normalized"),
}


@pytest.mark.parametrize("tie", list(TIES), ids=list(TIES))
@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_options_that_read_the_same_are_refused_by_one_rule_on_every_route(route, tie):
    criteria, why = TIES[tie]
    async with running_app() as (client, engine):
        status, error, _ = await route.post(client, _choice(route, criteria))
        assert status == route.invalid, error
        text = str(error)
        alternatives = (why, "appears more than once")  # OpenAI's values are its names
        assert any(w in text for w in alternatives), text
        assert engine.plans == []
        status, error, _ = await route.post(client, _choice(route, {"a": "yes", "b": "no"}))
        assert status == 200, error


@pytest.mark.parametrize("route", EVERY, ids=IDS)
async def test_question_ids_or_names_that_differ_by_an_invisible_character_are_refused(route):
    async with running_app() as (client, engine):
        status, error, _ = await route.post(client, _choice(route, {"a": "yes", "b": "no"}, ("refund", "ref\u200bund")))
        assert status == route.invalid, error
        assert "same once normalized" in str(error) or "the same name twice" in str(error), error
        assert engine.plans == []


async def test_two_questions_with_the_same_name_on_v1_decisions_are_a_400():
    async with running_app() as (client, engine):
        q = {"type": "predicate", "name": "refund", "instructions": "Refund?"}
        r = await client.post("/v1/decisions", json={"model": "jev-latest", "input": "x", "questions": [q, q]})
        assert r.status_code == 400 and "the same name twice" in r.text, r.text
        assert engine.plans == []


async def test_the_playground_and_the_docs_send_security_headers_that_allow_what_they_use():
    import base64
    import hashlib
    import re

    async with running_app() as (client, _):
        for path in ("/", "/playground"):
            r = await client.get(path)
            assert r.status_code == 200
            assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
            (script,) = re.findall(r"<script>(.*?)</script>", r.text, re.S)  # its one inline script, allowed by hash
            digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
            assert f"script-src 'sha256-{digest}'" in csp, csp
            assert "unsafe-inline" not in csp.split("script-src", 1)[1].split(";", 1)[0]
        for path in ("/docs", "/redoc"):
            r = await client.get(path)
            assert r.status_code == 200, path
            assert (
                r.headers["x-frame-options"] == "DENY"
                and "frame-ancestors 'none'" in r.headers["content-security-policy"]
            )
            assert '<script src="http' not in r.text  # assets from this server, which the policy allows
        r = await client.get("/health")
        assert r.headers["x-content-type-options"] == "nosniff" and "content-security-policy" not in r.headers


async def test_a_keys_requests_in_progress_are_bounded_by_the_per_client_setting():
    """Issue 48, item 5, per key: a key's requests in progress (from many addresses) are
    bounded as one address's connections are (--max-connections-per-client): the third of a
    key with a bound of 2 is a 429 at once, another key is served meanwhile."""
    import asyncio

    from tests.support.fakes import FakeEngine

    engine = FakeEngine(delay_s=0.5)
    async with running_app(engine, api_keys=("key-a", "key-b"), max_connections_per_client=2) as (client, _):
        route = EVERY[0]
        a, b = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}
        slow = [asyncio.create_task(route.post(client, route.body("7 7"), a)) for _ in range(2)]
        await asyncio.sleep(0.2)  # both in progress, waiting on the engine
        status, error, r = await route.post(client, route.body("7 7"), a)
        assert status == 429 and "requests in progress" in str(error), error
        assert r.headers["retry-after"] == "1"
        status, error, _ = await route.post(client, route.body("7 7"), b)
        assert status == 200, error
        assert [s for s, _, _ in await asyncio.gather(*slow)] == [200, 200]
        status, error, _ = await route.post(client, route.body("7 7"), a)  # done: room again
        assert status == 200, error
