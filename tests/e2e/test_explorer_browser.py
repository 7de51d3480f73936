"""The run explorer (/runs, /runs/NS/NAME of the inbox's web app) in a real headless browser
(Debian's Chromium, driven by Playwright) against the local control plane, with the operator, the
S3 server and the inbox of test_inbox_browser.py (its fixtures; the inbox runs as its own
ServiceAccount with the chart's inbox RBAC, the people sign in with ServiceAccount tokens):

* bob (may read agentruns and Events in this module's namespace, and list namespaces; nothing
  else) sees the runs of that namespace and not those of another one, without an error; a run of
  the other namespace is not shown to him by its URL either; a run made while his page is open
  appears without a reload;
* a run of 4 laps with a tool call in most and one approval: its page's timeline (laps, the
  approval wait) and each lap's attempt, outcome, cost, tool calls and idempotency keys are those
  of ``agentrun trace --output json`` for that run; its Events are listed; its trace link is the
  configured template with the run's uid as the trace id.

Screenshots (explorer-runs.png, explorer-run.png) go where test_inbox_browser.py puts its own
(AGENTRUN_INBOX_SCREENSHOTS: docs/images for the docs).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from test_approval_authz import cli
from test_inbox_browser import browser, inbox, no_reload, shots, sign_in  # noqa: F401
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.api.approval import ANN_APPROVED
from agentrun.api.contract import run_trace_id

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRACE_TEMPLATE = "http://jaeger.test/trace/{trace_id}"
PRICING = {"inputPerMillionTokensUSD": "3.00", "outputPerMillionTokensUSD": "15.00"}


def _usage(i: int) -> dict:
    return {"inputTokens": 1000 * i, "outputTokens": 200 + 50 * i}


@pytest.fixture(scope="module")
def explorer(inbox):  # noqa: F811
    """An inbox of every namespace the person may list (not --namespaces), with a trace link; bob
    may list namespaces and read Events here; another namespace holds a run bob may not read."""
    e = inbox.env
    c = e.cluster
    c.kubectl_run("create", "clusterrole", f"ns-lister-{e.ns}", "--verb=list", "--resource=namespaces")
    c.kubectl_run("create", "clusterrolebinding", f"bob-lists-ns-{e.ns}", f"--clusterrole=ns-lister-{e.ns}",
                  f"--serviceaccount={e.ns}:bob")
    c.kubectl_run("create", "role", "event-reader", "-n", e.ns, "--verb=list", "--resource=events")
    c.kubectl_run("create", "rolebinding", "bob-reads-events", "-n", e.ns, "--role=event-reader",
                  f"--serviceaccount={e.ns}:bob")
    other = f"{e.ns}-other"
    c.kubectl_run("create", "namespace", other)
    doc = e.run_doc("not-for-bob", [{"content": "done"}])
    c.kubectl_run("apply", "-n", other, "-f", "-", input=json.dumps(doc))
    url = inbox.spawn("token", "--namespaces", "", "--trace-url-template", TRACE_TEMPLATE)
    yield SimpleNamespace(url=url, tokens=inbox.tokens, users=inbox.users, env=e, other=other)
    c.kubectl_run("delete", "namespace", other, "--wait=false", check=False)
    c.kubectl_run("delete", "clusterrolebinding", f"bob-lists-ns-{e.ns}", check=False)
    c.kubectl_run("delete", "clusterrole", f"ns-lister-{e.ns}", check=False)


@pytest.fixture(scope="module")
def finished_run(explorer):
    """A run of 4 laps: a note, a refund that waits for approval (approved with kubectl), a note,
    done; each lap with tokens at a price, so the cost grows lap by lap."""
    e = explorer.env
    script = [
        {"content": "noting the order", "toolCalls": [{"name": "note", "arguments": {"text": "order 4711"}}],
         "usage": _usage(1)},
        {"content": "refunding <b>4711</b>", "toolCalls": [{"name": "refund", "arguments": {"order": "4711"}}],
         "usage": _usage(2)},
        {"content": "noting the refund", "toolCalls": [{"name": "note", "arguments": {"text": "refunded"}}],
         "usage": _usage(3)},
        {"content": "finished", "usage": _usage(4)},
    ]
    doc = e.run_doc("explore-me", script)
    doc["spec"]["agent"]["model"]["pricing"] = PRICING
    e.apply(doc)
    assert e.wait_phase("explore-me", "AwaitingApproval", "Failed", "Succeeded")["phase"] == "AwaitingApproval"
    e.kubectl("annotate", "agentrun", "explore-me", "-n", e.ns, f"{ANN_APPROVED}=true", "agentrun.dev/reason=ok")
    st = e.wait_phase("explore-me", "Succeeded", "Failed", timeout=180)
    assert st["phase"] == "Succeeded", st
    r = cli(e, "trace", "explore-me", "-n", e.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_non_approver_sees_the_runs_of_the_namespaces_he_may_read_and_no_others(explorer, finished_run,
                                                                                 browser, shots):  # noqa: F811
    e = explorer.env
    e.apply(e.run_doc("explore-waits", [  # waits for a decision: its row names who it waits on
        {"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": "4712"}}]},
        {"content": "finished"}]))
    page = sign_in(browser, explorer, "bob")
    page.goto(f"{explorer.url}/runs")
    page.locator("#live", has_text="Live:").wait_for()
    page.evaluate("window.__noReload = 42")
    rows = page.locator("table.runs tbody tr")
    rows.first.wait_for()
    keys = {rows.nth(i).get_attribute("data-key") for i in range(rows.count())}
    assert f"{e.ns}/explore-me" in keys and all(k.startswith(f"{e.ns}/") for k in keys), keys
    assert page.locator(".notice").count() == 0  # the other namespace is simply absent, not an error
    assert explorer.other not in page.content()
    row = page.locator(f'tr[data-key="{e.ns}/explore-me"]')
    cells = row.locator("td").all_text_contents()
    assert cells[1:4] == ["Succeeded", str(finished_run["totals"]["laps"]), e.status("explore-me")["cost"]["usd"]], cells
    assert cells[4].endswith("ago")
    # the run of the other namespace, by its URL: not shown, and nothing of it on the page
    r = page.request.get(f"{explorer.url}/runs/{explorer.other}/not-for-bob")
    assert r.status == 403 and "that you may read" in r.text() and "e2e not-for-bob" not in r.text()
    # filter: by phase (a server-side form; the live part follows the filter)
    page.select_option("#f-phase", "Succeeded")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(r"/runs\?.*phase=Succeeded"))
    page.locator("#live", has_text="Live:").wait_for()
    page.evaluate("window.__noReload = 42")
    # a run made while the page is open shows up without a reload (the inbox's event stream)
    e.apply(e.run_doc("explore-new", [{"content": "done", "usage": _usage(1)}]))
    assert e.wait_phase("explore-new", "Succeeded", "Failed")["phase"] == "Succeeded"
    page.locator(f'tr[data-key="{e.ns}/explore-new"]').wait_for(timeout=60_000)
    no_reload(page)
    assert page.locator("table.runs tbody tr td:nth-child(2)").all_text_contents() == (
        ["Succeeded"] * page.locator("table.runs tbody tr").count())
    assert e.wait_phase("explore-waits", "AwaitingApproval", "Failed", "Succeeded")["phase"] == "AwaitingApproval"
    page.goto(f"{explorer.url}/runs")
    waits = page.locator(f'tr[data-key="{e.ns}/explore-waits"]')
    waits.wait_for()
    assert waits.locator("td").all_text_contents()[1] == "AwaitingApproval"
    assert waits.locator("td").all_text_contents()[5] == "e2e-team"  # the approval's owner (status.waitingOn)
    page.screenshot(path=str(shots / "explorer-runs.png"), full_page=True)
    page.context.close()


def test_a_runs_timeline_and_laps_match_agentrun_trace_json(explorer, finished_run, browser, shots):  # noqa: F811
    e = explorer.env
    trace = finished_run
    laps = trace["laps"]
    assert len(laps) >= 4 and sum(1 for lap in laps if lap["toolCalls"]) >= 2, laps
    page = sign_in(browser, explorer, "bob")
    page.goto(f"{explorer.url}/runs")
    page.click(f'tr[data-key="{e.ns}/explore-me"] a')
    page.wait_for_url(f"{explorer.url}/runs/{e.ns}/explore-me")
    page.locator("#live", has_text="Live:").wait_for()
    # the laps table and each lap's details: the CLI's document, lap by lap
    assert page.locator("table.laps-table tbody tr").count() == len(laps)
    for lap in laps:
        cells = page.locator(f'table.laps-table tr[data-lap="{lap["lap"]}"] td').all_text_contents()
        t = lap["timings"]
        seconds = (datetime.fromisoformat(t["finishedAt"]) - datetime.fromisoformat(t["startedAt"])).total_seconds()
        assert cells[3] == datetime.fromisoformat(t["startedAt"]).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
        assert (cells[4], cells[5], cells[6]) == (f"{seconds:.1f}s", lap["costUSD"], str(len(lap["toolCalls"])))
        d = page.locator(f'details.lap[data-lap="{lap["lap"]}"]')
        assert (d.get_attribute("data-attempt"), d.get_attribute("data-outcome"), d.get_attribute("data-cost")) == (
            str(lap["attempt"]), lap["outcome"]["type"], lap["costUSD"]), lap["lap"]
        d.locator("summary").click()
        shown = d.locator("tr.tool")
        assert shown.count() == len(lap["toolCalls"])
        for i, call in enumerate(lap["toolCalls"]):
            t = shown.nth(i)
            assert t.get_attribute("data-call") == call["callId"]
            assert t.locator("code.idem").text_content() == call["idempotencyKey"]
            assert json.loads(t.locator("code.args").text_content()) == call["arguments"]
            assert t.locator(".status").text_content().startswith(call["status"])
        said = [m["content"] for m in lap["messages"] if m["role"] == "assistant" and m.get("content")]
        for text in said:
            assert text in d.locator("ol.messages").text_content()  # escaped, shown as text
        assert lap["key"] in d.locator(".stored").text_content()
    # the timeline: a bar per lap and one for the approval wait; the cost plot: the CLI's totals
    waits = sum(1 for lap in laps if lap.get("pendingApproval"))
    assert waits == 1
    assert page.locator("svg.timeline rect").count() == len(laps) + waits
    assert page.locator("svg.timeline rect.tl-wait").count() == waits
    totals = [(c.get_attribute("data-lap"), c.get_attribute("data-total"))
              for c in page.locator("svg.cost circle").all()]
    assert totals == [(str(lap["lap"]), lap["totals"]["costUSD"]) for lap in laps]
    # decided by whom, as the lap resumed from it records
    decision = next(lap["approvalDecision"] for lap in laps if lap.get("approvalDecision"))
    assert f"approved by {decision['decidedBy']}" in page.locator("#explore").text_content()
    # Events (bob may list them here) and the trace link from the run's uid
    page.locator("table.events", has_text="LapCheckpointed").wait_for()
    uid = trace["run"]["uid"]
    assert page.locator("a.trace").get_attribute("href") == TRACE_TEMPLATE.replace("{trace_id}", run_trace_id(uid))
    assert explorer.tokens["bob"] not in page.content() and e.s3.secret_key not in page.content()
    approval_lap = str(next(lap["lap"] for lap in laps if lap.get("pendingApproval")))
    for d in page.locator("details.lap").all():  # for the screenshot: only the approval's lap open
        if d.get_attribute("data-lap") != approval_lap:
            d.locator("summary").click()
    page.screenshot(path=str(shots / "explorer-run.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider than the screen
    wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391
        && !e.closest('.scroll')).slice(0, 5).map(e => e.tagName + '.' + e.className)""")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, wide
    page.context.close()
