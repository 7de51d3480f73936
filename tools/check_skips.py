"""Report the skipped tests of a pytest run from its junit xml, grouped by reason; with --strict
(.ci/run) fail on any skip that tools/allowed-skips.txt does not allow (issue 36: CI passed with
every image and runc test skipped).

    python tools/check_skips.py build/test-results.xml            # report (make test)
    python tools/check_skips.py --strict build/test-results.xml   # report, exit 1 on a skip not allowed

tools/allowed-skips.txt, one entry a line (# comments): ``TEST-GLOB | REASON-SUBSTRING | WHY``. A skip
is allowed when its test id (``tests/x/test_y.py::test_z[param]``) matches the glob and its reason
contains the substring; WHY (required) says why that skip is acceptable on the CI machine.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ALLOWED = Path(__file__).resolve().parent / "allowed-skips.txt"


@dataclass(frozen=True)
class Allow:
    glob: str
    reason: str
    why: str


@dataclass(frozen=True)
class Skip:
    test: str
    reason: str


def parse_allowed(text: str) -> list[Allow]:
    """The allow list; a line without its three fields, or without a WHY, is an error naming it."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"allowed-skips line {n}: expected 'TEST-GLOB | REASON-SUBSTRING | WHY', got {line!r}")
        out.append(Allow(*parts))
    return out


def _test_id(case: ET.Element) -> str:
    """pytest's junit classname ``tests.x.test_y`` (or ``tests.x.test_y.TestClass``) and name -> a node id."""
    classname, name = case.get("classname") or "", case.get("name") or ""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):  # the module is the longest prefix that names a file
        path = Path(*parts[:i]).with_suffix(".py")
        if path.exists() or i == 1:
            rest = parts[i:]
            return "::".join([str(path) if path.exists() else classname, *rest, name])
    return f"{classname}::{name}"


def read_skips(xml: str | Path) -> tuple[int, list[Skip]]:
    """(tests run, the skipped ones) from a pytest junit xml."""
    root = ET.parse(xml).getroot()
    cases = list(root.iter("testcase"))
    skips = []
    for case in cases:
        s = case.find("skipped")
        if s is not None:
            reason = (s.get("message") or s.text or "").strip()
            skips.append(Skip(_test_id(case), reason.removeprefix("Skipped: ")))
    return len(cases), skips


def classify(skips: list[Skip], allowed: list[Allow]) -> tuple[list[tuple[Skip, Allow]], list[Skip]]:
    ok, bad = [], []
    for s in skips:
        match = next((a for a in allowed if fnmatch.fnmatchcase(s.test, a.glob) and a.reason in s.reason), None)
        if match is not None:
            ok.append((s, match))
        else:
            bad.append(s)
    return ok, bad


def report(total: int, ok: list[tuple[Skip, Allow]], bad: list[Skip], strict: bool) -> str:
    """A few lines, grouped by reason (at most 3 test ids each), for the end of a CI log."""
    lines = [f"skips: {len(ok) + len(bad)} of {total} tests skipped, {len(ok)} allowed by tools/allowed-skips.txt, "
             f"{len(bad)} not allowed" + (" (--strict: this fails the run)" if strict and bad else "")]
    by_reason: dict[str, list[str]] = defaultdict(list)
    for s in bad:
        by_reason[s.reason].append(s.test)
    for reason, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        more = f" (+{len(tests) - 3} more)" if len(tests) > 3 else ""
        lines.append(f"  NOT ALLOWED x{len(tests)}: {reason[:200]}\n      {', '.join(tests[:3])}{more}")
    allowed: dict[str, int] = defaultdict(int)
    for _, a in ok:
        allowed[a.why] += 1
    for why, n in sorted(allowed.items()):
        lines.append(f"  allowed x{n}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", help="pytest --junitxml output")
    ap.add_argument("--strict", action="store_true", help="exit 1 on a skip the allow list does not allow")
    ap.add_argument("--allowed", default=str(ALLOWED))
    a = ap.parse_args(argv)
    if not Path(a.junit).exists():
        print(f"skips: {a.junit} not found (pytest did not write it)", file=sys.stderr)
        return 1 if a.strict else 0
    total, skips = read_skips(a.junit)
    ok, bad = classify(skips, parse_allowed(Path(a.allowed).read_text()))
    print(report(total, ok, bad, a.strict))
    return 1 if a.strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
