"""Aliases, batch and `openjev ask` through a real `openjev serve` with the embedded model."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from openjev.api.server.app import SYSTEMONE_ROUTES
from tests.integration.test_live_server import README_EXAMPLE

pytestmark = pytest.mark.model

QUESTIONS = README_EXAMPLE["questions"]


def _close(a: dict, b: dict, tol: float = 2e-3) -> None:
    """Two answers maps agree: same choices, probabilities within `tol` (batched forwards
    may differ from a lone one in the last float bits)."""
    assert a.keys() == b.keys()
    for qid in a:
        x, y = a[qid], b[qid]
        assert x["type"] == y["type"]
        if x["type"] == "noul":
            assert x["noul"] == pytest.approx(y["noul"], abs=tol)
        else:
            assert x["probabilities"].keys() == y["probabilities"].keys()
            for k in x["probabilities"]:
                assert x["probabilities"][k] == pytest.approx(y["probabilities"][k], abs=tol)


@pytest.mark.parametrize("path", SYSTEMONE_ROUTES[1:])
def test_aliases_answer_like_systemone(live, path):
    want = httpx.post(live.url + "/v1/systemone", json=README_EXAMPLE, headers=live.headers(), timeout=60)
    got = httpx.post(live.url + path, json=README_EXAMPLE, headers=live.headers(), timeout=60)
    assert got.status_code == 200, got.text
    assert got.json()["model"] == want.json()["model"]
    _close(got.json()["answers"], want.json()["answers"])
    assert httpx.post(live.url + path, json=README_EXAMPLE, timeout=60).status_code == 401


def test_batch_items_sharing_a_state_compute_it_once(live):
    state = "Order #9913 log. " + " ".join(f"Step {i}: the parcel moved to depot {i % 7}." for i in range(40))
    items = [{"state": state, "questions": {name: q}} for name, q in QUESTIONS.items()]
    items.append({"state": "A different, short ticket: my app crashes on start.", "questions": QUESTIONS})
    r = httpx.post(live.url + "/v1/systemone/batch", json={"requests": items}, headers=live.headers(), timeout=300)
    assert r.status_code == 200, r.text
    lines = [json.loads(line) for line in r.text.splitlines()]
    summary = lines.pop()["summary"]
    assert summary == {**summary, "items": 4, "succeeded": 4, "failed": 0}
    by_index = {line["index"]: line for line in lines}
    leader, followers = by_index[0], [by_index[1], by_index[2]]
    state_tokens = leader["usage"]["x_computed_tokens"] - 30  # the state dominates the leader's work
    assert state_tokens > 300
    for f in followers:
        # the state came from the prefix cache: only the follower's own question was computed
        assert f["usage"]["x_cached_tokens"] >= state_tokens, f["usage"]
        assert f["usage"]["x_computed_tokens"] < leader["usage"]["x_computed_tokens"] / 4, f["usage"]
    assert summary["usage"]["x_cached_tokens"] >= 2 * state_tokens
    # the same answers as one request each
    for i, item in enumerate(items):
        single = httpx.post(live.url + "/v1/systemone", json=item, headers=live.headers(), timeout=60).json()
        _close(by_index[i]["answers"], single["answers"])


def test_batch_states_form_as_json_array_with_a_bad_item(live):
    body = {"questions": QUESTIONS, "states": ["I was charged twice.", None, {"ticket": "The app crashes."}]}
    r = httpx.post(
        live.url + "/v1/systemone/batch",
        json=body,
        timeout=300,
        headers={**live.headers(), "Accept": "application/json"},
    )
    assert r.status_code == 200, r.text
    first, bad, third = r.json()
    assert [first["index"], bad["index"], third["index"]] == [0, 1, 2]
    assert set(first["answers"]) == set(QUESTIONS) and set(third["answers"]) == set(QUESTIONS)
    assert bad["status"] == 422 and bad["error"]["error_type"] == "invalid_request"
    limits = httpx.get(live.url + "/v1/limits", headers=live.headers()).json()
    assert limits["max_batch_items"] > 0 and limits["max_batch_tokens"] > 0


def _ask(live, *args, key=True):
    env = {**os.environ, "OPENJEV_API_KEY": live.key if key else ""}
    return subprocess.run(
        [sys.executable, "-m", "openjev", "ask", "--url", live.url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


ASK = [
    "--state",
    README_EXAMPLE["state"],
    "--noul",
    "refund=Does the customer ask for a refund?",
    "--choice",
    "department=Which team should handle this?",
    "billing=Payments, charges and refunds",
    "technical=Bugs in the app",
    "--score",
    "urgency=How urgent is this?",
    "Routine",
    "Urgent",
    "Emergency",
]


def test_ask_prints_the_answers_the_api_gives(live):
    api = httpx.post(live.url + "/v1/systemone", json=README_EXAMPLE, headers=live.headers(), timeout=60).json()
    proc = _ask(live, *ASK, "--json")
    assert proc.returncode == 0, proc.stderr
    _close(json.loads(proc.stdout)["answers"], api["answers"])
    proc = _ask(live, *ASK)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    print(out)
    team = api["answers"]["department"]
    assert f"department: Which team should handle this?  ->  {team['choice']}" in out
    chosen = [line for line in out.splitlines() if line.startswith("  > ")]
    assert len(chosen) == 3 and any(team["choice"] in line for line in chosen)
    assert "█" in out and "input_tokens" in out and "server timing: prepare;dur=" in out
    p_billing = team["probabilities"]["billing"]
    assert f"{p_billing:6.1%}" in out


def test_ask_reports_the_servers_refusal(live):
    proc = _ask(live, *ASK, key=False)
    assert proc.returncode == 1 and "401 authentication_error" in proc.stderr
    proc = _ask(live, "--state", "x", "--choice", "Which?", "a", "b", "--model", "gpt-4")
    assert proc.returncode == 1 and "404 not_found" in proc.stderr
    proc = _ask(live, "--state", "x")
    assert proc.returncode == 2 and "at least one question" in proc.stderr


@pytest.mark.parametrize("alias", SYSTEMONE_ROUTES[1:])
def test_conformance_suite_passes_on_each_alias(live, tmp_path, alias):
    """jevcompat only calls <base>/v1/systemone, so a pass-through forwarder serves the alias
    under that name: the suite's every request and check then exercises the alias route."""
    from tests.integration.test_live_server import run_jevcompat
    from tests.support import route_proxy

    url, proxy = route_proxy.start(live.url, "/v1/systemone", alias)
    try:
        run_jevcompat(url, live.key, tmp_path)
        assert proxy.rewritten > 30
    finally:
        proxy.shutdown()
