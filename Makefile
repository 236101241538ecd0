# nodelock: `make demo` runs the main job on a local GPU cluster, `make test` runs every test.
# Both set everything up from nothing: a virtualenv in .venv and the Kubernetes binaries,
# built from their Go modules into ~/.cache/nodelock (reused on later runs).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup test lint unit demo bench binaries proto clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

binaries: setup
	$(BIN)/nodelock devcluster build

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy --strict .
	$(BIN)/lint-imports

unit: setup
	$(BIN)/pytest -m unit

test: lint binaries
	$(BIN)/pytest

demo: setup
	$(BIN)/nodelock demo

bench: setup binaries
	$(BIN)/python -m bench

proto: setup
	$(BIN)/python -m proto.generate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
