"""Engine faults against a real SGLang-protocol server (SGLang-JAX or SGLang 0.5.23 on PyTorch:
tests/sglang/server.py KINDS, whichever are asked for) behind a real `openjev serve --connect`.

The server is stopped (SIGSTOP: it accepts connections and never answers), killed (SIGKILL
of its whole process group, mid-request) and started again on the same port; openjev is
never restarted. What a client sees is asserted, with bounds on how long each answer took:

- stalled: every request is answered 504 at the deadline (--engine-timeout-s), none later,
  /health says the engine does not answer, and after SIGCONT both recover;
- killed mid-request: every in-flight request is answered with a retryable 503 within
  seconds, new requests too, and /health says the engine is unreachable;
- back on the same port: openjev uses it again (200), /health is 200;
- and first, a client that leaves mid-request: every branch of its call is aborted on the
  server (one /abort_request per branch rid); then one that leaves a call it shares with
  another request (--coalesce-calls 1): its branches only are aborted, the other is answered.

openjev runs `--strategy all` here, so that each request's branches are one batched call
where the server takes them (SGLang 0.5.23): the faults hit batched calls.

The tests run in file order and share one server and one openjev (their states depend on
each other; that is the scenario). The server is the one the rest of tests/sglang uses
(tests/sglang/conftest.py), so these run after the others of its kind. `make test-sglang` and `make test-sglang-torch` run them with
the rest of tests/sglang.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from tests.sglang import server as sgl

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not sgl.enabled_kinds(), reason="the real SGLang suites run with `make test-sglang` / `make test-sglang-torch`"
    ),
]

from tests.integration.conftest import start_server, stop_server  # noqa: E402
from tests.sglang.conftest import SIZING  # noqa: E402
from tests.support.tickets import TEXT  # noqa: E402

DEADLINE_S = 10.0  # openjev's --engine-timeout-s: a stalled engine is answered 504 after this
MARGIN_S = 3.0  # what an answer may take beyond the deadline (or beyond a kill)
RETRYABLE = {502, 503, 504}
# How many times the ticket text the states in flight at the kill repeat (~800 tokens, under the
# 1,024-token context): enough prefill that they are still running 1.5 s in. Not less for
# SGLang-JAX: its server ran the rest of tests/sglang first (and the JIT cache persists across
# runs), so the shapes of shorter states are compiled already and no compile time pads them.
IN_FLIGHT_REPEAT = {"jax": 14, "torch": 14}


@dataclass
class Answer:
    status: int
    seconds: float  # from sending the request to its answer
    done_at: float  # time.monotonic() of the answer
    headers: dict
    body: str


QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "late": {"type": "noul", "instructions": "Is the order late?"},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
}


def ask(url: str, n: int, timeout_s: float = 120.0, repeat: int = 1, questions: int = 3) -> Answer:
    """`questions` noul questions on a state of its own (`n`; `repeat` times the ticket
    text), each read once: one branch each, sent in one batched call where the server
    takes them."""
    body = {
        "state": TEXT.format(n=n) * repeat,
        "questions": dict(list(QUESTIONS.items())[:questions]),
    }
    t0 = time.monotonic()
    try:
        r = httpx.post(
            url + "/v1/systemone",
            json=body,
            headers={"x-openjev-rotations": "1", "x-openjev-calibration": "none"},
            timeout=timeout_s,
        )
    except httpx.TimeoutException:  # the failure this suite exists to catch: a hung request
        return Answer(0, time.monotonic() - t0, time.monotonic(), {}, "no answer (client timeout)")
    t1 = time.monotonic()
    return Answer(r.status_code, t1 - t0, t1, dict(r.headers), r.text[:300])


def ask_many(url: str, ns: list[int], timeout_s: float = 120.0, repeat: int = 1):
    """Send every request at once; returns a future per request."""
    pool = ThreadPoolExecutor(len(ns))
    futures = [pool.submit(ask, url, n, timeout_s, repeat) for n in ns]
    pool.shutdown(wait=False)
    return futures


def until_ok(url: str, n: int, within_s: float) -> tuple[Answer, list[Answer]]:
    """Ask until a 200 (a cold server compiles each new shape for seconds, which can take a
    first try past the deadline); (the 200, the retryable failures before it). Fails with
    the last answer otherwise."""
    end = time.monotonic() + within_s
    failed: list[Answer] = []
    while True:
        answer = ask(url, n)
        if answer.status == 200:
            return answer, failed
        assert answer.status in RETRYABLE, answer
        failed.append(answer)
        if time.monotonic() > end:
            pytest.fail(f"no 200 within {within_s:g} s; last: {answer}")
        time.sleep(1.0)


def summary(answers: list[Answer]) -> list[tuple[int, float]]:
    return [(a.status, round(a.seconds, 2)) for a in answers]


def health(url: str) -> tuple[int, dict]:
    r = httpx.get(url + "/health", timeout=30)
    return r.status_code, r.json()


@pytest.fixture(scope="module")
def scene(sgl_server):
    """The kind's shared server (tests/sglang/conftest.py: sgl_server; these tests run after
    the kind's others, since they kill it) and an openjev --connect'ed to it. Yields a dict
    the tests share: `sgl` is that server, which a test restarts in place (take_over)."""
    server = sgl_server
    root = server.root
    api = None
    state = {"sgl": server, "folder": server.folder, "root": root, "kind": server.kind}
    try:
        api = start_server(
            root,
            "--engine",
            "sglang",
            "--connect",
            server.url,
            "--model",
            str(sgl.embedded_model_folder()),
            "--engine-timeout-s",
            str(DEADLINE_S),
            "--strategy",
            "all",  # a request's branches in one call (batched): what the faults below hit
            # one call in flight before concurrent requests' stages wait to share the next
            # (where the server takes shared calls): the faults below hit shared calls too
            "--coalesce-calls",
            "1",
            # Admission would refuse (529) what this CPU server, measured during the warm-up,
            # cannot serve before half the deadline: these tests need requests in flight.
            "--max-queue-wait-s",
            "1000",
        )
        state["api"] = api
        # Compile the shapes a one-branch request needs, cold and cached, so that later
        # answers are about faults, not about JAX compiling.
        until_ok(api.url, 1, 180)
        until_ok(api.url, 1, 60)
        yield state
    finally:
        if api is not None:
            stop_server(api)


def _group(server) -> int:
    return server.process.process.pid


def test_a_client_that_leaves_has_every_branch_of_its_call_aborted_on_the_server(scene):
    """The client gives up while its request's one batched call is on the server: openjev
    notices (it polls the connection), cancels, and asks the server to drop every branch of
    the call by its rid, which the server's access log shows. The server is paused from
    just after the call went out until openjev has noticed, so that the call is in flight
    when the client leaves on a CPU of any speed (a Xeon with AMX answered it in 1.6 s)."""
    api, server = scene["api"], scene["sgl"]
    mark = len(server.log_tail(10**9))
    pool = ThreadPoolExecutor(1)
    leaving = pool.submit(ask, api.url, 30, timeout_s=3.0, repeat=IN_FLIGHT_REPEAT[scene["kind"]])
    pool.shutdown(wait=False)
    time.sleep(0.3)  # openjev's call is out (or in the socket of the server paused next)
    with server.paused():
        gone = leaving.result()
        time.sleep(1.5)  # openjev notices the client left (a poll every 0.5 s) and posts the aborts
    assert gone.status == 0, f"answered before the client left: nothing was in flight ({gone})"
    deadline = time.monotonic() + 10
    while (aborts := server.log_tail(10**9)[mark:].count("POST /abort_request")) < len(QUESTIONS):
        assert time.monotonic() < deadline, f"{aborts} aborts logged, expected {len(QUESTIONS)}"
        time.sleep(0.2)
    after, failed = until_ok(api.url, 31, 120)
    print(f"client left: {aborts} aborts logged; then 200 in {after.seconds:.1f} s after {summary(failed)}")
    assert aborts == len(QUESTIONS)  # each branch once, nothing else aborted


def _shared(url: str) -> tuple[float, float] | None:
    """openjev's (shared calls, parts sent in them) since start; None where the server's
    batches are not shared (SGLang-JAX 0.1.0rc0: openjev_engine_shared_calls absent)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("openjev_engine_shared_call")
    }
    if not values:
        return None
    return values["openjev_engine_shared_calls_total"], values["openjev_engine_shared_call_parts_total"]


def test_a_client_that_leaves_a_shared_call_aborts_its_own_branches_and_the_others_are_answered(scene):
    """Two requests that waited behind a third share the next call (--coalesce-calls 1);
    one client leaves while that call is on the server (paused meanwhile, so that it is
    still in flight on a CPU of any speed): the server is asked to drop that request's
    branches only (one /abort_request per rid, in its access log) and answers the other
    request's in full, the same answer as that request sent again alone (1e-3)."""
    import asyncio

    api, server = scene["api"], scene["sgl"]
    before = _shared(api.url)
    if before is None:
        pytest.skip("this server's batched calls are not shared (its batches lose extra_key)")
    mark = len(server.log_tail(10**9))
    repeat = IN_FLIGHT_REPEAT[scene["kind"]]

    async def post(client: httpx.AsyncClient, n: int) -> httpx.Response:
        body = {"state": TEXT.format(n=n) * repeat, "questions": QUESTIONS}
        headers = {"x-openjev-rotations": "1", "x-openjev-calibration": "none"}
        return await client.post(api.url + "/v1/systemone", json=body, headers=headers, timeout=300)

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient() as first_client, httpx.AsyncClient() as stay_client:
            leave_client = httpx.AsyncClient()
            try:
                first = asyncio.create_task(post(first_client, 40))
                await asyncio.sleep(0.5)  # its call is out: the next two wait for it
                stay = asyncio.create_task(post(stay_client, 41))
                leave = asyncio.create_task(post(leave_client, 42))
                answered = await first
                await asyncio.sleep(0.3)  # the shared call is out
                with server.paused():  # so it is in flight when the client leaves, on a CPU of any speed
                    assert not stay.done() and not leave.done(), "the shared call ended before the client left"
                    leave.cancel()
                    await asyncio.gather(leave, return_exceptions=True)
                    await leave_client.aclose()  # the client is gone
                    await asyncio.sleep(1.5)  # openjev notices (a poll every 0.5 s) and posts the aborts
            finally:
                await leave_client.aclose()
            stayed = await stay
            again = await post(stay_client, 41)
            return answered, stayed, again

    first, stayed, again = asyncio.run(scenario())
    assert first.status_code == 200 and stayed.status_code == 200, (first.text[:300], stayed.text[:300])
    calls, parts = _shared(api.url)
    # the first alone, then the two together, then the one sent again alone
    assert (calls - before[0], parts - before[1]) == (3, 4)
    deadline = time.monotonic() + 10
    while (aborts := server.log_tail(10**9)[mark:].count("POST /abort_request")) < len(QUESTIONS):
        assert time.monotonic() < deadline, f"{aborts} aborts logged, expected {len(QUESTIONS)}"
        time.sleep(0.2)
    time.sleep(1.0)
    assert server.log_tail(10**9)[mark:].count("POST /abort_request") == len(QUESTIONS)  # the leaver's only
    shared, alone = stayed.json()["answers"], again.json()["answers"]
    for qid in QUESTIONS:
        assert abs(shared[qid]["noul"] - alone[qid]["noul"]) < 1e-3, (qid, shared[qid], alone[qid])


def test_a_stalled_engine_is_answered_504_at_the_deadline_and_recovers(scene):
    api, server = scene["api"], scene["sgl"]
    with server.paused():  # accepts connections (the kernel does), never answers
        sent = time.monotonic()
        answers = [f.result() for f in ask_many(api.url, [10, 11, 12])]
        code, body = health(api.url)
    print("stalled:", summary(answers), "health", code, body)
    for a in answers:
        assert a.status == 504, a
        assert DEADLINE_S - 0.5 <= a.seconds <= DEADLINE_S + MARGIN_S, a
    assert max(a.done_at for a in answers) - sent <= DEADLINE_S + MARGIN_S
    assert code == 503 and body["status"] == "engine_unavailable", body

    recovered, failed = until_ok(api.url, 1, 120)  # the cached request: no compile
    code, body = health(api.url)
    print("after SIGCONT: failed first", summary(failed), "then 200 in", round(recovered.seconds, 2), "s; health", code)
    assert code == 200 and body["status"] == "ok", body


def test_requests_in_flight_when_the_engine_is_killed_get_503_within_seconds(scene):
    api, server = scene["api"], scene["sgl"]
    # new states (~800 tokens): seconds of prefill each
    futures = ask_many(api.url, [20, 21, 22], repeat=IN_FLIGHT_REPEAT[scene["kind"]])
    time.sleep(1.5)
    assert not any(f.done() for f in futures), "answered before the kill: nothing was in flight"
    killed = time.monotonic()
    os.killpg(_group(server), signal.SIGKILL)
    answers = [f.result() for f in futures]
    print("killed:", [(a.status, round(a.done_at - killed, 2)) for a in answers])
    for a in answers:
        assert a.status == 503, a
        assert a.headers.get("retry-after"), a
        assert a.done_at - killed <= MARGIN_S, a

    down = ask(api.url, 23)
    code, body = health(api.url)
    print("down:", down.status, round(down.seconds, 2), "health", code, body)
    assert down.status == 503 and down.seconds <= MARGIN_S, down
    assert code == 503 and body["status"] == "engine_unavailable", body


def test_a_connected_engine_that_comes_back_is_used_again(scene):
    old = scene["sgl"]
    old.process.stop(grace_s=1.0)  # reap what is left of the killed group
    port = int(old.url.rsplit(":", 1)[1])
    t0 = time.monotonic()
    # the same sizes: the shapes the first server compiled come from the JIT cache (jax)
    old.take_over(
        sgl.start(
            scene["folder"], scene["root"] / "server-2.log", timeout_s=600, port=port, kind=scene["kind"], **SIZING
        )
    )
    back = time.monotonic() - t0
    answer, failed = until_ok(scene["api"].url, 1, 180)  # the warm-up's shapes: compiled, in the JIT cache
    code, body = health(scene["api"].url)
    print(
        f"restarted in {back:.1f} s; failed first", summary(failed), f"then 200 in {answer.seconds:.1f} s; health", code
    )
    assert code == 200 and body["status"] == "ok", body
