"""The CLI's conventions (issue 31) against click's runner: -o formats and kubectl's JSONPath
subset, flags before or after the subcommand, the whole KUBECONFIG list, --as/--as-group and
--request-timeout on the wire (a local HTTP server that records what it receives), exit codes,
colour and width, completion, the kubectl plugin entry point."""

from __future__ import annotations

import json
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from agentrun.cli import kube, output
from agentrun.cli import runs as rn
from agentrun.cli.exitcodes import OUTCOME_CODES, ExitCode
from agentrun.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------ jsonpath, durations

DOC = {"items": [{"name": "a", "lap": 1, "tags": {"k.x": "v"}, "ok": True, "n": None},
                 {"name": "b", "lap": 2, "tags": {}, "ok": False}]}


@pytest.mark.parametrize("template, text", [
    ("{.items[*].name}", "a b"),
    ("{.items[0].lap}", "1"),
    ("{.items[-1].name}", "b"),
    ("{.items[0].tags['k.x']}", "v"),
    ("{.items[0].ok}/{.items[1].ok}", "true/false"),
    ("{.items[0].n}|{.items[0].missing}|", "||"),
    ("{range .items[*]}{.name}{\"\\t\"}{.lap}{\"\\n\"}{end}", "a\t1\nb\t2\n"),
    ("{range .items}{.name},{end}", "a,b,"),
    ("{.items[1].tags}", "{}"),
    ("names: {.items[*].name}!", "names: a b!"),
    ("{$.items[1].name}", "b"),
])
def test_jsonpath_template(template, text):
    assert output.jsonpath(template, DOC) == text


@pytest.mark.parametrize("template, words", [
    ('{.items[?(@.name=="a")]}', "filters"),
    ("{..name}", "recursive descent"),
    ("{.items[0:1]}", "slices"),
    ("{range .items[*]}{.name}", "{range} without {end}"),
    ("{.items", "unbalanced"),
])
def test_jsonpath_refuses_what_it_does_not_do(template, words):
    with pytest.raises(ValueError, match=words.replace("{", r"\{").replace("}", r"\}")):
        output.compile_template(template)


@pytest.mark.parametrize("text, seconds", [("0", 0), ("30", 30), ("1.5s", 1.5), ("5m", 300), ("1h30m", 5400),
                                           ("2h", 7200), ("1m30s", 90)])
def test_parse_duration(text, seconds):
    assert output.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "5ms", "-1s", "1d"])
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError, match="is not a duration"):
        output.parse_duration(text)


# ------------------------------------------------------------------------------ the fake API

NOW = rn._now()


def run(name: str, ns: str = "team-a", phase: str = "Running", **status: Any) -> dict:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "7",
                         "generation": 1},
            "spec": {"task": "t"},
            "status": {"phase": phase, "lap": 2, "cost": {"usd": "0.50"}, "observedGeneration": 1, **status}}


class FakeApi:
    def __init__(self, runs: list[dict]) -> None:
        self.runs = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in runs}
        self.listed: list[str | None] = []
        self.patches: list[tuple[str, str, dict]] = []
        self.reads = 0
        self.on_read: Any = None

    def get_namespaced_custom_object(self, group, version, ns, plural, name):
        from kubernetes.client.exceptions import ApiException

        self.reads += 1
        if self.on_read:
            self.on_read(self)
        if (ns, name) not in self.runs:
            raise ApiException(status=404, reason="Not Found")
        return self.runs[(ns, name)]

    def list_namespaced_custom_object(self, group, version, ns, plural):
        self.listed.append(ns)
        return {"items": [r for (n, _), r in self.runs.items() if n == ns]}

    def list_cluster_custom_object(self, group, version, plural):
        self.listed.append(None)
        return {"items": list(self.runs.values())}

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, body):
        self.patches.append((ns, name, body))
        return self.runs[(ns, name)]


@pytest.fixture
def fake(monkeypatch):
    from agentrun.cli import approvals as ap
    from agentrun.cli import describe as ds
    from agentrun.cli import lifecycle as lc

    api = FakeApi([run("r1"), run("r2", phase="Failed", message="lap 2 failed: boom"),
                   run("w", phase="AwaitingApproval", waitingOn="ops",
                       approval={"state": "Pending", "tool": "pay", "callId": "c1", "lap": 2}),
                   run("other", ns="team-b")])

    def connect(opts=None):
        opts = opts or kube.current_options()
        return api, opts.namespace or "team-a"

    for mod in (kube, rn, lc, ds):
        monkeypatch.setattr(mod, "connect", connect)
    monkeypatch.setattr(ap, "_api", lambda: connect())
    monkeypatch.setattr(ap, "_whoami", lambda: "alice")
    monkeypatch.setattr(ap, "_stored_call", lambda run: ap.StoredCall(error="no store"))
    return api


def invoke(*args: str, **kw: Any):
    return CliRunner().invoke(main, list(args), **kw)


def test_runs_formats(fake):
    rows = json.loads(invoke("runs", "-o", "json").output)
    assert [r["name"] for r in rows] == ["r1", "r2", "w"]
    assert yaml.safe_load(invoke("runs", "-o", "yaml").output) == rows
    assert invoke("runs", "-o", "name").output.splitlines() == [
        "agentrun.agentrun.dev/r1", "agentrun.agentrun.dev/r2", "agentrun.agentrun.dev/w"]
    r = invoke("runs", "-o", "jsonpath={range .items[*]}{.name}={.phase};{end}")
    assert r.exit_code == 0 and r.output == "r1=Running;r2=Failed;w=AwaitingApproval;"
    wide = invoke("runs", "-o", "wide").output.splitlines()
    assert wide[0].split()[-3:] == ["AGENT-VERSION", "FORKED-FROM", "RETRIES"]
    assert invoke("runs").output.splitlines()[0].split()[-1] == "CAUSE"
    r = invoke("runs", "-o", "csv")
    assert r.exit_code == ExitCode.USAGE and "jsonpath=TEMPLATE" in r.output
    r = invoke("runs", "-o", "jsonpath={..name}")
    assert r.exit_code == ExitCode.USAGE and "recursive descent" in r.output


def test_approval_listings_and_decisions_take_o(fake):
    assert invoke("approvals", "-o", "name").output.strip() == "agentrun.agentrun.dev/w"
    assert invoke("approvals", "list", "-o", "jsonpath={.items[0].callId}").output == "c1"
    assert invoke("approvals", "-o", "wide").output.splitlines()[0].split()[-2:] == ["CALL-ID", "APPROVED-BY"]
    r = invoke("approve", "w", "-o", "name")
    assert r.exit_code == 0 and r.stdout.strip() == "agentrun.agentrun.dev/w"
    r = invoke("approvals", "reject", "w", "--reason", "no", "-o", "json")
    assert r.exit_code == 0 and json.loads(r.stdout)["metadata"]["name"] == "w"
    r = invoke("approvals", "reject", "w")
    assert r.exit_code == ExitCode.USAGE and "--reason" in r.output


def test_flags_go_before_or_after_the_subcommand(fake):
    assert invoke("-n", "team-b", "runs", "-o", "name").output.strip() == "agentrun.agentrun.dev/other"
    assert invoke("runs", "-n", "team-b", "-o", "name").output.strip() == "agentrun.agentrun.dev/other"
    # both: the one after the subcommand wins, as the nearer one
    invoke("-n", "team-b", "runs", "-n", "team-a")
    assert fake.listed[-1] == "team-a"
    invoke("-A", "runs")
    assert fake.listed[-1] is None
    r = invoke("-A", "runs", "-n", "x")
    assert r.exit_code == ExitCode.USAGE and "exclusive" in r.output
    assert invoke("-n", "team-b", "describe", "other", "-o", "jsonpath={.metadata.namespace}").output == "team-b"


def test_help_with_h_everywhere_and_version():
    for args in (["-h"], ["runs", "-h"], ["approvals", "show", "-h"], ["wait", "-h"], ["-n", "x", "trace", "-h"]):
        r = invoke(*args)
        assert r.exit_code == 0 and "Usage:" in r.output and "-h, --help" in r.output, args
    assert invoke("--version").exit_code == 0


# ------------------------------------------------------------------------------ kubeconfig, --as

def kubeconfig(path: Path, server: str, context: str = "x", namespace: str = "team-x", token: str = "t") -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": context,
        "clusters": [{"name": f"c-{context}", "cluster": {"server": server}}],
        "contexts": [{"name": context, "context": {"cluster": f"c-{context}", "user": f"u-{context}",
                                                  "namespace": namespace}}],
        "users": [{"name": f"u-{context}", "user": {"token": token}}]}))
    return path


def test_the_whole_kubeconfig_list_is_merged(tmp_path, monkeypatch):
    a = kubeconfig(tmp_path / "a", "http://127.0.0.1:9", "x", "team-x")
    b = kubeconfig(tmp_path / "b", "http://127.0.0.1:9", "y", "team-y")
    missing = tmp_path / "missing"
    monkeypatch.setenv("KUBECONFIG", f"{missing}:{a}:{b}")
    assert kube.load_config(kube.KubeOptions()) == "team-x"  # the first current-context set wins
    assert kube.load_config(kube.KubeOptions(context="y")) == "team-y"  # a context of the second file
    monkeypatch.setenv("KUBECONFIG", f"{missing}:{tmp_path / 'missing2'}")
    with pytest.raises(kube.CLIError, match="does not exist") as e:
        kube.load_config(kube.KubeOptions())
    assert e.value.exit_code == ExitCode.USAGE


class Recorder(BaseHTTPRequestHandler):
    """A stand-in for the API server's list of AgentRuns: records the request headers; ``hang``
    makes it never answer (for --request-timeout)."""

    seen: list[Any] = []
    hang = False

    def do_GET(self) -> None:  # noqa: N802
        Recorder.seen.append(self.headers)
        if Recorder.hang:
            time.sleep(5)
            return
        body = json.dumps({"kind": "AgentRunList", "items": [run("srv")]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture
def server(tmp_path):
    Recorder.seen, Recorder.hang = [], False
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{srv.server_address[1]}")
    srv.shutdown()
    srv.server_close()


def test_impersonation_headers_reach_the_server(server):
    r = invoke("--kubeconfig", str(server), "--as", "bob", "--as-group", "team-a", "runs", "--as-group",
               "system:authenticated", "-o", "name")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == "agentrun.agentrun.dev/srv"
    headers = Recorder.seen[-1]
    assert headers.get_all("Impersonate-User") == ["bob"]
    assert sorted(headers.get_all("Impersonate-Group")) == ["system:authenticated", "team-a"]  # one line each
    assert headers["Authorization"] == "Bearer t"
    invoke("--kubeconfig", str(server), "runs")
    assert Recorder.seen[-1].get_all("Impersonate-User") is None
    r = invoke("--kubeconfig", str(server), "--as-group", "g", "runs")
    assert r.exit_code == ExitCode.USAGE and "--as-group needs --as" in r.output


def test_request_timeout_gives_up_with_its_exit_code(server):
    Recorder.hang = True
    started = time.monotonic()
    r = invoke("runs", "--kubeconfig", str(server), "--request-timeout", "1s")
    assert r.exit_code == ExitCode.TIMEOUT, r.output
    assert "did not answer in time (--request-timeout 1s)" in r.output
    assert time.monotonic() - started < 4.5  # not the server's 5 s (urllib3 retries once)
    r = invoke("runs", "--request-timeout", "soon")
    assert r.exit_code == ExitCode.USAGE and "not a duration" in r.output


# ------------------------------------------------------------------------------ colour, width

def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert output.use_colour(Tty()) is True
    monkeypatch.setenv("NO_COLOR", "1")
    assert output.use_colour(Tty()) is False
    monkeypatch.delenv("NO_COLOR")
    assert output.use_colour(object()) is False  # not a terminal
    monkeypatch.setattr(output, "use_colour", lambda stream=None: True)
    assert output.colour_phase("Failed", "Failed") == "\x1b[31mFailed\x1b[0m"
    rows = rn.run_rows([run("a", phase="Failed")], NOW)
    line = rn.format_runs(rows).splitlines()[1]
    assert "\x1b[31mFailed\x1b[0m" in line and line.replace("\x1b[31m", "").replace("\x1b[0m", "").split()[1] == "Failed"


def test_runs_are_plain_when_piped(fake):
    assert "\x1b[" not in invoke("runs", color=False).output


def test_width_from_the_terminal(fake, monkeypatch):
    fake.runs[("team-a", "r2")]["status"]["message"] = "lap 2 failed: " + "x" * 300
    monkeypatch.setenv("COLUMNS", "100")
    lines = invoke("runs").output.splitlines()
    assert max(len(line) for line in lines) == 100  # CAUSE cut to fit (it keeps at least 20 characters)
    monkeypatch.setenv("COLUMNS", "300")
    assert 100 <= max(len(line) for line in invoke("runs").output.splitlines()) <= 200  # CAUSE at most 100
    assert max(len(line) for line in invoke("runs", "-o", "wide").output.splitlines()) > 300  # wide cuts nothing


# ------------------------------------------------------------------------------ completion, plugin

@pytest.mark.parametrize("shell, marker", [("bash", "complete -o nosort -F"), ("zsh", "compdef"),
                                           ("fish", "complete --no-files --command agentrun")])
def test_completion_scripts(shell, marker):
    r = invoke("completion", shell, prog_name="agentrun")
    assert r.exit_code == 0 and marker in r.output and "_AGENTRUN_COMPLETE" in r.output


def test_run_names_complete_from_the_cluster_and_fail_silently(fake, monkeypatch):
    from click.shell_completion import ShellComplete

    comp = ShellComplete(main, {}, "agentrun", "_AGENTRUN_COMPLETE")
    assert [c.value for c in comp.get_completions(["wait"], "r")] == ["r1", "r2"]
    assert [c.value for c in comp.get_completions(["-n", "team-b", "describe"], "")] == ["other"]

    def down(opts=None):
        raise kube.CLIError("cannot reach", ExitCode.UNREACHABLE)

    monkeypatch.setattr(kube, "connect", down)
    assert comp.get_completions(["retry"], "") == []


def test_kubectl_plugin_entry_point(monkeypatch):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-agentrun"] == "agentrun.cli.main:plugin_main"
    from agentrun.cli import main as m

    seen = {}
    monkeypatch.setattr(m, "main", lambda **kw: seen.update(kw))
    m.plugin_main()
    assert seen == {"prog_name": "kubectl agentrun", "complete_var": "_KUBECTL_AGENTRUN_COMPLETE"}


def test_usage_names_the_plugin():
    r = CliRunner().invoke(main, ["runs", "-h"], prog_name="kubectl agentrun")
    assert r.output.startswith("Usage: kubectl agentrun runs")


# ------------------------------------------------------------------------------ exit codes

def test_exit_codes_are_distinct_and_documented():
    assert len({int(c) for c in ExitCode}) == len(ExitCode)
    doc = (ROOT / "docs" / "cli.md").read_text()
    for c in ExitCode:
        assert f"| {int(c)} | `{c.name}` |" in doc, c
    assert OUTCOME_CODES == {"Succeeded": 0, "Failed": 10, "BudgetExceeded": 11, "Cancelled": 12,
                             "DeadlineExceeded": 13}


def test_errors_exit_by_kind(fake, monkeypatch):
    from kubernetes.client.exceptions import ApiException

    assert invoke("describe", "ghost").exit_code == ExitCode.NOT_FOUND
    assert invoke("approve", "r1").exit_code == ExitCode.CONFLICT  # not waiting

    def forbidden(*a, **k):
        raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(fake, "patch_namespaced_custom_object", forbidden)
    r = invoke("suspend", "r1")
    assert r.exit_code == ExitCode.FORBIDDEN and r.output.startswith("agentrun: ") and "forbidden" in r.output
