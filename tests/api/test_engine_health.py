"""GET /health asks an engine that reaches a server (LoadedEngine.probe) whether it answers."""

import asyncio

import httpx

from openjev.api.server.app import create_app
from openjev.config import load_settings
from openjev.engines import LoadedEngine
from tests.api.conftest import CARD
from tests.support.fakes import FakeEngine, FakeTokenizer


async def test_health_reports_an_engine_server_that_does_not_answer_and_its_return():
    problem: list[str | None] = ["the engine server cannot be reached"]

    async def probe() -> str | None:
        return problem[0]

    def load(settings):
        return LoadedEngine(engine=FakeEngine(), tokenizer=FakeTokenizer(), card=CARD, load_seconds=0.01, probe=probe)

    app = create_app(load_settings({}, environ={}), loader=load)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
            for _ in range(200):
                r = await client.get("/health")
                if r.json()["status"] != "loading":
                    break
                await asyncio.sleep(0.01)
            assert r.status_code == 503 and r.json() == {
                "status": "engine_unavailable",
                "error": "the engine server cannot be reached",
            }
            assert (await client.get("/health/live")).status_code == 200  # the process itself is alive
            problem[0] = None  # the server is back
            r = await client.get("/health")
            assert r.status_code == 200 and r.json()["status"] == "ok"
