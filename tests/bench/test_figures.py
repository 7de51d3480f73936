"""Figures that trace to their source (issues 17 and 37): bench/results.json keeps every measured figure
and the record of the run that measured it; bench/results.md and the benchmark table of
docs/evidence.md are rendered from it by bench/run_all.py, and every figure README and the docs pages
quote stands in a span ``<!-- fig NAME -->value<!-- /fig -->`` filled from it by
tools/docsite/docgen.py. These tests check that the committed files are exactly that rendering, so a
number cannot be edited by hand in one place and not the other. One source per number: README and
the pages of ``docgen.FIGURE_PAGES`` quote no measured figure (a number with a unit of time, size or
ratio) outside the generated table and the spans; no page under docs/ states a resume time,
checkpoint-bytes ratio, overhead percentile, cold start or CPU per lap of its own. README is at most
200 lines. Also the pure JSON merge of a partial run (``--only``).
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

sys.path.insert(0, str(ROOT / "tools" / "docsite"))
import docgen  # noqa: E402

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


def test_evidence_benchmark_table_is_generated_from_results_json() -> None:
    assert run_all.README == ROOT / "docs" / "evidence.md"
    got = run_all.readme_block(run_all.README.read_text())
    want = run_all.readme_figures(RESULTS)
    assert got == want, ("docs/evidence.md's benchmark table is not generated from bench/results.json: run "
                         "`python bench/run_all.py --render`\n" + _diff(got, want))


# ------------------------------------------------------------------ README and the pages that quote figures

README_MAX_LINES = 200


def test_readme_is_for_users_at_most_200_lines() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


#: a measured-looking figure: a number with a unit of time, size, ratio or share
MEASURED = re.compile(r"(?<![\w.])\d[\d,.]*\s?(?:ms|µs|us|s|sec|min|minutes|h|hours|B|kB|KiB|MB|MiB|GB|GiB|x|×|%)(?![\w])")

#: numbers with a unit that are settings, not measurements, allowed outside the spans (each with where it is set)
SETTINGS = {
    "docs/limitations.md": {
        "30 s",  # notifications/inbox polling, step-down delay and the CRD paramKind window: fixed in code or chart
        "10 ms",  # the target of operator CPU per lap (bench/run_all.py)
        "12 ms",  # the target after issue 30 (bench/analysis.md)
        "100 ms",  # the lap-gap target p50 (bench/run_all.py TARGET_P50)
        "1 s",  # the lap-gap target p99 (bench/run_all.py TARGET_P99)
        "10 s",  # a store outage while forking is retried every 10 s (controller)
        "2 minutes",  # watchTimeoutSeconds' default (the chart)
        "10 minutes",  # the duration `bench_operator_cluster.py active` is run for (a parameter)
        "100 x",  # the chaos `full` schedule's scale scenario, 100 runs x 3 (a parameter)
    },
}


def measured_outside_spans(text: str, allowed: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """The measured-looking figures of ``text`` outside run_all's generated table and the fig spans."""
    a, b = text.find(run_all.README_BEGIN), text.find(run_all.README_END)
    if a >= 0 and b > a:
        text = text[:a] + text[b:]
    text = docgen.FIG.sub("", text)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return [m.group(0) for m in MEASURED.finditer(text) if m.group(0) not in allowed]


@pytest.mark.parametrize("page", docgen.FIGURE_PAGES)
def test_pages_quote_measured_figures_only_from_results_json(page: str) -> None:
    text = (ROOT / page).read_text()
    found = measured_outside_spans(text, SETTINGS.get(page, set()))
    assert not found, (f"{page} quotes figures outside the spans filled from bench/results.json "
                       f"(tools/docsite/docgen.py FIGURES): {found}")


@pytest.mark.parametrize("page", docgen.SPAN_PAGES)
def test_every_span_holds_the_figure_of_results_json(page: str) -> None:
    text = (ROOT / page).read_text()
    spans = docgen.FIG.findall(text)
    for name, value in spans:
        assert name in docgen.FIGURES, f"{page}: unknown figure {name}"
        assert value == docgen.FIGURES[name](RESULTS), (page, name, value)
    if page == "README.md":
        assert len(spans) >= 8, spans


def test_the_rule_finds_a_figure_written_by_hand() -> None:
    """The negative control: a ratio, a time and a size typed into README's text are found; the same in
    spans are not."""
    assert measured_outside_spans("97.06 MB / 415.44 kB = 233.6x, resumed in 3.7 ms") == ["97.06 MB", "415.44 kB",
                                                                                       "233.6x", "3.7 ms"]
    assert measured_outside_spans("in <!-- fig resume_p50 -->3.7 ms<!-- /fig -->") == []
    assert docgen.fill_figures("<!-- fig resume_p50 -->9 ms<!-- /fig -->", RESULTS) != \
        "<!-- fig resume_p50 -->9 ms<!-- /fig -->"


def test_readme_compares_against_the_best_peer_configuration_only() -> None:
    """README quotes no ratio against LangGraph as a headline: a comparison points at the evidence page, which
    names the best mode (DeltaChannel) that bench/results.json's langgraph sections compare with
    (tests/bench/test_langgraph_best.py)."""
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"\d+(\.\d+)?\s?[x×]", docgen.FIG.sub("", readme)), "README states a ratio"
    assert "DeltaChannel" in readme and "docs/evidence.md#checkpoint-bytes-against-langgraph" in readme
    evidence = (ROOT / "docs" / "evidence.md").read_text()
    assert "## Checkpoint bytes against LangGraph" in evidence and "DeltaChannel" in evidence


# a benchmark figure stated outside the generated table and the spans (a second source for the same number)
SECOND_SOURCES = [
    re.compile(r"resume[^|\n]*?\b\d+(\.\d+)?\s*ms", re.I),  # a resume time
    re.compile(r"LangGraph[^|\n]*?\b\d+\.\d+x\b"),  # a measured bytes ratio (a target is a whole 50x)
    re.compile(r"overhead[^|\n]*?\bp(50|99)\b[^|\n]*?\d+(\.\d+)?\s*(ms|s)\b", re.I),  # an overhead percentile
    re.compile(r"cold start[^|\n]*?\b\d+(\.\d+)?\s*(ms|s)\b", re.I),  # a cold start
    re.compile(r"\b\d+(\.\d+)?\s*ms of (operator )?CPU per lap", re.I),  # the operator's CPU per lap
]

SECOND_SOURCE_PAGES = ["README.md", "bench/README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
    # chaos.md times its own suite (not a benchmark of results.json); cli.md is --help text
    if p.name not in {"chaos.md", "cli.md"}
    # the traces helper's page: the tracing cost per lap it quotes (issue 35) is not in results.json yet
    and p.name != "observability.md")]


@pytest.mark.parametrize("doc", SECOND_SOURCE_PAGES)
def test_no_benchmark_figure_outside_the_generated_table(doc: str) -> None:
    text = (ROOT / doc).read_text()
    a, b = text.find(run_all.README_BEGIN), text.find(run_all.README_END)
    if a >= 0 and b > a:
        text = text[:a] + text[b:]
    text = docgen.FIG.sub("", text)
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
    """docs/limitations.md (README's Limitations until issue 37): every limitation of agentrun."""
    return " ".join((ROOT / "docs" / "limitations.md").read_text().split())


def test_no_committed_section_failed_unless_a_known_failure_the_readme_repeats() -> None:
    failed = {name: sec["exit"] for name, sec in RESULTS["sections"].items() if sec["exit"] != 0}
    unknown = sorted(set(failed) - set(run_all.KNOWN_FAILURES))
    assert not unknown, (f"bench/results.json holds failed section(s) {unknown} (exit {[failed[n] for n in unknown]}): a "
                         "failed check is not a result; re-measure them, or list them in run_all.KNOWN_FAILURES with a "
                         "reason README's Limitations repeat")


def test_every_known_failure_is_repeated_in_the_limitations_page() -> None:
    limitations = _limitations()
    for name, reason in run_all.KNOWN_FAILURES.items():
        assert name in run_all.SECTIONS, f"KNOWN_FAILURES names {name}, not a section"
        assert reason.strip(), f"KNOWN_FAILURES[{name!r}] gives no reason"
        assert " ".join(reason.split()) in limitations, (
            f"docs/limitations.md does not repeat why {name} may fail: {reason!r}")


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
