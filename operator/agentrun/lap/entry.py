"""What ``agentrun lap`` runs: one lap configured by the process environment, exit code per
docs/contracts.md. Imports neither click nor pydantic itself (``agentrun.cli.entry`` calls it for
the exact command line ``agentrun lap``, so the lap pod imports no click at all).

``run`` sets ``PYDANTIC_DISABLE_PLUGINS=__all__`` unless the environment sets it (to anything,
even empty) before the lap's modules build their first pydantic model: pydantic otherwise scans
the entry points of every installed distribution for its plugins then, 10-25 ms of every lap pod's
start, and the lap uses no pydantic plugin. It is set here, by the lap's process entry, and not by
importing a package: an importer of ``agentrun`` keeps its environment (and its plugins).

``run`` also makes ``import trio`` fail in the lap process (a ``None`` in ``sys.modules``, unless
something imported trio already). httpcore (under httpx: the lap's model and tool clients) imports
trio whenever it is installed, to support trio event loops; the lap runs no trio loop (its MCP
client runs ``anyio.run`` on asyncio), and the import is 50-60 ms of a lap's start on a node or dev
environment that has trio installed (the image does not). httpcore and anyio treat the failed import
as trio not installed. Also the process entry's, not a package's: an embedding process keeps trio.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

PLUGINS_ENV = "PYDANTIC_DISABLE_PLUGINS"
#: Imported by libraries the lap uses only to support an event loop the lap never runs (see above).
UNUSED_LOOPS = ("trio",)


def prepare_process() -> None:
    """What the lap's process entry sets before it imports the lap (see above)."""
    os.environ.setdefault(PLUGINS_ENV, "__all__")
    for name in UNUSED_LOOPS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def run() -> int:
    """Run the lap configured by ``os.environ``; its exit code."""
    prepare_process()
    from agentrun.lap.process import run_from_env

    return run_from_env(os.environ)


def main() -> NoReturn:
    sys.exit(run())
