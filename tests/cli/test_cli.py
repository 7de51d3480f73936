"""The ``agentrun`` CLI's pure parts (rows, JSON shapes, store resolution, the fork object) and its
one-line errors, without a cluster (a fake CustomObjectsApi only where the I/O is the subject)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checkpoint"))
from ckpt_builders import RUN, make_record  # noqa: E402

from agentrun.checkpoint import locate  # noqa: E402
from agentrun.cli import approvals as ap  # noqa: E402
from agentrun.cli import fork as fk
from agentrun.cli import kube
from agentrun.cli import runs as rn
from agentrun.cli import trace as tr
from agentrun.cli.exitcodes import ExitCode
from agentrun.cli.main import SUBCOMMANDS, main

NOW = datetime(2030, 5, 1, 12, 0, tzinfo=UTC)


def run(name: str, ns: str = "team-a", phase: str | None = "Running", lap: int = 3, since: int | None = 65,
        waiting: str | None = None, **status: Any) -> dict:
    st: dict[str, Any] = {"lap": lap, "cost": {"usd": "1.25"}, **status}
    if phase:
        st["phase"] = phase
    if since is not None:
        st["lastCheckpointTime"] = (NOW - timedelta(seconds=since)).isoformat().replace("+00:00", "Z")
    if waiting:
        st["waitingOn"] = waiting
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"}, "spec": {"task": "t"}, "status": st}


# ------------------------------------------------------------------------------------- runs

def test_run_rows_and_table():
    rows = rn.run_rows([run("b", waiting="ops", phase="AwaitingApproval"), run("a", since=None, phase=None, lap=0),
                        run("c", ns="team-0", since=7200)], NOW)
    assert [(r["namespace"], r["name"]) for r in rows] == [("team-0", "c"), ("team-a", "a"), ("team-a", "b")]
    a = rows[1]
    assert a["phase"] == "Pending" and a["lap"] == 0 and a["secondsSinceCheckpoint"] is None
    assert rows[2]["waitingOn"] == "ops" and rows[2]["secondsSinceCheckpoint"] == 65
    lines = rn.format_runs(rows).splitlines()
    assert lines[0].split() == list(rn.COLUMNS)
    assert lines[1].split() == ["c", "Running", "3", "2h", "$1.25", "<none>", "<none>"]
    assert lines[3].split() == ["b", "AwaitingApproval", "3", "1m5s", "$1.25", "ops", "<none>"]
    assert rn.format_runs(rows, with_namespace=True).splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]


def test_runs_json_and_yaml_shapes():
    rows = rn.run_rows([run("a")], NOW)
    doc = json.loads(rn.render(rows, "json", False))
    assert set(doc[0]) == {"namespace", "name", "agent", "agentPinned", "phase", "lap", "lastCheckpointTime", "secondsSinceCheckpoint",
                           "costUSD", "waitingOn", "agentVersion", "forkedFrom", "message", "cause",
                           "retriesInPlace"}
    import yaml

    assert yaml.safe_load(rn.render(rows, "yaml", False)) == doc


def test_runs_show_the_cause_of_a_failing_or_retrying_run_on_one_bounded_line():
    cause = "RetryableError: model endpoint http://m:8080/v1 unreachable (ConnectError)"
    retrying = run("r", phase="Retrying", lap=2, message="lap 3 attempt 1 failed (...)",
                   retries=[{"lap": 2, "retries": 1, "lastReason": "old"}, {"lap": 3, "retries": 1, "lastReason": cause}])
    failed = run("f", phase="Failed", message="lap 1 \x1b[2Jfailed; last: " + cause + "\n" + "x" * 300)
    held = run("h", phase="Pending", conditions=[{"type": "Progressing", "status": "True", "reason": "SecretMissing",
                                                  "message": "lap 1 attempt 1 cannot start: Secret 'k' does not exist"}])
    rows = {r["name"]: r for r in rn.run_rows([retrying, failed, held, run("ok")], NOW)}
    assert rows["r"]["cause"] == cause and rows["ok"]["cause"] is None
    assert rows["h"]["cause"].endswith("Secret 'k' does not exist")
    lines = rn.format_runs(list(rows.values())).splitlines()
    assert len(lines) == 5  # one line per run: the cause's newline and escape are escaped
    (f_line,) = [ln for ln in lines if ln.startswith("f ")]
    assert "last: RetryableError: model endpoint" in f_line and "\x1b[" not in f_line and "\\x1b[" in f_line
    assert len(f_line.split("   lap 1 ", 1)[1]) < rn.MAX_CAUSE_COLUMN
    assert any(ln.startswith("r ") and ln.rstrip().endswith("(ConnectError)") for ln in lines)


# ---------------------------------------------------------------------------- store resolution

def test_store_prefix_from_the_status_object_uri():
    f = locate.store_prefix_from_status
    assert f("s3://b/pre/fix/ns/n/u/laps/00000003.json", "ns", "n", "u") == "s3://b/pre/fix"
    assert f("s3://b/ns/n/u/snapshots/00000002.json", "ns", "n", "u") == "s3://b"
    assert f("s3://b/pre/xns/n/u/laps/1.json", "ns", "n", "u") is None  # not a segment boundary
    assert f("s3://b/pre/other/n/u/laps/1.json", "ns", "n", "u") is None
    assert f("", "ns", "n", "u") is None


def test_resolve_store_precedence_flags_env_spec_status():
    body = {"metadata": {"namespace": "ns", "name": "n", "uid": "u"},
            "spec": {"checkpoint": {"region": "eu-1"}},
            "status": {"checkpoint": {"uri": "s3://b/p/ns/n/u/laps/00000001.json", "endpoint": "http://st:9000",
                                      "pathStyle": True, "region": "us-9"}}}
    got = locate.resolve_store({}, {}, body)
    assert (got["uri"], got["endpoint"], got["region"], got["pathStyle"]) == ("s3://b/p", "http://st:9000", "eu-1", True)
    assert got["from"] == {"uri": "status.checkpoint.uri", "endpoint": "status.checkpoint.endpoint",
                           "region": "spec.checkpoint.region", "pathStyle": "status.checkpoint.pathStyle"}
    env = {"AGENTRUN_CHECKPOINT_URI": "s3://envb/x", "AGENTRUN_S3_ENDPOINT": "http://env:1", "AGENTRUN_S3_PATH_STYLE": "false"}
    got = locate.resolve_store({}, env, body)
    assert (got["uri"], got["endpoint"], got["pathStyle"]) == ("s3://envb/x", "http://env:1", False)
    got = locate.resolve_store({"uri": "s3://flag/y", "endpoint": "http://flag:2", "path_style": True, "region": "r"}, env, body)
    assert (got["uri"], got["endpoint"], got["region"], got["pathStyle"]) == ("s3://flag/y", "http://flag:2", "r", True)
    assert locate.resolve_store({}, {}, {"metadata": {}, "spec": {}, "status": {}})["uri"] is None


def test_resolve_store_prefers_the_pinned_status_store_to_env_and_spec():
    """status.store is where the operator reads and writes the run for its whole life: only a flag
    overrides it (a changed default or spec cannot point the CLI at another prefix)."""
    body = {"metadata": {"namespace": "ns", "name": "n", "uid": "u"},
            "spec": {"checkpoint": {"uri": "s3://spec/x"}},
            "status": {"store": {"uri": "s3://pinned/p", "endpoint": "http://pin:9000", "pathStyle": False},
                       "checkpoint": {"uri": "s3://b/p/ns/n/u/laps/00000001.json", "pathStyle": True}}}
    env = {"AGENTRUN_CHECKPOINT_URI": "s3://envb/x", "AGENTRUN_S3_ENDPOINT": "http://env:1", "AGENTRUN_S3_PATH_STYLE": "true"}
    got = locate.resolve_store({}, env, body)
    assert (got["uri"], got["endpoint"], got["pathStyle"]) == ("s3://pinned/p", "http://pin:9000", False)
    assert got["from"]["uri"] == "status.store.uri"
    got = locate.resolve_store({"uri": "s3://flag/y"}, env, body)
    assert got["uri"] == "s3://flag/y"


# ---------------------------------------------------------------------------- trace output

def test_trace_json_document_shape_and_text_details():
    recs = [make_record(1), make_record(2, "ab" * 32)]

    class Obj:
        def __init__(self, lap: int) -> None:
            self.key, self.sha256 = f"k/{lap}", f"{lap:064d}"

    doc = tr.trace_doc(RUN, {"uri": "s3://b", "endpoint": None, "region": None, "pathStyle": False, "from": {}},
                       None, [(r, Obj(r.lap)) for r in recs])
    assert set(doc) == {"run", "store", "forkedFrom", "retries", "laps", "totals"} and doc["retries"] is None
    assert doc["run"] == {"namespace": RUN.namespace, "name": RUN.name, "uid": RUN.uid}
    assert doc["laps"][1]["key"] == "k/2" and doc["laps"][1]["sha256"] == f"{2:064d}"
    assert doc["laps"][1]["prevSha256"] == "ab" * 32 and doc["laps"][0]["toolCalls"][0]["idempotencyKey"]
    assert doc["totals"] == recs[1].totals.to_api()
    json.dumps(doc)  # serializable
    text = "\n".join(tr.text_lap(recs[0], 120))
    assert f"key {RUN.long_id}:1:extract_invoice:call_1" in text
    assert 'args {"doc": "doc_4401"}' in text and "result {" in text
    assert "tokens 1000 in / 100 out, cost 0.0125 USD" in text and "tool[call_1]:" in text
    assert "stored " not in text  # size unknown: no bytes line
    from agentrun.checkpoint.schema import Storage

    counted = recs[1].model_copy(update={"storage": Storage(bytes=5000, objects=7)})
    text = "\n".join(tr.text_lap(counted, 120, 640))
    assert "stored 640 B (lap record, gzip); the run's checkpoints through this lap: 5640 B in 8 objects" in text
    sized = tr.trace_doc(RUN, {"uri": "s3://b", "endpoint": None, "region": None, "pathStyle": False}, None,
                         [(counted, type("O", (), {"key": "k", "sha256": "s", "size": 640})())])
    assert sized["laps"][0]["bytes"] == 640 and sized["laps"][0]["storage"] == {"bytes": 5000, "objects": 7}


# ---------------------------------------------------------------------------------- fork

def test_fork_body_copies_the_spec_and_points_back_at_the_source():
    src = {"metadata": {"name": "orig", "namespace": "ns", "uid": "u-1", "resourceVersion": "9", "labels": {"x": "y"}},
           "spec": {"task": "t", "suspend": True, "forkFrom": {"name": "older", "uid": "u-0", "lap": 1},
                    "checkpoint": {"uri": "s3://b/p"}},
           "status": {"lap": 4}}
    body = fk.fork_body(src, "orig-2", 2)
    assert body["metadata"]["name"] == "orig-2" and body["metadata"]["namespace"] == "ns"
    assert "resourceVersion" not in body["metadata"] and "status" not in body
    assert body["spec"]["forkFrom"] == {"name": "orig", "uid": "u-1", "lap": 2}
    assert "suspend" not in body["spec"] and body["spec"]["checkpoint"] == {"uri": "s3://b/p"}
    assert body["metadata"]["labels"] == {fk.LABEL_FORKED_FROM: "orig"}
    assert body["metadata"]["annotations"][fk.ANN_FORKED_FROM] == "ns/orig uid u-1 lap 2"
    assert src["spec"]["suspend"] is True  # the source object is not changed
    long = fk.fork_body({"metadata": {"name": "a" * 70, "namespace": "ns", "uid": "u"}, "spec": {}}, "b", 1)
    assert long["metadata"]["labels"] == {}  # not a valid label value: annotation only


# --------------------------------------------------------------------- commands and errors

def test_every_command_is_registered_and_has_help():
    for name in ("runs", "approvals", "approve", "reject", "trace", "fork", "crd", "lap", "operator"):
        assert name in SUBCOMMANDS
    for args in (["--help"], ["runs", "--help"], ["approvals", "--help"], ["approve", "--help"], ["reject", "--help"],
                 ["trace", "--help"], ["fork", "--help"], ["crd", "--help"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0 and "Usage:" in r.output, (args, r.output)
    for cmd in ("runs", "approvals", "trace", "fork", "approve"):
        out = CliRunner().invoke(main, [cmd, "--help"]).output
        assert "--kubeconfig" in out and "--context" in out and "--namespace" in out, cmd


def test_crd_still_prints():
    r = CliRunner().invoke(main, ["crd"])
    assert r.exit_code == 0 and "forkFrom" in r.output and "kind: CustomResourceDefinition" in r.output


def _err(r: Any, code: int = 1) -> str:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrun: "), r.output
    return lines[0]


def test_no_kubeconfig_and_unreachable_api_server_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert "does not exist (from KUBECONFIG)" in _err(CliRunner().invoke(main, ["runs"]), ExitCode.USAGE)
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-x"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    for args in (["runs"], ["approvals"], ["trace", "r"], ["fork", "r", "--from-lap", "1", "--name", "n"],
                 ["approve", "r"]):
        line = _err(CliRunner().invoke(main, [*args, "--kubeconfig", str(kc)]), ExitCode.UNREACHABLE)
        assert "cannot reach the Kubernetes API server at http://127.0.0.1:9" in line, (args, line)
    line = _err(CliRunner().invoke(main, ["runs", "--kubeconfig", str(kc), "--context", "nope"]))
    assert "context nope" in line


def test_default_namespace_comes_from_the_context(tmp_path):
    kc = tmp_path / "kc"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-x"}},
                     {"name": "y", "context": {"cluster": "c", "user": "u", "namespace": "team-y"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    assert kube.load_config(kube.KubeOptions(kubeconfig=str(kc))) == "team-x"
    assert kube.load_config(kube.KubeOptions(kubeconfig=str(kc), context="y")) == "team-y"
    assert kube.load_config(kube.KubeOptions(kubeconfig=str(kc), context="y", namespace="z")) == "z"


class FakeApi:
    def __init__(self, runs: list[dict]) -> None:
        self.runs = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in runs}
        self.created: list[dict] = []
        self.listed: list[str | None] = []

    def get_namespaced_custom_object(self, group, version, ns, plural, name):
        from kubernetes.client.exceptions import ApiException

        if (ns, name) not in self.runs:
            raise ApiException(status=404, reason="Not Found")
        return self.runs[(ns, name)]

    def list_namespaced_custom_object(self, group, version, ns, plural):
        self.listed.append(ns)
        return {"items": [r for (n, _), r in self.runs.items() if n == ns]}

    def list_cluster_custom_object(self, group, version, plural):
        self.listed.append(None)
        return {"items": list(self.runs.values())}

    def create_namespaced_custom_object(self, group, version, ns, plural, body):
        self.created.append(body)
        return body


@pytest.fixture
def fake(monkeypatch):
    api = FakeApi([run("waiting", phase="AwaitingApproval", waiting="ops"), run("busy", ns="team-b")])

    def connect(opts=None):
        opts = opts or kube.current_options()
        return api, opts.namespace or "team-a"

    for mod in (kube, rn, tr, fk):
        monkeypatch.setattr(mod, "connect", connect)
    monkeypatch.setattr(ap, "_api", lambda: connect())
    monkeypatch.setattr(rn, "_now", lambda: NOW)
    return api


def test_missing_run_is_one_line_everywhere(fake):
    for args in (["trace", "ghost"], ["fork", "ghost", "--from-lap", "1", "--name", "n"], ["approve", "ghost"],
                 ["reject", "ghost", "--reason", "r"], ["approvals", "show", "ghost"]):
        line = _err(CliRunner().invoke(main, args), ExitCode.NOT_FOUND)
        assert line == 'agentrun: agentrun "ghost" not found in namespace "team-a"', (args, line)
    line = _err(CliRunner().invoke(main, ["trace", "ghost", "-n", "team-z"]), ExitCode.NOT_FOUND)
    assert line.endswith('not found in namespace "team-z"')


def test_runs_namespaces(fake):
    r = CliRunner().invoke(main, ["runs", "-o", "json"])
    assert r.exit_code == 0 and [x["name"] for x in json.loads(r.output)] == ["waiting"] and fake.listed == ["team-a"]
    r = CliRunner().invoke(main, ["runs", "-A"])
    assert r.output.splitlines()[0].split()[0] == "NAMESPACE" and fake.listed[-1] is None
    r = CliRunner().invoke(main, ["runs", "-A", "-n", "x"])
    assert r.exit_code == 2 and "exclusive" in r.output


def test_bare_approvals_lists_the_queue_of_every_namespace(fake):
    r = CliRunner().invoke(main, ["approvals", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert [x["name"] for x in json.loads(r.output)] == ["waiting"] and fake.listed == [None]
    CliRunner().invoke(main, ["approvals", "-n", "team-b"])
    assert fake.listed[-1] == "team-b"


def test_reject_needs_a_reason_and_fork_needs_a_checkpointed_lap(fake):
    r = CliRunner().invoke(main, ["reject", "waiting"])
    assert r.exit_code == 2 and "--reason" in r.output
    r = CliRunner().invoke(main, ["reject", "waiting", "--reason", " "])
    assert r.exit_code == 2 and "must not be empty" in r.output
    line = _err(CliRunner().invoke(main, ["fork", "waiting", "--from-lap", "4", "--name", "n"]))
    assert line == 'agentrun: lap 4 of agentrun "waiting" was never checkpointed (its last checkpointed lap is 3)'
    r = CliRunner().invoke(main, ["fork", "waiting", "--from-lap", "1", "--name", "Bad_Name"])
    assert r.exit_code == 2 and "--name" in r.output
    assert fake.created == []


def test_trace_without_a_known_store_says_how_to_name_it(fake, monkeypatch):
    monkeypatch.delenv("AGENTRUN_CHECKPOINT_URI", raising=False)
    line = _err(CliRunner().invoke(main, ["trace", "waiting"]))
    assert "no checkpoint store known" in line and "--uri" in line


def test_the_trace_reports_retries_in_place_from_the_runs_status():
    """Issue 31: a retry shows in the trace (who, when, after what, which lap started again), from
    status.lifecycle; values a user chose are escaped to one line."""
    assert tr.retries_of({"status": {"lifecycle": {"retries": 0}}}) is None and tr.retries_of(None) is None
    body = {"status": {"lifecycle": {"retries": 2, "lastRetryBy": "alice\x1b[31m", "lastRetryAt": "2026-12-03T10:00:00Z",
                                     "lastRetryFromPhase": "Failed", "retriedLap": 3, "attemptsBeforeRetry": 2,
                                     "cancelledBy": "bob"}}}
    retries = tr.retries_of(body)
    assert retries == {"retries": 2, "lastRetryBy": "alice\x1b[31m", "lastRetryAt": "2026-12-03T10:00:00Z",
                       "lastRetryFromPhase": "Failed", "retriedLap": 3, "attemptsBeforeRetry": 2}
    line = tr.retry_line(retries)
    assert line.startswith("retried in place 2 times; the last by alice") and "\x1b" not in line
    assert "at 2026-12-03T10:00:00Z after Failed: lap 3 started again at attempt 3, with the same idempotency keys" in line
    doc = tr.trace_doc(RUN, {"uri": "s3://b", "endpoint": None, "region": None, "pathStyle": False}, None, [], retries)
    assert doc["retries"]["retriedLap"] == 3
    json.dumps(doc)


def test_the_trace_heading_names_each_history_of_a_rewound_run():
    """A rewind in place (agentrun retry --from-lap) shows in the heading: the lap it went back to,
    the new history's own keys, and which laps each history holds."""
    body = {"status": {"lifecycle": {"retries": 2, "lastRetryBy": "dave", "lastRetryFromPhase": "Failed",
                                     "lastRetryFromLap": 2, "retriedLap": 3, "rewinds": [4, 2]}}}
    line = tr.retry_line(tr.retries_of(body) or {})
    assert ", rewound to lap 2: lap 3 started again at attempt 1, with history 2's own journal and idempotency keys" in line
    assert ("rewound in place 2 times: history 1 (laps after 4, under histories/001/), history 2 (laps after 2, "
            "under histories/002/); the laps shown are the run's current history") in line
    plain = tr.retry_line({"retries": 3, "retriedLap": 3, "rewinds": [4, 2]})
    assert "with the same idempotency keys" in plain, "a later plain retry keeps the history's keys"
