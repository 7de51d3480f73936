"""docs/architecture.md matches the code: every module it names exists, and every package of
agentrun is named in it (a new package without its place in the picture fails here)."""

from __future__ import annotations

import importlib.util
import pkgutil
import re
from pathlib import Path

import agentrun

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
NAME = re.compile(r"\bagentrun(?:\.[a-z_][a-z0-9_]*)+")


def test_every_module_the_architecture_page_names_exists():
    names = sorted(set(NAME.findall(DOC.read_text())))
    assert len(names) > 20, names
    missing = [n for n in names if importlib.util.find_spec(n) is None]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_package_of_agentrun_has_its_place_in_the_picture():
    text = DOC.read_text()
    packages = [m.name for m in pkgutil.iter_modules(agentrun.__path__) if m.ispkg]
    unnamed = [p for p in packages if p != "testfault" and f"agentrun.{p}" not in text]
    assert not unnamed, f"packages missing from docs/architecture.md: {unnamed}"
