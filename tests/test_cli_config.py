import json
import subprocess
import sys

import pytest

from openjev.cli import _settings, build_parser
from openjev.config import load_settings
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
    assert (s.port, s.api_keys, s.temperature, s.model, s.max_in_flight) == (9002, ("a", "b"), 0.5, "/m", 3)
    assert load_settings({}, environ={}).api_keys == ()


@pytest.mark.parametrize(
    "env", [{"OPENJEV_PORT": "eighty"}, {"OPENJEV_MAX_IN_FLIGHT": "0"}, {"OPENJEV_TEMPERATURE": "-1"}]
)
def test_bad_settings_are_config_errors(env):
    with pytest.raises(ConfigError):
        load_settings({}, environ=env)


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
    assert (s.port, s.api_keys, s.max_questions, s.engine_timeout_s) == (1234, ("k1", "k2"), 8, 2.5)


def test_schema_prints_openapi_without_loading_ml_frameworks():
    code = (
        "import sys, io, contextlib; from openjev.cli import main; buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf): rc = main(['schema'])\n"
        "assert rc == 0 and 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
        "sys.stdout.write(buf.getvalue())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    spec = json.loads(out)
    assert spec["openapi"].startswith("3.") and "/v1/systemone" in spec["paths"]
