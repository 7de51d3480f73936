# The chaos suite (issue 7, docs/chaos.md). Included by the top-level Makefile (-include mk/*.mk).
#
#   make chaos                 the ci schedule (also run by make test via tests/e2e/test_chaos.py)
#   make chaos-full            the full schedule (every scenario on its own, more faults, 100 runs x 3 laps)
#   CHAOS_SEED=N make chaos    replay a seed (printed first by every run)
#
# Each run starts its own control plane, S3 server, tool server and operator in a temp dir
# (CHAOS_DIR to choose it) and stops them at the end.
PYTHON ?= python3
CHAOS_SEED ?=
CHAOS_DIR ?=

.PHONY: chaos chaos-full

chaos:
	CHAOS_SEED=$(CHAOS_SEED) $(PYTHON) -m e2e.chaos --schedule ci $(if $(CHAOS_DIR),--dir $(CHAOS_DIR))

chaos-full:
	CHAOS_SEED=$(CHAOS_SEED) $(PYTHON) -m e2e.chaos --schedule full $(if $(CHAOS_DIR),--dir $(CHAOS_DIR))
