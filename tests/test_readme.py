from pathlib import Path

from openjev.config import env_name, flag_name, setting_fields

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()


def test_configuration_table_lists_every_setting():
    for _, f in setting_fields():
        assert f"| `{flag_name(f)}` | `{env_name(f)}` |" in CONFIGURATION, f.name


def test_the_two_commands_are_named():
    assert "make serve" in README and "make test" in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_stays_within_250_lines():
    assert len(README.splitlines()) <= 250  # the rest belongs in docs/
