"""Lines of the operator package ``operator/agentrun`` (non-test Python) at two git revisions.

Reads both revisions from git (``git ls-tree`` / ``git cat-file``; no checkout), so any two
commits can be compared from any work tree::

    python bench/bench_lines.py d72b1d9            # d72b1d9 vs HEAD
    python bench/bench_lines.py d72b1d9 main --json

Per file it counts

* **raw**: every line;
* **lines**: non-blank lines that hold something other than a comment (docstrings included; a
  line inside a multi-line string counts when it is not blank);
* **doc**: the non-blank lines of docstrings (the first statement of a module, class or function
  when it is a string literal);
* **code**: ``lines - doc``.

Test modules (``test_*.py``, ``*_test.py``, ``conftest.py``, anything under a ``tests``
directory) are left out.

The like-for-like view splits the newer revision's files into the modules that existed at the
base (same path, or the destination of a rename or copy ``git diff -M --name-status`` records)
and the modules added since, grouped by top-level subpackage (``api``, ``controller``, ...;
modules directly in ``agentrun/`` are ``(top)``), so that a feature added since the base does not
hide or inflate what happened to the code that was already there.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
import tokenize
from dataclasses import asdict, dataclass
from pathlib import PurePosixPath

PACKAGE = "operator/agentrun"
_NON_CODE_TOKENS = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)


@dataclass(frozen=True)
class Count:
    raw: int = 0
    lines: int = 0
    doc: int = 0

    @property
    def code(self) -> int:
        return self.lines - self.doc

    def __add__(self, other: Count) -> Count:
        return Count(self.raw + other.raw, self.lines + other.lines, self.doc + other.doc)

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "code": self.code}


def count_source(text: str) -> Count:
    """The counts of one Python source (see the module docstring)."""
    lines = text.splitlines()
    covered: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in _NON_CODE_TOKENS:
            covered.update(range(tok.start[0], tok.end[0] + 1))
    nonblank = {n for n in covered if n <= len(lines) and lines[n - 1].strip()}
    doc: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                first = body[0]
                doc.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return Count(raw=len(lines), lines=len(nonblank), doc=len(doc & nonblank))


def is_counted(path: str) -> bool:
    p = PurePosixPath(path)
    if p.suffix != ".py" or not path.startswith(PACKAGE + "/"):
        return False
    name = p.name
    if name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py":
        return False
    return "tests" not in p.parts[:-1]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def files_at(rev: str) -> dict[str, Count]:
    """Every counted file of ``rev`` and its counts (one ``git cat-file --batch`` for all)."""
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, "--", PACKAGE).splitlines() if is_counted(p)]
    if not paths:
        return {}
    request = "".join(f"{rev}:{p}\n" for p in paths).encode()
    out = subprocess.run(["git", "cat-file", "--batch"], input=request, check=True, capture_output=True).stdout
    counts: dict[str, Count] = {}
    pos = 0
    for path in paths:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        body = out[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        counts[path] = count_source(body.decode("utf-8"))
    return counts


def renames(base: str, head: str) -> dict[str, str]:
    """head path -> base path for the renames and copies git detects between the two revisions."""
    out = _git("diff", "-M", "-C", "--name-status", base, head, "--", PACKAGE)
    moved: dict[str, str] = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if parts[0][:1] in ("R", "C") and len(parts) == 3:
            moved[parts[2]] = parts[1]
    return moved


def subpackage(path: str) -> str:
    parts = PurePosixPath(path).relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else "(top)"


def _total(counts: dict[str, Count], paths: object = None) -> Count:
    keys = counts.keys() if paths is None else paths
    total = Count()
    for p in keys:  # type: ignore[attr-defined]
        total = total + counts[p]
    return total


def compare(base: str, head: str) -> dict[str, object]:
    base_files, head_files = files_at(base), files_at(head)
    moved = renames(base, head)
    origin = {p: (p if p in base_files else moved.get(p)) for p in head_files}
    carried = {p for p, o in origin.items() if o in base_files}
    carried_origins = {origin[p] for p in carried}
    groups: dict[str, dict[str, object]] = {}
    for sub in sorted({subpackage(p) for p in [*base_files, *head_files]}):
        in_base = [p for p in base_files if subpackage(p) == sub]
        kept = [p for p in head_files if p in carried and subpackage(p) == sub]
        new = [p for p in head_files if p not in carried and subpackage(p) == sub]
        gone = [p for p in in_base if p not in carried_origins]
        groups[sub] = {
            "base": _total(base_files, in_base).as_dict(),
            "base_files": len(in_base),
            "carried": _total(head_files, kept).as_dict(),
            "carried_files": len(kept),
            "carried_at_base": _total(base_files, [origin[p] for p in kept]).as_dict(),
            "new": _total(head_files, new).as_dict(),
            "new_files": len(new),
            "removed_at_base": _total(base_files, gone).as_dict(),
            "removed_files": len(gone),
            "head": _total(head_files, [p for p in head_files if subpackage(p) == sub]).as_dict(),
        }
    return {
        "base": {"rev": base, "commit": _git("rev-parse", base).strip(), "files": len(base_files),
                 **_total(base_files).as_dict()},
        "head": {"rev": head, "commit": _git("rev-parse", head).strip(), "files": len(head_files),
                 **_total(head_files).as_dict()},
        "renames": {h: b for h, b in moved.items() if is_counted(h)},
        "carried": {
            "files": len(carried),
            "at_base": _total(base_files, carried_origins).as_dict(),
            "at_head": _total(head_files, carried).as_dict(),
        },
        "new": {"files": len(head_files) - len(carried),
                "at_head": _total(head_files, set(head_files) - carried).as_dict()},
        "removed": {"files": len(set(base_files) - carried_origins),
                    "at_base": _total(base_files, set(base_files) - carried_origins).as_dict()},
        "subpackages": groups,
    }


def _pct(new: int, old: int) -> str:
    return f"{(new - old) / old * 100:+.1f} %" if old else "   n/a"


def render(r: dict[str, object]) -> str:
    base, head = r["base"], r["head"]
    assert isinstance(base, dict) and isinstance(head, dict)
    out = [f"operator/agentrun, non-test Python: {base['rev']} ({base['commit'][:9]}) vs {head['rev']} ({head['commit'][:9]})", ""]
    out.append(f"{'':14}{'base':>9}{'head':>9}{'change':>10}")
    for key in ("files", "raw", "lines", "doc", "code"):
        out.append(f"{key:14}{base[key]:>9}{head[key]:>9}{_pct(head[key], base[key]):>10}")
    out.append("")
    out.append("lines = non-blank, non-comment (docstrings included); doc = docstring lines; code = lines - doc")
    carried, new, removed = r["carried"], r["new"], r["removed"]
    assert isinstance(carried, dict) and isinstance(new, dict) and isinstance(removed, dict)
    out.append("")
    out.append("Like for like (modules of the base, by path or git's renames, vs modules added since):")
    out.append(
        f"  carried: {carried['files']} files, lines {carried['at_base']['lines']} -> {carried['at_head']['lines']} "
        f"({_pct(carried['at_head']['lines'], carried['at_base']['lines'])}), "
        f"code {carried['at_base']['code']} -> {carried['at_head']['code']} "
        f"({_pct(carried['at_head']['code'], carried['at_base']['code'])})"
    )
    out.append(f"  new:     {new['files']} files, lines {new['at_head']['lines']}, code {new['at_head']['code']}")
    out.append(f"  removed: {removed['files']} files, lines {removed['at_base']['lines']} at the base")
    out.append("")
    hdr = (f"{'subpackage':12}{'base':>7}{'carried':>9}{'@base':>7}{'@head':>7}{'change':>9}"
           f"{'new':>5}{'@head':>7}{'gone':>6}{'@base':>7}{'head':>7}")
    out.append("lines per top-level subpackage: base = all its lines at the base; carried = its modules of the base"
               " (files, lines at base, at head); new = added since (files, lines); gone = removed (files, lines at base)")
    out.append(hdr)
    groups = r["subpackages"]
    assert isinstance(groups, dict)
    for sub, g in groups.items():
        out.append(
            f"{sub:12}{g['base']['lines']:>7}{g['carried_files']:>9}{g['carried_at_base']['lines']:>7}"
            f"{g['carried']['lines']:>7}{_pct(g['carried']['lines'], g['carried_at_base']['lines']):>9}"
            f"{g['new_files']:>5}{g['new']['lines']:>7}{g['removed_files']:>6}{g['removed_at_base']['lines']:>7}"
            f"{g['head']['lines']:>7}"
        )
    renamed = r["renames"]
    assert isinstance(renamed, dict)
    if renamed:
        out.append("")
        out.append("renames/copies git records (head <- base):")
        out.extend(f"  {h} <- {b}" for h, b in sorted(renamed.items()))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("base", help="the base revision (e.g. d72b1d9)")
    ap.add_argument("head", nargs="?", default="HEAD", help="the revision to compare (default HEAD)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    report = compare(args.base, args.head)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
