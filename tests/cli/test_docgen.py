"""docs/cli.md's command reference is generated from the commands (``agentrun.cli.docgen``) and
equals their ``--help``: a command or flag added without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from agentrun.cli import docgen
from agentrun.cli.main import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_has_the_generated_reference_of_today():
    text = DOC.read_text(encoding="utf-8")
    assert docgen.BEGIN in text and docgen.END in text
    assert docgen.splice(text, docgen.reference()) == text, \
        "docs/cli.md is out of date: run python -m agentrun.cli.docgen docs/cli.md"
    assert docgen.main(["--check", str(DOC)]) == 0


PATHS = [path for path, _, _ in docgen.commands()]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "agentrun")
def test_each_block_is_the_commands_help(path):
    r = CliRunner().invoke(main, [*path, "--help"], terminal_width=docgen.WIDTH, prog_name="agentrun")
    assert r.exit_code == 0, r.output
    title = " ".join(["agentrun", *path])
    text = DOC.read_text(encoding="utf-8")
    block = text.split(f"### `{title}`\n\n```text\n", 1)[1].split("\n```", 1)[0]
    assert block == r.output.rstrip(), title
    # -h is the same as --help, everywhere
    assert CliRunner().invoke(main, [*path, "-h"], terminal_width=docgen.WIDTH, prog_name="agentrun").output == r.output


def test_every_people_command_is_in_the_reference():
    names = {" ".join(p) for p in PATHS}
    for cmd in ("runs", "describe", "wait", "logs", "suspend", "resume", "cancel", "retry", "approvals reject",
                "approve", "reject", "trace", "fork", "gc", "completion"):
        assert cmd in names, cmd


def test_check_fails_on_a_stale_page(tmp_path):
    stale = tmp_path / "cli.md"
    stale.write_text(DOC.read_text(encoding="utf-8").replace("Impersonate GROUP too", "Impersonate GROUPS"))
    assert docgen.main(["--check", str(stale)]) == 1
    assert docgen.main([str(stale)]) == 0 and docgen.main(["--check", str(stale)]) == 0
