"""Run the operator under yappi (CPU clock, every thread) and write its per-function figures when it
exits: ``OUT.pstat`` (pstats format, for snakeviz or ``python -m pstats``) and ``OUT.txt`` (the
functions by own CPU time). A profiling aid for bench_operator_cluster.py (``BENCH_OPERATOR_YAPPI=OUT``);
yappi's own cost roughly doubles the operator's CPU, so read shares and call counts, not times.

    python bench/yappi_operator.py OUT operator [args...]
"""

from __future__ import annotations

import atexit
import runpy
import sys

import yappi


def main() -> None:
    out = sys.argv[1]
    sys.argv = ["agentrun", *sys.argv[2:]]
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)

    def dump() -> None:
        yappi.stop()
        stats = yappi.get_func_stats()
        stats.save(out + ".pstat", type="pstat")
        with open(out + ".txt", "w", encoding="utf-8") as fh:
            stats.sort("tsub").print_all(out=fh, columns={0: ("name", 100), 1: ("ncall", 12), 2: ("tsub", 10),
                                                          3: ("ttot", 10)})
            fh.write("\n")
            yappi.get_thread_stats().print_all(out=fh)

    atexit.register(dump)
    runpy.run_module("agentrun.cli.main", run_name="__main__")


if __name__ == "__main__":
    main()
