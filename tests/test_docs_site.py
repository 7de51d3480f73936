"""The docs site (mkdocs.yml, docs/; issue 37): a strict build with no warning (a broken link or
anchor, a page missing from the navigation), every page under docs/ in the navigation, the pages
generated from code up to date (tools/docsite/docgen.py --check), the troubleshooting text covering
every reason of agentrun.api.reasons and no other, and the links that leave docs/ pointed at the
repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "tools" / "docsite"))

import docgen  # noqa: E402
import hooks  # noqa: E402

pytest.importorskip("mkdocs", reason="the docs site needs the test extra (mkdocs, mkdocs-material): make install")
pytest.importorskip("material", reason="the docs site needs the test extra (mkdocs-material): make install")


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's !!python/object tags (the toc slugify) read as plain data: only the nav is wanted."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _nav_pages(nav: list) -> list[str]:
    pages: list[str] = []
    for item in nav:
        for value in (item.values() if isinstance(item, dict) else [item]):
            if isinstance(value, list):
                pages += _nav_pages(value)
            elif isinstance(value, str) and not re.match(r"[a-z]+://", value):
                pages.append(value)
    return pages


def test_the_strict_build_has_no_warning(tmp_path: Path) -> None:
    assert (DOCS / "install.md").exists(), "docs/install.md (installing a release, issue 37 item 3) is missing"
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    out = p.stdout + p.stderr
    warnings = [line for line in out.splitlines() if re.match(r"(WARNING|ERROR)\b", line)]
    assert p.returncode == 0 and not warnings, f"mkdocs build --strict failed (exit {p.returncode}):\n{out[-6000:]}"
    home = (tmp_path / "site" / "index.html").read_text()
    assert "lap loop" in home and "troubleshooting/" in home
    assert (tmp_path / "site" / "troubleshooting" / "index.html").exists()


def test_the_build_refuses_a_broken_anchor(tmp_path: Path) -> None:
    """The negative control: the same config fails on a link to a heading that does not exist."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[there](other.md#no-such-heading)\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    cfg.update(docs_dir=str(docs), site_dir=str(tmp_path / "site"), nav=["index.md", "other.md"])
    cfg["hooks"] = [str(ROOT / "tools" / "docsite" / "hooks.py")]
    cfg["markdown_extensions"] = [e for e in cfg["markdown_extensions"] if not (isinstance(e, dict) and "toc" in e)]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert p.returncode != 0 and "no-such-heading" in p.stdout + p.stderr, p.stdout + p.stderr


def test_every_page_under_docs_is_in_the_navigation() -> None:
    cfg = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)
    nav = _nav_pages(cfg["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(set(nav)) == sorted(nav), f"a page is in the navigation twice: {nav}"
    missing = sorted(set(pages) - set(nav))
    assert not missing, f"pages under docs/ that the navigation of mkdocs.yml does not list: {missing}"
    sections = [next(iter(item)) for item in cfg["nav"] if isinstance(item, dict)]
    for section in ("Getting started", "Concepts", "Guides", "Reference", "Troubleshooting", "Security", "Evidence",
                    "Limitations", "Development"):
        assert section in sections, (section, sections)
    guides = _nav_pages(next(item["Guides"] for item in cfg["nav"] if isinstance(item, dict) and "Guides" in item))
    for page in ("agents.md", "tools.md", "approvals.md", "tenancy.md", "scheduling.md", "observability.md",
                 "operations.md", "upgrading.md"):
        assert page in guides, (page, guides)
    reference = _nav_pages(next(item["Reference"] for item in cfg["nav"]
                                if isinstance(item, dict) and "Reference" in item))
    for page in ("crd-reference.md", "cli.md", "metrics.md", "alerts.md"):
        assert page in reference, (page, reference)


def test_the_generated_pages_and_figures_are_up_to_date() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "docsite" / "docgen.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_troubleshooting_covers_every_reason_of_the_code() -> None:
    data = docgen.load_troubleshooting()
    assert docgen.coverage_problems(data) == []
    page = (DOCS / "troubleshooting.md").read_text()
    assert "## By phase" in page and "`Pending`: no lap has started" in page
    for kind, values in docgen.reason_sets().items():
        for v in values:
            assert f"### `{v}`" in page, (kind, v)


def test_troubleshooting_coverage_names_a_missing_and_an_invented_reason() -> None:
    """The negative control of the coverage check."""
    data = docgen.load_troubleshooting()
    first = data["groups"][0]["reasons"]
    gone = next(iter(first))
    data["groups"][0]["reasons"] = {k: v for k, v in first.items() if k != gone} | {
        "NoSuchReason": {"means": "x", "do": "y"}}
    problems = docgen.coverage_problems(data)
    assert any(gone in p and "0 times" in p for p in problems), problems
    assert any("NoSuchReason" in p and "not in agentrun.api.reasons" in p for p in problems), problems
    data["symptoms"] = [{"symptom": "x", "reasons": ["NotAReason"]}]
    assert any("NotAReason" in p for p in docgen.coverage_problems(data))


def test_the_metrics_page_lists_every_metric_of_the_registries() -> None:
    page = (DOCS / "metrics.md").read_text()
    names = [row[0] for row in docgen._metric_rows()]
    assert len(names) > 20 and "agentrun_lap_duration_seconds" in names and "agentrun_runs" in names
    for name in names:
        assert f"| `{name}` |" in page, name
    # every agentrun_ series the alerts use is a documented metric
    alerts = (ROOT / "helm" / "prometheus" / "agentrun-alerts.yaml").read_text()
    used = {m.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
            for m in re.findall(r"\bagentrun_[a-z_]+", alerts)}
    assert used <= set(names), sorted(used - set(names))


def test_the_alerts_page_has_every_alert_and_its_runbook() -> None:
    groups = yaml.safe_load((ROOT / "helm" / "prometheus" / "agentrun-alerts.yaml").read_text())["groups"]
    alerts = [r["alert"] for g in groups for r in g["rules"] if "alert" in r]
    page = (DOCS / "alerts.md").read_text()
    operations = (DOCS / "operations.md").read_text()
    for a in alerts:
        assert f"\n## {a}\n" in page, a
        assert f"\n### {a}\n" in operations, f"docs/operations.md has no runbook section for {a}"


def test_the_home_page_is_the_readme() -> None:
    index = (DOCS / "index.md").read_text()
    assert index == docgen.index_page((ROOT / "README.md").read_text())
    assert "](docs/" not in index


@pytest.mark.parametrize(("page", "target", "want"), [
    ("concepts.md", "../examples/agent.yaml", "https://github.com/agentrun/agentrun/blob/main/examples/agent.yaml"),
    ("index.md", "../bench/", "https://github.com/agentrun/agentrun/tree/main/bench/"),
    ("index.md", "../bench/README.md#results", "https://github.com/agentrun/agentrun/blob/main/bench/README.md#results"),
    ("concepts.md", "cli.md", None),
    ("sub/page.md", "../concepts.md", None),
])
def test_links_that_leave_docs_go_to_the_repository(page: str, target: str, want: str | None) -> None:
    assert hooks.outside_link(page, target, "https://github.com/agentrun/agentrun") == want


def test_the_lap_loop_picture_names_jobs_as_the_code_does() -> None:
    """README's picture, docs/concepts.md and the Job names of the code agree (issue 37: they did not)."""
    from agentrun.controller.decide.jobs import job_name

    template = "<run>-<uid[:5]>-l<lap>-a<attempt>"
    assert template in (ROOT / "README.md").read_text()
    assert f"`{template}`" in (DOCS / "concepts.md").read_text()
    assert job_name("invoices", "c9e4aed9-3b7e-4d0f-a1c2-5e8b7d6f4a21", 3, 1) == "invoices-c9e4a-l3-a1"
