"""``httpx`` without its command-line client, for a lighter lap start.

``import httpx`` also imports ``httpx._main`` (its CLI: click, rich, pygments) whenever those
packages are installed, which an agent image or a dev environment often has (import-linter brings
rich): ~50 ms of an idle lap start, up to 170 ms on a busy node, for nothing the lap uses. A ``None``
in ``sys.modules`` makes that import fail, and httpx then defines a stub ``main``. Import httpx in
the lap through this module: ``from agentrun.lap.httpx_lite import httpx``.
"""

from __future__ import annotations

import sys

if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]

import httpx  # noqa: E402

__all__ = ["httpx"]
