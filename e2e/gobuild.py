"""The cached Go builds of the e2e components (``e2e/<name>/build.sh``: localkube's siblings
versitygw, Kueue and Jaeger): run the script, which is a no-op when its cache holds the build, and return
the path it prints last."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


class BuildError(RuntimeError):
    pass


def cached_build(what: str, build_sh: Path, override: str | None = None) -> str:
    """The path ``build_sh`` prints last (building ``what`` first if its cache does not hold it);
    ``override`` (an environment variable's value) instead, when set."""
    if override:
        return override
    t0 = time.time()
    r = subprocess.run(["bash", str(build_sh)], stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise BuildError(f"building {what} failed (exit {r.returncode}); see the output above")
    if time.time() - t0 > 5:
        print(f"{what} built in {time.time() - t0:.0f}s", file=sys.stderr)
    return r.stdout.strip().splitlines()[-1]
