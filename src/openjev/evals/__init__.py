"""Measuring and fitting decision quality: `openjev eval` and `openjev calibrate`.

Tools beside the server, never imported by the request path. The data format, metrics
and runner are stdlib plus httpx; fitting needs numpy and scipy, the reliability diagram
matplotlib (the `eval` extra, installed by `make setup`).
"""
