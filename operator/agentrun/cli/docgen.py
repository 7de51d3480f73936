"""The command reference of docs/cli.md, generated from the commands themselves: every command's
``--help`` (click's own text at a fixed width of 100 columns), walked from the ``agentrun`` group.

    python -m agentrun.cli.docgen docs/cli.md            # rewrite the generated section
    python -m agentrun.cli.docgen --check docs/cli.md    # exit 1 if it is out of date

The section lies between :data:`BEGIN` and :data:`END`; the prose around it is written by hand.
tests/cli/test_docgen.py checks that the file's section is what this prints and that each block
is exactly ``agentrun ... --help``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import click

BEGIN = "<!-- BEGIN GENERATED: python -m agentrun.cli.docgen docs/cli.md -->"
END = "<!-- END GENERATED -->"
WIDTH = 100


def commands(group: click.Group | None = None) -> Iterator[tuple[list[str], click.Command, click.Context]]:
    """(path, command, context) of every command, depth first, in name order, from ``agentrun``."""
    from agentrun.cli.main import CONTEXT_SETTINGS, PROG, main

    root = group or main
    ctx = click.Context(root, info_name=PROG, terminal_width=WIDTH, max_content_width=WIDTH,
                        help_option_names=list(CONTEXT_SETTINGS["help_option_names"]))  # type: ignore[call-overload]

    def walk(cmd: click.Command, ctx: click.Context, path: list[str]) -> Iterator[tuple[list[str], click.Command, click.Context]]:
        yield path, cmd, ctx
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is None or sub.hidden:
                    continue
                yield from walk(sub, click.Context(sub, info_name=name, parent=ctx), [*path, name])

    yield from walk(root, ctx, [])


def reference() -> str:
    """The generated section (without the markers)."""
    out = ["## Reference: every command's `--help`", "",
           "Generated from the commands (`python -m agentrun.cli.docgen docs/cli.md`); "
           "tests/cli/test_docgen.py keeps it equal to `--help`.", ""]
    for path, cmd, ctx in commands():
        title = " ".join(["agentrun", *path])
        out += [f"### `{title}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(out)


def splice(text: str, section: str) -> str:
    """``text`` with the generated section replaced (appended, with the markers, when absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return f"{head}{BEGIN}\n{section}\n{END}{tail}"
    return text.rstrip("\n") + f"\n\n{BEGIN}\n{section}\n{END}\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [a for a in args if a != "--check"]
    if len(paths) != 1:
        print("usage: python -m agentrun.cli.docgen [--check] docs/cli.md", file=sys.stderr)
        return 2
    with open(paths[0], encoding="utf-8") as fh:
        old = fh.read()
    new = splice(old, reference())
    if check:
        if new != old:
            print(f"{paths[0]}: the command reference is out of date; run python -m agentrun.cli.docgen {paths[0]}",
                  file=sys.stderr)
            return 1
        return 0
    if new != old:
        with open(paths[0], "w", encoding="utf-8") as fh:
            fh.write(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
