"""The ``openai`` model provider through the real operator, on the local control plane, with a real
S3 server: an AgentRun whose model is an OpenAI-compatible server written for the test
(e2e/openai_server.py, which decides each answer from the conversation it receives) and whose tool
is the recording tool server (examples/tool_server.py) behind a gate (e2e_support.ToolGate).

The lap process is SIGKILLed while its tool call is held at the gate (the model's answer is
journaled by then); the retried lap must reuse the journaled answer. The model server hands out a
fresh random call id for every turn it is asked, so a replay that asked the model again would show
up twice: the same conversation in the model server's record, and a second execution under a
second Idempotency-Key at the tool server.

Fixtures ``cluster`` and ``s3`` come from tests/e2e/conftest.py (the session's control plane and S3
server, shared with the other e2e modules); ``Env`` and the diagnostics on failure come from
test_operator_e2e.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import urllib.error
import urllib.request
from typing import Any

import boto3
import pytest
from e2e.openai_server import TOOL, ClerkModelServer
from e2e.proc_kubelet import pid_has_marker
from e2e_support import ToolGate, wait_for
from test_operator_e2e import Env, _diagnostics_on_failure, running_env  # noqa: F401

from agentrun.checkpoint.codec import inflate

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RUN = "llm-clerk"
MODEL = "gpt-4o-mini"
TASK = "Book invoice INV-7731 of ACME GmbH (1299.00 EUR) into the ledger, once."
SYSTEM = "You are an accounts-payable clerk. Book each invoice exactly once. Answer without a tool call when done."
INVOICE = {"invoice": "INV-7731", "vendor": "ACME GmbH", "amountCents": 129900, "currency": "EUR"}
PARAMETERS = {
    "type": "object",
    "properties": {"invoice": {"type": "string"}, "vendor": {"type": "string"},
                   "amountCents": {"type": "integer", "minimum": 1}, "currency": {"type": "string"}},
    "required": ["invoice", "amountCents", "currency"],
}
DESCRIPTION = "Book one invoice into the ledger."


@pytest.fixture(scope="module")
def env(cluster, s3, tmp_path_factory):
    yield from running_env(Env(cluster, s3, tmp_path_factory.mktemp("openai-provider")))


def _doc(env: Env, base_url: str, tool_url: str) -> dict:
    """The run: provider openai at ``base_url`` with its key from Secret ``agentrun-openai``, one
    side-effecting http tool at ``tool_url``; long tool and lap timeouts, so that only the gate
    (or the test's kill) ends the held call."""
    doc = env.run_doc(RUN, [])
    spec = doc["spec"]
    spec["task"] = TASK
    spec["agent"]["window"] = {"systemPrompt": SYSTEM}
    spec["agent"]["model"] = {
        "provider": "openai", "name": MODEL, "baseURL": base_url,
        "apiKeySecretRef": {"name": "agentrun-openai", "key": "api-key"},
        "temperature": "0.2", "maxOutputTokens": 256, "requestTimeout": "60s",
        "pricing": {"inputPerMillionTokensUSD": "0.15", "outputPerMillionTokensUSD": "0.60"},
    }
    spec["agent"]["tools"] = [{"name": TOOL, "description": DESCRIPTION, "parameters": PARAMETERS,
                               "http": {"url": f"{tool_url}/ledger/invoices", "timeout": "10m"}}]
    spec["lapTimeout"] = "15m"
    return doc


def _objects(env: Env, prefix: str) -> dict[str, bytes]:
    """key -> stored bytes of every object under ``prefix``."""
    s3 = boto3.client("s3", endpoint_url=env.s3.endpoint_url, region_name=env.s3.region,
                      aws_access_key_id=env.s3.access_key, aws_secret_access_key=env.s3.secret_key)
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=env.s3.bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    return {k: s3.get_object(Bucket=env.s3.bucket, Key=k)["Body"].read() for k in keys}


def _lap_pid(env: Env) -> int | None:
    """The pid of the run's running lap process (the process kubelet's ``lap.pid``, checked to still
    carry its pod's marker), or None."""
    pods = json.loads(env.kubectl("get", "pods", "-n", env.ns, "-l", f"agentrun.dev/run={RUN}",
                                  "-o", "json").stdout)["items"]
    for p in pods:
        if p["status"].get("phase") != "Running":
            continue
        md = p["metadata"]
        f = env.cluster.pods_dir / f"{env.ns}_{md['name']}_{md['uid']}" / "lap.pid"
        try:
            pid = int(f.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_has_marker(pid, md["uid"]):
            return pid
    return None


def _assert_no_key(key: str, where: str, data: bytes | str) -> None:
    """Fail if ``key`` is in ``data``, quoting the place around it with the key masked (the failure
    output is a log too)."""
    text = data if isinstance(data, str) else data.decode("utf-8", errors="replace")
    at = text.find(key)
    if at >= 0:
        around = text[max(0, at - 200):at + len(key) + 200].replace(key, "<THE-KEY>")
        pytest.fail(f"the model API key leaked into {where}: ...{around}...")


def test_openai_provider_lap_killed_mid_tool_call_reuses_the_journaled_answer(env):
    key = f"sk-e2e-{secrets.token_hex(24)}"
    env.kubectl("create", "secret", "generic", "agentrun-openai", "-n", env.ns, f"--from-literal=api-key={key}")
    model = ClerkModelServer(key, INVOICE)

    def shown(value: Any) -> str:  # what a failure message may quote of the record: the key masked
        return json.dumps(value).replace(key, "<THE-KEY>")

    gate = ToolGate(env.tool_url)
    try:
        env.apply(_doc(env, model.base_url, gate.url))

        # lap 1 asked the model, journaled its answer and is now held in its tool call: SIGKILL it
        wait_for("lap 1's book_invoice call held at the gate", gate.arrived, timeout=180)
        uid = env.get(RUN)["metadata"]["uid"]
        prefix = f"e2e-{env.ns}/{env.ns}/{RUN}/{uid}/"
        mid_run = _objects(env, prefix)
        assert f"{prefix}journal/00000001/model.json" in mid_run, sorted(mid_run)
        pid = wait_for("the running lap's process", lambda: _lap_pid(env))
        os.killpg(pid, signal.SIGKILL)
        # the retried attempt replays lap 1: the same call, with the same key, reaches the gate
        # while the killed attempt's call is still held; the model was not asked again
        wait_for("the retried attempt's book_invoice call at the gate", lambda: gate.arrived() >= 2, timeout=240)
        assert len(model.record()) == 1, shown(model.record())
        gate.open()
        st = env.wait_phase(RUN, "Succeeded", "Failed", "BudgetExceeded", timeout=240)
        assert st["phase"] == "Succeeded", st
        assert st["lap"] == 2 and st["totalRetries"] >= 1, st

        # --- the model server's record: each turn asked once, with the key, in the wire format
        record = model.record()
        assert [r["status"] for r in record] == [200, 200], shown(record)  # lap 1 once (not by the replay), lap 2
        assert all(r["authorization"] == f"Bearer {key}" for r in record), shown([r["authorization"] for r in record])
        conversations = [json.dumps(r["body"]["messages"], sort_keys=True) for r in record]
        assert len(set(conversations)) == len(conversations), conversations  # no turn requested twice
        first, second = (r["body"] for r in record)
        tools = [{"type": "function", "function": {"name": TOOL, "description": DESCRIPTION, "parameters": PARAMETERS}}]
        opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        for body in (first, second):
            assert body["model"] == MODEL and body["tools"] == tools, body
            assert body["temperature"] == 0.2 and body["max_tokens"] == 256, body
        assert first["messages"] == opening, first["messages"]
        issued = record[0]["answer"]["choices"][0]["message"]["tool_calls"][0]
        assert second["messages"][:2] == opening, second["messages"]
        assistant, answer = second["messages"][2:]
        assert assistant["role"] == "assistant" and len(assistant["tool_calls"]) == 1, assistant
        sent = assistant["tool_calls"][0]
        assert sent["id"] == issued["id"] and sent["type"] == "function", (sent, issued)
        assert sent["function"]["name"] == TOOL and json.loads(sent["function"]["arguments"]) == INVOICE, sent
        assert answer["role"] == "tool" and answer["tool_call_id"] == issued["id"], answer
        assert json.loads(answer["content"])["echo"] == INVOICE, answer

        # --- the tool server's record: both attempts sent the call under one key; executed once
        arrivals = [a for a in gate.arrivals if a["path"] == "/ledger/invoices"]
        tool_key = f"r_{uid.replace('-', '')}:1:{TOOL}:{issued['id']}"
        assert [a["idempotencyKey"] for a in arrivals] == [tool_key, tool_key], arrivals
        executed = env.calls("/ledger/invoices")
        assert [(c["idempotencyKey"], c["arguments"]) for c in executed] == [(tool_key, INVOICE)], executed
        counts = env.tools.recorder.record()["keys"][tool_key]
        assert (counts["requests"], counts["executions"], counts["replays"]) == (2, 1, 1), counts

        # --- the API key: in the lap pods' environment by secretKeyRef, nowhere else
        jobs = env.jobs(RUN)
        assert '"secretKeyRef"' in json.dumps(jobs)
        pod_logs = "".join(f.read_text(errors="replace") for f in env.cluster.pods_dir.glob(f"{env.ns}_{RUN}-*/*.log"))
        assert "model response reused from the journal" in pod_logs  # the retried attempt's log is there
        assert "lap checkpointed" in pod_logs
        wait_for("the run's two LapCheckpointed Events",
                 lambda: [e["reason"] for e in env.events(RUN)].count("LapCheckpointed") == 2)
        events = env.kubectl("get", "events", "-n", env.ns, "-o", "json").stdout
        final = _objects(env, prefix)
        assert f"{prefix}laps/00000001.json" in final and f"{prefix}laps/00000002.json" in final, sorted(final)
        places: list[tuple[str, Any]] = [
            ("the AgentRun and its status", json.dumps(env.get(RUN))), ("the namespace's Events", events),
            ("the Jobs", json.dumps(jobs)), ("the operator log", env.log.read_text(errors="replace")),
            ("the lap pods' logs", pod_logs),
        ]
        for when, objects in (("mid-run", mid_run), ("final", final)):
            for k, data in objects.items():
                places += [(f"S3 object {k} ({when}, stored bytes)", data),
                           (f"S3 object {k} ({when}, inflated)", inflate(data, k))]
        for where, data in places:
            _assert_no_key(key, where, data)
    finally:
        gate.close()
        model.close()


def _post(url: str, body: Any, authorization: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": authorization} if authorization else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_the_model_server_decides_from_the_conversation_and_refuses_what_openai_refuses():
    """The test's model server itself, over HTTP (it needs no cluster; it sits beside the test it
    serves, whose module fixtures are up anyway): its checks are real, so the e2e test above cannot
    pass against a lap that sends a wrong key or unmatched tool_call_ids, and its answers follow
    the conversation, not a request count."""
    key = f"sk-e2e-{secrets.token_hex(8)}"
    model = ClerkModelServer(key, INVOICE)
    url = f"{model.base_url}/chat/completions"
    tools = [{"type": "function", "function": {"name": TOOL, "description": DESCRIPTION, "parameters": PARAMETERS}}]
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    try:
        for auth in (None, "Bearer sk-wrong", key):  # no header, another key, the key without "Bearer "
            status, body = _post(url, {"model": MODEL, "messages": opening, "tools": tools}, auth)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", (auth, body)
            assert "sk-wrong" not in json.dumps(body) and key not in json.dumps(body), body
        # the same conversation twice: a tool call each time, under a fresh id each time
        ids = []
        for _ in range(2):
            status, body = _post(url, {"model": MODEL, "messages": opening, "tools": tools}, f"Bearer {key}")
            assert status == 200, body
            (call,) = body["choices"][0]["message"]["tool_calls"]
            assert call["function"]["name"] == TOOL and json.loads(call["function"]["arguments"]) == INVOICE, call
            ids.append(call["id"])
        assert ids[0] != ids[1], ids
        asked = {"role": "assistant", "content": None,
                 "tool_calls": [{"id": ids[0], "type": "function",
                                 "function": {"name": TOOL, "arguments": json.dumps(INVOICE)}}]}
        # a tool result that answers another id, and an unanswered call: refused as OpenAI does
        for bad in ([*opening, asked, {"role": "tool", "tool_call_id": ids[1], "content": "{}"}], [*opening, asked]):
            status, body = _post(url, {"model": MODEL, "messages": bad, "tools": tools}, f"Bearer {key}")
            assert status == 400 and "tool" in body["error"]["message"], body
        # with the booking's result in the conversation: the final answer, no tool call
        done = [*opening, asked, {"role": "tool", "tool_call_id": ids[0], "content": '{"ok": true}'}]
        status, body = _post(url, {"model": MODEL, "messages": done, "tools": tools}, f"Bearer {key}")
        assert status == 200 and not body["choices"][0]["message"].get("tool_calls"), body
        assert body["choices"][0]["message"]["content"].startswith("Booked."), body
        assert [r["status"] for r in model.record()] == [401, 401, 401, 200, 200, 400, 400, 200]
    finally:
        model.close()
