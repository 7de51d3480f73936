# The chaos suite (issue 7, docs/chaos.md). Included by the top-level Makefile (-include mk/*.mk).
#
#   make chaos                 the ci schedule (also run by make test via tests/e2e/test_chaos.py)
#   make chaos-full            the full schedule (every scenario on its own, more faults, 100 runs x 3 laps)
#   CHAOS_SEED=N make chaos    replay a seed (printed first by every run)
#   make soak                  N runs x M minutes of random faults, then the invariants (not in make test)
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

# make soak: proof on demand, NOT part of make test (docs/chaos.md, "Soak"). Waves of SOAK_RUNS runs
# of up to SOAK_LAPS laps with random faults of every kind from the seed (operator, pod, kubelet,
# etcd and apiserver restarts, S3 outages; every 3rd wave two replicas with skewed Lease clocks, an
# approval burst and a leader kill), the invariants after every wave, until SOAK_MINUTES have passed.
SOAK_RUNS ?= 20
SOAK_LAPS ?= 4
SOAK_MINUTES ?= 30

.PHONY: soak chaos-new

soak:
	CHAOS_SEED=$(CHAOS_SEED) $(PYTHON) -m e2e.chaos --schedule soak --runs $(SOAK_RUNS) --laps $(SOAK_LAPS) \
		--minutes $(SOAK_MINUTES) $(if $(CHAOS_DIR),--dir $(CHAOS_DIR))

# the faults of issue 17 alone (etcd + kubelet restarts, leader kill in an approval burst, clock skew)
chaos-new:
	CHAOS_SEED=$(CHAOS_SEED) $(PYTHON) -m e2e.chaos --schedule new $(if $(CHAOS_DIR),--dir $(CHAOS_DIR))
