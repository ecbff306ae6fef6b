"""Reloads, start-up checks and caches that cannot take the server down (issue 16, part C),
through real `openjev serve` processes on loopback: SIGHUP with a keys file that is not
UTF-8, a keys file that cannot be read at startup, a busy port, a cache folder that is a
file, and a converted-weights cache that was damaged after conversion."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.integration.conftest import start_server, stop_server
from tests.support.models import EMBEDDED_FLAGS
from tests.support.net import free_port

pytestmark = pytest.mark.model

SHORT = {
    "model": "jev-latest",
    "state": "Hi, I was charged twice for order #1234 and I want my money back today.",
    "questions": {"refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"}},
}
LATIN1 = "# clé de l'équipe\nalice:alice-key\n".encode("latin-1")  # one é: not UTF-8


def _serve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """`openjev serve` expected to exit before listening (no model is ever loaded)."""
    return subprocess.run(
        [sys.executable, "-m", "openjev", "serve", *EMBEDDED_FLAGS, "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OPENJEV_DTYPE": "float32"},
    )


def _healthy(server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.process.poll() is None, open(server.log_path).read()[-3000:]
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, open(server.log_path).read()[-3000:]
        time.sleep(0.2)


def _status(server, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(server.url + "/v1/models", timeout=10, headers=headers).status_code


def test_sighup_with_a_keys_file_that_is_not_utf8_keeps_the_old_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key\n")
    server = start_server(tmp_path, "--api-keys-file", str(keys))
    try:
        assert _status(server, "alice-key") == 200
        keys.write_bytes(LATIN1.replace(b"alice:alice-key", b"bob:bob-key"))
        os.kill(server.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "keys not reloaded" not in open(server.log_path).read():
            assert server.process.poll() is None, open(server.log_path).read()[-3000:]
            assert time.monotonic() < deadline, "the failed reload was never logged"
            time.sleep(0.1)
        log = open(server.log_path).read()
        assert "not UTF-8" in log and "line 1" in log and str(keys) in log
        assert server.process.poll() is None  # alive
        assert _status(server, "alice-key") == 200  # the old keys still work
        assert _status(server, "bob-key") == 401  # the unreadable file changed nothing
        r = httpx.post(
            server.url + "/v1/systemone", json=SHORT, timeout=120, headers={"Authorization": "Bearer alice-key"}
        )
        assert r.status_code == 200 and 0 <= r.json()["answers"]["refund"]["noul"] <= 1
        # a good file again is taken
        keys.write_text("alice:alice-key\nbob:bob-key\n")
        os.kill(server.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while _status(server, "bob-key") != 200:
            assert time.monotonic() < deadline, "the fixed file was never loaded"
            time.sleep(0.1)
    finally:
        stop_server(server)


def test_a_keys_file_that_cannot_be_read_at_startup_exits_2_with_the_reason(tmp_path):
    keys = tmp_path / "keys"
    keys.write_bytes(LATIN1)
    run = _serve("--api-keys-file", str(keys))
    assert run.returncode == 2, run.stderr[-2000:]
    assert "not UTF-8" in run.stderr and str(keys) in run.stderr and "line 1" in run.stderr
    assert "Traceback" not in run.stderr
    run = _serve("--api-keys-file", str(tmp_path))  # a folder
    assert run.returncode == 2 and str(tmp_path) in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_busy_port_fails_before_the_model_loads(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        t0 = time.monotonic()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "openjev",
                "serve",
                *EMBEDDED_FLAGS,
                "--port",
                str(port),
                "--cache-dir",
                str(tmp_path / "cache"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - t0
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr and "in use" in run.stderr
    assert "dtype" not in run.stderr and "converting" not in run.stderr  # nothing was loaded
    assert not (tmp_path / "cache").exists()  # nor converted
    assert took < 60  # a conversion alone takes ~20 s on an idle laptop; the margin is for a loaded CI box


def test_a_cache_dir_that_is_a_file_is_refused_in_preflight(tmp_path):
    blocker = tmp_path / "cache-file"
    blocker.write_text("not a folder")
    run = _serve("--cache-dir", str(blocker))
    assert run.returncode == 2, run.stderr[-2000:]
    assert str(blocker) in run.stderr and "not a folder" in run.stderr
    assert "dtype" not in run.stderr and "converting" not in run.stderr
    run = _serve("--cache-dir", str(blocker / "below"))  # a file on the way to it
    assert run.returncode == 2 and str(blocker) in run.stderr, run.stderr[-2000:]


def test_a_truncated_weights_cache_is_converted_again(tmp_path):
    from openjev.config import load_settings
    from openjev.engines.models.converted import cache_problem
    from openjev.engines.models.source import gguf_cache_folder, resolve_source

    source = resolve_source(None)
    cache = tmp_path / "cache"
    user_cache = gguf_cache_folder(source, load_settings(environ={}).served.cache_dir)
    folder = gguf_cache_folder(source, str(cache))
    if (user_cache / ".openjev-complete").exists() and cache_problem(user_cache) is None:
        shutil.copytree(user_cache, folder)  # a verified conversion: saves one
    else:
        first = start_server(tmp_path, "--cache-dir", str(cache), wait=False)  # converts
        try:
            _healthy(first, 600)
        finally:
            stop_server(first)
    assert cache_problem(folder) is None
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)
    server = start_server(tmp_path, "--cache-dir", str(cache), wait=False)
    try:
        _healthy(server, 600)  # a conversion: ~20 s idle, minutes on a loaded shared CPU
        log = open(server.log_path).read()
        assert f"{weights} has" in log and "truncated" in log and "converting again" in log
        assert "from source" in log  # loaded from the new conversion, not the damaged one
        assert cache_problem(folder) is None  # and the cache is whole again
        r = httpx.post(server.url + "/v1/systemone", json=SHORT, timeout=120)
        assert r.status_code == 200
        assert r.json()["answers"]["refund"]["x_label_mass"] > 0.5  # the model, not noise
    finally:
        stop_server(server)


@pytest.mark.parametrize(
    ("written", "reason"),
    [
        (b"", "holds no keys"),  # a file emptied while it is rewritten
        (b"# the team's keys\n", "holds no keys"),
        (b"alice:alice-key\nbob:bo", "does not end with a newline"),  # cut mid-key: bob would hold "bo"
    ],
    ids=["empty", "comments-only", "truncated"],
)
def test_sighup_with_an_empty_or_truncated_keys_file_keeps_the_old_keys(tmp_path, written, reason):
    """Issue 28, item 9: on main these reloaded to 0 keys (every client 401) or to a cut key."""
    keys = tmp_path / "keys"
    keys.write_text("alice:alice-key\nbob:bob-key\n")
    server = start_server(tmp_path, "--api-keys-file", str(keys))
    try:
        assert _status(server, "alice-key") == 200
        keys.write_bytes(written)
        os.kill(server.process.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while "keys not reloaded" not in open(server.log_path).read():
            assert server.process.poll() is None, open(server.log_path).read()[-3000:]
            assert time.monotonic() < deadline, "the refused reload was never logged"
            time.sleep(0.1)
        assert reason in open(server.log_path).read()
        assert _status(server, "alice-key") == 200 and _status(server, "bob-key") == 200  # the old keys
        assert _status(server, "bo") == 401
        r = httpx.post(
            server.url + "/v1/systemone", json=SHORT, timeout=120, headers={"Authorization": "Bearer bob-key"}
        )
        assert r.status_code == 200
    finally:
        stop_server(server)
