"""The fast test model, named explicitly: the embedded SmolLM2-135M-Instruct on the in-process
engine. `openjev serve` with no flags serves the default model (Qwen2.5-Coder-1.5B on
llama.cpp), so every test that loads or serves the embedded model says so with these."""

from __future__ import annotations

from openjev.config import EMBEDDED_MODEL

# as load_settings() overrides
EMBEDDED = {"engine": "transformers", "model": EMBEDDED_MODEL}
# as `openjev serve` flags
EMBEDDED_FLAGS = ("--engine", "transformers", "--model", EMBEDDED_MODEL)
# as the environment of an `openjev serve` process
EMBEDDED_ENV = {"OPENJEV_ENGINE": "transformers", "OPENJEV_MODEL": EMBEDDED_MODEL}
