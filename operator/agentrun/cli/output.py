"""Output shared by the CLI's commands: kubectl-like columns and durations, the ``-o`` formats
(table, wide, json, yaml, name, jsonpath=TEMPLATE), colour (only on a terminal, never with
``NO_COLOR``) and the terminal's width."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
import yaml

F = TypeVar("F", bound=Callable[..., Any])


def columns(header: Sequence[str], rows: Sequence[Sequence[str]],
            style: Callable[[int, str, str], str] | None = None) -> str:
    """kubectl-like columns: left-aligned, three spaces apart, no trailing spaces. ``style(column,
    padded cell, cell)`` may colour a data cell after it is padded (alignment is of the plain text)."""
    lines = [list(header)] + [list(r) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        cells = [c.ljust(w) for c, w in zip(line, widths)]
        if style is not None and n > 0:
            cells = [style(i, cell, line[i]) for i, cell in enumerate(cells)]
        out.append("   ".join(cells).rstrip())
    return "\n".join(out)


# ------------------------------------------------------------------------------ durations

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str) -> float:
    """Seconds of a kubectl-style duration: ``30s``, ``5m``, ``1h30m``, ``1.5s`` or a bare number of
    seconds (``0``). ValueError names the accepted forms."""
    t = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", t):
        return float(t)
    m = _DURATION.match(t)
    if not t or not m or not any(m.groups()):
        raise ValueError(f"{text!r} is not a duration (e.g. 30s, 5m, 1h30m, or seconds)")
    h, mi, s = (float(g) if g else 0.0 for g in m.groups())
    return h * 3600 + mi * 60 + s


# ------------------------------------------------------------------------------ output formats

LIST_FORMATS = ("table", "wide", "json", "yaml", "name")


if TYPE_CHECKING:  # click >= 8.2 types ParamType as a generic; click 8.1 cannot subscript it at run time
    _ParamType = click.ParamType[str, Any]
else:
    _ParamType = click.ParamType


class OutputFormat(_ParamType):
    """``-o``: one of ``choices`` or ``jsonpath=TEMPLATE`` (kubectl's template subset, see
    :func:`jsonpath`). The value is the format's name, or ``("jsonpath", TEMPLATE)`` parsed."""

    name = "format"

    def __init__(self, choices: tuple[str, ...] = LIST_FORMATS, jsonpath: bool = True) -> None:
        self.choices = choices
        self.jsonpath = jsonpath

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "[" + "|".join(self.choices) + ("|jsonpath=TEMPLATE" if self.jsonpath else "") + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and self.jsonpath and value.startswith("jsonpath="):
            try:
                compile_template(value[len("jsonpath="):])
            except ValueError as e:
                self.fail(str(e), param, ctx)
            return value
        if value in self.choices:
            return value
        self.fail(f"{value!r} is not one of {', '.join(self.choices)}"
                  + (" or jsonpath=TEMPLATE" if self.jsonpath else ""), param, ctx)


def output_option(choices: tuple[str, ...] = LIST_FORMATS, default: str = "table", jsonpath: bool = True,
                  help: str | None = None) -> Callable[[F], F]:
    return click.option("-o", "--output", type=OutputFormat(choices, jsonpath), default=default, show_default=True,
                        help=help or "Output format: " + ", ".join(choices)
                        + (", or jsonpath=TEMPLATE (kubectl's JSONPath template)" if jsonpath else "") + ".")


def render(output: str, doc: Any, table: Callable[[], str] | None = None, wide: Callable[[], str] | None = None,
           names: Callable[[], list[str]] | None = None, items: Any = None) -> str:
    """One document in the chosen format: ``json``/``yaml`` of ``doc``; ``jsonpath=`` over
    ``{"items": items}`` for a listing (``items`` given; as kubectl applies it to a List) or over
    ``doc``; ``name``: one name per line; ``table``/``wide``: the callables' text."""
    if output == "json":
        return json.dumps(doc, indent=2)
    if output == "yaml":
        return str(yaml.safe_dump(doc, sort_keys=False)).rstrip("\n")
    if output.startswith("jsonpath="):
        return jsonpath(output[len("jsonpath="):], {"items": items} if items is not None else doc)
    if output == "name" and names is not None:
        return "\n".join(names())
    if output == "wide" and wide is not None:
        return wide()
    if table is None or output not in ("table", "wide", "text"):
        raise click.UsageError(f"-o {output} is not supported here")
    return table()


def run_name(name: str) -> str:
    """``-o name`` of an AgentRun, as kubectl prints it."""
    return f"agentrun.agentrun.dev/{name}"


# ------------------------------------------------------------------ kubectl's JSONPath template
# The subset of https://kubernetes.io/docs/reference/kubectl/jsonpath/ that covers scripts:
# text outside braces, {.a.b}, {.a[0]}, {.a[-1]}, {.a[*].b}, {.a['key.with.dots']}, {.*},
# {range EXPR}...{end}, string literals {"\n"} / {'\t'}. Filters ([?()]), slices and recursive
# descent (..) are refused with a message saying so (use -o json | jq).

_TOKEN = re.compile(r"\{((?:[^{}\"']|\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*')*)\}")


def _parse_path(expr: str) -> list[Any]:
    """Steps of ``.a.b[0][*]['k']``: str (key), int (index), ``*`` (every element)."""
    e = expr.strip()
    if "..'" in e or ".." in e.replace("...", ""):
        raise ValueError(f"jsonpath {{{expr}}}: recursive descent (..) is not supported; use -o json and jq")
    if "[?" in e:
        raise ValueError(f"jsonpath {{{expr}}}: filters [?()] are not supported; use -o json and jq")
    if e.startswith("$"):
        e = e[1:]
    steps: list[Any] = []
    i = 0
    while i < len(e):
        c = e[i]
        if c == ".":
            m = re.match(r"\.([A-Za-z0-9_\-/*]+)", e[i:])
            if not m:
                if e[i:] == ".":  # {.}: the document
                    break
                raise ValueError(f"jsonpath {{{expr}}}: bad field at {e[i:]!r}")
            steps.append("*" if m.group(1) == "*" else m.group(1))
            i += m.end()
        elif c == "[":
            m = re.match(r"\[\s*(?:(-?\d+)|(\*)|'([^']*)'|\"([^\"]*)\")\s*\]", e[i:])
            if not m:
                raise ValueError(f"jsonpath {{{expr}}}: unsupported subscript at {e[i:]!r} "
                                 "(indexes, [*] and ['key'] are supported; slices and filters are not)")
            if m.group(1) is not None:
                steps.append(int(m.group(1)))
            elif m.group(2):
                steps.append("*")
            else:
                steps.append(m.group(3) if m.group(3) is not None else m.group(4))
            i += m.end()
        else:
            raise ValueError(f"jsonpath {{{expr}}}: expected . or [ at {e[i:]!r}")
    return steps


def _walk(values: list[Any], steps: list[Any]) -> list[Any]:
    for step in steps:
        out: list[Any] = []
        for v in values:
            if step == "*":
                out += list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, list) else []
            elif isinstance(step, int):
                if isinstance(v, list) and -len(v) <= step < len(v):
                    out.append(v[step])
            elif isinstance(v, dict) and step in v:
                out.append(v[step])
        values = out
    return values


def compile_template(template: str) -> list[tuple[str, Any]]:
    """The template's parts: ("text", s), ("path", steps), ("range", steps), ("end", None)."""
    parts: list[tuple[str, Any]] = []
    pos = 0
    depth = 0
    for m in _TOKEN.finditer(template):
        if m.start() > pos:
            parts.append(("text", template[pos:m.start()]))
        body = m.group(1).strip()
        if body.startswith(("\"", "'")) and body.endswith(body[0]) and len(body) >= 2:
            parts.append(("text", body[1:-1].encode().decode("unicode_escape")))
        elif body.startswith("range "):
            parts.append(("range", _parse_path(body[len("range "):])))
            depth += 1
        elif body == "end":
            if depth == 0:
                raise ValueError("jsonpath: {end} without {range}")
            parts.append(("end", None))
            depth -= 1
        else:
            parts.append(("path", _parse_path(body)))
        pos = m.end()
    rest = template[pos:]
    if "{" in rest or "}" in rest:
        raise ValueError(f"jsonpath: unbalanced braces in {template!r}")
    if rest:
        parts.append(("text", rest))
    if depth:
        raise ValueError("jsonpath: {range} without {end}")
    return parts


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def jsonpath(template: str, doc: Any) -> str:
    """kubectl's ``-o jsonpath=TEMPLATE`` over ``doc`` (the subset above); several results of one
    expression are joined with a space, as kubectl joins them."""
    parts = compile_template(template)

    def run(parts: list[tuple[str, Any]], node: Any) -> str:
        out: list[str] = []
        i = 0
        while i < len(parts):
            kind, arg = parts[i]
            if kind == "text":
                out.append(arg)
            elif kind == "path":
                out.append(" ".join(_text(v) for v in _walk([node], arg)))
            elif kind == "range":
                depth, j = 1, i + 1
                while depth:
                    depth += {"range": 1, "end": -1}.get(parts[j][0], 0)
                    j += 1
                body = parts[i + 1:j - 1]
                for item in _walk([node], arg):
                    for element in (item if isinstance(item, list) and arg and arg[-1] != "*" else [item]):
                        out.append(run(body, element))
                i = j
                continue
            i += 1
        return "".join(out)

    return run(parts, doc)


# ------------------------------------------------------------------------------ terminal

def use_colour(stream: Any = None) -> bool:
    """Colour only on a terminal, never with ``NO_COLOR`` set (https://no-color.org) or TERM=dumb."""
    if os.environ.get("NO_COLOR", "") != "" or os.environ.get("TERM") == "dumb":
        return False
    s = stream if stream is not None else sys.stdout
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


PHASE_COLOURS = {"Succeeded": "green", "Failed": "red", "BudgetExceeded": "red", "DeadlineExceeded": "red",
                 "Cancelled": "yellow", "AwaitingApproval": "yellow", "Retrying": "yellow", "Suspended": "blue"}


def colour_phase(cell: str, phase: str) -> str:
    """``cell`` (the phase, maybe padded) coloured by the phase when :func:`use_colour`."""
    colour = PHASE_COLOURS.get(phase)
    return click.style(cell, fg=colour) if colour and use_colour() else cell


def terminal_width(default: int = 120) -> int:
    """The terminal's width (``COLUMNS`` first, as shells export it); ``default`` when not a terminal."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(40, int(os.environ["COLUMNS"]))
    try:
        if sys.stdout.isatty():
            return max(40, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    return default
