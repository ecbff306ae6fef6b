import json
import os
import subprocess
import sys

import pytest

from openjev.cli import _settings, build_parser
from openjev.config import DEFAULT_ENGINE, DEFAULT_MODEL, INSTALL_DEFAULT, load_settings
from openjev.errors import ConfigError


def test_env_twins_are_parsed_and_flags_win():
    env = {
        "OPENJEV_PORT": "9001",
        "OPENJEV_API_KEYS": "a, b,",
        "OPENJEV_TEMPERATURE": "0.5",
        "OPENJEV_MODEL": "/m",
        "OPENJEV_MAX_IN_FLIGHT": "3",
    }
    s = load_settings({"port": 9002}, environ=env)
    got = (s.listen.port, s.keys.api_keys, s.quality.temperature, s.served.model, s.limits.max_in_flight)
    assert got == (9002, ("a", "b"), 0.5, "/m", 3)
    assert load_settings({}, environ={}).keys.api_keys == ()


@pytest.mark.parametrize(
    "env", [{"OPENJEV_PORT": "eighty"}, {"OPENJEV_MAX_IN_FLIGHT": "0"}, {"OPENJEV_TEMPERATURE": "-1"}]
)
def test_bad_settings_are_config_errors(env):
    with pytest.raises(ConfigError):
        load_settings({}, environ=env)


@pytest.mark.parametrize(
    "value", ["-1", "100", "100,", ",30d", "0,30d", "100,0d", "100,30", "100,30y", "a,b", "100,-1d"]
)
def test_a_bad_outcome_retention_is_a_config_error(value):
    with pytest.raises(ConfigError, match="outcome-retention"):
        load_settings({"outcome_retention": value}, environ={})


def test_outcome_retention_reads_count_and_age():
    assert load_settings({}, environ={}).tasks.retention() == (100_000, 30 * 86400.0)
    assert load_settings({"outcome_retention": "50,12h"}, environ={}).tasks.retention() == (50, 12 * 3600.0)
    assert load_settings({"outcome_retention": "0"}, environ={}).tasks.retention() is None


def test_cli_flags_map_onto_settings(monkeypatch):
    monkeypatch.delenv("OPENJEV_API_KEYS", raising=False)
    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "1234",
            "--api-key",
            "k1",
            "--api-key",
            "k2",
            "--max-questions",
            "8",
            "--engine-timeout-s",
            "2.5",
        ]
    )
    s = _settings(args)
    assert (s.listen.port, s.keys.api_keys, s.limits.max_questions, s.limits.engine_timeout_s) == (
        1234,
        ("k1", "k2"),
        8,
        2.5,
    )


def test_schema_prints_openapi_without_loading_ml_frameworks_or_writing_files(tmp_path):
    code = (
        "import sys, io, contextlib; from openjev.cli import main; buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf): rc = main(['schema'])\n"
        "assert rc == 0 and 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "sys.stdout.write(buf.getvalue())"
    )
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    spec = json.loads(out)
    assert spec["openapi"].startswith("3.") and "/v1/systemone" in spec["paths"] and "/v1/tasks" in spec["paths"]
    assert list(tmp_path.rglob("*")) == []  # no task store (nor anything else) created


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--temperature", "nan"], "temperature must be a finite number"),
        (["--temperature", "inf"], "temperature must be a finite number"),
        (["--temperature", "1e-9"], "temperature must be between"),
        (["--engine-timeout-s", "nan"], "engine_timeout_s must be a finite number"),
        (["--engine-timeout-s=-inf"], "engine_timeout_s must be a finite number"),
        (["--batch-window-ms", "nan"], "batch_window_ms must be a finite number"),
        (["--port", "70000"], "port must be a port number"),
        (["--sglang-port", "0"], "sglang_port must be a port number"),
        (["--head-timeout-s", "0"], "head_timeout_s must be positive"),
        (["--body-timeout-s", "inf"], "body_timeout_s must be a finite number"),
        (["--max-connections", "0"], "max_connections must be positive"),
        (["--max-head-bytes", "100"], "max_head_bytes must be at least 1024"),
        (["--max-rotations", "1000", "--rotations", "4"], "max_rotations must be at most 255"),
        (["--retry-after-s", "100000"], "retry_after_s must be at most"),
        (["--docs", "open"], "docs must be public, auth or off"),
        (["--allowed-hosts", "a b"], "allowed_hosts"),
        (["--trusted-proxies", "proxy.example"], "trusted_proxies: 'proxy.example' is not an IP address"),
        (["--log-level", "loud"], "log_level must be"),
        (["--workers", "2"], "--workers 2: only an API tier in front of a running engine server"),
        (["--limits-redis-mode", "maybe"], "limits_redis_mode must be one of closed, local, open"),
    ],
)
def test_serve_refuses_nonsense_settings_before_anything_loads(flags, why):
    """Exit 2 with the reason, at once: no model loads, nothing listens (a server started
    with --temperature nan used to be healthy and answer every request 0.5 or 500)."""
    code = (
        "import sys; from openjev.cli import main; rc = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules and 'uvicorn' not in sys.modules, 'loaded something'\n"
        "sys.exit(rc)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OPENJEV_")}
    run = subprocess.run(
        [sys.executable, "-c", code, "serve", *flags], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 2, run.stderr
    assert why in run.stderr and run.stderr.startswith("openjev: ")


def test_serve_with_no_flags_serves_what_make_serve_serves():
    """One default: `openjev serve` with no flags and `make serve` name the same engine and model."""
    from pathlib import Path

    makefile = (Path(__file__).parent.parent / "Makefile").read_text()
    served = load_settings({}, environ={}).served
    assert (served.engine, served.model) == (DEFAULT_ENGINE, DEFAULT_MODEL) == ("llamacpp", "qwen2.5-coder-1.5b")
    assert f"MODEL ?= {DEFAULT_MODEL}\n" in makefile
    assert "openjev serve --engine llamacpp --model $(MODEL)" in makefile


def test_serve_with_no_flags_before_the_default_is_installed_says_how_to_install_it(tmp_path):
    """Exit 2 naming the one command that installs the default model (an empty cache: its GGUF
    is missing, and llama-cpp-python too where it is not installed), before anything loads."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("OPENJEV_")}
    run = subprocess.run(
        [sys.executable, "-m", "openjev", "serve", "--cache-dir", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 2, run.stderr
    assert f"the default model, {DEFAULT_MODEL} on llama.cpp, is not installed yet" in run.stderr, run.stderr
    assert f"`{INSTALL_DEFAULT}`" in run.stderr and "--model embedded" in run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("name", ["OPENJEV_TEMPERATURE", "OPENJEV_ENGINE_TIMEOUT_S", "OPENJEV_HEAD_TIMEOUT_S"])
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf"])
def test_non_finite_numbers_from_the_environment_are_refused(name, raw):
    with pytest.raises(ConfigError, match="finite"):
        load_settings({}, environ={name: raw})


def test_allowed_hosts_take_commas_and_repeats_and_the_environment():
    args = build_parser().parse_args(["serve", "--allowed-hosts", "a.example,b.example", "--allowed-hosts", "*.c"])
    assert _settings(args).listen.allowed_hosts == ("a.example", "b.example", "*.c")
    assert load_settings({}, environ={"OPENJEV_ALLOWED_HOSTS": "x, y"}).listen.allowed_hosts == ("x", "y")


def test_connection_limits_are_shown_in_limits():
    from openjev.api.server.limits import limits_body

    limits = limits_body(load_settings({}, environ={}), None, None)
    assert {"max_connections", "head_timeout_s", "body_timeout_s", "max_head_bytes"} <= set(limits)


def test_the_defaults_are_valid():
    assert load_settings({}, environ={}).validate()


def test_trusted_proxies_take_addresses_and_networks():
    args = build_parser().parse_args(["serve", "--trusted-proxies", "127.0.0.1,10.0.0.0/8", "--trusted-proxies", "::1"])
    assert _settings(args).listen.trusted_proxies == ("127.0.0.1", "10.0.0.0/8", "::1")
    assert load_settings({}, environ={"OPENJEV_TRUSTED_PROXIES": "192.168.1.1"}).listen.trusted_proxies == (
        "192.168.1.1",
    )


def test_the_readouts_config_accepts_are_the_cores():
    from openjev.core.readouts import READOUT_NAMES

    for name in READOUT_NAMES:
        assert load_settings({"readout": name}, environ={}).quality.readout == name
    with pytest.raises(ConfigError, match="readout must be one of"):
        load_settings({"readout": "tea-leaves"}, environ={})


def test_flat_names_reach_their_sections_and_unknown_ones_are_refused():
    from openjev.config import replace_settings, section_of, setting_fields

    names = [f.name for _, f in setting_fields()]
    assert len(names) == len(set(names)) == 83  # one flat name per flag and environment twin
    s = load_settings({"dtype": "float32", "max_in_flight": 3, "rotations": 2}, environ={"OPENJEV_DOCS": "off"})
    assert (s.served.dtype, s.limits.max_in_flight, s.quality.rotations, s.listen.docs) == ("float32", 3, 2, "off")
    assert section_of("api_keys_file") == "keys" and section_of("slice_ms") == "inprocess"
    moved = replace_settings(s, port=9100, sglang_args=("--tp", "2"))
    assert (moved.listen.port, moved.remote.sglang_args, moved.served) == (9100, ("--tp", "2"), s.served)
    with pytest.raises(TypeError, match="unknown setting 'no_such'"):
        load_settings({"no_such": 1}, environ={})


def test_left_at_default_is_told_from_set():
    s = load_settings({}, environ={})
    assert s.quality.readout_left() and s.quality.abstain_left() and not s.quality.rotations_moved()
    moved = load_settings({"rotations": 2, "abstain_min_confidence": 0.2}, environ={})
    assert not moved.quality.readout_left() and not moved.quality.abstain_left() and moved.quality.rotations_moved()


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"workers": 2, "engine": "llamacpp"}, "an in-process engine holds the model"),
        ({"workers": 2, "engine": "sglang"}, "with --connect URL"),
        ({"workers": 2, "engine": "vllm", "connect": "http://127.0.0.1:9"}, "without --limits-redis-url"),
        ({"limits_redis_url": "http://127.0.0.1:6379"}, "must start with redis://"),
        ({"limits_redis_timeout_ms": 0.0}, "limits_redis_timeout_ms must be in"),
        ({"limits_replicas": 0}, "limits_replicas must be between 1 and 1024"),
    ],
)
def test_fleet_settings_that_cannot_work_are_refused(values, why):
    with pytest.raises(ConfigError, match=why):
        load_settings(values, environ={})


def test_workers_in_front_of_a_running_engine_with_a_shared_store_are_accepted():
    settings = load_settings(
        {"workers": 2, "engine": "sglang", "connect": "http://127.0.0.1:9", "limits_redis_url": "redis://127.0.0.1:1"},
        environ={},
    )
    assert (settings.fleet.workers, settings.fleet.limits_redis_mode) == (2, "local")


def test_the_task_settings_are_checked_and_name_their_file(tmp_path):
    from pathlib import Path

    with pytest.raises(ConfigError, match="task_target_precision must be between 0 and 1"):
        load_settings({"task_target_precision": 1.5}, environ={})
    with pytest.raises(ConfigError, match="max_task_examples must be positive"):
        load_settings({"max_task_examples": 0}, environ={})
    tasks = load_settings(environ={}).tasks
    assert tasks.database(str(tmp_path)) == tmp_path / "tasks.sqlite3"
    assert load_settings({"tasks_db": "off"}, environ={}).tasks.database(str(tmp_path)) is None
    chosen = load_settings(environ={"OPENJEV_TASKS_DB": str(tmp_path / "x.db")}).tasks
    assert chosen.database("/elsewhere") == Path(tmp_path / "x.db")


def test_max_connections_per_client_is_not_negative_and_0_turns_it_off():
    from openjev.config import load_settings
    from openjev.errors import ConfigError

    assert load_settings({"max_connections_per_client": 0}, environ={}).connections.max_connections_per_client == 0
    with pytest.raises(ConfigError, match=r"max.connections.per.client"):
        load_settings({"max_connections_per_client": -1}, environ={})
