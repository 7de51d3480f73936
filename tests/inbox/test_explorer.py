"""The run explorer (agentrun.inbox.explorer, and its routes in agentrun.inbox.server): pure views
of AgentRun dicts and lap documents; the lap documents are those of ``agentrun trace -o json``."""
from __future__ import annotations

import re
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
from ckpt_builders import RUN, make_record  # noqa: E402

from agentrun.api.contract import run_trace_id  # noqa: E402
from agentrun.api.traceid import check_template, trace_of  # noqa: E402
from agentrun.cli import trace as cli_trace  # noqa: E402
from agentrun.inbox import explorer, identity  # noqa: E402
from agentrun.inbox.kube import ApiError, User  # noqa: E402
from agentrun.inbox.server import Inbox, Settings, make_server  # noqa: E402

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
UID = "8f2a1c0d-4b7e-4f10-9a51-2c3d4e5f6a7b"


class Stored:
    """What CheckpointStore.get_lap returns beside the record (key, sha256, size)."""

    def __init__(self, lap: int) -> None:
        self.key, self.sha256, self.size = f"p/{RUN.namespace}/{RUN.name}/{RUN.uid}/laps/{lap:08d}.json", "ab" * 32, 321


def pairs():
    """Four laps: lap 2 asks for approval, lap 3 (its second attempt) resumes from the decision."""
    recs = [make_record(1), make_record(2, pending=True, outcome="awaiting-approval"),
            make_record(3, attempt=2, decision="approved", text="<script>alert(1)</script> paying"),
            make_record(4, outcome="done")]
    return [(r, Stored(r.lap)) for r in recs]


def run(name="invoices-nov", ns="billing", phase="Running", created="2026-12-01T11:00:00Z", **status):
    return {"metadata": {"namespace": ns, "name": name, "uid": UID, "resourceVersion": "7",
                         "creationTimestamp": created},
            "spec": {"task": f"task of {name} <b>bold</b>"},
            "status": {"phase": phase, "lap": 4, "cost": {"usd": "0.05"}, "agentVersion": "v1", **status}}


# ------------------------------------------------------------------------------ the CLI agrees

def test_a_lap_document_is_the_one_agentrun_trace_prints():
    for record, obj in pairs():
        assert explorer.lap_doc(record, obj) == cli_trace.lap_doc(record, obj.key, obj.sha256, obj.size)
    doc = cli_trace.trace_doc(RUN, {"uri": "s3://b", "endpoint": None, "region": None, "pathStyle": False}, None,
                              pairs())
    assert doc["laps"] == [explorer.lap_doc(r, o) for r, o in pairs()]


def test_the_run_page_shows_each_lap_as_the_cli_json_has_it():
    laps = [explorer.lap_doc(r, o) for r, o in pairs()]
    html = explorer.run_html(run(), laps, None, [], None, NOW, None, run_trace_id(UID))
    for doc in laps:  # the facts of each lap, from the same document
        m = re.search(rf'<details class="lap" id="lap-{doc["lap"]}" data-lap="{doc["lap"]}" '
                      rf'data-attempt="(\d+)" data-outcome="([^"]+)" data-cost="([^"]+)">', html)
        assert m and (int(m[1]), m[2], m[3]) == (doc["attempt"], doc["outcome"]["type"], doc["costUSD"]), doc["lap"]
        for call in doc["toolCalls"]:
            assert f'<code class="idem">{call["idempotencyKey"]}</code>' in html
            assert f'data-call="{call["callId"]}"' in html
        assert doc["key"] in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; paying" in html and "<script>" not in html
    assert "&lt;b&gt;bold" in html
    assert "Asked for approval of call <code>pay_2</code>" in html
    assert "Resumed after call pay_2 approved by alice" in html
    assert ", attempt 2" in html  # the retried lap
    assert run_trace_id(UID) in html and "<a class=\"trace\"" not in html  # no template: the id, no link


def test_the_timeline_has_the_laps_and_the_approval_wait_between_them():
    views = [explorer.lap_view(explorer.lap_doc(r, o)) for r, o in pairs()]
    spans = explorer.timeline(views, NOW)
    assert [(s.kind, s.lap) for s in spans] == [("continue", 1), ("awaiting-approval", 2), ("wait", 2),
                                                ("continue", 3), ("done", 4)]
    wait = spans[2]
    assert wait.start == views[1].approval_requested and wait.end == views[2].started  # no decidedAt: next start
    assert views[2].retries == 1 and views[0].seconds == 2.0
    svg = explorer.timeline_svg(spans)
    assert svg.count("<rect ") == 5 and 'class="tl-wait"' in svg and "<title>approval of pay_2" in svg


def test_a_run_still_waiting_has_an_open_wait_until_now():
    views = [explorer.lap_view(explorer.lap_doc(r, o)) for r, o in pairs()[:2]]
    spans = explorer.timeline(views, NOW, waiting_since=views[1].approval_requested)
    assert spans[-1].kind == "wait" and spans[-1].end == NOW and "waiting after" in spans[-1].label
    assert explorer.timeline(views, NOW)[-1].kind != "wait"  # not waiting any more, no decision read: no bar


def test_the_cost_plot_has_a_point_per_lap_at_the_runs_total():
    views = [explorer.lap_view(explorer.lap_doc(r, o)) for r, o in pairs()]
    svg = explorer.cost_svg(views)
    totals = re.findall(r'data-lap="(\d+)" data-total="([^"]+)"', svg)
    assert totals == [(str(v.lap), v.total_usd) for v in views] == [("1", "0.0125"), ("2", "0.025"), ("3", "0.0375"),
                                                                     ("4", "0.05")]
    ys = [float(y) for y in re.findall(r'<circle class="cost-dot" cx="[\d.]+" cy="([\d.]+)"', svg)]
    assert ys == sorted(ys, reverse=True)  # the total only grows: the line goes up (y down)
    assert "<script" not in svg and "style=" not in svg
    assert explorer.cost_svg([]) == '<p class="note">No laps yet.</p>'


def test_events_newest_first_escaped_or_why_not():
    evs = [{"type": "Normal", "reason": "LapCheckpointed", "message": "lap 1", "count": 1,
            "lastTimestamp": "2026-12-01T11:01:00Z"},
           {"type": "Warning", "reason": "Bad<i>", "message": "<img src=x>", "lastTimestamp": "2026-12-01T11:05:00Z"}]
    html = explorer.events_html(evs, None)
    assert html.index("Bad&lt;i&gt;") < html.index("LapCheckpointed") and "<img" not in html
    assert "may not list" in explorer.events_html(None, "You may not list Events in namespace x.")


def test_the_trace_link_and_a_run_waiting_for_approval_points_to_the_inbox():
    tid, link = trace_of(run(), "https://jaeger.example/trace/{trace_id}")
    html = explorer.run_html(run(phase="AwaitingApproval", approval={"callId": "pay_2", "tool": "post_ledger"}),
                             [], None, [], None, NOW, link, tid)
    assert f'<a class="trace" href="https://jaeger.example/trace/{tid}"' in html
    assert '<a href="/">decide in the approval inbox</a>' in html and "<form" not in html  # read only


# ------------------------------------------------------------------------------------ trace ids

def test_the_trace_of_a_run_is_the_recorded_one_else_its_uids_when_a_ui_is_configured():
    tpl = "https://j/trace/{trace_id}"
    tid = UID.replace("-", "")
    assert run_trace_id(UID) == tid
    assert trace_of(run(), None) == (None, None)  # not recorded, no tracing UI: nothing to show
    assert trace_of(run(), tpl) == (tid, f"https://j/trace/{tid}")
    assert trace_of(run(traceId="ab" * 16), None) == ("ab" * 16, None)
    assert trace_of(run(traceId="ab" * 16), tpl) == ("ab" * 16, "https://j/trace/" + "ab" * 16)
    assert trace_of(run(traceId='"><script>'), tpl) == (tid, f"https://j/trace/{tid}")  # not an id: derived


@pytest.mark.parametrize("template, why", [
    ("javascript:alert(1)//{trace_id}", "https://"), ("https://t/trace", "{trace_id}"),
    ('https://t/"><script>/{trace_id}', "quotes"), ("https://t/ {trace_id}", "whitespace"),
    ("https://t/" + "a" * 600 + "{trace_id}", "longer"),
])
def test_a_bad_trace_url_template_is_refused(template, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        check_template(template)


# ------------------------------------------------------------------------------------ runs list

def test_filters_are_bounded_and_unknown_values_dropped():
    f = explorer.parse_filters({"namespace": ["Team_A"], "phase": ["Exploded"], "q": ["x" * 500]})
    assert (f.namespace, f.phase, len(f.text)) == ("", "", explorer.MAX_QUERY)
    f = explorer.parse_filters({"namespace": ["team-a"], "phase": ["Running"], "q": [" pay "]})
    assert (f.namespace, f.phase, f.text) == ("team-a", "Running", "pay")
    assert f.query() == "?namespace=team-a&phase=Running&q=pay"


def test_runs_filtered_newest_first_with_phase_lap_cost_age_waiting_on():
    runs = [run("old", "a", "Succeeded", "2026-12-01T09:00:00Z"),
            run("new", "b", "AwaitingApproval", "2026-12-01T11:59:00Z", waitingOn="finance"),
            run("mid", "a", "Running", "2026-12-01T11:00:00Z", message="calling pay")]
    rows, n = explorer.run_rows(runs, NOW, explorer.Filters())
    assert [r.name for r in rows] == ["new", "mid", "old"] and n == 3
    assert (rows[0].phase, rows[0].lap, rows[0].cost_usd, rows[0].age_seconds, rows[0].waiting_on) == (
        "AwaitingApproval", 4, "0.05", 60, "finance")
    assert [r.name for r in explorer.run_rows(runs, NOW, explorer.Filters(namespace="a"))[0]] == ["mid", "old"]
    assert [r.name for r in explorer.run_rows(runs, NOW, explorer.Filters(phase="Succeeded"))[0]] == ["old"]
    assert [r.name for r in explorer.run_rows(runs, NOW, explorer.Filters(text="FINANCE"))[0]] == ["new"]
    assert [r.name for r in explorer.run_rows(runs, NOW, explorer.Filters(text="pay"))[0]] == ["mid"]
    html = explorer.runs_html(rows, 3, 3, [])
    assert 'href="/runs/b/new"' in html and "1m ago" in html and "(3 of 3)" in html


def test_a_long_list_is_cut_and_says_so():
    runs = [run(f"r{i}", created=(NOW - timedelta(seconds=i)).isoformat()) for i in range(explorer.MAX_ROWS + 3)]
    rows, n = explorer.run_rows(runs, NOW, explorer.Filters())
    assert len(rows) == explorer.MAX_ROWS and n == explorer.MAX_ROWS + 3 and rows[0].name == "r0"
    assert "narrow the filter" in explorer.runs_html(rows, n, n, [])


@given(st.text(max_size=300))
def test_any_text_in_a_run_is_escaped(text):
    r = run(message=text)
    r["spec"]["task"] = text
    html = explorer.runs_html(explorer.run_rows([r], NOW, explorer.Filters())[0], 1, 1, [text])
    html += explorer.run_html(r, [], text, [{"message": text, "reason": text, "type": text}], None, NOW, None, None)
    body = re.sub(r"<[a-z/][^<>]*>", "", html)  # the markup the views write; what is left is text
    assert "<" not in body and ">" not in body


# -------------------------------------------------------------------------- routes and identity

class FakeKube:
    """The API server as bob sees it: he may list and get agentruns in team-a only (403 elsewhere)
    and may not list Events; every call is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def request(self, method, path, user, **kw):  # the cluster-wide list of Inbox.scopes
        raise ApiError(403, '{"message": "forbidden"}', "list agentruns")

    def list_namespaces(self, user):
        return ["team-a", "team-b"]

    def list_runs(self, user, ns):
        self.calls.append(("list", user.name, ns))
        if ns != "team-a":
            raise ApiError(403, '{"message": "forbidden"}', "list agentruns")
        return {"items": [run("mine", "team-a")]}

    def get_run(self, user, ns, name):
        self.calls.append(("get", user.name, ns, name))
        if ns != "team-a":
            raise ApiError(403, '{"message": "forbidden"}', "get agentrun")
        return run(name, ns)

    def list_events(self, user, ns, name, uid=None):
        self.calls.append(("events", user.name, ns, name, uid))
        raise ApiError(403, '{"message": "forbidden"}', "list events")


class NoStore:
    def __init__(self) -> None:
        self.read = []

    def history(self, r, count):
        self.read.append(r["metadata"]["name"])
        return [], "checkpoint store not read: none here"


def test_the_list_has_only_the_namespaces_the_person_may_list_and_no_error():
    kube, store = FakeKube(), NoStore()
    app = Inbox(kube, Settings(), store)
    main, namespaces = app.runs_list(User("bob"), explorer.Filters())
    assert namespaces == ["team-a"] and "team-a/" in main and "team-b" not in main and "notice" not in main
    assert ("list", "bob", "team-b") in kube.calls  # asked as bob, refused, absent


def test_a_run_the_person_may_not_read_is_not_shown_nor_its_store_read():
    kube, store = FakeKube(), NoStore()
    app = Inbox(kube, Settings(trace_url_template="https://j/trace/{trace_id}"), store)
    status, html = app.run_page(User("bob"), "team-b", "theirs")
    assert status == 403 and "that you may read" in html and store.read == []
    status, html = app.run_page(User("bob"), "team-a", "mine")
    assert status == 200 and store.read == ["mine"] and ("events", "bob", "team-a", "mine", UID) in kube.calls
    assert "You may not list Events in namespace team-a." in html and "none here" in html
    assert f'href="https://j/trace/{run_trace_id(UID)}"' in html


KEY = b"k" * 32


@pytest.fixture(scope="module")
def url():
    kube = FakeKube()
    srv = make_server(Inbox(kube, Settings(key=KEY, secure_cookies=False), NoStore()), "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", kube
    srv.shutdown()
    srv.server_close()


def test_explorer_routes_need_a_session_and_refuse_bad_names_before_the_api(url):
    base, kube = url
    assert httpx.get(f"{base}/runs").status_code == 303
    assert httpx.get(f"{base}/runs/team-a/mine/fragment").status_code == 401
    s = identity.new_session(User("bob"), time.time(), 600)
    cookies = {identity.COOKIE: identity.encode_session(s, KEY)}
    before = len(kube.calls)
    for bad in ("/runs/Team_A/x", "/runs/a/%3Cscript%3E", "/runs/a/b/c"):
        r = httpx.get(base + bad, cookies=cookies)
        assert r.status_code == 404 and "<script>" not in r.text, bad
    assert len(kube.calls) == before
    r = httpx.get(f"{base}/runs?namespace=team-a&q=%3Cb%3E", cookies=cookies)
    assert r.status_code == 200 and 'data-live="/runs/fragment?namespace=team-a&amp;q=%3Cb%3E"' in r.text
    assert 'value="&lt;b&gt;"' in r.text and "script-src 'self'" in r.headers["content-security-policy"]
    r = httpx.get(f"{base}/runs/team-a/mine", cookies=cookies)
    assert r.status_code == 200 and 'data-live="/runs/team-a/mine/fragment"' in r.text and "Events" in r.text
    assert httpx.get(f"{base}/runs/team-b/theirs/fragment", cookies=cookies).status_code == 403


def test_the_lap_in_flight_and_failed_attempts_from_status():
    views = [explorer.lap_view(explorer.lap_doc(r, o)) for r, o in pairs()]
    r = run(activeJob={"name": "j", "lap": 5, "attempt": 2, "agentVersion": "v1",
                       "startedAt": (NOW - timedelta(seconds=90)).isoformat()},
            retries=[{"lap": 5, "retries": 1, "lastReason": "<OOMKilled>"}, {"lap": 3, "retries": 1}], totalRetries=2)
    spans = explorer.timeline(views, NOW, active=explorer.active_lap(r))
    assert (spans[-1].kind, spans[-1].lap, spans[-1].end) == ("running", 5, NOW)
    assert spans[-1].label == "lap 5 in progress, attempt 2, for 1m30s"
    assert explorer.active_lap(run()) is None
    assert explorer.lap_retries(r) == {5: "1 failed: <OOMKilled>", 3: "1 failed"}
    html = explorer.run_html(r, [explorer.lap_doc(x, o) for x, o in pairs()], None, [], None, NOW, None, None)
    assert 'class="tl-running"' in html and '<span class="note failed-attempts">1 failed</span>' in html
    assert "<dt>Failed attempts</dt><dd>2</dd>" in html and "<OOMKilled>" not in html
