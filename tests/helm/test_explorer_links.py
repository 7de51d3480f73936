"""The chart's links to the run explorer (issue 35): the Grafana dashboard's per-run tables link
each run's name to its explorer page (dashboard.explorerURL), and the inbox gets the trace URL
template (inbox.traceUrlTemplate); bad values are refused by the values schema."""
from __future__ import annotations

import json

from helm_support import CHART, template

DASHBOARD = CHART / "files" / "dashboard.json"


def _links(dash: dict) -> dict[str, list[dict]]:
    out = {}
    for p in dash["panels"]:
        for o in p["fieldConfig"].get("overrides", []):
            if o["matcher"] == {"id": "byName", "options": "name"}:
                out[p["title"]] = next(x["value"] for x in o["properties"] if x["id"] == "links")
    return out


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
    _, docs = template(helm, "--set", "dashboard.enabled=true", "--set", "inbox.enabled=true")
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert cm["data"]["agentrun.json"] == DASHBOARD.read_text().rstrip("\n")  # unset: the file as it is
    inbox = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-inbox"))
    assert "AGENTRUN_TRACE_URL_TEMPLATE" not in {e["name"] for e in inbox["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_bad_links_are_refused_by_the_values_schema(helm):
    for value in ("inbox.traceUrlTemplate=https://jaeger.example/trace", "inbox.traceUrlTemplate=javascript:x{trace_id}",
                  'dashboard.explorerURL=https://x/"><script>', "dashboard.explorerURL=ftp://x"):
        proc, _ = template(helm, "--set", value, check=False)
        assert proc.returncode != 0 and "pattern" in proc.stderr, (value, proc.stderr)
