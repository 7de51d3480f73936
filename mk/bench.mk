# make bench: every benchmark, one command; writes bench/results.md and bench/results-*.png
# (regenerated each time; the committed ones are the last measured run, see its header).
#   make bench                 the full set: a local control plane with 1/50/200 concurrent runs and
#                              a 1,000-run restart, 500-lap checkpoints beside LangGraph, cold start
#                              (~20-40 min on 2 CPUs)
#   BENCH_ARGS=--quick make bench   small counts, to check the harness (~5 min)
#   BENCH_ARGS=--skip-cluster make bench   no control plane
# The benchmarks need the `bench` extra (LangGraph, its SQLite checkpointer, matplotlib, py-spy),
# installed by bench-install. They run under nice -n 10: they are not tests and time nothing in CI.
.PHONY: bench bench-install
BENCH_ARGS ?=

bench: bench-install
	nice -n 10 $(PYTHON) bench/run_all.py $(BENCH_ARGS)

bench-install:
	$(PYTHON) -m pip install -q -e '.[test,bench]'
