# agentrun — top-level make targets. Component targets live in mk/*.mk.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: install test test-unit dev lint help

help:
	@echo "make install   - pip install the project with test extras (the image's pins where installable)"
	@echo "make test      - run the whole test suite (unit, S3 integration, e2e on a local control plane)"
	@echo "make dev       - local control plane + S3 + operator + an example run"
	@echo "make lint      - ruff, mypy --strict (api, checkpoint, controller, lap, metrics, cli, inbox, notify), import-linter (run by make test)"
	@echo "make crds      - regenerate crds/ from the pydantic models"
	@echo "make bench     - run every benchmark, write bench/results.md and plots (not a test)"

# the versions the image pins (tools/image/requirements.txt) where the package index has them, so the
# tests run what ships; without them (an index that lacks a pin) the newest that fit pyproject.toml
install:
	$(PYTHON) -m pip install -q -e '.[test]' -c tools/image/requirements.txt || { \
	  echo "make install: the image's pinned versions are not all installable here; installing unpinned" >&2; \
	  $(PYTHON) -m pip install -q -e '.[test]'; }

test: install lint
	$(PYTHON) -m pytest

# mypy --strict on the typed layers, and the import-linter contracts of .importlinter
TYPED = operator/agentrun/api operator/agentrun/checkpoint operator/agentrun/controller operator/agentrun/lap \
	operator/agentrun/metrics operator/agentrun/cli operator/agentrun/inbox operator/agentrun/notify operator/agentrun/testfault

lint:
	$(PYTHON) -m ruff check operator tests bench e2e tools
	$(PYTHON) -m mypy $(TYPED)
	$(PYTHON) -c "from importlinter.cli import lint_imports_command; lint_imports_command()"

test-unit: install
	AGENTRUN_SKIP_E2E=1 $(PYTHON) -m pytest -m 'not e2e'

-include mk/*.mk
