"""The Grafana dashboard: valid JSON, the panels asked for, and every metric a panel queries is
one the operator exports (read from a real scrape of the collector)."""
from __future__ import annotations

import json
import re

from helm_support import CHART
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agentrun.metrics import OperatorMetrics

DASHBOARD = CHART / "files" / "dashboard.json"
ALERTS = CHART / "files" / "alerts.yaml"
# series Prometheus itself adds to every target
PROMETHEUS_SERIES = {"up"}
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right",
    "rate", "increase", "irate", "histogram_quantile", "sort_desc", "sort", "time", "absent", "and", "or",
    "unless", "topk", "bottomk", "le", "bool", "offset", "delta", "clamp_min",
}


def exported_series() -> set[str]:
    m = OperatorMetrics(process_metrics=False, clock=lambda: 2e9)
    # make every optional series appear: a running run with budget and checkpoint, a pending approval
    m.observe_run("ns", "a", {"budget": {"maxCostUSD": "1"}}, {
        "phase": "AwaitingApproval", "lap": 1, "startedAt": "2033-01-01T00:00:00Z", "traceId": "ab" * 16,
        "lastCheckpointTime": "2033-01-01T00:00:00Z", "cost": {"usd": "0.1"}, "storage": {"bytes": 1, "objects": 1},
        "approval": {"state": "Pending", "owner": "o", "requestedAt": "2033-01-01T00:00:00Z",
                     "deadline": "2033-01-02T00:00:00Z"}})
    names = set()
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        names.update(s.name for s in fam.samples)
    return names


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\{[^}]*\}", "", expr)        # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)       # ranges
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\$\w+", "", expr)             # grafana variables
    return {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in PROMQL_WORDS}


def panels():
    return json.loads(DASHBOARD.read_text())["panels"]


def test_dashboard_is_valid_json_with_unique_ids():
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] == "agentrun-overview"
    assert all(p["targets"] for p in dash["panels"])


def test_dashboard_has_the_panels_operators_need():
    titles = " | ".join(p["title"] for p in panels()).lower()
    for needle in ("by phase", "laps per minute", "since last checkpoint", "approval queue",
                   "cost per run", "spend", "retries"):
        assert needle in titles, needle


def test_every_panel_queries_only_exported_metrics():
    exported = exported_series() | PROMETHEUS_SERIES
    for p in panels():
        for t in p["targets"]:
            unknown = metric_names(t["expr"]) - exported
            assert not unknown, (p["title"], t["expr"], unknown)


def test_every_alert_queries_only_exported_metrics():
    import yaml

    exported = exported_series() | PROMETHEUS_SERIES
    for g in yaml.safe_load(ALERTS.read_text())["groups"]:
        for r in g["rules"]:
            expr = re.sub(r"\[\[\w+\]\]", "1", r["expr"])
            unknown = metric_names(expr) - exported
            assert not unknown, (r["alert"], unknown)


def test_name_check_can_fail():
    assert metric_names('sum(rate(agentrun_not_a_metric_total[5m]))') == {"agentrun_not_a_metric_total"}
