"""bench/bench_lines.py's counting: which lines count, which are docstrings, which files are tests,
and the like-for-like split between two revisions of this repository."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_lines import compare, count_source, is_counted  # noqa: E402

SOURCE = '''"""Module docstring,
on two lines."""

# a comment
import os  # a trailing comment counts as code


def f() -> str:
    """One line."""
    text = """
# not a comment: inside a string

still the string"""
    return text
'''


def test_count_source_splits_code_docstrings_comments_and_blanks() -> None:
    c = count_source(SOURCE)
    assert c.raw == 14
    assert c.doc == 3  # the module's two lines and the function's one
    # import, def, text = (4 non-blank string lines: the opening, '# not...', 'still...'), return
    assert c.lines == 3 + 1 + 1 + 3 + 1
    assert c.code == c.lines - c.doc


def test_test_modules_and_other_files_are_not_counted() -> None:
    assert is_counted("operator/agentrun/controller/reconciler.py")
    assert is_counted("operator/agentrun/testfault/__init__.py")  # fault injection, shipped
    for path in ("operator/agentrun/controller/test_x.py", "operator/agentrun/x_test.py",
                 "operator/agentrun/conftest.py", "operator/agentrun/tests/helpers.py",
                 "operator/agentrun/inbox/assets.css", "tests/controller/test_cache.py"):
        assert not is_counted(path), path


def test_a_revision_against_itself_carries_every_module_unchanged() -> None:
    r = compare("HEAD", "HEAD")
    base, head, carried = r["base"], r["head"], r["carried"]
    assert isinstance(base, dict) and isinstance(head, dict) and isinstance(carried, dict)
    assert base["files"] == head["files"] == carried["files"] > 100
    assert carried["at_base"] == carried["at_head"] and carried["at_head"]["lines"] == head["lines"]
    assert r["new"] == {"files": 0, "at_head": {"raw": 0, "lines": 0, "doc": 0, "code": 0}}
