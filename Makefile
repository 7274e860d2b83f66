# Strata: `make run` starts everything on embedded defaults; `make test` runs the test suite.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8000

.PHONY: install browser run test lint bench screenshots clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# The CPU build of torch 2.13.0 first (a local wheel where the machine has one); then everything else.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.3"
	$(BIN)/python -m pip install -q -e ".[node,dev,bench]"
	touch $(STAMP)

install: $(STAMP)

# Debian's Chromium for the browser tests (never a browser downloaded by a test tool). Needs root or sudo;
# without either the browser tests skip (CI sets STRATA_REQUIRE_SERVICES=1, which turns that skip into a failure).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; else \
	    echo "make: chromium is missing and there is no root or sudo to install it; browser tests will skip"; exit 0; fi; \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

run: install
	$(BIN)/strata up --port $(PORT)

test: install browser
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/strata bench control-plane
	$(BIN)/strata bench dashboard

# Saves the main pages as PNG files in docs/img (the README shows them), from the browser tests.
screenshots: install browser
	STRATA_SCREENSHOT_DIR=$(CURDIR)/docs/img $(BIN)/python -m pytest -q tests/e2e/test_browser.py tests/e2e/test_browser_gpushare.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
