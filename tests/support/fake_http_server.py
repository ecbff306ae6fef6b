"""The HTTP plumbing of the named fake engine servers (fake_sglang_server.py,
fake_vllm_server.py): JSON in, JSON out, one thread per request, quiet."""

from __future__ import annotations

import json
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = tuple[int, Any]  # (status, JSON body)


def serve(host: str, port: int, get: Callable[[str], Answer], post: Callable[[str, dict], Answer]) -> None:
    """Serve until killed: GET `path` -> get(path), POST `path` with a JSON body -> post(path, body)."""

    class Handler(BaseHTTPRequestHandler):
        # Keep-alive, as the real servers (uvicorn) answer: HTTP/1.0 would close every
        # connection, and a client's reconnects would be measured as its own work.
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the head and body go in two writes: no delayed-ACK wait between them

        def log_message(self, *a) -> None:  # quiet
            pass

        def _json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._json(*get(self.path))

        def do_POST(self) -> None:
            self._json(*post(self.path, json.loads(self.rfile.read(int(self.headers["content-length"])))))

    ThreadingHTTPServer((host, port), Handler).serve_forever()
