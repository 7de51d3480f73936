# agentrun — top-level make targets. Component targets live in mk/*.mk.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: install test test-unit test-e2e dev lint crds help

help:
	@echo "make install   - pip install the project with test extras"
	@echo "make test      - run the whole test suite (unit, S3 integration, e2e on a local control plane)"
	@echo "make dev       - local control plane + S3 + operator + an example run"
	@echo "make crds      - regenerate crds/ from the pydantic models"

install:
	$(PYTHON) -m pip install -q -e '.[test]'

test: install
	$(PYTHON) -m pytest

test-unit: install
	AGENTRUN_SKIP_E2E=1 $(PYTHON) -m pytest -m 'not e2e'

-include mk/*.mk
