# agentrun — top-level make targets. Component targets live in mk/*.mk.
SHELL := /bin/bash
PYTHON ?= python3

.PHONY: install test test-deps test-unit test-stress dev lint help

help:
	@echo "make install   - pip install the project with test extras (the image's pins where installable)"
	@echo "make test      - install what the tests need (tools/test-deps.sh), run the whole suite (unit, S3, e2e, the image under runc)"
	@echo "make test-stress - make test beside a CPU hog; a dated log under bench/stress/ (not part of make test)"
	@echo "make dev       - local control plane + S3 + operator + an example run"
	@echo "make lint      - ruff, mypy --strict (api, checkpoint, controller, lap, metrics, cli, inbox, notify), import-linter (run by make test)"
	@echo "make crds      - regenerate crds/ from the pydantic models"
	@echo "make bench     - run every benchmark, write bench/results.md and plots (not a test)"
	@echo "make docs      - the generated docs pages (make docs-gen), then the docs site, mkdocs --strict, into build/site"

# the versions the image pins (tools/image/requirements.txt) where the package index has them, so the
# tests run what ships; without them (an index that lacks a pin) the newest that fit pyproject.toml
install:
	$(PYTHON) -m pip install -q -e '.[test]' -c tools/image/requirements.txt || { \
	  echo "make install: the image's pinned versions are not all installable here; installing unpinned" >&2; \
	  $(PYTHON) -m pip install -q -e '.[test]'; }

# The whole suite. test-deps installs what the tests need beyond Python (runc, buildah, mmdebstrap,
# promtool, helm, chromium, localkube, versitygw, the image; idempotent and cached: a few seconds
# warm). The skipped tests are reported at the end, grouped by reason (tools/check_skips.py);
# CHECK_SKIPS=1 (.ci/run) fails on any skip tools/allowed-skips.txt does not allow.
JUNIT ?= build/test-results.xml
CHECK_SKIPS ?=
PYTEST_ARGS ?=

test: install lint test-deps
	@mkdir -p $(dir $(JUNIT))
	@rm -f $(JUNIT)
	$(PYTHON) -m pytest --junitxml=$(JUNIT) $(PYTEST_ARGS); rc=$$?; \
	  $(PYTHON) tools/check_skips.py $(if $(CHECK_SKIPS),--strict) $(JUNIT) || rc=1; exit $$rc

test-deps:
	@PYTHON=$(PYTHON) bash tools/test-deps.sh

# make test beside a CPU hog (stress-ng, else one `yes` per CPU): bench/bench_test_stress.py, run by
# bench/run_all.py as its opt-in section test_stress, so the result is recorded in bench/results.json;
# the whole output and a SUMMARY line go to bench/stress/<UTC date>.log. Commit those with results.md.
test-stress:
	$(PYTHON) bench/run_all.py --only test_stress

# mypy --strict on the typed layers, and the import-linter contracts of .importlinter
TYPED = operator/agentrun/api operator/agentrun/checkpoint operator/agentrun/controller operator/agentrun/lap operator/agentrun/kube \
	operator/agentrun/metrics operator/agentrun/cli operator/agentrun/inbox operator/agentrun/notify operator/agentrun/testfault operator/agentrun/toolkit operator/agentrun/schedule

lint:
	$(PYTHON) -m ruff check operator tests bench e2e tools
	$(PYTHON) -m mypy $(TYPED)
	$(PYTHON) -c "from importlinter.cli import lint_imports_command; lint_imports_command()"

test-unit: install
	AGENTRUN_SKIP_E2E=1 $(PYTHON) -m pytest -m 'not e2e'

-include mk/*.mk
