"""The playground in a real headless browser (Debian's chromium + chromedriver, driven by
Selenium) against a real `openjev serve`: it runs an example and the bars must show the
probabilities the API gives for the same request; its Tasks panel shows a task's figures as
the API gives them and sends with the task. Saves screenshots.

`make test-browser` installs the browser and sets OPENJEV_BROWSER_TEST=1 (then a missing
browser fails the test); elsewhere the test is skipped when the browser is absent."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
REQUIRED = os.environ.get("OPENJEV_BROWSER_TEST") == "1"
SCREENSHOT = Path(
    os.environ.get(
        "OPENJEV_SCREENSHOT", Path(__file__).resolve().parents[2] / "build" / "screenshots" / "playground.png"
    )
)


def _missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is not installed (apt-get install chromium chromium-driver, or run make test-browser)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[browser]', or run make test-browser)"
    return None


pytestmark = [pytest.mark.model, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        if REQUIRED:
            pytest.fail(f"browser test required but {missing}")
        pytest.skip(missing)
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="openjev-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={profile}",
        "--window-size=1400,1100",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, to see CSP refusals
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    srv = start_server(tmp, "--tasks-db", str(tmp / "tasks.sqlite3"), key="browser-key")
    yield srv
    stop_server(srv)


def _wait(driver, script: str, timeout: float = 120):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(script))


def _send(driver) -> None:
    before = driver.execute_script("return document.getElementById('result').dataset.done || ''")
    driver.find_element("id", "send").click()
    _wait(
        driver,
        f"return (document.getElementById('result').dataset.done || '') !== {json.dumps(before)} "
        "|| !document.getElementById('error').classList.contains('hidden')",
    )


def _bars(driver) -> dict:
    """{qid: {option: (p from data, text shown, bar width %)}} as the page shows them."""
    return driver.execute_script("""
        const out = {};
        for (const a of document.querySelectorAll('#answers .answer')) {
          out[a.dataset.qid] = {};
          for (const r of a.querySelectorAll('.bar-row')) {
            out[a.dataset.qid][r.dataset.option] = [parseFloat(r.dataset.p), r.querySelector('.pct').textContent,
                                                    parseFloat(r.querySelector('.fill').style.width)];
          }
        }
        return out;""")


def _api_bars(answers: dict) -> dict:
    out = {}
    for qid, a in answers.items():
        if a["type"] == "noul":
            out[qid] = {"true": a["noul"], "false": 1 - a["noul"]}
        elif a["type"] == "choice":
            out[qid] = dict(a["probabilities"])
        else:
            out[qid] = {f"{i} {a['legend'][i]}": p for i, p in a["probabilities"].items()}
    return out


def test_playground_runs_an_example_and_shows_the_apis_probabilities(browser, server):
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server.url + "/")
    _wait(driver, "return document.getElementById('editor').dataset.ready === '1'", 30)
    # auth is on: the page found out and shows the key field
    assert driver.find_element("id", "key-box").is_displayed()
    assert "serving smollm2-135m-instruct" in driver.find_element("id", "model-info").text

    # without the key: the server's own message is shown
    _send(driver)
    error = driver.find_element("id", "error")
    assert error.is_displayed() and "401 authentication_error: missing API key" in error.text

    driver.find_element("id", "key").send_keys(server.key)
    Select(driver.find_element("id", "example")).select_by_visible_text("Log severity")
    _send(driver)
    assert not driver.find_element("id", "error").is_displayed(), driver.find_element("id", "error").text
    shown = _bars(driver)

    # as JSON text: WebDriver's own object conversion may reorder keys, and option order matters
    request = json.loads(driver.execute_script("return JSON.stringify(buildRequest())"))
    assert set(request["questions"]) == {"severity", "page_someone", "impact"}
    api = httpx.post(server.url + "/v1/systemone", json=request, headers=server.headers(), timeout=60)
    assert api.status_code == 200
    want = _api_bars(api.json()["answers"])
    assert shown.keys() == want.keys()
    for qid in want:
        assert shown[qid].keys() == want[qid].keys()
        for option, p in want[qid].items():
            data_p, text, width = shown[qid][option]
            # the API's second answer comes from the prefix cache: equal up to float noise
            assert data_p == pytest.approx(p, abs=1e-3), (qid, option)
            assert text == f"{data_p:.3f}" and width == pytest.approx(100 * data_p, abs=0.01)
    chosen = driver.execute_script(
        "return [...document.querySelectorAll('.answer[data-qid=severity] .bar-row.chosen')].map(r => r.dataset.option)"
    )
    assert chosen == [api.json()["answers"]["severity"]["choice"]]

    usage = {row.get_attribute("data-field") for row in driver.find_elements("css selector", "#usage tr")}
    assert {"input_tokens", "output_tokens", "x_computed_tokens"} <= usage
    phases = [r.get_attribute("data-option") for r in driver.find_elements("css selector", "#timing .bar-row")]
    assert {"prepare", "queue", "prefill", "branches", "engine"} <= set(phases)
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(str(SCREENSHOT))
    print(f"screenshot: {SCREENSHOT}")

    # the copied Python snippet runs with the official SDK and agrees with the page
    driver.find_element("id", "copy-python").click()
    snippet = driver.find_element("id", "snippet").get_attribute("value")
    assert "from typesafe_sdk import" in snippet and 'TypeSafeClient(api_key="browser-key"' in snippet
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"severity {api.json()['answers']['severity']['choice']} " in proc.stdout

    # and so does the curl one
    driver.find_element("id", "copy-curl").click()
    snippet = driver.find_element("id", "snippet").get_attribute("value")
    assert snippet.startswith("curl -sS ") and "Authorization: Bearer browser-key" in snippet
    if shutil.which("curl"):
        proc = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["answers"]["severity"]["choice"] == api.json()["answers"]["severity"]["choice"]

    # a request the server refuses: its message, not a crash
    driver.find_element("id", "model").clear()
    driver.find_element("id", "model").send_keys("gpt-4")
    _send(driver)
    assert "404 not_found: model 'gpt-4' is not served here" in driver.find_element("id", "error").text


def _openai_bars(a: dict) -> dict:
    if a["type"] == "predicate":
        return {"true": a["probability"], "false": 1 - a["probability"]}
    if a["type"] == "choice":
        return {str(p["value"]): p["probability"] for p in a["probabilities"]}
    if a["type"] == "score":
        return {f"{p['value']} {p['label']}": p["probability"] for p in a["probabilities"]}
    return {}  # a refusal


def test_playground_switches_to_openais_format_and_its_snippets_run(browser, server):
    """The same editor sends OpenAI's Decisions body to /v1/decisions; the bars show that
    route's answers, and the curl and openai-SDK snippets send the same request."""
    from selenium.webdriver.support.ui import Select

    driver = browser
    driver.get(server.url + "/")
    _wait(driver, "return document.getElementById('editor').dataset.ready === '1'", 30)
    driver.find_element("id", "key").clear()  # this tab may remember the key from an earlier test
    driver.find_element("id", "key").send_keys(server.key)
    Select(driver.find_element("id", "example")).select_by_visible_text("Ticket triage")
    Select(driver.find_element("id", "format")).select_by_value("openai")
    assert driver.find_element("id", "state-label").text == "Input"
    _send(driver)
    assert not driver.find_element("id", "error").is_displayed(), driver.find_element("id", "error").text
    shown = _bars(driver)

    request = json.loads(driver.execute_script("return JSON.stringify(requestBody())"))
    assert [q["type"] for q in request["questions"]] == ["predicate", "choice", "score"]
    assert [q["name"] for q in request["questions"]] == ["refund", "department", "urgency"]
    api = httpx.post(server.url + "/v1/decisions", json=request, headers=server.headers(), timeout=60)
    assert api.status_code == 200, api.text
    answers = api.json()["answers"]
    want = {a["name"]: _openai_bars(a) for a in answers}  # a refusal (the abstain rule) shows no bars
    assert shown.keys() == want.keys()
    for qid in want:
        assert shown[qid].keys() == want[qid].keys()
        for option, p in want[qid].items():
            assert shown[qid][option][0] == pytest.approx(p, abs=1e-3), (qid, option)
    usage = {row.get_attribute("data-field") for row in driver.find_elements("css selector", "#usage tr")}
    assert {"input_tokens", "input_tokens_details.cached_tokens", "total_tokens"} <= usage

    driver.find_element("id", "copy-openai").click()
    snippet = driver.find_element("id", "snippet").get_attribute("value")
    assert "from openai import OpenAI" in snippet and "client.decisions.create(" in snippet
    proc = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.splitlines()
    assert [line.split()[0] for line in printed] == ["refund", "department", "urgency"], proc.stdout
    for line, answer in zip(printed, answers, strict=True):
        said = line.split()[1]
        if answer["type"] == "refusal":
            assert said == "refused"
        elif answer["type"] == "choice":
            assert said == str(answer["choice"])

    driver.find_element("id", "copy-curl").click()
    snippet = driver.find_element("id", "snippet").get_attribute("value")
    assert "/v1/decisions" in snippet and '"input"' in snippet
    if shutil.which("curl"):
        proc = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert [a["type"] for a in json.loads(proc.stdout)["answers"]] == [a["type"] for a in answers]

    # a refused request: OpenAI's error shape, its param shown
    driver.find_element("id", "model").clear()
    driver.find_element("id", "model").send_keys("gpt-6-luna")
    _send(driver)
    assert (
        "404 invalid_request_error (model): model 'gpt-6-luna' is not served here"
        in driver.find_element("id", "error").text
    )


TASK_QUESTION = {"type": "noul", "instructions": "Does the customer ask for their money back?"}
ASKS = [
    "I want a refund for order {n}, it arrived broken.",
    "Please send my money back for order {n}.",
    "Order {n} was wrong; refund me please.",
]
OTHER = [
    "Where is my order {n}? It has not arrived.",
    "Can I change the address on order {n}?",
    "Thanks, order {n} arrived and it is great.",
]


def _task_examples() -> list[dict]:
    out = []
    for n in range(6):  # 12 examples: a few more than the 10 a fit needs
        out.append({"state": ASKS[n % 3].format(n=100 + n), "answer": True})
        out.append({"state": OTHER[n % 3].format(n=200 + n), "answer": False})
    return out


def _fixed(x: float, digits: int) -> str:
    """JavaScript's toFixed: the float's exact value rounded half up (Python's format rounds half to even)."""
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def _cells(driver, table: str) -> dict:
    """{(side, metric): (text shown, value in data)} of a figures table."""
    rows = driver.execute_script(
        f"return [...document.querySelectorAll('#{table} td[data-metric]')]"
        ".map(td => [td.dataset.side, td.dataset.metric, td.textContent, td.dataset.value])"
    )
    return {(side, metric): (text, float(value)) for side, metric, text, value in rows}


def test_playground_tasks_panel_shows_a_tasks_figures_and_sends_with_it(browser, server):
    """A task created over HTTP: the panel lists it, follows its fit to ready, shows its
    figures before and after as the API gives them, and "Use this task" makes Send name it
    in x-openjev-task on both formats, the answer showing the task's calibration."""
    from selenium.webdriver.support.ui import Select

    created = httpx.post(
        server.url + "/v1/tasks",
        json={"question": TASK_QUESTION, "examples": _task_examples(), "caller_id": "refunds"},
        headers=server.headers(),
        timeout=120,
    )
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]

    driver = browser
    driver.get(server.url + "/")
    _wait(driver, "return document.getElementById('editor').dataset.ready === '1'", 30)
    driver.find_element("id", "key").clear()
    driver.find_element("id", "key").send_keys(server.key)
    driver.find_element("id", "tasks-refresh").click()
    row = f"#task-list .task-row[data-id={json.dumps(task_id)}]"
    _wait(driver, f"return document.querySelector({json.dumps(row)}) !== null", 30)
    assert "refunds" in driver.find_element("css selector", row).text
    driver.find_element("css selector", row).click()
    # no further click: while it is queued or fitting the panel polls it until ready
    _wait(driver, "return ['ready', 'failed'].includes(document.getElementById('task-view').dataset.status)", 300)
    task = httpx.get(f"{server.url}/v1/tasks/{task_id}", headers=server.headers(), timeout=30).json()
    assert task["status"] == "ready", task
    assert driver.find_element("id", "task-view").get_attribute("data-status") == "ready"
    fit = task["fit"]

    shown = _cells(driver, "task-table")
    for (side, metric), cell in shown.items():
        assert cell == (_fixed(fit[side][metric], 0 if metric == "n" else 3), fit[side][metric]), (side, metric)
    expected = {"accuracy", "brier", "ece", "n"} | ({"ece_debiased"} & set(fit["after"]))
    assert set(shown) == {(side, metric) for side in ("before", "after") for metric in expected}
    assert fit["after"]["n"] == 12
    bars = driver.execute_script(
        "return [...document.querySelectorAll('#task-bars .pair .bar-row')]"
        ".map(r => [r.closest('.pair').dataset.metric, r.dataset.side, r.querySelector('.pct').textContent])"
    )
    assert sorted(bars) == sorted(
        [metric, side, _fixed(fit[side][metric], 3)] for metric in ("ece", "brier") for side in ("before", "after")
    )
    threshold = _cells(driver, "task-threshold")
    for metric, digits in (("target_precision", 2), ("min_confidence", 3), ("coverage", 3), ("precision", 3)):
        assert threshold["threshold", metric][0] == _fixed(fit["threshold"][metric], digits), metric
    assert driver.find_element("id", "task-fit").get_attribute("data-form") == fit["form"]

    Select(driver.find_element("id", "example")).select_by_visible_text("Ticket triage")
    driver.find_element("id", "task-use").click()
    assert driver.find_element("id", "task-chip").is_displayed()
    assert driver.find_element("id", "task-chip-id").text == task_id
    # the task's question joined the request, so the named task has a question to answer
    assert json.loads(driver.execute_script("return JSON.stringify(buildRequest())"))["questions"]["task"] == {
        "type": "noul",
        "instructions": TASK_QUESTION["instructions"],
    }
    shot = SCREENSHOT.with_name("playground-tasks.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    panel = driver.find_element("id", "tasks")
    driver.execute_script("arguments[0].scrollIntoView()", panel)  # an element's screenshot stops at the viewport
    panel.screenshot(str(shot))
    print(f"screenshot: {shot}")

    for fmt in ("jev", "openai"):
        Select(driver.find_element("id", "format")).select_by_value(fmt)
        _send(driver)
        assert not driver.find_element("id", "error").is_displayed(), driver.find_element("id", "error").text
        applied = driver.find_element("id", "applied")
        assert applied.is_displayed() and f"task:{task_id}" in applied.text, (fmt, applied.text)
        assert f"task:{task_id}" in applied.get_attribute("data-calibration").split(","), fmt
        assert "task" in _bars(driver), fmt
    driver.find_element("id", "copy-curl").click()
    assert f"x-openjev-task: {task_id}" in driver.find_element("id", "snippet").get_attribute("value")

    # the header itself is sent: without the task's question the server refuses the named task
    driver.find_element("css selector", "#questions .question:last-child .remove").click()
    _send(driver)
    error = driver.find_element("id", "error")
    assert error.is_displayed() and "409" in error.text and f"task {task_id} is for another question" in error.text

    # and once dropped, Send names no task
    driver.find_element("id", "task-drop").click()
    assert not driver.find_element("id", "task-chip").is_displayed()
    _send(driver)
    assert not driver.find_element("id", "error").is_displayed(), driver.find_element("id", "error").text
    assert "task:" not in driver.find_element("id", "applied").get_attribute("data-calibration")
    # nothing the page did was refused by its Content-Security-Policy
    console = [entry["message"] for entry in driver.get_log("browser")]
    assert not [m for m in console if "Content Security Policy" in m], console
