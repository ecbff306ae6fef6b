"""Engines behind an HTTP server (SGLang, SGLang-JAX, vLLM): the one HTTP engine (engine.py)
given a server's wire as data (protocol.py; sglang_protocol.py, vllm_protocol.py,
vllm_batch.py), the submission strategies (submission.py), the registry entries and start-up
checks (sglang.py, vllm.py), reaching or starting the server (remote.py, server_process.py).
"""
