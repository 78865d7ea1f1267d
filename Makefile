# mpigate — two commands on a fresh Debian machine with Python 3.11 (as root):
#   make demo   set everything up and run the main job on the bundled example org
#   make test   set everything up and run the test suite (+ lint)
# Everything lives in .venv; Debian packages are installed with apt-get when missing.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.mpigate-installed
# Debian packages the tests and the demo use (OpenMPI for the real MPI tests, Chromium for the
# report rendering test, git for revisions). Installed only when missing.
DEB_PACKAGES ?= git openmpi-bin libopenmpi-dev iproute2 chromium
PYTEST_ARGS ?=

.PHONY: all demo test lint format docs lock system-deps venv clean help report-screenshot

all: test

help:
	@echo "make demo    - set up and run the demo on the example org"
	@echo "make test    - set up, run the tests and lint"
	@echo "make lint    - ruff + mypy --strict on src/mpigate"
	@echo "make docs    - regenerate generated docs (config reference)"
	@echo "make lock    - refresh constraints.txt from the current venv"
	@echo "make report-screenshot - regenerate docs/img/report.png (headless Chromium)"

system-deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	     (apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends $$missing >/dev/null)); \
	  else echo "warning: missing Debian packages:$$missing (run as root or install them)"; fi; \
	fi

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $@

venv: $(STAMP)

test: system-deps venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory lint

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

docs: venv
	$(BIN)/python -m mpigate.config.reference > docs/config-reference.md
	$(BIN)/python scripts/gen_policy_docs.py

demo: system-deps venv
	@PATH="$(abspath $(BIN)):$$PATH" bash scripts/demo.sh

report-screenshot: system-deps venv
	$(BIN)/python -m tests.report.chromium --out docs/img/report.png

lock: venv
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
