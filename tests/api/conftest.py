import asyncio
import threading
from contextlib import asynccontextmanager

import httpx
import pytest

from openjev.api.server.app import create_app
from openjev.config import load_settings
from openjev.engines import LoadedEngine, ModelCard
from tests.support.fakes import FakeEngine, FakeTokenizer

CARD = ModelCard(name="fake-model-1", description="a fake", release_date="2026-01-01")

# Settings every running_app takes besides its own: where the per-key limits are kept
# (`limits_store`: this process's memory, or a real Redis).
STORE: dict[str, str] = {}


@pytest.fixture(params=["memory", "redis"])
def limits_store(request):
    """Runs a limits test on both backends: the in-memory default, and a real redis-server
    (emptied first) named by --limits-redis-url."""
    if request.param == "memory":
        yield "memory"
        return
    server = request.getfixturevalue("redis_server")
    if server.process is None:  # a test that killed it left it down
        server.start()
    server.flush()
    STORE["limits_redis_url"] = server.url
    try:
        yield "redis"
    finally:
        STORE.clear()


def fake_loader(
    engine: FakeEngine, gate: threading.Event | None = None, fail: Exception | None = None, card: ModelCard = CARD
):
    def load(settings):
        if gate is not None:
            gate.wait(10)
        if fail is not None:
            raise fail
        return LoadedEngine(engine=engine, tokenizer=FakeTokenizer(), card=card, load_seconds=0.01)

    return load


@asynccontextmanager
async def running_app(
    engine: FakeEngine | None = None,
    *,
    gate=None,
    fail=None,
    on_fatal=None,
    on_loaded=None,
    wait=True,
    card: ModelCard = CARD,
    **settings,
):
    """The app with its lifespan running, and an httpx client on it (in-process ASGI)."""
    engine = engine or FakeEngine()
    loader = fake_loader(engine, gate, fail, card)
    app = create_app(
        load_settings({**STORE, **settings}, environ={}), loader=loader, on_fatal=on_fatal, on_loaded=on_loaded
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            if wait:
                await healthy(client)
            yield client, engine


async def healthy(client: httpx.AsyncClient) -> None:
    """Wait (up to ~2 s) until the app's /health says the model is loaded."""
    for _ in range(200):
        if (await client.get("/health")).status_code == 200:
            return
        await asyncio.sleep(0.01)


@pytest.fixture
async def api():
    async with running_app() as pair:
        yield pair
