"""What ``agentrun lap`` runs: one lap configured by the process environment, exit code per
docs/contracts.md. Imports neither click nor pydantic itself (``agentrun.cli.entry`` calls it for
the exact command line ``agentrun lap``, so the lap pod imports no click at all).

``run`` sets ``PYDANTIC_DISABLE_PLUGINS=__all__`` unless the environment sets it (to anything,
even empty) before the lap's modules build their first pydantic model: pydantic otherwise scans
the entry points of every installed distribution for its plugins then, 10-25 ms of every lap pod's
start, and the lap uses no pydantic plugin. It is set here, by the lap's process entry, and not by
importing a package: an importer of ``agentrun`` keeps its environment (and its plugins).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"


def run() -> int:
    """Run the lap configured by ``os.environ``; its exit code."""
    os.environ.setdefault(PLUGINS_ENV, "__all__")
    from agentrun.lap.process import run_from_env

    return run_from_env(os.environ)


def main() -> NoReturn:
    sys.exit(run())
