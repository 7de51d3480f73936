"""An OpenAI-compatible chat-completions server for the e2e tests: a clerk that books one invoice.

It plays the model behind ``spec.agent.model.provider: openai`` and decides every answer from the
conversation it receives, the way a real model would, never from how many requests came before:

* no tool message answering a ``book_invoice`` call in ``messages`` yet: it answers with one
  ``book_invoice`` tool call (the arguments of :attr:`ClerkModelServer.invoice`) under a fresh
  random call id, as OpenAI does (``call_`` + 24 random characters);
* once such a tool message is there: it answers with a final text (no tool call), quoting what
  the tool answered.

So a lap that asks the same turn again gets a *different* call id, hence a different
Idempotency-Key for the tool: a replay that re-asked the model instead of reusing its journaled
answer shows up both here (the same conversation twice) and at the tool server (two executions).

Like api.openai.com it refuses what a real endpoint refuses, and says why:

* 401 without ``Authorization: Bearer <the key>`` (the body does not echo the key sent);
* 404 for any path but ``POST {base}/chat/completions``;
* 400 for a body that is not a JSON object with a ``messages`` list, a ``tools`` entry that is not
  ``{type: function, function: {name, parameters: object}}``, a ``tool`` message whose
  ``tool_call_id`` answers no call of the assistant message before it, or an assistant message
  whose tool calls are not all answered before the next non-tool message.

Every request is recorded (:meth:`ClerkModelServer.record`), refused or not, in arrival order:
``{"path", "authorization", "body" (the parsed JSON or None), "status", "answer"}``.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOL = "book_invoice"


def problem_of(body: Any) -> str | None:
    """Why OpenAI would answer ``body`` with 400, or None if it is a well-formed request."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for i, t in enumerate(body.get("tools") or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            return f"tools[{i}] must be {{type: function, function: {{...}}}}"
        if not isinstance(fn.get("name"), str) or not isinstance(fn.get("parameters"), dict):
            return f"tools[{i}].function needs a name and a parameters object"
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
            return f"messages[{i}] has no valid role"
        if m["role"] == "tool":
            if m.get("tool_call_id") not in open_calls:
                return (f"messages[{i}]: messages with role 'tool' must be a response to a preceding message "
                        f"with 'tool_calls' (tool_call_id {m.get('tool_call_id')!r} answers none)")
            open_calls.discard(m["tool_call_id"])
            continue
        if open_calls:
            return (f"messages[{i}]: an assistant message with 'tool_calls' must be followed by tool messages "
                    f"responding to each 'tool_call_id'; unanswered: {sorted(open_calls)}")
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                fn = c.get("function") if isinstance(c, dict) else None
                if not isinstance(fn, dict) or c.get("type") != "function" or not isinstance(c.get("id"), str):
                    return f"messages[{i}].tool_calls: each call needs an id, type function and a function"
                if not isinstance(fn.get("arguments"), str):
                    return f"messages[{i}].tool_calls[].function.arguments must be a JSON string"
                open_calls.add(c["id"])
    if open_calls:
        return f"the last assistant message's tool calls are unanswered: {sorted(open_calls)}"
    return None


def booking_result(messages: list[dict[str, Any]]) -> str | None:
    """The content of the tool message answering a ``book_invoice`` call, if the conversation has one."""
    booking_ids = {c["id"] for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []
                   if c["function"].get("name") == TOOL}
    return next((str(m.get("content") or "") for m in messages
                 if m.get("role") == "tool" and m.get("tool_call_id") in booking_ids), None)


class ClerkModelServer:
    """The server, on a free loopback port, in a thread. ``base_url`` is what ``spec.agent.model.baseURL``
    takes (``.../v1``). ``invoice``: the arguments of the ``book_invoice`` call it asks for."""

    def __init__(self, api_key: str, invoice: dict[str, Any]) -> None:
        self.api_key, self.invoice = api_key, invoice
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                auth = self.headers.get("Authorization")
                status, answer = server.decide(self.command, self.path, auth, body)
                with server._lock:
                    server._requests.append({"path": self.path, "authorization": auth, "body": body,
                                             "status": status, "answer": answer})
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the caller is gone (a killed lap): the request is recorded all the same

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @staticmethod
    def _error(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def decide(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        """The status and JSON answer to one request: refusals first, then the clerk's next move."""
        if authorization != f"Bearer {self.api_key}":
            return 401, self._error("Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
        if method != "POST" or path != "/v1/chat/completions":
            return 404, self._error(f"Invalid URL ({method} {path})", "invalid_request_error")
        problem = problem_of(body)
        if problem:
            return 400, self._error(problem, "invalid_request_error")
        result = booking_result(body["messages"])
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        if result is not None:
            message: dict[str, Any] = {"role": "assistant", "content": f"Booked. The ledger answered: {result[:200]}"}
        elif TOOL not in offered:
            message = {"role": "assistant", "content": f"I cannot book the invoice: no {TOOL} tool was offered."}
        else:
            call = {"id": f"call_{secrets.token_hex(12)}", "type": "function",
                    "function": {"name": TOOL, "arguments": json.dumps(self.invoice)}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        prompt = len(json.dumps(body["messages"])) // 4
        return 200, {
            "id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20},
        }

    def record(self) -> list[dict[str, Any]]:
        """Every request so far, in arrival order (copies)."""
        with self._lock:
            return json.loads(json.dumps(self._requests))

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
