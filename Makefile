VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck unit bench clean compile uncompile test-compiled

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
