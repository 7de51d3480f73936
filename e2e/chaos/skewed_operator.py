"""``agentrun operator`` with its Lease elector's wall clock off by ``--offset`` seconds (and its
clock running at ``--rate``), for the chaos suite's clock-skew scenario.

The skew goes in through the elector's injectable time source
(``agentrun.kube.lease.set_default_clock``), nothing else is changed: the replica writes
renewTime/acquireTime from its skewed clock, and must still never take a Lease that another live
replica renews (expiry is measured by its own observed time, not by comparing clocks).

    python -m e2e.chaos.skewed_operator --offset 45 [--rate 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

from agentrun.kube import lease


class SkewedClock:
    def __init__(self, offset: float, rate: float = 1.0) -> None:
        self.offset, self.rate, self.t0 = offset, rate, time.monotonic()

    def wall(self) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=self.offset + (time.monotonic() - self.t0) * (self.rate - 1))

    def monotonic(self) -> float:
        return self.t0 + (time.monotonic() - self.t0) * self.rate

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds / self.rate)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m e2e.chaos.skewed_operator")
    ap.add_argument("--offset", type=float, required=True, help="seconds the wall clock is off (+ ahead, - behind)")
    ap.add_argument("--rate", type=float, default=1.0, help="clock rate (1.0: true time)")
    a = ap.parse_args(argv)
    lease.set_default_clock(SkewedClock(a.offset, a.rate))
    print(f"skewed_operator: Lease clock offset {a.offset}s, rate {a.rate}", flush=True)
    from agentrun.cli.main import main as cli

    cli(["operator"], prog_name="agentrun")


if __name__ == "__main__":
    main()
