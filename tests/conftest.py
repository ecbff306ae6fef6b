import os

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


import pytest


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server for the session, on a free loopback port (tests/support/redis_server.py)."""
    from tests.support.redis_server import RedisServer, require_redis

    server = RedisServer(require_redis())
    server.start()
    try:
        yield server
    finally:
        server.stop()
