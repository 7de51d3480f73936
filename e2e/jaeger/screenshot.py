"""How docs/images/trace-jaeger.png (docs/observability.md "Traces") was made: the trace of a real
run in Jaeger's own UI, in Chromium.

1. ``e2e/jaeger/build-ui.sh`` builds the Jaeger UI (npm, cached; the binary of build.sh has no UI).
2. The e2e test ``tests/e2e/test_traces.py::test_a_five_lap_run_with_an_approval_is_one_trace_in_jaeger``
   runs as in CI (local control plane, operator, S3, laps as pods), with the ``jaeger`` fixture's
   Jaeger serving those assets (``JAEGER_UI_ASSETS``, e2e/jaeger_server.py).
3. When the test has passed, while its Jaeger still runs, a pytest plugin of this script opens
   ``/trace/<the run's trace id>`` in Chromium (Playwright, as tests/e2e/test_inbox_browser.py
   launches it) and saves the page.

Docs only: the tests and CI never need the UI build. Heavy (a control plane): run it with
``flock /tmp/heavy.lock python e2e/jaeger/screenshot.py [--out docs/images/trace-jaeger.png]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/e2e/test_traces.py::test_a_five_lap_run_with_an_approval_is_one_trace_in_jaeger"
RUN = "traced"  # the run the test makes
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]


def build_ui() -> str:
    out = subprocess.run(["bash", str(Path(__file__).with_name("build-ui.sh"))], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    return out.strip().splitlines()[-1]


def shoot(query_url: str, trace_id: str, out: Path) -> None:
    """Jaeger's trace page of ``trace_id`` as a PNG at ``out``."""
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("AGENTRUN_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{query_url}/trace/{trace_id}")
            page.get_by_text("agentrun.run traced").first.wait_for(timeout=30_000)  # the run's root span row
            page.wait_for_timeout(1000)  # the timeline's layout settles
            rows = page.locator(".span-row").count()  # a virtualized list: make the window fit every row
            if rows:
                page.set_viewport_size({"width": 1600, "height": min(4000, 320 + 29 * rows)})
                page.wait_for_timeout(1000)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()


class Shot:
    """After the test passed (its session-scoped Jaeger still running): the screenshot."""

    def __init__(self, out: Path) -> None:
        self.out, self.taken = out, False

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        outcome = yield
        if outcome.excinfo is not None or item.nodeid != TEST:
            return
        from agentrun.api.contract import run_trace_id

        env, jaeger = item.funcargs["env"], item.funcargs["jaeger"]
        shoot(jaeger.query_url, run_trace_id(env.get(RUN)["metadata"]["uid"]), self.out)
        self.taken = True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "trace-jaeger.png")
    ap.add_argument("--ui", help="built Jaeger UI assets (default: e2e/jaeger/build-ui.sh's)")
    ap.add_argument("--tests", nargs="*", default=[TEST],
                    help="the tests to run (default: the 5-lap one; e.g. tests/e2e/test_traces.py for all of them)")
    a = ap.parse_args()
    os.environ["JAEGER_UI_ASSETS"] = a.ui or build_ui()
    # the lap pods run `python` from PATH (the process kubelet): this interpreter's, with agentrun
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    shot = Shot(a.out.resolve())
    os.chdir(ROOT)
    code = pytest.main(["-q", "-p", "no:cacheprovider", *a.tests], plugins=[shot])
    if code == 0 and shot.taken:
        print(f"screenshot: {shot.out}", file=sys.stderr)
        return 0
    print("screenshot: not taken (the test failed; see above)", file=sys.stderr)
    return 1 if code == 0 else int(code)


if __name__ == "__main__":
    sys.exit(main())
