"""The engine registry's prestart: declared on an entry, called with the sections it names."""

from openjev.config import load_settings
from openjev.engines import ENGINES, EngineEntry, prestart_engine
from tests.support.models import EMBEDDED


def _never(*_sections):
    raise AssertionError("not called by prestart_engine")


def test_a_declared_prestart_is_called_with_its_sections(monkeypatch):
    calls = []
    entry = EngineEntry(
        load=_never,
        preflight=_never,
        sections=("served",),
        prestart=lambda *sections: calls.append(sections),
        prestart_sections=("served", "inprocess"),
    )
    monkeypatch.setitem(ENGINES, "transformers", entry)
    settings = load_settings(EMBEDDED, environ={})
    prestart_engine(settings)
    assert calls == [(settings.served, settings.inprocess)]


def test_only_the_llamacpp_engine_declares_one():
    assert {name for name, entry in ENGINES.items() if entry.prestart is not None} == {"llamacpp"}
    prestart_engine(load_settings(EMBEDDED, environ={}))  # the transformers engine: nothing begun, nothing raised
