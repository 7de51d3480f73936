"""Upgrade with a run in flight (issue 16): a run checkpointed by the previous release's code
finishes under this release's code, with no side effect repeated and its idempotency keys unchanged.

The previous release is a commit of this repository (``PREVIOUS_RELEASE``, the last one writing
checkpoint schema 2). Its ``operator/agentrun`` package, committed as a ``git archive`` of that
commit (``tests/fixtures/previous-release``; checked file by file against the history where the
clone has it), is extracted into a temp dir and run with ``PYTHONPATH`` pointing at it, in this
environment (same dependencies): the old ``agentrun operator`` as a subprocess, and old lap pods,
because the old operator's lap command (``AGENTRUN_LAP_COMMAND``, what the process kubelet runs for
a lap pod) is ``env PYTHONPATH=<old code> python -m agentrun.cli.main lap``.

The story, on the real local control plane with the session's S3 server:

1. The old operator runs laps 1 and 2 (one tool call each) with old lap pods: schema-2 checkpoints.
2. Lap 3 calls two tools. The first is executed and journaled by the old lap; the second is held
   at a gate (e2e_support.ToolGate). Now the old operator is SIGKILLed, and the old lap pod is
   deleted (its process is gone) while that call is in flight; then the gate forwards the held call,
   so the tool server executes it once, but no journal entry of its result exists.
3. This release's operator starts (new lap command): it retries lap 3 with new code, which must
   re-derive the old keys (``r_<8 hex>``), reuse the old journal (the model response and the first
   call) and resend the second call with the same key (the tool server replays, does not execute),
   then run laps 4 and 5 to Succeeded.

The checks read independent records: the tool server's per-key counts, the raw S3 objects (bytes,
gzip, sha256 recomputed with the standard library, not through CheckpointStore), the Jobs' commands,
the run's status and Events.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest
from e2e.cluster import _alive  # the harness's own liveness check (a zombie is dead)
from e2e_support import ToolGate, wait_for
from test_operator_e2e import ROOT, Env, _diagnostics_on_failure, _gated, _one_job_per_attempt  # noqa: F401

sys.path.insert(0, str(ROOT / "examples"))
import tool_server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: The previous release: the first parent of 6d778e3 ("Merge checkpoint-v3"), the last commit whose
#: lap runner writes checkpoint schema 2 with idempotency keys r_<first 8 hex of the run's uid>.
PREVIOUS_RELEASE = "4bcd136970601229768ae94d9c020f91d5d6dadd"

NAME = "upgrade"
GZIP_MAGIC = b"\x1f\x8b"


#: The same ``operator/agentrun`` tree as a committed archive (``git archive --format=tar
#: PREVIOUS_RELEASE operator/agentrun | xz -9``), so that a clone without that history (a shallow
#: one) still runs the test; where the history is there, the archive is checked against it.
PREVIOUS_RELEASE_ARCHIVE = ROOT / "tests" / "fixtures" / "previous-release" / "agentrun-4bcd136.tar.xz"


def _tree(tar: tarfile.TarFile) -> dict[str, bytes]:
    return {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers() if m.isfile()}


def previous_release_code(dest: Path) -> Path:
    """``operator/agentrun`` of PREVIOUS_RELEASE extracted under ``dest``; returns the directory to
    put on PYTHONPATH. The committed archive is used; when the repository has the commit, every
    file of the archive must equal the commit's (a drifted fixture fails the test)."""
    with tarfile.open(PREVIOUS_RELEASE_ARCHIVE, "r:xz") as tar:
        committed = _tree(tar)
        tar.extractall(dest, filter="data")
    if shutil.which("git") is not None and subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
            capture_output=True).returncode == 0:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_RELEASE,
                                  "operator/agentrun"], capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            assert _tree(tar) == committed, f"{PREVIOUS_RELEASE_ARCHIVE} is not {PREVIOUS_RELEASE}'s operator/agentrun"
    return dest / "operator"


class UpgradeEnv(Env):
    """Env whose operator is either the previous release's code (``old=True``) or this one's, one
    at a time, both logging to ``self.log``; the tool server has a record of its own."""

    def __init__(self, cluster: Any, s3: Any, tmp: Path, old_code: Path) -> None:
        super().__init__(cluster, s3, tmp)
        self.tools.shutdown()  # Env's server shares the module-level record: take one of our own
        self.tools = tool_server.serve(0, str(self.record), recorder=tool_server.Recorder())
        self.tool_url = f"http://127.0.0.1:{self.tools.server_address[1]}"
        self.old_code = old_code
        self.old_lap_command = [shutil.which("env") or "/usr/bin/env", f"PYTHONPATH={old_code}", sys.executable,
                                "-m", "agentrun.cli.main", "lap"]
        self.new_lap_command = json.loads(self.operator_env()["AGENTRUN_LAP_COMMAND"])
        self.s3c = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name=s3.region,
                                aws_access_key_id=s3.access_key, aws_secret_access_key=s3.secret_key)

    def start_operator(self, old: bool = False) -> None:  # type: ignore[override]
        assert self.proc is None or self.proc.poll() is not None, "one operator at a time"
        if old:
            env = self.operator_env(AGENTRUN_IDENTITY="previous-release",
                                    AGENTRUN_LAP_COMMAND=json.dumps(self.old_lap_command))
            env["PYTHONPATH"] = str(self.old_code)
        else:
            env = self.operator_env(AGENTRUN_IDENTITY="this-release")
        with open(self.log, "ab") as fh:
            fh.write(f"===== starting the {'previous release' if old else 'new'} operator =====\n".encode())
            self.proc = subprocess.Popen([sys.executable, "-m", "agentrun.cli.main", "operator"], env=env,
                                         stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)

    def tool_record(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.tool_url}/_record", timeout=10) as r:
            return json.load(r)

    def pods(self, name: str) -> list[dict]:
        r = self.kubectl("get", "pods", "-n", self.ns, "-l", f"agentrun.dev/run={name}", "-o", "json")
        return json.loads(r.stdout)["items"]

    def raw_objects(self, prefix: str) -> dict[str, tuple[bytes, str]]:
        """key relative to ``prefix`` -> (stored bytes, x-amz-meta-sha256), read with plain S3 calls."""
        out: dict[str, tuple[bytes, str]] = {}
        for page in self.s3c.get_paginator("list_objects_v2").paginate(Bucket=self.s3.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                got = self.s3c.get_object(Bucket=self.s3.bucket, Key=o["Key"])
                out[o["Key"][len(prefix):]] = (got["Body"].read(), got["Metadata"].get("sha256", ""))
        return out


def doc_of(data: bytes) -> dict[str, Any]:
    """The JSON document of a stored object: gzip (schema 3) or plain JSON (schemas 1-2)."""
    return json.loads(gzip.decompress(data) if data[:2] == GZIP_MAGIC else data)


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    old_code = previous_release_code(tmp_path_factory.mktemp("previous-release"))
    probe = subprocess.run([sys.executable, "-c", "import agentrun.checkpoint.schema as s; print(s.__file__); "
                            "print(s.SCHEMA_VERSION)"], env={**os.environ, "PYTHONPATH": str(old_code)},
                           capture_output=True, text=True, check=True).stdout.split()
    assert probe[0].startswith(str(old_code)) and probe[1] == "2", \
        f"PYTHONPATH={old_code} does not import the previous release's agentrun (schema 2): {probe}"
    e = UpgradeEnv(cluster, s3, tmp_path_factory.mktemp("upgrade"), old_code)
    e.prepare_namespace()
    yield e
    e.kill_operator()
    e.tools.shutdown()
    if os.environ.get("AGENTRUN_E2E_KEEP") is None:
        cluster.kubectl_run("delete", "namespace", e.ns, "--wait=false", check=False)


def _note(*orders: str) -> dict:
    calls = [{"name": "note", "arguments": {"order": o}} for o in orders]
    return {"content": " ".join(orders), "toolCalls": calls}


def test_run_checkpointed_by_the_previous_release_finishes_under_this_release(env, request):
    script = [_note("up1"), _note("up2"), _note("up3a", "up3b"), _note("up4"), {"content": "done"}]
    held = "up3b"
    gate = ToolGate(env.tool_url, hold=lambda args: isinstance(args, dict) and args.get("order") == held)
    request.addfinalizer(gate.close)
    doc = _gated(env.run_doc(NAME, script, retry={"attemptsPerLap": 3,
                                                  "backoff": {"initial": "1s", "max": "2s", "factor": 2}}), gate)
    env.start_operator(old=True)
    env.apply(doc)

    # --- 1-2. the previous release: laps 1 and 2 checkpointed, lap 3 in flight at its second call
    wait_for("lap 3's second call (up3b) held at the gate", lambda: gate.arrived(held), timeout=240)
    uid = env.get(NAME)["metadata"]["uid"]
    uid8 = uid.replace("-", "")[:8]
    prefix = f"e2e-{env.ns}/{env.ns}/{NAME}/{uid}/"
    before = env.raw_objects(prefix)
    laps_before = sorted(k for k in before if k.startswith("laps/"))
    assert laps_before == ["laps/00000001.json", "laps/00000002.json"], sorted(before)
    journal3 = sorted(k for k in before if k.startswith("journal/00000003/"))
    assert len(journal3) == 2 and "journal/00000003/model.json" in journal3, journal3  # the response, up3a
    for key in [*laps_before, *journal3]:
        data, _ = before[key]
        assert data[:1] == b"{" and doc_of(data)["schemaVersion"] == 2, (key, data[:80])
    wait_for("the previous release's status at lap 2 (schema 2)", lambda: (s := env.status(NAME)).get("lap") == 2
             and s["checkpoint"]["schemaVersion"] == 2 and s.get("activeJob"), timeout=60)

    # the previous release stops while lap 3 is in flight: operator SIGKILLed, lap pod deleted
    env.kill_operator()
    pod = next(p for p in env.pods(NAME) if p["metadata"]["labels"]["agentrun.dev/lap"] == "3")
    pod_name = pod["metadata"]["name"]
    pid_files = list(env.cluster.pods_dir.glob(f"{env.ns}_{pod_name}_*/*.pid"))
    assert pid_files, f"no pid file of the old lap pod {pod_name} under {env.cluster.pods_dir}"
    pids = [int(f.read_text()) for f in pid_files]
    env.kubectl("delete", "pod", pod_name, "-n", env.ns, "--wait=false")
    wait_for("the old lap 3 process gone", lambda: not any(_alive(p) for p in pids), timeout=120)
    wait_for("the old lap 3 Job failed", lambda: any(
        c["type"] == "Failed" and c["status"] == "True"
        for j in env.jobs(NAME) if j["metadata"]["labels"]["agentrun.dev/lap"] == "3"
        for c in j.get("status", {}).get("conditions") or []), timeout=120)
    # the held call reaches the tool (it had begun): executed once, its result journaled nowhere
    gate.open()
    wait_for("up3b executed by the tool server", lambda: [c for c in env.calls("/note")
                                                          if c["arguments"].get("order") == held], timeout=60)

    # --- 3. this release takes over
    env.start_operator()
    st = env.wait_phase(NAME, "Succeeded", "Failed", "BudgetExceeded", timeout=300)
    assert st["phase"] == "Succeeded", st
    assert env.proc is not None and env.proc.poll() is None, "the new operator exited"

    # --- 4. every side effect executed exactly once, under the run's old keys
    rec = env.tool_record()
    key_re = re.compile(rf"^r_{uid8}:(\d+):note:(call_\d+)$")
    mine = {k: v for k, v in rec["keys"].items() if k.startswith(f"r_{uid8}")}
    assert all(key_re.match(k) for k in mine), f"keys not in the run's uid8 scheme: {sorted(mine)}"
    assert {k: v["executions"] for k, v in mine.items()} == dict.fromkeys(mine, 1), mine
    assert len(mine) == 5 and rec["totals"]["executions"] == 5, rec["totals"]
    assert rec["withoutKey"] == {"requests": 0, "executions": 0} and rec["totals"]["conflicts"] == 0, rec
    calls = env.calls("/note")
    by_order = {c["arguments"]["order"]: c["idempotencyKey"] for c in calls}
    assert sorted(c["arguments"]["order"] for c in calls) == ["up1", "up2", "up3a", "up3b", "up4"], calls
    laps_of_keys = {o: int(key_re.match(k).group(1)) for o, k in by_order.items()}  # type: ignore[union-attr]
    assert laps_of_keys == {"up1": 1, "up2": 2, "up3a": 3, "up3b": 3, "up4": 4}, by_order
    # the new code finished the old lap: up3b resent with its old key (replayed, not executed), up3a
    # taken from the old journal (not resent)
    assert mine[by_order["up3b"]]["requests"] == 2 and mine[by_order["up3b"]]["replays"] == 1, mine
    assert all(mine[by_order[o]]["requests"] == 1 for o in ("up1", "up2", "up3a", "up4")), mine

    # --- the raw objects: schema 2 then schema 3, one hash chain across them
    after = env.raw_objects(prefix)
    laps = sorted(k for k in after if k.startswith("laps/"))
    assert laps == [f"laps/{n:08d}.json" for n in range(1, 6)], sorted(after)
    prev = None
    for n, key in enumerate(laps, 1):
        data, meta = after[key]
        sha = hashlib.sha256(data).hexdigest()
        assert sha == meta, f"{key}: sha256 of the stored bytes {sha} != x-amz-meta-sha256 {meta}"
        doc = doc_of(data)
        assert doc["lap"] == n and doc["run"]["uid"] == uid, (key, doc.get("lap"), doc.get("run"))
        if n <= 2:  # the previous release's records, untouched
            assert data == before[key][0], f"{key} was rewritten by the upgrade"
            assert data[:1] == b"{" and doc["schemaVersion"] == 2 and "keyScheme" not in doc, (key, doc)
        else:
            assert data[:2] == GZIP_MAGIC and doc["schemaVersion"] == 3, (key, data[:16])
            assert doc["keyScheme"] == "uid8", (key, doc.get("keyScheme"))
        assert doc.get("prevSha256") == prev, f"{key}: prevSha256 {doc.get('prevSha256')} != {prev} (chain broken)"
        prev = sha
    # lap 3's record holds both calls under their old keys (stored, or derived from keyScheme uid8)
    lap3 = doc_of(after["laps/00000003.json"][0])
    keys3 = {c["callId"]: c.get("idempotencyKey") or f"r_{uid8}:3:{c['tool']}:{c['callId']}"
             for c in lap3["toolCalls"]}
    assert sorted(keys3.values()) == sorted([by_order["up3a"], by_order["up3b"]]), (keys3, by_order)
    # the old code's journals stay (schema 2, the old keys); lap 3's, finished by the new code, is gone
    old_journals = sorted(k for k in before if k.startswith(("journal/00000001/", "journal/00000002/")))
    assert old_journals == [f"journal/0000000{n}/{e}.json" for n in (1, 2) for e in ("model", "tool-call_1")], \
        old_journals  # each lap's model response and tool call
    for key in old_journals:
        assert after[key][0] == before[key][0], f"{key} changed"
        if "tool-" in key:  # the old code's journal entry names the key the tool server saw
            assert by_order[f"up{key[15]}"] in after[key][0].decode(), (key, after[key][0][:400])
    assert not [k for k in after if k.startswith(("journal/00000003/", "journal/00000004/", "journal/00000005/"))], \
        sorted(after)

    # --- the run's status, Jobs and Events
    assert st["lap"] == 5 and st["checkpoint"]["key"] == prefix + "laps/00000005.json", st
    assert st["checkpoint"]["sha256"] == prev and st["checkpoint"]["schemaVersion"] == 3, st["checkpoint"]
    conditions = {c["type"]: c for c in st["conditions"]}
    assert len(conditions) == len(st["conditions"]), st["conditions"]
    assert conditions["Complete"]["status"] == "True", conditions
    assert all(c["status"] == "False" for t, c in conditions.items() if t == "Failed"), conditions
    assert [r["lap"] for r in st.get("retries") or []] == [3], st.get("retries")
    jobs = env.jobs(NAME)
    _one_job_per_attempt(jobs)
    commands = {(j["metadata"]["labels"]["agentrun.dev/lap"], j["metadata"]["labels"]["agentrun.dev/attempt"]):
                j["spec"]["template"]["spec"]["containers"][0]["command"] for j in jobs}
    old, new = env.old_lap_command, env.new_lap_command
    assert commands == {("1", "1"): old, ("2", "1"): old, ("3", "1"): old,
                        ("3", "2"): new, ("4", "1"): new, ("5", "1"): new}, commands
    checkpointed: Counter = Counter()
    for e in env.events(NAME):
        if e["reason"] == "LapCheckpointed":
            checkpointed[int(e["message"].split()[1])] += e.get("count") or 1
    assert checkpointed == Counter({1: 1, 2: 1, 3: 1, 4: 1, 5: 1}), checkpointed
