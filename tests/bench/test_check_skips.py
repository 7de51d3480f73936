"""tools/check_skips.py (issue 36): CI fails on a skip the allow list does not allow, from a real
pytest run's junit xml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import check_skips  # noqa: E402

SAMPLE = '''
import os, pytest

def test_runs():
    pass

def test_needs_root():
    pytest.skip("the runc node needs root (runc, overlay mounts)")

@pytest.mark.skipif(True, reason="needs Linux's /proc/net/tcp")
def test_proc():
    pass
'''


@pytest.fixture
def junit(tmp_path: Path) -> Path:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out = tmp_path / "results.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                    f"--junitxml={out}", "test_sample.py"], cwd=tmp_path, capture_output=True, timeout=120)
    return out


def test_a_skip_not_allowed_fails_strict_and_is_named(junit: Path, tmp_path: Path) -> None:
    allowed = tmp_path / "allowed.txt"
    allowed.write_text("# comment\n*test_proc | /proc/net/tcp | a host without it\n")
    args = [str(junit), "--allowed", str(allowed)]
    assert check_skips.main(args) == 0  # report only
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "check_skips.py"), "--strict", *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "2 of 3 tests skipped, 1 allowed" in p.stdout and "1 not allowed" in p.stdout
    assert "NOT ALLOWED x1: the runc node needs root" in p.stdout and "test_needs_root" in p.stdout
    assert "allowed x1: a host without it" in p.stdout
    allowed.write_text("*test_proc | /proc/net/tcp | a host without it\n*needs_root | needs root | not in CI\n")
    assert check_skips.main(["--strict", *args]) == 0


def test_an_allow_entry_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="line 1"):
        check_skips.parse_allowed("tests/x.py::* | needs root\n")
    with pytest.raises(ValueError, match="line 2"):
        check_skips.parse_allowed("# c\ntests/x.py::* | needs root | \n")


def test_the_repository_allow_list_parses_and_every_entry_says_why() -> None:
    entries = check_skips.parse_allowed(check_skips.ALLOWED.read_text())
    assert all(len(a.why) > 20 for a in entries), entries
    assert not [a for a in entries if "image" in a.glob or "runc" in a.glob or "root" in a.reason], entries
