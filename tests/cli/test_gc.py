"""``agentrun gc``: the pure parts (grouping a store listing by run prefix, picking orphans, the
text output). The command against a real cluster and S3 is in tests/e2e/test_lifecycle.py."""

from __future__ import annotations

from datetime import UTC, datetime

from click.testing import CliRunner

from agentrun.cli.gc import PrefixUsage, human_bytes, orphans, render, run_prefixes
from agentrun.cli.main import main

T1 = datetime(2030, 1, 1, tzinfo=UTC)
T2 = datetime(2030, 1, 2, tzinfo=UTC)


def test_run_prefixes_groups_by_namespace_name_uid_and_ignores_other_keys():
    listing = [
        ("ckpt/team-a/nightly/u1/laps/00000001.json", 100, T1),
        ("ckpt/team-a/nightly/u1/laps/00000002.json", 150, T2),
        ("ckpt/team-a/nightly/u1/journal/00000002/call-1.json", 50, T1),
        ("ckpt/team-a/nightly/u2/laps/00000001.json", 10, T1),
        ("ckpt/team-b/other/u3/snapshots/00000010.json", 7, None),
        ("ckpt/.agentrun-probe/abc", 3, T1),        # the store probe's leftover: not a run
        ("ckpt/team-a/nightly/u1", 1, T1),          # not under a run prefix
        ("ckpt/stray.txt", 1, T1),
        ("elsewhere/team-a/nightly/u9/laps/x.json", 1, T1),
    ]
    got = run_prefixes(listing, "ckpt")
    assert got == [
        PrefixUsage("team-a", "nightly", "u1", 3, 300, T2),
        PrefixUsage("team-a", "nightly", "u2", 1, 10, T1),
        PrefixUsage("team-b", "other", "u3", 1, 7, None),
    ]


def test_run_prefixes_with_an_empty_store_prefix():
    got = run_prefixes([("ns/run/uid/laps/00000001.json", 5, T1), (".agentrun-probe/x", 1, T1)], "")
    assert got == [PrefixUsage("ns", "run", "uid", 1, 5, T1)]


def test_orphans_are_prefixes_without_a_live_uid_in_the_namespace_considered():
    usages = [PrefixUsage("a", "r1", "live", 1, 1, T1), PrefixUsage("a", "r2", "gone", 2, 20, T1),
              PrefixUsage("b", "r3", "gone-b", 1, 5, T1)]
    assert [u.uid for u in orphans(usages, {"live"})] == ["gone", "gone-b"]
    assert [u.uid for u in orphans(usages, {"live"}, namespace="a")] == ["gone"]
    assert orphans(usages, {"live", "gone", "gone-b"}) == []


def test_render_lists_rows_and_says_nothing_was_deleted_in_a_dry_run():
    found = [PrefixUsage("a", "r2", "gone", 2, 2048, T1)]
    text = render(found, "s3://b/ckpt", None)
    header, row, summary = text.splitlines()
    assert header.split() == ["NAMESPACE", "NAME", "UID", "OBJECTS", "BYTES", "SIZE", "NEWEST"]
    assert row.split()[:5] == ["a", "r2", "gone", "2", "2048"] and "2.0 KiB" in row
    assert "1 orphan prefix(es) in s3://b/ckpt: 2 objects, 2048 bytes" in summary
    assert "nothing deleted (dry run)" in summary
    assert "deleted 2 objects" in render(found, "s3://b/ckpt", {("a", "r2", "gone"): 2})
    assert render([], "s3://b/ckpt", None) == "0 orphan prefix(es) in s3://b/ckpt: 0 objects, 0 bytes (0 B)"


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1024, 5 * 1024**3)] == ["0 B", "1023 B", "1.0 KiB", "5.0 GiB"]


def test_dry_run_and_delete_are_exclusive_and_a_store_is_required(monkeypatch):
    monkeypatch.delenv("AGENTRUN_CHECKPOINT_URI", raising=False)
    r = CliRunner().invoke(main, ["gc", "--dry-run", "--delete"])
    assert r.exit_code == 2 and "exclusive" in r.output
    r = CliRunner().invoke(main, ["gc"])
    assert r.exit_code == 1 and "no checkpoint store" in r.output
    r = CliRunner().invoke(main, ["gc", "--uri", "s3://Bad_Bucket"])
    assert r.exit_code == 1 and "checkpoint store" in r.output and "Traceback" not in r.output
