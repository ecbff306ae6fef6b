"""A byte-for-byte HTTP forwarder that serves one route under another name.

jevcompat always calls `<base>/v1/systemone`; to run it against an alias route, put this in
front of the server: requests for /v1/systemone go to the alias, everything else (and every
header, body and status) passes through unchanged. Test helper only."""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "upgrade"}


def start(upstream: str, route: str, alias: str) -> tuple[str, ThreadingHTTPServer]:
    """Serve on a free loopback port; returns (its URL, the server to shutdown())."""
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            path = self.path
            if path == route or path.startswith(route + "?"):
                path = alias + path[len(route) :]
                server.rewritten += 1
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=600)
            try:
                conn.request(self.command, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            finally:
                conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _forward

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.rewritten = 0  # requests sent to the alias: proof the suite exercised it
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
