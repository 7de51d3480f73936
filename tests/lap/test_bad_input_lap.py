"""Bad input on the lap runner's side (issue 7, the bad-input table), against real local servers
that misbehave on purpose:

* a model endpoint that answers garbage (not JSON, truncated JSON, a connection cut mid-body, an
  HTML page, JSON of the wrong shape, an oversize body) or too slowly: each is classified
  retryable or permanent as documented in docs/lap-runner.md, and the message names the endpoint
  (without credentials) and what was wrong;
* a refused API key (401): permanent, naming the Secret, never the key;
* a model that calls a tool the agent does not declare: an unknown-tool answer to the model, the
  lap goes on;
* a tool that answers 50 MB: the result is cut at ``maxResultBytes`` with a marker, the checkpoint
  stays small and the run continues;
* an S3 endpoint that refuses the credentials: exit 2 naming the Secret, not the key.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from lap_helpers import RUN, ChatServer, chat_reply, lap_env, log_lines, run_lap_process, spec_doc, spec_of, tool

from agentrun.checkpoint.schema import RunRef
from agentrun.checkpoint.store import CheckpointStore, StoreConfig, sha256_hex
from agentrun.lap.errors import PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ModelRequest
from agentrun.lap.models.openai import OpenAIModel
from agentrun.lap.tools.http import TRUNCATION_MARKER, HTTPToolRunner

API_KEY = "sk-live-BADINPUT-0123456789"


class Misbehaving:
    """A local HTTP server whose every answer is ``behave(handler)``; counts bytes it managed to send."""

    def __init__(self, behave: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.sent = 0
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                server.requests += 1
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                try:
                    behave(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            do_GET = do_POST = do_HEAD = do_PUT = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Misbehaving:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(status: int, body: bytes, content_type: str = "application/json", length: int | None = None,
          chunked: bool = False) -> Callable[[BaseHTTPRequestHandler], None]:
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for i in range(0, len(body), 65536):
                part = body[i:i + 65536]
                h.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            h.wfile.write(b"0\r\n\r\n")
            return
        h.send_header("Content-Length", str(len(body) if length is None else length))
        h.end_headers()
        h.wfile.write(body)
    return behave


def _model(base_url: str, timeout: str = "5s", **extra: Any) -> tuple[OpenAIModel, ModelRequest]:
    spec = spec_of(spec_doc([tool("lookup", "http://127.0.0.1:9")], [], model={
        "provider": "openai", "name": "gpt-test", "baseURL": base_url, "requestTimeout": timeout,
        "apiKeySecretRef": {"name": "openai-key", "key": "api-key"}, **extra}))
    return OpenAIModel(spec.agent.model, API_KEY), ModelRequest(lap=1, messages=(), tools=tuple(spec.agent.tools))


GOOD = json.dumps(chat_reply("fine")).encode()
BIG = b'{"choices": [{"message": {"content": "' + b"x" * (9 * 1024 * 1024) + b'"}}]}'

# name, server behaviour, expected error class, text the message must contain
GARBAGE = [
    ("plain-text", reply(200, b"Internal hiccup, try later", "text/plain"), RetryableLapError, "not JSON"),
    ("truncated-json", reply(200, GOOD[: len(GOOD) // 2]), RetryableLapError, "not JSON"),
    ("cut-mid-body", reply(200, GOOD[:40], length=len(GOOD)), RetryableLapError, "connection broke"),
    ("html-page", reply(200, b"<!DOCTYPE html><html><body>Welcome to nginx</body></html>", "text/html"),
     PermanentLapError, "HTML page"),
    ("html-without-content-type", reply(200, b"\n<html><body>Login</body></html>"), PermanentLapError, "HTML page"),
    ("wrong-shape", reply(200, b'{"result": "ok"}'), RetryableLapError, "no choices[0]"),
    ("empty-choices", reply(200, b'{"choices": []}'), RetryableLapError, "no choices[0]"),
    ("choice-without-message", reply(200, b'{"choices": [{"text": "hi"}]}'), RetryableLapError,
     "no choices[0].message"),
    ("tool-calls-not-a-list", reply(200, b'{"choices": [{"message": {"tool_calls": "lookup"}}]}'), RetryableLapError,
     "tool_calls is not a list"),
    ("json-list", reply(200, b"[1, 2, 3]"), RetryableLapError, "a JSON list"),
    ("error-object-with-200", reply(200, b'{"error": {"message": "upstream overloaded"}}'), RetryableLapError,
     "upstream overloaded"),
    ("oversize-declared", reply(200, BIG), PermanentLapError, "limit of one model response"),
    ("oversize-chunked", reply(200, BIG, chunked=True), PermanentLapError, "limit of one model response"),
    ("http-502-html", reply(502, b"<html>Bad Gateway</html>", "text/html"), RetryableLapError, "HTTP 502"),
    ("http-404", reply(404, b'{"error": {"message": "model gpt-test does not exist"}}'), PermanentLapError,
     "model gpt-test does not exist"),
]


@pytest.mark.parametrize("name,behave,error,text", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_model_endpoint_garbage_is_classified_and_named(name, behave, error, text) -> None:
    with Misbehaving(behave) as srv:
        # credentials in the base URL must never reach a message
        base = srv.url.replace("http://", "http://user:hunter2pass@") + "/v1"
        model, request = _model(base)
        with pytest.raises(error) as err:
            model.complete(request)
    msg = str(err.value)
    assert text in msg, msg
    assert f"{srv.url}/v1/chat/completions" in msg, msg  # the endpoint, redacted
    assert "hunter2pass" not in msg and "user:" not in msg and API_KEY not in msg, msg
    assert len(msg) < 1200, msg  # bounded, even for a 9 MiB body


def test_refused_api_key_is_permanent_and_names_the_secret_not_the_key() -> None:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {API_KEY[:8]}...{API_KEY[-4:]}"}}).encode()
    with Misbehaving(reply(401, body)) as srv:
        model, request = _model(srv.url + "/v1")
        with pytest.raises(PermanentLapError) as err:
            model.complete(request)
    msg = str(err.value)
    assert "HTTP 401" in msg and "Secret 'openai-key' key 'api-key'" in msg, msg
    assert API_KEY[:8] not in msg and API_KEY[-4:] not in msg, msg  # not even the provider's masked echo


def _stalled(release: threading.Event, drip: bool) -> Callable[[BaseHTTPRequestHandler], None]:
    """A model endpoint that never finishes its answer until the test releases it: no headers at
    all, or headers and then one byte of (chunked) body every 50 ms (each read succeeds, so only a bound on
    the whole call ends it)."""
    def behave(h: BaseHTTPRequestHandler) -> None:
        if not drip:
            release.wait(300)
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Transfer-Encoding", "chunked")  # no size declared: nothing to refuse up front
        h.end_headers()
        while not release.is_set():
            h.wfile.write(b"1\r\n \r\n")
            h.wfile.flush()
            release.wait(0.05)
    return behave


@pytest.mark.parametrize("drip", [False, True], ids=["no-answer", "dripping-body"])
def test_model_timeout_is_retryable_and_honours_request_timeout(drip: bool) -> None:
    """requestTimeout bounds the whole call, body included. The server never completes an answer
    while the call runs, so the call can only end by the client's own timeout: no wall-clock
    window is asserted (a loaded box only makes the call end later, never wrongly)."""
    release = threading.Event()
    outcome: list[BaseException | object] = []
    with Misbehaving(_stalled(release, drip)) as srv:
        model, request = _model(srv.url + "/v1", timeout="1s")

        def call() -> None:
            try:
                outcome.append(model.complete(request))
            except BaseException as exc:  # noqa: BLE001  (handed to the test thread)
                outcome.append(exc)
        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(120)  # generous: the timeout is 1 s; the server would stall the call forever
        ended = not t.is_alive()
        release.set()
    assert ended, "the model call did not end: spec.agent.model.requestTimeout does not bound it"
    err = outcome[0]
    assert isinstance(err, RetryableLapError), err
    assert "timed out after 1s (spec.agent.model.requestTimeout)" in str(err), err
    assert srv.url in str(err)


def test_model_timeout_in_a_lap_process_exits_75(s3_env: dict[str, str]) -> None:
    release = threading.Event()
    with Misbehaving(_stalled(release, drip=False)) as srv:
        spec = spec_doc([], [], model={"provider": "openai", "name": "m", "baseURL": srv.url + "/v1",
                                       "requestTimeout": "1s"})
        try:
            p = run_lap_process(lap_env(s3_env, spec, 1))
        finally:
            release.set()
    assert p.returncode == 75, p.stderr
    failed = [x for x in log_lines(p.stderr) if x["msg"] == "lap failed"]
    assert failed and "timed out after 1s" in failed[0]["error"], p.stderr


# ------------------------------------------------------------------------ unknown tool


def test_model_asking_for_an_undeclared_tool_gets_a_tool_error_and_the_run_goes_on(s3_env: dict[str, str]) -> None:
    with ChatServer() as chat:
        chat.replies += [
            (200, chat_reply("cleaning up", [("call_1", "delete_everything", '{"really": true}')])),
            (200, chat_reply("ok, I will not")),
        ]
        spec = spec_doc([tool("lookup", "http://127.0.0.1:9")], [],
                        model={"provider": "openai", "name": "m", "baseURL": chat.base_url})
        first = run_lap_process(lap_env(s3_env, spec, 1))
        second = run_lap_process(lap_env(s3_env, spec, 2))
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        sent = chat.requests[1][1]["messages"]
    rec = CheckpointStore(StoreConfig.from_env(s3_env)).get_lap(RUN, 1)[0]
    assert [(c.tool, c.status) for c in rec.tool_calls] == [("delete_everything", "unknown-tool")]
    assert rec.outcome.type == "continue"
    tool_msgs = [m for m in sent if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "call_1",
                          "content": "unknown-tool: unknown tool 'delete_everything'; declared tools: lookup"}]
    assert CheckpointStore(StoreConfig.from_env(s3_env)).get_lap(RUN, 2)[0].outcome.type == "done"


# ------------------------------------------------------------------------ enormous tool result

FIFTY_MB = 50 * 1024 * 1024


def _huge(chunked: bool) -> Callable[[BaseHTTPRequestHandler], None]:
    """50 MB of JSON-ish text, generated on the fly (never held in memory)."""
    def behave(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        block = b"0123456789abcdef" * 4096  # 64 KiB
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(FIFTY_MB))
        h.end_headers()
        for _ in range(FIFTY_MB // len(block)):
            h.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block)
            h.server.owner.sent += len(block)  # type: ignore[attr-defined]
        if chunked:
            h.wfile.write(b"0\r\n\r\n")
    return behave


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_enormous_tool_result_is_cut_at_max_result_bytes(chunked: bool) -> None:
    with Misbehaving(_huge(chunked)) as srv:
        srv.httpd.owner = srv  # type: ignore[attr-defined]
        spec = spec_of(spec_doc([tool("dump", srv.url, parameters={"type": "object"},
                                      http={"maxResultBytes": 4096})], []))
        out = HTTPToolRunner().call(spec.agent.tools[0], {}, "k1")
    assert out.status == "ok" and out.result.startswith("0123456789abcdef")
    body, marker = out.result.split("\n" + TRUNCATION_MARKER)
    assert len(body.encode()) == 4096
    total = f"of {FIFTY_MB} bytes" if not chunked else "of more than that (not read further)"
    assert f"kept the first 4096 bytes {total}; limit maxResultBytes=4096]" in marker, marker
    assert srv.sent < FIFTY_MB  # the rest was not downloaded: the connection was closed


def test_an_enormous_tool_result_keeps_the_checkpoint_small_and_the_run_going(s3_env: dict[str, str]) -> None:
    with Misbehaving(_huge(chunked=False)) as srv:
        srv.httpd.owner = srv  # type: ignore[attr-defined]
        script = [{"content": "dumping", "toolCalls": [{"name": "dump", "arguments": {}}]}, {"content": "summarised"}]
        spec = spec_doc([tool("dump", srv.url, parameters={"type": "object"})], script)  # default 16 KiB
        first = run_lap_process(lap_env(s3_env, spec, 1))
        second = run_lap_process(lap_env(s3_env, spec, 2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    rec, stored = store.get_lap(RUN, 1)
    # the result is kept twice (the call record and the tool message the model sees), plus the
    # record's own fields: about 2 x maxResultBytes, whatever the tool sent
    assert stored.size < 2 * 16384 + 4096, stored.size
    assert TRUNCATION_MARKER in (rec.tool_calls[0].result or "") and f"of {FIFTY_MB} bytes" in rec.tool_calls[0].result
    assert store.get_lap(RUN, 2)[0].outcome.type == "done"
    assert srv.sent < FIFTY_MB, srv.sent  # the rest was not downloaded: the connection was closed


# ------------------------------------------------------------------------ unreadable checkpoints (runner side)

OTHER = RunRef(namespace=RUN.namespace, name="other-run", uid="0c0c0c0c-9999-8888-7777-666655554444")


def _objects(client: Any, bucket: str) -> dict[str, bytes]:
    objs = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in objs}


@pytest.mark.parametrize("damage", ["truncated", "foreign-run"])
def test_a_truncated_or_foreign_checkpoint_stops_the_lap_with_exit_2_and_is_left_intact(
    damage: str, s3_env: dict[str, str], s3_client: Any, s3_bucket: Any
) -> None:
    # lap 2 reads lap 1 before anything else: the damaged object stops it there
    spec = spec_doc([], [{"content": "one"}, {"content": "two"}])
    store = CheckpointStore(StoreConfig.from_env(s3_env))
    key = store.lap_key(RUN, 1)
    if damage == "truncated":  # lap 1 written, then cut in half (re-uploaded with a matching sha256)
        assert run_lap_process(lap_env(s3_env, spec, 1)).returncode == 0
        whole = s3_client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()
        data = whole[: len(whole) // 2]
        s3_client.put_object(Bucket=s3_bucket.name, Key=key, Body=data, Metadata={"sha256": sha256_hex(data)})
        expect = f"checkpoint {key} is a truncated or padded gzip stream"
    else:  # another run's lap 1, copied byte for byte (with its metadata) under this run's key
        other = lap_env(s3_env, spec, 1, AGENTRUN_NAME=OTHER.name, AGENTRUN_UID=OTHER.uid)
        assert run_lap_process(other).returncode == 0
        s3_client.copy_object(Bucket=s3_bucket.name, Key=key, MetadataDirective="COPY",
                              CopySource={"Bucket": s3_bucket.name, "Key": store.lap_key(OTHER, 1)})
        expect = f"checkpoint {key} holds lap 1 of default/other-run (uid {OTHER.uid}): not the object this key names"
    before = _objects(s3_client, s3_bucket.name)
    p = run_lap_process(lap_env(s3_env, spec, 2))
    assert p.returncode == 2, p.stderr
    failed = [x for x in log_lines(p.stderr) if x["msg"] == "lap failed"]
    assert failed and expect in failed[0]["error"], p.stderr
    after = _objects(s3_client, s3_bucket.name)
    assert {k: v for k, v in after.items() if "/attempts/" not in k} == before  # nothing changed, nothing written
    report = store.get_attempt_failure(RUN, 2, 1)
    assert report is not None and report["reason"] == "CheckpointUnreadable", report


# ------------------------------------------------------------------------ S3 refuses the credentials

DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access Key '
          b"Id you provided does not exist in our records.</Message></Error>")


def test_s3_refusing_the_credentials_exits_2_naming_the_secret_not_the_key() -> None:
    secret_value = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    with Misbehaving(reply(403, DENIED, "application/xml")) as srv:
        store_env = {"AGENTRUN_CHECKPOINT_URI": "s3://agentrun/c", "AGENTRUN_S3_ENDPOINT": srv.url,
                     "AGENTRUN_S3_REGION": "us-east-1", "AGENTRUN_S3_PATH_STYLE": "true"}
        spec = spec_doc([], [{"content": "never"}])
        p = run_lap_process(lap_env(store_env, spec, 1, AWS_ACCESS_KEY_ID="AKIAWRONGKEY0000",
                                    AWS_SECRET_ACCESS_KEY=secret_value, AGENTRUN_S3_CREDENTIALS_SECRET="s3-creds"))
    assert p.returncode == 2, p.stderr
    failed = [x for x in log_lines(p.stderr) if x["msg"] == "lap failed"]
    assert failed, p.stderr
    msg = failed[0]["error"]
    assert "HTTP 403" in msg and "refused the credentials from Secret 's3-creds'" in msg, msg
    assert secret_value not in p.stderr and "AKIAWRONGKEY0000" not in p.stderr


def test_a_failed_lap_writes_its_cause_as_one_line_into_the_termination_message_file(tmp_path):
    from agentrun.api.contract import Env
    from agentrun.controller.decide import lap_cause
    from agentrun.lap.process import run_from_env, write_termination_message

    path = tmp_path / "termination-log"
    path.write_text("")  # the kubelet creates the file; the runner never does
    env = {"AGENTRUN_NAMESPACE": "ns", "AGENTRUN_NAME": "r", "AGENTRUN_UID": "u", "AGENTRUN_LAP": "1",
           Env.TERMINATION_MESSAGE_PATH: str(path)}
    assert run_from_env(env) == 2
    written = path.read_text()
    assert written.count("\n") == 1 and json.loads(written) == {"msg": "lap failed", "error": "AGENTRUN_SPEC is not set"}
    # the operator reads the cause from it as from the log tail
    assert lap_cause(written) == "AGENTRUN_SPEC is not set"
    assert write_termination_message("first line\nsecond line", str(path))
    assert json.loads(path.read_text())["error"] == "first line"
    assert write_termination_message("é" * 5000, str(path)) and len(path.read_bytes()) < 4096
    assert len(json.loads(path.read_text())["error"]) == 900
    missing = tmp_path / "no-such-file"
    assert not write_termination_message("cause", str(missing)) and not missing.exists()
