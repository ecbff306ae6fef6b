"""One real SGLang-protocol server per kind for the whole of tests/sglang.

test_sglang_server.py and test_faults.py need the same server (same model, same sizes), and
starting one costs a model load, and for SGLang-JAX a compile of every shape: they share it.
The fault tests stop, kill and restart it (on the same port, updating this object in place:
SglServer.take_over), so they run after every other test of their kind (the hook below).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sglang import server as sgl

# Up to 4 branches at once, up to ~1,000 tokens each (see sgl.sizing_flags): what both modules ask.
SIZING = {"max_running": 4, "context_length": 1024, "chunk": 512}


@pytest.fixture(scope="session", params=sgl.enabled_kinds())
def sgl_server(tmp_path_factory, request):
    """A server of each kind asked for, started once (its idle scheduler burns a core:
    stopped after the last test of its kind)."""
    kind = request.param
    root = tmp_path_factory.mktemp(f"sgl_{kind}")
    folder = sgl.model_folder(kind, root)
    srv = sgl.start(folder, root / "server-1.log", timeout_s=600, kind=kind, **SIZING)
    srv.folder, srv.root = folder, root
    try:
        yield srv
    finally:
        srv.stop()


@pytest.hookimpl(trylast=True)  # after pytest grouped the tests by the session fixture's kind
def pytest_collection_modifyitems(items):
    """Within each kind, the fault tests (which kill the shared server) last, in file order;
    the tests of other folders keep their places."""
    here = Path(__file__).parent
    order = sgl.enabled_kinds()

    def key(item):
        spec = getattr(item, "callspec", None)
        kind = spec.params.get("sgl_server") if spec is not None else None
        return (order.index(kind) if kind in order else -1, item.path.name == "test_faults.py")

    places = [i for i, item in enumerate(items) if item.path.parent == here]
    for i, item in zip(places, sorted((items[i] for i in places), key=key), strict=True):
        items[i] = item
