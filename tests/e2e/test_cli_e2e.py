"""The ``agentrun`` CLI against the real local control plane, the real S3 server and the operator
(one subprocess for the module): the approval queue lists exactly the waiting runs and approve /
reject move them; ``runs`` shows phase, lap, cost, waiting-on; ``trace`` prints what the store holds
(compared with the LapRecords read from S3 directly); ``fork --from-lap 2`` of a finished 4-lap run
continues at lap 3 to Succeeded and leaves the original's CR and store objects byte-identical;
errors are one line (missing run, unreachable store / API server, a lap never checkpointed).

The CLI runs as a user runs it: a subprocess with the cluster's kubeconfig and the S3 credentials
in the standard AWS variables, and NO ``AGENTRUN_*`` store variables: the store is found from the
cluster (status.checkpoint).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from test_operator_e2e import _diagnostics_on_failure, env  # noqa: F401

from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig
from agentrun.cli.main import main

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# A few commands run as a user runs them (a subprocess); the rest run in this process through
# click's CliRunner with the same environment, which saves a Python start-up per call.
SUBPROCESS = {"approvals", "fork", "trace"}
_seen: set[str] = set()


def cli(e, *args: str, timeout: float = 90, **extra: str) -> subprocess.CompletedProcess:
    penv = {k: v for k, v in e.cluster.env().items() if not k.startswith("AGENTRUN_")}
    penv.update({"AWS_ACCESS_KEY_ID": e.s3.access_key, "AWS_SECRET_ACCESS_KEY": e.s3.secret_key,
                 "AWS_DEFAULT_REGION": e.s3.region, **extra})
    if args[0] in SUBPROCESS and args[0] not in _seen:  # the first call of each: a real process
        _seen.add(args[0])
        return subprocess.run([sys.executable, "-m", "agentrun.cli.main", *args], env=penv, capture_output=True,
                              text=True, timeout=timeout, check=False)
    unset = {k: None for k in os.environ if k.startswith(("AGENTRUN_", "AWS_")) and k not in penv}
    r = CliRunner().invoke(main, list(args), env={**unset, **penv}, catch_exceptions=False)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrun: "), r.stderr
    return lines[0]


def store_of(e) -> CheckpointStore:
    import boto3
    from botocore.config import Config

    config = StoreConfig(uri=f"s3://{e.s3.bucket}/e2e-{e.ns}", endpoint_url=e.s3.endpoint_url,
                         region=e.s3.region, path_style=True)
    client = boto3.session.Session().client(
        "s3", endpoint_url=e.s3.endpoint_url, region_name=e.s3.region, aws_access_key_id=e.s3.access_key,
        aws_secret_access_key=e.s3.secret_key, config=Config(s3={"addressing_style": "path"}))
    return CheckpointStore(config, client=client)


def objects(e, prefix: str) -> dict[str, bytes]:
    client = store_of(e).client
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=e.s3.bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            out[item["Key"]] = client.get_object(Bucket=e.s3.bucket, Key=item["Key"])["Body"].read()
    return out


def approval_doc(e, name: str) -> dict:
    script = [{"content": "refunding", "toolCalls": [{"name": "refund", "arguments": {"order": name}}]},
              {"content": "finished"}]
    return e.run_doc(name, script)


def test_queue_runs_approve_and_reject(env):  # noqa: F811 (the fixture)
    env.apply(approval_doc(env, "q-approve"))
    env.apply(approval_doc(env, "q-reject"))
    env.apply(env.run_doc("q-suspended", [{"content": "x"}], suspend=True))
    for name in ("q-approve", "q-reject"):
        assert env.wait_phase(name, "AwaitingApproval", "Failed")["phase"] == "AwaitingApproval"
    env.wait_phase("q-suspended", "Suspended")

    # the queue: exactly the two waiting runs, with owner, tool, lap and deadline
    r = cli(env, "approvals", "-n", env.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    queued = json.loads(r.stdout)
    assert sorted((q["name"], q["owner"], q["tool"], q["lap"]) for q in queued) == [
        ("q-approve", "e2e-team", "refund", 1), ("q-reject", "e2e-team", "refund", 1)]
    assert all(0 < q["secondsLeft"] <= 3600 and q["ageSeconds"] >= 0 for q in queued)
    r = cli(env, "approvals")  # bare: every namespace, table
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0][:3] == ["NAMESPACE", "NAME", "OWNER"]
    mine = sorted(x[1] for x in rows[1:] if x[0] == env.ns)
    assert mine == ["q-approve", "q-reject"], r.stdout

    # runs: phase, lap, waiting-on; -A adds the namespace column
    r = cli(env, "runs", "-n", env.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    by = {x["name"]: x for x in json.loads(r.stdout)}
    assert by["q-approve"]["phase"] == "AwaitingApproval" and by["q-approve"]["waitingOn"] == "e2e-team"
    assert by["q-approve"]["lap"] == 1 and by["q-approve"]["secondsSinceCheckpoint"] >= 0
    assert by["q-suspended"]["phase"] == "Suspended" and by["q-suspended"]["waitingOn"] is None
    r = cli(env, "runs", "-A")
    header = r.stdout.splitlines()[0].split()
    assert header == ["NAMESPACE", "NAME", "PHASE", "LAP", "SINCE-CHECKPOINT", "COST", "WAITING-ON", "CAUSE"], r.stdout
    assert any(line.split()[:3] == [env.ns, "q-approve", "AwaitingApproval"] for line in r.stdout.splitlines())

    # reject needs a reason; approve and reject move the runs
    r = cli(env, "reject", "q-reject", "-n", env.ns)
    assert r.returncode == 2 and "--reason" in r.stderr
    r = cli(env, "approve", "q-approve", "-n", env.ns, "--reason", "checked")
    assert r.returncode == 0 and "approved call" in r.stdout, (r.stdout, r.stderr)
    r = cli(env, "reject", "q-reject", "-n", env.ns, "--reason", "duplicate order")
    assert r.returncode == 0 and "rejected call" in r.stdout, (r.stdout, r.stderr)
    a = env.wait_phase("q-approve", "Succeeded", "Failed")
    j = env.wait_phase("q-reject", "Succeeded", "Failed")
    assert a["phase"] == "Succeeded" and a["approval"]["state"] == "Approved", a
    assert j["phase"] == "Succeeded" and j["approval"]["state"] == "Rejected", j
    assert j["approval"]["reason"] == "duplicate order"
    orders = [c["arguments"].get("order") for c in env.calls("/refund")]
    assert orders.count("q-approve") == 1 and "q-reject" not in orders
    assert json.loads(cli(env, "approvals", "-n", env.ns, "-o", "json").stdout) == []
    # deciding again: refused in one line, nothing queued
    line = one_line_error(cli(env, "approve", "q-approve", "-n", env.ns))
    assert "not awaiting approval (phase Succeeded)" in line

    # a fork of the lap that asked for approval waits for approval too; approved, it runs the call
    # anew (the fork's idempotency key), the original's single refund stays single
    r = cli(env, "fork", "q-approve", "-n", env.ns, "--from-lap", "1", "--name", "q-approve-again")
    assert r.returncode == 0, (r.stdout, r.stderr)
    f = env.wait_phase("q-approve-again", "AwaitingApproval", "Failed", "Succeeded")
    assert f["phase"] == "AwaitingApproval" and f["approval"]["tool"] == "refund" and f["lap"] == 1, f
    assert not env.jobs("q-approve-again")
    assert cli(env, "approve", "q-approve-again", "-n", env.ns).returncode == 0
    f = env.wait_phase("q-approve-again", "Succeeded", "Failed")
    assert f["phase"] == "Succeeded" and f["lap"] == 2, f
    refunds = [c for c in env.calls("/refund") if c["arguments"].get("order") == "q-approve"]
    assert len(refunds) == 2 and len({c["idempotencyKey"] for c in refunds}) == 2, refunds


def test_trace_shows_the_store_and_fork_continues_from_lap_2(env):  # noqa: F811
    script = [
        {"content": f"step {i}", "toolCalls": [{"name": "note", "arguments": {"text": f"lap {i}"}}],
         "usage": {"inputTokens": 100 * i, "outputTokens": 10 * i}} for i in (1, 2, 3)
    ] + [{"content": "all done", "usage": {"inputTokens": 400, "outputTokens": 40}}]
    env.apply(env.run_doc("orig", script))
    st = env.wait_phase("orig", "Succeeded", "Failed", "BudgetExceeded", timeout=240)
    assert st["phase"] == "Succeeded" and st["lap"] == 4, st
    assert st["checkpoint"]["endpoint"] == env.s3.endpoint_url  # where `agentrun trace` finds the store
    orig = env.get("orig")
    ref = RunRef(namespace=env.ns, name="orig", uid=orig["metadata"]["uid"])
    store = store_of(env)
    stored = list(store.iter_laps(ref))

    # trace -o json: one document, every lap as stored (keys, tokens, sha256)
    r = cli(env, "trace", "orig", "-n", env.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["run"] == ref.to_api() and doc["forkedFrom"] is None
    assert doc["store"]["uri"] == f"s3://{env.s3.bucket}/e2e-{env.ns}"
    assert [lap["lap"] for lap in doc["laps"]] == [1, 2, 3, 4]
    for got, (rec, obj) in zip(doc["laps"], stored):
        assert got["sha256"] == obj.sha256 and got["key"] == obj.key
        assert got["bytes"] == obj.size
        assert {k: v for k, v in got.items() if k not in ("key", "sha256", "bytes")} == rec.to_api()
    keys = [c.idempotency_key for rec, _ in stored for c in rec.tool_calls]
    assert len(keys) == 3 and all(k.startswith(ref.long_id + ":") for k in keys)
    assert doc["totals"] == stored[-1][0].totals.to_api() and doc["totals"]["inputTokens"] == 1000
    # text: the table, the tool calls with their idempotency keys, tokens and the totals
    r = cli(env, "trace", "orig", "-n", env.ns)
    assert r.returncode == 0, r.stderr
    for k in keys:
        assert f"key {k}" in r.stdout
    assert "tokens 300 in / 30 out" in r.stdout and "totals through lap 4: 4 laps, 1000/100 tokens" in r.stdout
    r = cli(env, "trace", "orig", "-n", env.ns, "--lap", "2", "-o", "json")
    assert [lap["lap"] for lap in json.loads(r.stdout)["laps"]] == [2]
    # --follow on a finished run: JSON lines, every lap, then the End line
    r = cli(env, "trace", "orig", "-n", env.ns, "--follow", "-o", "json", "--interval", "0.2")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x.get("lap") for x in lines[:-1]] == [1, 2, 3, 4] and lines[-1]["kind"] == "End"
    assert lines[-1]["phase"] == "Succeeded" and lines[-1]["lastLap"] == 4

    # fork refusals, one line each, nothing created
    line = one_line_error(cli(env, "fork", "orig", "-n", env.ns, "--from-lap", "9", "--name", "nofork"))
    assert 'lap 9 of agentrun "orig" was never checkpointed' in line
    line = one_line_error(cli(env, "fork", "nope", "-n", env.ns, "--from-lap", "1", "--name", "nofork"))
    assert line == f'agentrun: agentrun "nope" not found in namespace "{env.ns}"'
    assert env.get("nofork") == {}

    before_objects = objects(env, store.run_prefix(ref))
    before_cr = env.get("orig")
    calls_before = len(env.calls("/note"))
    r = cli(env, "fork", "orig", "-n", env.ns, "--from-lap", "2", "--name", "orig-fork")
    assert r.returncode == 0 and "next lap is 3" in r.stdout, (r.stdout, r.stderr)
    fst = env.wait_phase("orig-fork", "Succeeded", "Failed", "BudgetExceeded", timeout=240)
    assert fst["phase"] == "Succeeded" and fst["lap"] == 4, fst
    fork = env.get("orig-fork")
    assert fork["spec"]["forkFrom"] == {"name": "orig", "uid": ref.uid, "lap": 2}
    assert fork["metadata"]["labels"]["agentrun.dev/forked-from"] == "orig"
    assert sorted(int(j["metadata"]["labels"]["agentrun.dev/lap"]) for j in env.jobs("orig-fork")) == [3, 4]
    # the totals carried over through lap 2, then laps 3 and 4 of the fork
    assert fst["cost"]["inputTokens"] == 1000 and fst["cost"]["outputTokens"] == 100
    # the fork's laps performed their side effects anew, under the fork's keys
    assert len(env.calls("/note")) == calls_before + 1
    fref = RunRef(namespace=env.ns, name="orig-fork", uid=fork["metadata"]["uid"])
    r = cli(env, "trace", "orig-fork", "-n", env.ns, "-o", "json")
    assert r.returncode == 0, r.stderr
    fdoc = json.loads(r.stdout)
    assert [lap["lap"] for lap in fdoc["laps"]] == [3, 4]
    assert fdoc["forkedFrom"] == {"run": ref.to_api(), "lap": 2, "sha256": stored[1][1].sha256}
    assert fdoc["laps"][0]["prevSha256"] == stored[1][1].sha256  # the chain continues from orig's lap 2
    assert fdoc["laps"][0]["toolCalls"][0]["idempotencyKey"].startswith(fref.long_id + ":3:note:")
    r = cli(env, "trace", "orig-fork", "-n", env.ns)
    assert f"forked from {env.ns}/orig (uid {ref.uid}) at lap 2" in r.stdout, r.stdout
    # the original: CR and store objects untouched
    assert objects(env, store.run_prefix(ref)) == before_objects
    after_cr = env.get("orig")
    assert after_cr["metadata"]["resourceVersion"] == before_cr["metadata"]["resourceVersion"]
    assert after_cr["spec"] == before_cr["spec"] and after_cr["status"] == before_cr["status"]
    # forkFrom is immutable
    fork["spec"]["forkFrom"]["lap"] = 1
    fork["metadata"].pop("resourceVersion", None)
    r = env.apply(fork, check=False)
    assert r.returncode != 0 and "spec.forkFrom is immutable" in r.stderr


def test_errors_are_one_line(env, tmp_path):  # noqa: F811
    line = one_line_error(cli(env, "trace", "ghost", "-n", env.ns))
    assert line == f'agentrun: agentrun "ghost" not found in namespace "{env.ns}"'
    line = one_line_error(cli(env, "approve", "ghost", "-n", env.ns))
    assert 'agentrun "ghost" not found' in line
    # a store that cannot be reached, and a lap never checkpointed (with --uid and --uri the
    # cluster is not asked: the store alone)
    store = ["--uid", "0badc0de-0000-4000-8000-000000000000", "--uri", f"s3://{env.s3.bucket}/e2e-{env.ns}",
             "--path-style", "--region", env.s3.region]
    # the call gives up (it does not retry forever: a hang would meet the test's timeout); how long
    # its retries take is the client's business, not asserted here
    line = one_line_error(cli(env, "trace", "err-run", "-n", env.ns, *store, "--endpoint", "http://127.0.0.1:9"))
    assert "checkpoint store" in line and "127.0.0.1:9" in line, line
    line = one_line_error(cli(env, "trace", "err-run", "-n", env.ns, *store, "--endpoint", env.s3.endpoint_url,
                              "--lap", "7"))
    assert line == 'agentrun: lap 7 of agentrun "err-run" was never checkpointed', line
    # an API server that cannot be reached; a kubeconfig that does not exist
    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    line = one_line_error(cli(env, "runs", "--kubeconfig", str(kc)))
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:9" in line
    line = one_line_error(cli(env, "runs", KUBECONFIG=str(tmp_path / "missing")))
    assert "does not exist" in line
    # bad flags: usage errors (exit 2)
    r = cli(env, "runs", "-n", env.ns, "-A")
    assert r.returncode == 2 and "exclusive" in r.stderr
    r = cli(env, "fork", "err-run", "--from-lap", "0", "--name", "x")
    assert r.returncode == 2 and "--from-lap" in r.stderr


def test_verbs_and_conventions_against_the_api_server(env, tmp_path):  # noqa: F811
    """Issue 31 on the real API server: ``wait`` exits by the outcome (0 Succeeded, 11 BudgetExceeded,
    7 on --timeout), suspend/resume are real patches, describe shows the operator's Events, logs
    prints a lap, flags go before the subcommand, -o name/jsonpath, --as/--as-group reach the API
    server (RBAC answers them: exit 4 FORBIDDEN), a KUBECONFIG list is merged, and
    ``kubectl agentrun`` runs through the real kubectl's plugin mechanism."""
    note = [{"content": "noting", "toolCalls": [{"name": "note", "arguments": {"order": "v"}}]}, {"content": "done"}]
    env.apply(env.run_doc("v-ok", note))
    env.apply(env.run_doc("v-budget", note, budget={"maxLaps": 1}))
    env.apply(env.run_doc("v-held", note, suspend=True))

    r = cli(env, "-n", env.ns, "wait", "v-ok", "--timeout", "3m")  # the namespace before the subcommand
    assert r.returncode == 0 and f"agentrun {env.ns}/v-ok: Succeeded (lap 2" in r.stdout, (r.stdout, r.stderr)
    r = cli(env, "wait", "v-budget", "-n", env.ns, "--timeout", "3m", "-o", "jsonpath={.status.phase}")
    assert (r.returncode, r.stdout) == (11, "BudgetExceeded"), (r.stdout, r.stderr)
    env.wait_phase("v-held", "Suspended")
    r = cli(env, "wait", "v-held", "-n", env.ns, "--timeout", "1s")
    assert r.returncode == 7 and "timed out after 1s" in r.stderr, r.stderr
    r = cli(env, "resume", "v-held", "-n", env.ns)
    assert r.returncode == 0 and env.get("v-held")["spec"]["suspend"] is False, r.stderr
    assert cli(env, "wait", "v-held", "-n", env.ns, "--timeout", "3m").returncode == 0
    assert cli(env, "suspend", "v-held", "-n", env.ns).returncode == 5  # it has ended
    assert cli(env, "wait", "ghost", "-n", env.ns).returncode == 3

    r = cli(env, "-n", env.ns, "runs", "-o", "name")
    assert {"agentrun.agentrun.dev/v-ok", "agentrun.agentrun.dev/v-budget"} <= set(r.stdout.split()), r.stdout
    r = cli(env, "runs", "-n", env.ns, "-o", "jsonpath={range .items[?(@.phase)]}{end}")
    assert r.returncode == 2 and "filters" in r.stderr
    r = cli(env, "runs", "-n", env.ns, "-o", "jsonpath={range .items[*]}{.name}={.phase}{\"\\n\"}{end}")
    assert "v-budget=BudgetExceeded" in r.stdout.splitlines(), r.stdout

    r = cli(env, "describe", "v-ok", "-n", env.ns)
    assert r.returncode == 0, r.stderr
    assert "Phase:          Succeeded" in r.stdout and "Events:" in r.stdout
    events = r.stdout.split("Events:", 1)[1]
    assert any(ev["reason"] in events for ev in env.events("v-ok")), events  # the operator's Events, read back
    r = cli(env, "logs", "v-ok", "-n", env.ns, "--lap", "1")
    assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)

    # impersonation is sent and judged by the API server's RBAC: a ServiceAccount without a role
    # is refused, the same user with the group system:masters is allowed
    sa = f"system:serviceaccount:{env.ns}:nobody-{env.ns[-6:]}"
    r = cli(env, "--as", sa, "runs", "-n", env.ns)
    assert r.returncode == 4 and "forbidden" in r.stderr, (r.stdout, r.stderr)
    r = cli(env, "runs", "-n", env.ns, "--as", sa, "--as-group", "system:masters", "-o", "name")
    assert r.returncode == 0 and "agentrun.agentrun.dev/v-ok" in r.stdout, r.stderr

    # a KUBECONFIG list: a missing file is skipped, the real one read
    r = cli(env, "runs", "-n", env.ns, "-o", "name", KUBECONFIG=f"{tmp_path / 'missing'}{os.pathsep}{env.cluster.kubeconfig}")
    assert r.returncode == 0 and "agentrun.agentrun.dev/v-ok" in r.stdout, r.stderr

    # kubectl agentrun: the real kubectl finds kubectl-agentrun on PATH and passes the arguments through
    bin_dir = os.path.dirname(sys.executable)
    assert os.path.exists(os.path.join(bin_dir, "kubectl-agentrun")), "pip install -e . installs the plugin"
    penv = env.cluster.env()
    penv["PATH"] = env.cluster.bin_dir + os.pathsep + bin_dir + os.pathsep + penv.get("PATH", "")
    p = subprocess.run([env.cluster.kubectl, "agentrun", "wait", "v-budget", "-n", env.ns, "-o", "name"], env=penv,
                       capture_output=True, text=True, timeout=60, check=False)
    assert (p.returncode, p.stdout.strip()) == (11, "agentrun.agentrun.dev/v-budget"), (p.stdout, p.stderr)
