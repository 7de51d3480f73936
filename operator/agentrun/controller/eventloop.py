"""The operator's event loop: uvloop unless ``AGENTRUN_EVENT_LOOP=asyncio``.

Everything the operator does per lap runs on this loop: the API server's watches and requests
(agentrun.kube.client), the lap record's S3 GET, the Lease. uvloop (libuv, with its transports and
TLS in Cython) does the same work as asyncio's selector loop with less CPU per wake-up, socket read
and TLS record, which is most of the operator's work per lap (the A/B is in bench/analysis.md).
Kopf runs on either (``kopf.run(loop=...)``, as its own CLI does when uvloop is installed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from .config import EVENT_LOOPS


@contextlib.contextmanager
def operator_loop(kind: str) -> Iterator[tuple[asyncio.AbstractEventLoop | None, str]]:
    """``(loop, what it is)`` for ``kopf.run(loop=...)``: a uvloop loop in an ``asyncio.Runner``
    (closed as ``asyncio.run`` closes its own: async generators, the default executor, the loop),
    or None (Kopf's ``asyncio.run``) for ``asyncio``."""
    if kind not in EVENT_LOOPS:
        raise ValueError(f"expected one of {', '.join(EVENT_LOOPS)}, got {kind!r}")
    if kind == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            yield runner.get_loop(), f"uvloop {getattr(uvloop, '__version__', '')}".rstrip()
        return
    yield None, "asyncio"
