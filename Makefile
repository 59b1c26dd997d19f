# Two commands on a fresh machine: `make demo` (creates .venv, runs the demo), `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test env clean

$(BIN)/psa-edge: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: an unpinned resolution would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

env: $(BIN)/psa-edge

demo: env
	$(BIN)/psa-edge demo

test: env
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
