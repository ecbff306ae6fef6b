"""Operations, in-process with a FakeEngine: keys before the body, per-key buckets, token
admission, metrics, logs without request text, the drain."""

import asyncio
import hashlib
import io
import json
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families

from openjev.api.identity.buckets import TokenBucket
from openjev.api.identity.keys import KeyRing, parse_keys_file
from openjev.api.operations.logs import JsonFormatter, TextFormatter
from openjev.errors import ConfigError, EngineError
from tests.api.conftest import running_app
from tests.api.test_systemone import VALID
from tests.support.fakes import FakeEngine

SECRET = "Zanzibar-7f3e-private-customer-text"


def _auth(key):
    return {"Authorization": f"Bearer {key}"}


class Captured:
    """Every log record of the test, formatted as the server would (json or text)."""

    def __init__(self, formatter):
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)

    def __enter__(self):
        root = logging.getLogger()
        self.level = root.level
        root.addHandler(self.handler)
        root.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeHandler(self.handler)
        logging.getLogger().setLevel(self.level)

    @property
    def text(self):
        return self.stream.getvalue()

    def json_lines(self):
        # one JSON object per line (a traceback lives inside its object, escaped)
        return [json.loads(line) for line in self.text.splitlines()]

    def access(self):
        return [r for r in self.json_lines() if r["logger"] == "openjev.access"]


# ---- keys


def test_keys_file_forms_and_options():
    digest = hashlib.sha256(b"bob-key").hexdigest()
    entries = parse_keys_file(f"""
        # a comment, then a blank line

        alice:alice-key
        bob:sha256:{digest}  requests_per_min=5 tokens_per_min=900
    """)
    assert [(e.name, e.requests_per_min, e.tokens_per_min) for e in entries] == [("alice", None, None), ("bob", 5, 900)]
    for bad in ("nocolon", "a:", "bad name:k", "a:sha256:1234", "a:k speed=3", "a:k\na:j"):
        with pytest.raises(ConfigError) as e:
            parse_keys_file(bad)
        assert "line" in str(e.value)


def test_the_documented_keys_file_example_parses():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    block = page[page.index("# name:key, or name:sha256") :]
    block = block[: block.index("```")]
    entries = parse_keys_file(block)
    assert [e.name for e in entries] == ["alice", "batch-jobs"]
    assert entries[0].requests_per_min == 120 and entries[0].tokens_per_min == 600000
    assert entries[1].digest == hashlib.sha256(b"batch-secret").digest()


def test_keyring_identifies_reloads_and_keeps_old_keys_on_a_broken_file(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:a-key\n")
    ring = KeyRing(("flag-key",), str(path))
    assert ring.identify("a-key").name == "alice"
    assert ring.identify("flag-key").name == "key1"
    assert ring.identify("a-ke") is None and ring.identify("") is None
    path.write_text("carol:c-key\n")
    assert ring.reload()
    assert ring.identify("a-key") is None and ring.identify("c-key").name == "carol"
    path.write_text("broken line\n")
    assert not ring.reload()
    assert ring.identify("c-key").name == "carol"


def test_token_bucket_refills_and_allows_debt_for_large_costs():
    now = [0.0]
    bucket = TokenBucket(60, clock=lambda: now[0])  # 1 per second, burst 60
    assert bucket.wait_s(60) == 0
    assert bucket.wait_s(1) == pytest.approx(1.0)
    now[0] += 2
    assert bucket.wait_s(1) == 0
    now[0] += 100
    assert bucket.wait_s(500) == 0  # above the capacity: passes when full, leaves a debt
    assert bucket.wait_s(1) == pytest.approx(441.0)


async def test_unauthenticated_request_is_401_before_the_body_is_read_or_parsed():
    async with running_app(api_keys=("k1",), max_body_bytes=100) as (client, engine):
        bad_json = await client.post(
            "/v1/systemone", content=b"{not json", headers={"content-type": "application/json"}
        )
        too_big = await client.post("/v1/systemone", content=b"x" * 1000)
        for r in (bad_json, too_big):
            assert r.status_code == 401, r.text
            assert r.json()["detail"]["error_type"] == "authentication_error"
            assert r.headers["x-typesafe-request-id"]
        ok_key_bad_json = await client.post(
            "/v1/systemone", content=b"{not json", headers={**_auth("k1"), "content-type": "application/json"}
        )
        assert ok_key_bad_json.status_code == 422
        assert engine.plans == []


async def test_named_keys_from_a_file_work_beside_flag_keys(tmp_path):
    path = tmp_path / "keys"
    path.write_text(f"alice:sha256:{hashlib.sha256(b'alice-secret').hexdigest()}\n")
    async with running_app(api_keys=("flag-key",), api_keys_file=str(path)) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID, headers=_auth("alice-secret"))).status_code == 200
        assert (await client.post("/v1/systemone", json=VALID, headers=_auth("flag-key"))).status_code == 200
        r = await client.post("/v1/systemone", json=VALID, headers=_auth("sha256:" + "0" * 64))
        assert r.status_code == 401


@pytest.mark.usefixtures("limits_store")
async def test_per_key_requests_per_minute_is_429_for_that_key_only(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:a-key requests_per_min=2\nbob:b-key\n")
    async with running_app(api_keys_file=str(path), key_requests_per_min=100) as (client, engine):
        codes = [(await client.post("/v1/systemone", json=VALID, headers=_auth("a-key"))).status_code for _ in range(2)]
        limited = await client.post("/v1/systemone", json=VALID, headers=_auth("a-key"))
        assert codes == [200, 200]
        assert limited.status_code == 429
        assert limited.json()["detail"]["error_type"] == "rate_limit_error"
        assert 1 <= int(limited.headers["retry-after"]) <= 30
        assert len(engine.plans) == 2
        assert (await client.post("/v1/systemone", json=VALID, headers=_auth("b-key"))).status_code == 200


@pytest.mark.usefixtures("limits_store")
async def test_per_key_tokens_per_minute_is_429_after_compile_before_the_engine():
    async with running_app(api_keys=("k1",), key_tokens_per_min=60) as (client, engine):
        first = await client.post("/v1/systemone", json=VALID, headers=_auth("k1"))
        assert first.status_code == 200 and first.json()["usage"]["input_tokens"] > 60  # debt: passes when full
        second = await client.post("/v1/systemone", json=VALID, headers=_auth("k1"))
        assert second.status_code == 429 and second.json()["detail"]["error_type"] == "rate_limit_error"
        assert int(second.headers["retry-after"]) >= 1
        assert len(engine.plans) == 1


# ---- token admission


async def test_tokens_in_flight_bound_is_529_with_retry_after_and_a_lone_request_always_passes():
    engine = FakeEngine(delay_s=0.3)
    async with running_app(engine, max_tokens_in_flight=10) as (client, _):
        # VALID alone is far above 10 tokens: admitted since nothing else is in flight
        results = await asyncio.gather(*(client.post("/v1/systemone", json=VALID) for _ in range(3)))
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 529, 529]
        for r in results:
            if r.status_code == 529:
                assert r.json()["detail"]["error_type"] == "rate_limit_error"
                assert int(r.headers["retry-after"]) >= 1
        assert len(engine.plans) == 1


def test_drain_rate_counts_busy_time_only():
    from openjev.api.identity.admission import DrainRate

    now = [0.0]
    rate = DrainRate(clock=lambda: now[0])
    assert rate.per_second() is None
    rate.started()
    now[0] = 1.0
    rate.finished(100)
    now[0] = 31.0  # idle: not counted
    rate.started()
    rate.started()
    now[0] = 32.0
    rate.finished(100)
    now[0] = 33.0
    rate.finished(200)
    assert rate.per_second() == pytest.approx(400 / 3)
    now[0] = 200.0  # all out of the window: the last measurement stands (issue 16, finding 7)
    assert rate.per_second() == pytest.approx(400 / 3)
    rate.started()
    now[0] = 260.0
    rate.finished(0)  # a failure (or a 504) served nothing: no measurement, not a rate of 0
    assert rate.per_second() == pytest.approx(400 / 3)
    rate.started()
    now[0] = 262.0
    rate.finished(100)  # a new measurement replaces the remembered one
    assert rate.per_second() == pytest.approx(50)
    now[0] = 299.0
    rate.started()
    now[0] = 300.0
    rate.finished(300)
    assert rate.per_second() == pytest.approx(400 / 3)  # both in the window
    now[0] = 323.0  # the one at 262 leaves the 60 s window, the one at 300 stays
    assert rate.per_second() == pytest.approx(300)


async def test_work_the_engine_could_not_reach_in_time_is_529_not_a_later_504():
    engine = FakeEngine(delay_s=0.3)
    async with running_app(engine, max_queue_wait_s=0.45) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200  # measures the rate
        results = await asyncio.gather(*(client.post("/v1/systemone", json=VALID) for _ in range(3)))
        assert sorted(r.status_code for r in results) == [200, 529, 529]
        assert all(int(r.headers["retry-after"]) >= 1 for r in results if r.status_code == 529)


def _ops(client):
    return client._transport.app.state.ops  # the app behind running_app's in-process client


def _later(rate, seconds: float) -> None:
    """Move the drain-rate clock `seconds` on (a quiet spell, without waiting for it)."""
    clock = rate._clock
    rate._clock = lambda: clock() + seconds


@pytest.mark.parametrize("after", ["idle", "failures"])
async def test_the_drain_rate_survives_idle_time_and_failures_so_overload_is_529(after):
    engine = FakeEngine(delay_s=0.3)
    async with running_app(engine, max_queue_wait_s=0.45) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200  # measures the rate
        rate = _ops(client).gate.rate
        _later(rate, 120.0)  # two quiet minutes: the measurement left the window
        if after == "failures":
            engine.fail = EngineError("the engine broke")
            assert (await client.post("/v1/systemone", json=VALID)).status_code == 502
            engine.fail = None
        assert rate.per_second() is not None
        calls = len(engine.plans)
        results = await asyncio.gather(*(client.post("/v1/systemone", json=VALID) for _ in range(3)))
        assert sorted(r.status_code for r in results) == [200, 529, 529]  # not three admitted toward 504s
        for r in results:
            if r.status_code == 529:
                assert int(r.headers["retry-after"]) >= 1
                assert "queue is too long" in r.json()["detail"]["message"]
        assert len(engine.plans) == calls + 1  # the refused ones never reached the engine
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 200  # the next is answered


async def test_evaluation_cap_still_applies():
    engine = FakeEngine(delay_s=0.3)
    async with running_app(engine, max_in_flight=1) as (client, _):
        codes = sorted(
            r.status_code for r in await asyncio.gather(*(client.post("/v1/systemone", json=VALID) for _ in range(2)))
        )
        assert codes == [200, 529]


# ---- metrics


def _families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families, name, **labels):
    for family in families.values():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def test_metrics_parse_with_prometheus_parser_and_move_when_requests_are_served():
    async with running_app(api_keys=("k1",)) as (client, _):
        before = _families((await client.get("/metrics")).text)
        assert _value(before, "openjev_requests_total", route="/v1/systemone", status="200") is None
        for _ in range(2):
            assert (await client.post("/v1/systemone", json=VALID, headers=_auth("k1"))).status_code == 200
        assert (await client.post("/v1/systemone", json={"model": "jev"}, headers=_auth("k1"))).status_code == 422
        r = await client.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        after = _families(r.text)
        assert _value(after, "openjev_requests_total", route="/v1/systemone", status="200", key="key1") == 2
        assert _value(after, "openjev_rejections_total", status="422", error_type="validation_error") == 1
        assert _value(after, "openjev_tokens_total", kind="distinct") > 0
        assert _value(after, "openjev_answers_total", type="choice") == 2
        assert _value(after, "openjev_label_mass_count", type="score") == 2
        assert _value(after, "openjev_phase_seconds_count", phase="total") == 3
        assert _value(after, "openjev_phase_seconds_count", phase="prepare") == 2
        assert _value(after, "openjev_engine_calls_total") == 2
        assert _value(after, "openjev_evaluations_in_flight") == 0
        assert _value(after, "openjev_ready") == 1
        assert _value(after, "process_resident_memory_bytes") > 0


async def test_engine_failures_are_counted_by_error_type():
    from openjev.errors import EngineUnavailable

    async with running_app(FakeEngine(fail=EngineUnavailable("down"))) as (client, _):
        assert (await client.post("/v1/systemone", json=VALID)).status_code == 503
        families = _families((await client.get("/metrics")).text)
        assert _value(families, "openjev_engine_failures_total", error_type="unknown") == 1


# ---- logs


async def test_json_access_lines_parse_and_carry_the_request_fields():
    with Captured(JsonFormatter()) as logs:
        async with running_app(api_keys=("k1",)) as (client, _):
            r = await client.post("/v1/systemone", json=VALID, headers=_auth("k1"))
    line = [a for a in logs.access() if a["route"] == "/v1/systemone"][-1]
    assert line["request_id"] == r.headers["x-typesafe-request-id"]
    assert line["key"] == "key1" and line["status"] == 200 and line["level"] == "info"
    assert line["tokens_distinct"] == r.json()["usage"]["input_tokens"]
    assert line["tokens_computed"] == r.json()["usage"]["x_computed_tokens"]
    assert line["tokens_cached"] == 0
    assert {"prepare", "engine"} <= set(line["timings_ms"])
    assert "k1" not in logs.text.replace('"key1"', "")  # the key's name, never the key


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
async def test_failing_requests_log_no_request_text(formatter):
    secret_state = {**VALID, "state": SECRET}
    with Captured(formatter) as logs:
        async with running_app(
            FakeEngine(fail=ValueError(f"engine saw {SECRET}")), max_branch_tokens=10**6, max_body_bytes=4096
        ) as (client, _):
            bad = {"model": "jev", "state": SECRET, "questions": {"q": {"type": "choice", "criteria": {SECRET: 1}}}}
            assert (await client.post("/v1/systemone", json=bad)).status_code == 422
            assert (
                await client.post(
                    "/v1/systemone", content=SECRET.encode() * 2, headers={"content-type": "application/json"}
                )
            ).status_code == 422
            assert (await client.post("/v1/systemone", json={**VALID, "state": SECRET * 200})).status_code == 413
            unexpected = await client.post("/v1/systemone", json=secret_state)
            assert unexpected.status_code == 500
            assert unexpected.json()["detail"]["error_type"] == "unknown"
            assert unexpected.headers["x-typesafe-request-id"]
    assert SECRET not in logs.text
    assert "ValueError" in logs.text  # the failure is logged, as its type


async def test_request_bodies_flag_lets_error_text_into_logs():
    with Captured(JsonFormatter(with_messages=True)) as logs:
        async with running_app(FakeEngine(fail=ValueError(f"engine saw {SECRET}")), log_request_bodies=True) as (
            client,
            _,
        ):
            await client.post("/v1/systemone", json={**VALID, "state": SECRET})
    assert SECRET in logs.text


# ---- drain


async def test_drain_turns_health_503_refuses_new_decisions_and_lets_in_flight_ones_finish():
    engine = FakeEngine(delay_s=0.5)
    async with running_app(engine) as (client, _):
        app_ops = client._transport.app.state.ops
        slow = asyncio.create_task(client.post("/v1/systemone", json=VALID))
        await asyncio.sleep(0.1)
        done = asyncio.Event()
        app_ops.drain.begin(done.set)
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        assert (await client.get("/health/live")).status_code == 200
        new = await client.post("/v1/systemone", json=VALID)
        assert new.status_code == 503 and new.headers["retry-after"] and new.headers["x-typesafe-request-id"]
        assert not done.is_set()
        assert (await slow).status_code == 200
        await asyncio.wait_for(done.wait(), 2)


async def test_drain_timeout_answers_what_still_runs_with_json_503():
    engine = FakeEngine(delay_s=5)
    async with running_app(engine, drain_timeout_s=0.3) as (client, _):
        app_ops = client._transport.app.state.ops
        slow = asyncio.create_task(client.post("/v1/systemone", json=VALID))
        await asyncio.sleep(0.1)
        done = asyncio.Event()
        app_ops.drain.begin(done.set)
        r = await asyncio.wait_for(slow, 3)
        assert r.status_code == 503 and r.json()["detail"]["error_type"] == "unknown"
        assert r.headers["x-typesafe-request-id"]
        await asyncio.wait_for(done.wait(), 2)
        assert engine.cancelled == 1


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("alice:a-key tokens_per_min=0\n", "tokens_per_min must be a whole number of at least 1"),
        ("alice:a-key requests_per_min=0\n", "requests_per_min must be a whole number of at least 1"),
        ("alice:a-key tokens_per_min=\u00b2\n", "tokens_per_min must be a whole number"),  # '²': str.isdigit() says yes
        ("alice:a-key tokens_per_min=\u0663\n", "tokens_per_min must be a whole number"),  # an Arabic-Indic 3
        ("alice:a-key tokens_per_min=5 tokens_per_min=9\n", "option 'tokens_per_min' given twice"),
        ("alice:a-key cache_group=a cache_group=b\n", "option 'cache_group' given twice"),
        ("alice:same-secret\nbob:same-secret\n", "key 'bob' has the same secret as 'alice'"),
    ],
)
def test_keys_file_rules_of_issue_48_name_the_line(text, why):
    """0 is refused (it meant 'unlimited' even where the server's default is a limit: leave
    the option out for the default); a repeated option, a secret shared by two names and a
    non-ASCII digit are errors naming the line, never the last one silently winning."""
    with pytest.raises(ConfigError) as e:
        parse_keys_file("# keys\n" + text)
    line = "line 3" if "\nbob:" in text else "line 2"
    assert why in str(e.value) and line in str(e.value), e.value
    assert "same-secret" not in str(e.value)  # never the key


def test_a_file_key_with_a_flag_keys_secret_is_refused(tmp_path):
    path = tmp_path / "keys"
    path.write_text("alice:flag-key\n")
    with pytest.raises(ConfigError, match="have the secret of an --api-key key"):
        KeyRing(("flag-key",), str(path))


def test_serve_exits_2_naming_the_line_of_a_malformed_keys_file(tmp_path):
    import os
    import subprocess
    import sys

    from tests.support.models import EMBEDDED_FLAGS

    path = tmp_path / "keys"
    path.write_text("alice:a-key\nbob:b-key tokens_per_min=\u00b2\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENJEV_")}
    run = subprocess.run(
        [sys.executable, "-m", "openjev", "serve", *EMBEDDED_FLAGS, "--api-keys-file", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "line 2" in run.stderr and "Traceback" not in run.stderr, run.stderr[-2000:]
