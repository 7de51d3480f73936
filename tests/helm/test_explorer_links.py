"""The chart's links to the run explorer and the traces (issue 35): the Grafana dashboard's per-run
tables link each run's name to its explorer page (dashboard.explorerURL) and its trace id (the
``agentrun_run_info`` series, joined in by PromQL that promtool evaluates here) to its trace
(dashboard.traceUrlTemplate, else inbox.traceUrlTemplate); the inbox gets the trace URL template
(inbox.traceUrlTemplate); bad values are refused by the values schema."""
from __future__ import annotations

import json
import subprocess

import yaml
from helm_support import CHART, template

DASHBOARD = CHART / "files" / "dashboard.json"


def _links(dash: dict, field: str = "name") -> dict[str, list[dict]]:
    out = {}
    for p in dash["panels"]:
        for o in p["fieldConfig"].get("overrides", []):
            if o["matcher"] == {"id": "byName", "options": field}:
                out[p["title"]] = next(x["value"] for x in o["properties"] if x["id"] == "links")
    return out


def _per_run_tables(dash: dict) -> list[dict]:
    return [p for p in dash["panels"] if p["type"] == "table" and all("namespace=~" in t["expr"] for t in p["targets"])]


def _boxes(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"] if v["type"] == "textbox"}


def test_every_per_run_table_links_the_run_to_its_explorer_page():
    dash = json.loads(DASHBOARD.read_text())
    per_run = {p["title"] for p in dash["panels"] if p["type"] == "table"
               and all("namespace=~" in t["expr"] for t in p["targets"])}
    links = _links(dash)
    assert per_run and set(links) == per_run, (per_run, set(links))
    for title, value in links.items():
        assert value[0]["url"] == "${explorer}/runs/${__data.fields.namespace}/${__value.raw}", title
    box = next(v for v in dash["templating"]["list"] if v["name"] == "explorer")
    assert box["type"] == "textbox" and box["query"] == ""


def test_every_per_run_table_links_the_run_to_its_trace():
    dash = json.loads(DASHBOARD.read_text())
    per_run = {p["title"] for p in _per_run_tables(dash)}
    links = _links(dash, "trace_id")
    assert per_run and set(links) == per_run, (per_run, set(links))
    for title, value in links.items():
        assert value[0]["url"] == "${trace_url_prefix}${__value.raw}${trace_url_suffix}", title
    for p in _per_run_tables(dash):  # the first query of each table carries the run's trace_id label
        assert "group_left(trace_id)" in p["targets"][0]["expr"] and "agentrun_run_info" in p["targets"][0]["expr"]
    boxes = _boxes(dash)
    assert boxes["trace_url_prefix"]["query"] == boxes["trace_url_suffix"]["query"] == ""


def test_the_tables_queries_join_the_trace_id_and_keep_runs_without_one(promtool, tmp_path):
    """promtool evaluates each table's first query on series like the operator's: a run with a trace
    id (agentrun_run_info) gets the label, a run without one (tracing off) is still listed, once."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [p["targets"][0]["expr"].replace("$namespace", ".*") for p in _per_run_tables(dash)]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "tables", "rules": [
        {"record": f"table_{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    series = []
    for metric in ("agentrun_run_last_checkpoint_age_seconds", "agentrun_run_cost_usd",
                   "agentrun_run_current_lap_retries"):
        for name in ("traced", "untraced"):
            series.append({"series": f'{metric}{{job="op",instance="i",namespace="ns",name="{name}"}}', "values": "5x2"})
    for name in ("traced", "untraced"):
        series.append({"series": f'agentrun_approval_age_seconds{{job="op",instance="i",namespace="ns",name="{name}",'
                                 'owner="o"}', "values": "5x2"})
    series.append({"series": 'agentrun_run_info{job="op",instance="i",namespace="ns",name="traced",'
                             'trace_id="0123456789abcdef0123456789abcdef"}', "values": "1x2"})
    expected = []
    for i, e in enumerate(exprs):
        owner = ',owner="o"' if "approval_age" in e else ""
        expected.append({"eval_time": "1m", "expr": f"table_{i}", "exp_samples": [
            {"labels": f'table_{i}{{job="op",instance="i",namespace="ns",name="traced",'
                       f'trace_id="0123456789abcdef0123456789abcdef"{owner}}}', "value": 5},
            {"labels": f'table_{i}{{job="op",instance="i",namespace="ns",name="untraced"{owner}}}', "value": 5}]})
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": expected}]}))
    proc = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_chart_fills_in_the_explorer_url_and_the_trace_template(helm):
    _, docs = template(helm, "--set", "dashboard.enabled=true", "--set", "dashboard.explorerURL=https://inbox.example/",
                       "--set", "inbox.enabled=true",
                       "--set", "inbox.traceUrlTemplate=https://jaeger.example/trace/{trace_id}")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    dash = json.loads(cm["data"]["agentrun.json"])
    box = next(v for v in dash["templating"]["list"] if v["name"] == "explorer")
    assert box["query"] == box["current"]["value"] == "https://inbox.example"
    assert dash["uid"] == "agentrun-overview" and _links(dash) == _links(json.loads(DASHBOARD.read_text()))
    assert [p["gridPos"] for p in dash["panels"]] == [p["gridPos"] for p in json.loads(DASHBOARD.read_text())["panels"]]
    inbox = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-inbox"))
    env = {e["name"]: e.get("value") for e in inbox["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTRUN_TRACE_URL_TEMPLATE"] == "https://jaeger.example/trace/{trace_id}"
    boxes = _boxes(dash)  # the dashboard's trace link: the inbox's template when dashboard.traceUrlTemplate is unset
    assert (boxes["trace_url_prefix"]["current"]["value"], boxes["trace_url_suffix"]["query"]) == (
        "https://jaeger.example/trace/", "")
    assert _links(dash, "trace_id") == _links(json.loads(DASHBOARD.read_text()), "trace_id")
    _, docs = template(helm, "--set", "dashboard.enabled=true", "--set", "inbox.traceUrlTemplate=https://j.example/t/{trace_id}",
                       "--set", "dashboard.traceUrlTemplate=https://grafana.example/explore?trace={trace_id}&x=1")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    boxes = _boxes(json.loads(cm["data"]["agentrun.json"]))
    assert (boxes["trace_url_prefix"]["query"], boxes["trace_url_suffix"]["current"]["value"]) == (
        "https://grafana.example/explore?trace=", "&x=1")
    assert boxes["explorer"]["query"] == ""
    _, docs = template(helm, "--set", "dashboard.enabled=true", "--set", "inbox.enabled=true")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert cm["data"]["agentrun.json"] == DASHBOARD.read_text().rstrip("\n")  # unset: the file as it is
    inbox = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-inbox"))
    assert "AGENTRUN_TRACE_URL_TEMPLATE" not in {e["name"] for e in inbox["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_bad_links_are_refused_by_the_values_schema(helm):
    for value in ("inbox.traceUrlTemplate=https://jaeger.example/trace", "inbox.traceUrlTemplate=javascript:x{trace_id}",
                  'dashboard.explorerURL=https://x/"><script>', "dashboard.explorerURL=ftp://x",
                  "dashboard.traceUrlTemplate=https://j/trace/", "dashboard.traceUrlTemplate=https://j/{trace_id}/{trace_id}",
                  "dashboard.traceUrlTemplate=javascript:alert(1){trace_id}"):
        proc, _ = template(helm, "--set", value, check=False)
        assert proc.returncode != 0 and "pattern" in proc.stderr, (value, proc.stderr)
