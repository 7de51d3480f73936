"""The ``agentrun`` console script. ``agentrun lap`` exactly (the lap Job's command line, see
``controller/decide/jobs.py``) runs the lap without importing click (``agentrun.lap.entry``: importing
the CLI is CPU every lap pod's start would pay for nothing it uses); any other command line,
``agentrun lap --help`` included, goes to the click group ``agentrun.cli.main:main``."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["lap"]:
        from agentrun.lap.entry import main as lap_main

        lap_main()
    from agentrun.cli.main import main as click_main

    click_main(prog_name="agentrun")
