"""Figures that trace to their source (issue 17): bench/results.json keeps every measured figure and
the record of the run that measured it; bench/results.md and README's benchmark table are rendered
from it by bench/run_all.py, and these tests check that the committed files are exactly that
rendering, so a number cannot be edited by hand in one place and not the other. One source per
number: outside the generated table, README and the docs state no resume time, checkpoint-bytes
ratio or overhead percentile of their own. Also the pure JSON merge of a partial run (``--only``).
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import run_all  # noqa: E402

RESULTS = json.loads((BENCH / "results.json").read_text())


def _diff(got: str, want: str) -> str:
    return "".join(list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "rendered", "committed"))[:80])


def test_every_section_names_the_run_that_measured_it() -> None:
    assert RESULTS["schema"] == run_all.SCHEMA
    sections, runs = RESULTS["sections"], RESULTS["runs"]
    assert sections, "bench/results.json has no measured section"
    assert set(runs) == {s["run"] for s in sections.values()}, "a run no section refers to, or a section without its run"
    for name, sec in sections.items():
        assert name in run_all.SECTIONS, name
        for key in ("benchmark", "command", "started", "seconds", "exit", "load_before", "load_after", "output"):
            assert key in sec, (name, key)
        if sec["exit"] == 0 and name not in run_all.TEXT_ONLY:
            assert sec["data"], f"{name}: exit 0 but no figures"
        run = runs[sec["run"]]
        for key in ("started", "finished", "load_before", "load_after", "uptime_before", "uptime_after", "host",
                    "commit", "nice"):
            assert run.get(key) is not None, (sec["run"], key)
        assert len(run["load_before"]) == len(run["load_after"]) == 3
        assert re.fullmatch(r"[0-9a-f]{40}", run["commit"]), run["commit"]


def test_results_md_is_rendered_from_results_json() -> None:
    analysis = BENCH / "analysis.md"
    want = run_all.render(RESULTS, analysis.read_text() if analysis.exists() else None)
    got = (BENCH / "results.md").read_text()
    assert got == want, ("bench/results.md is not the rendering of bench/results.json: run "
                         "`python bench/run_all.py --render`\n" + _diff(got, want))


def test_results_md_header_states_each_runs_time_and_load_from_the_json() -> None:
    text = (BENCH / "results.md").read_text()
    header = text.split("\n## ", 1)[0]
    for run in RESULTS["runs"].values():
        assert run["started"].replace("T", " ").replace("Z", " UTC") in header
        assert run_all._load(run["load_before"]) in header and run_all._load(run["load_after"]) in header
        assert run["commit"][:12] in header


def test_readme_benchmark_table_is_generated_from_results_json() -> None:
    got = run_all.readme_block((ROOT / "README.md").read_text())
    want = run_all.readme_figures(RESULTS)
    assert got == want, ("README.md's benchmark table is not generated from bench/results.json: run "
                         "`python bench/run_all.py --render`\n" + _diff(got, want))


# a benchmark figure stated outside the generated table (a second source for the same number)
SECOND_SOURCES = [
    re.compile(r"resume[^|\n]*?\b\d+(\.\d+)?\s*ms", re.I),  # a resume time
    re.compile(r"LangGraph[^|\n]*?\b\d+\.\d+x\b"),  # a measured bytes ratio (a target is a whole 50x)
    re.compile(r"overhead[^|\n]*?\bp(50|99)\b[^|\n]*?\d+(\.\d+)?\s*(ms|s)\b", re.I),  # an overhead percentile
]


@pytest.mark.parametrize("doc", ["README.md", "docs/lap-runner.md", "docs/operations.md", "bench/README.md"])
def test_no_benchmark_figure_outside_the_generated_table(doc: str) -> None:
    text = (ROOT / doc).read_text()
    if doc == "README.md":
        a, b = text.index(run_all.README_BEGIN), text.index(run_all.README_END)
        text = text[:a] + text[b:]
    found = [m.group(0) for p in SECOND_SOURCES for m in p.finditer(text)]
    assert not found, f"{doc} states benchmark figures of its own (they belong to bench/results.json): {found}"


# ------------------------------------------------------------------ the merge of a partial run


def _sec(run: str) -> dict:
    return {"run": run, "data": {}, "command": "", "exit": 0}


def test_a_partial_run_replaces_only_its_sections_and_drops_runs_no_one_refers_to() -> None:
    old = {"schema": run_all.SCHEMA, "runs": {"r1": {"started": "r1"}, "r2": {"started": "r2"}},
           "sections": {"langgraph": _sec("r1"), "cold_start": _sec("r2"), "decision_compute": _sec("r2")}}
    res = run_all.merge(old, "r3", {"started": "r3"}, {"langgraph": _sec("r3"), "cold_start": _sec("r3")})
    assert {k: v["run"] for k, v in res["sections"].items()} == {
        "langgraph": "r3", "cold_start": "r3", "decision_compute": "r2"}
    assert set(res["runs"]) == {"r2", "r3"}  # r1 measured nothing that is still there
    assert list(res["sections"]) == [n for n in run_all.SECTIONS if n in res["sections"]]  # stable order
    assert run_all.merge(None, "r1", {"started": "r1"}, {"cold_start": _sec("r1")})["runs"] == {"r1": {"started": "r1"}}


def test_sections_not_measured_are_named_not_invented() -> None:
    res = {"schema": run_all.SCHEMA, "runs": {}, "sections": {}}
    md = run_all.render(res)
    assert "Not in results.json" in md and "operator_cluster" in md
    rows = [line.split(" | ") for line in run_all.readme_figures(res).splitlines() if line.startswith("| ")][2:]
    assert rows and all(r[2].startswith("not in bench/results.json") for r in rows), rows  # no measured cell


# ------------------------------------------------------------------ failed sections (issue 36)


def _limitations() -> str:
    text = (ROOT / "README.md").read_text()
    a = text.index("\n## Limitations\n")
    b = text.find("\n## ", a + 1)
    return " ".join(text[a: b if b > 0 else None].split())


def test_no_committed_section_failed_unless_a_known_failure_the_readme_repeats() -> None:
    failed = {name: sec["exit"] for name, sec in RESULTS["sections"].items() if sec["exit"] != 0}
    unknown = sorted(set(failed) - set(run_all.KNOWN_FAILURES))
    assert not unknown, (f"bench/results.json holds failed section(s) {unknown} (exit {[failed[n] for n in unknown]}): a "
                         "failed check is not a result; re-measure them, or list them in run_all.KNOWN_FAILURES with a "
                         "reason README's Limitations repeat")


def test_every_known_failure_is_repeated_in_the_readme_limitations() -> None:
    limitations = _limitations()
    for name, reason in run_all.KNOWN_FAILURES.items():
        assert name in run_all.SECTIONS, f"KNOWN_FAILURES names {name}, not a section"
        assert reason.strip(), f"KNOWN_FAILURES[{name!r}] gives no reason"
        assert " ".join(reason.split()) in limitations, (
            f"README's Limitations do not repeat why {name} may fail: {reason!r}")


def test_run_all_refuses_a_failed_section_unless_it_is_a_known_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    sections = {"cold_start": {**_sec("r"), "exit": 0}, "checkpoint_store": {**_sec("r"), "exit": 1},
                "langgraph": {**_sec("r"), "exit": -9}}
    assert run_all.refused(sections) == ["checkpoint_store", "langgraph"]
    monkeypatch.setitem(run_all.KNOWN_FAILURES, "langgraph", "a reason")
    assert run_all.refused(sections) == ["checkpoint_store"]
    md = run_all.render({"schema": run_all.SCHEMA, "runs": {}, "sections": {
        "langgraph": {**sections["langgraph"], "seconds": 1.0, "load_before": [0, 0, 0], "load_after": [0, 0, 0],
                      "output": "", "stderr_tail": "", "benchmark": "b", "started": "s", "data": None}}})
    assert "**Known failure**: a reason" in md


def test_run_all_keeps_a_failed_section_out_of_results_json(tmp_path: Path) -> None:
    """The real script end to end on a copy of results.json: a benchmark that exits 1 (a stand-in
    script named as the checkpoint_store section's) is refused, exit 1, and the JSON is unchanged."""
    import subprocess

    bench = tmp_path / "bench"
    bench.mkdir()
    for f in ("run_all.py", "benchlib.py"):
        (bench / f).write_text((BENCH / f).read_text())
    (bench / "bench_checkpoints.py").write_text("import sys\nprint('[FAIL] a check')\nsys.exit(1)\n")
    results = tmp_path / "results.json"
    results.write_text((BENCH / "results.json").read_text())
    before = results.read_text()
    p = subprocess.run([sys.executable, str(bench / "run_all.py"), "--only", "checkpoint_store", "--results",
                        str(results), "--out", str(tmp_path / "results.md")], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED: checkpoint_store exited non-zero" in p.stderr and "[FAIL] a check" in p.stdout
    assert results.read_text() == before and not (tmp_path / "results.md").exists()
