"""Scale-out on SGLang's real router: two SGLang-JAX workers on this CPU behind
`sglang-router` (PyPI) with its cache-aware policy, and a real `openjev serve --engine sglang
--connect <router>` in front.

Runs with `make test-scaleout` (installs SGLang-JAX and the router into their own venvs);
skipped otherwise. Each worker's own log says what it prefilled and what it found cached
("#new-token: N, #cached-token: M"): that is how the tests see which worker served what.

    OPENJEV_SCALEOUT=1 .venv/bin/python -m pytest tests/scaleout -v -s
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server
from tests.support import processes
from tests.support.net import free_port

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        os.environ.get("OPENJEV_SCALEOUT") != "1", reason="the scale-out suite runs with `make test-scaleout`"
    ),
]

from tests.sglang import server as sgl  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ROUTER_PYTHON = REPO / ".venv-sglang-router" / "bin" / "python"
PREFILL = re.compile(r"#new-token: (\d+), #cached-token: (\d+)")
# Two workers on two cores: each sized for one request's branches at a time (the native
# backend pads attention to these sizes, see tests/sglang/server.py: sizing_flags).
WORKER_SIZE = {"max_running": 4, "context_length": 1024, "chunk": 512}


@dataclass
class Router:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        processes.stop(self.process, grace_s=15)


def wait_idle(worker, timeout_s: float = 600) -> None:
    """Until the worker has finished its own start-up warm-up and answers /get_server_info
    at once. The router gives a worker's metadata 10 s at registration and does not retry
    a failed registration; a CPU worker in its warm-up forward misses that."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "fired up and ready to roll" in worker.log_tail(10**9):
            try:
                if httpx.get(worker.url + "/get_server_info", timeout=3).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(1)
    raise RuntimeError(f"worker {worker.url} not idle in time:\n{worker.log_tail()}")


def registered(router_url: str) -> list[dict]:
    """The router's own view of its workers (GET /workers): url, is_healthy, load."""
    return httpx.get(router_url + "/workers", timeout=30).json()["workers"]


def start_router(workers: list[str], log_path: Path) -> Router:
    port = free_port()
    cmd = [
        str(ROUTER_PYTHON),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--policy",
        "cache_aware",
        "--worker-urls",
        *workers,
        # A CPU worker in a long forward answers /health slowly: a short timeout would mark
        # the busy worker unhealthy and send its state's requests elsewhere. A dead worker
        # refuses connections at once, so requests are retried on the other anyway.
        "--health-check-interval-secs",
        "5",
        "--health-check-timeout-secs",
        "60",
        "--health-failure-threshold",
        "2",
        "--request-timeout-secs",
        "900",
        "--log-level",
        "info",
        # A request whose worker died is retried, but the cache-aware policy picks the same
        # (dead) worker again while it still looks healthy: with the defaults all retries hit
        # it within 0.4 s. Two failures open its circuit breaker, so a retry goes elsewhere,
        # and the backoff outlasts the health checker's verdict (about 10 s) in any case.
        "--cb-failure-threshold",
        "2",
        "--retry-max-retries",
        "5",
        "--retry-initial-backoff-ms",
        "500",
        "--retry-max-backoff-ms",
        "5000",
    ]
    with open(log_path, "w") as log:
        proc = processes.spawn(cmd, stdout=log, stderr=subprocess.STDOUT)
    router = Router(f"http://127.0.0.1:{port}", proc, log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited {proc.returncode}:\n{router.log()[-3000:]}")
        try:
            if len([w for w in registered(router.url) if w["is_healthy"]]) == len(workers):
                return router
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    router.stop()
    raise RuntimeError(f"router did not register every worker in time:\n{router.log()[-3000:]}")


def prefills(worker) -> list[tuple[int, int]]:
    """(new tokens, cached tokens) of every prefill batch the worker logged so far."""
    return [(int(a), int(b)) for a, b in PREFILL.findall(worker.log_tail(10**9))]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("scaleout")
    folder = sgl.served_folder(sgl.embedded_model_folder(), root / "model")
    workers, router, api, single = [], None, None, None
    try:
        for i in range(2):
            t0 = time.monotonic()
            workers.append(sgl.start(folder, root / f"worker{i}.log", timeout_s=900, **WORKER_SIZE))
            print(f"worker {i} at {workers[-1].url}: healthy in {time.monotonic() - t0:.1f} s")
        for w in workers:
            wait_idle(w)
        router = start_router([w.url for w in workers], root / "router.log")
        args = ("--engine", "sglang", "--model", str(folder), "--strategy", "auto", "--engine-timeout-s", "900")
        api = start_server(root, *args, "--connect", router.url)
        single = start_server(root, *args, "--connect", workers[0].url)  # the reference: one worker
        yield workers, router, api, single
    finally:
        for server in (api, single):
            if server is not None:
                stop_server(server)
        if router is not None:
            router.stop()
        for w in workers:
            w.stop()


def ask(server, state: str, questions: dict, timeout: float = 900) -> dict:
    r = httpx.post(server.url + "/v1/systemone", json={"state": state, "questions": questions}, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this?",
        "criteria": {"billing": "Payments and refunds", "technical": "Bugs in the app"},
    },
    "urgency": {"type": "score", "instructions": "How urgent is this?", "criteria": ["Routine", "Urgent", "Emergency"]},
}
MORE = [
    {"late": {"type": "noul", "instructions": "Is the order late?"}},
    {
        "channel": {
            "type": "choice",
            "instructions": "Where should the answer go?",
            "criteria": {"email": None, "phone": None},
        }
    },
    {"angry": {"type": "noul", "instructions": "Is the customer angry?"}},
]


def long_state(tag: str) -> str:
    """About 300 tokens, distinct per tag (no worker has it cached before)."""
    return f"Ticket {tag}. " + " ".join(
        f"Day {i}: the parcel for order {tag} was still not delivered." for i in range(25)
    )


def test_answers_through_the_router_equal_a_single_workers(cluster):
    _, _, api, single = cluster
    state = long_state("parity")
    got, want = ask(api, state, QUESTIONS), ask(single, state, QUESTIONS)
    worst = 0.0
    for qid, a in got["answers"].items():
        b = want["answers"][qid]
        pa = {"p": a["noul"]} if a["type"] == "noul" else a["probabilities"]
        pb = {"p": b["noul"]} if b["type"] == "noul" else b["probabilities"]
        worst = max(worst, *(abs(pa[k] - pb[k]) for k in pa))
    print(f"parity: max probability difference {worst:.2e}")
    assert worst < 1e-3


def test_requests_sharing_a_state_land_on_the_worker_that_has_it(cluster):
    workers, _, api, _ = cluster
    state = long_state("affinity")
    before = [len(prefills(w)) for w in workers]
    first = ask(api, state, QUESTIONS)
    new = [prefills(w)[n:] for w, n in zip(workers, before, strict=True)]
    hot = max(range(2), key=lambda i: sum(t for t, _ in new[i]))  # the worker that prefilled the state
    cold = 1 - hot
    assert sum(t for t, _ in new[hot]) > 250, new
    mark = [len(prefills(w)) for w in workers]
    cached = 0
    for questions in MORE:
        cached += ask(api, state, questions)["usage"]["x_cached_tokens"]
    after = [prefills(w)[n:] for w, n in zip(workers, mark, strict=True)]
    hot_cached = sum(c for _, c in after[hot])
    cold_cached = sum(c for _, c in after[cold])
    share = hot_cached / max(1, hot_cached + cold_cached)
    print(
        f"affinity: worker {hot} prefilled the state ({first['usage']['x_computed_tokens']} tokens computed); "
        f"follow-ups: worker {hot} cached {hot_cached} tokens in {len(after[hot])} prefills, "
        f"worker {cold} cached {cold_cached} in {len(after[cold])}; hit share on the state's worker {share:.0%}"
    )
    assert hot_cached >= 3 * 250 and cached >= 3 * 250
    assert cold_cached == 0 and not after[cold], after  # the other worker saw none of them


def test_a_killed_worker_is_routed_around_and_reported(cluster):
    workers, router, api, _ = cluster
    state = long_state("failover")
    before = [len(prefills(w)) for w in workers]
    ask(api, state, QUESTIONS)
    hot = max(range(2), key=lambda i: sum(t for t, _ in prefills(workers[i])[before[i] :]))
    victim, survivor = workers[hot], workers[1 - hot]  # the worker the router sends this state to
    log_mark = len(router.log())
    noticed: list[float] = []

    def watch() -> None:  # when the router's own view turns the victim unhealthy
        while time.monotonic() - t0 < 300:
            try:
                if _healthy(router, victim.url) is not True:
                    noticed.append(time.monotonic() - t0)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)

    survivor_before = len(prefills(survivor))
    t0 = time.monotonic()
    os.killpg(victim.process.process.pid, signal.SIGKILL)  # a crash, not a shutdown
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    answered = ask(api, state, MORE[0])  # routed to the dead worker first: the router retries
    failover_s = time.monotonic() - t0
    assert set(answered["answers"]) == set(MORE[0])
    # The survivor served it. It computes the state anew unless some of the first request's
    # branches had already been balanced onto it (more likely the more branches a request
    # has, e.g. under --rotations): then it finds the state in its own cache.
    served = prefills(survivor)[survivor_before:]
    assert served, "the survivor prefilled nothing after the kill"
    print(
        f"survivor after the kill: {len(served)} prefills, {sum(n for n, _ in served)} tokens computed, "
        f"{sum(c for _, c in served)} cached"
    )
    for questions in MORE[1:]:
        assert set(ask(api, state, questions)["answers"]) == set(questions)
    watcher.join(300)
    assert noticed, "the router never marked the killed worker unhealthy"
    print(
        f"failover: killed worker {hot} ({victim.url}), the one holding the state; first answer "
        f"{failover_s:.1f} s after the kill (served by worker {1 - hot}); the router marked it unhealthy "
        f"{noticed[0]:.1f} s after the kill; /workers: "
        f"{[(w['url'], w['is_healthy']) for w in registered(router.url)]}"
    )
    # the operator sees which worker failed: the router's /workers, and its log
    assert _healthy(router, victim.url) is not True  # marked unhealthy, or dropped
    assert _healthy(router, survivor.url) is True
    said = [line for line in _plain(router.log()[log_mark:]).splitlines() if victim.url.split("//")[1] in line]
    print("router log on the failed worker:\n" + "\n".join(said[:2]))
    assert said


def _healthy(router: Router, url: str) -> bool | None:
    """The router's health flag for `url`; None once it dropped the worker altogether."""
    return next((w["is_healthy"] for w in registered(router.url) if w["url"] == url), None)


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)
