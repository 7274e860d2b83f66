# Strata: `make run` starts everything on embedded defaults; `make test` runs the test suite.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8000

.PHONY: install run test test-fast lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch 2.13.0 first (a local wheel where the machine has one); then everything else.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.3"
	$(BIN)/python -m pip install -q -e ".[node,dev,bench]"
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/strata up --port $(PORT)

test: install
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/strata bench control-plane

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
