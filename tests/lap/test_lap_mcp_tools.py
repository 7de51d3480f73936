"""MCP tools in the lap: the pure parts (patterns, the offered tools, the discovery diff, the journaled
step with an in-memory MCP port) and the real client (the ``mcp`` SDK over streamable HTTP against
examples/mcp_tool_server.py in its own process, whose ledger counts executions)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from lap_helpers import RUN, Crash, FakeModel, FakeTools, MemoryJournal, spec_doc, spec_of, tool

from agentrun.api.addresses import AddressRules
from agentrun.api.approval import arguments_sha256, call_target, target_sha256
from agentrun.api.mcp import find_mcp_tool, matches
from agentrun.api.spec import AgentRunSpec, McpServer
from agentrun.checkpoint.fold import fold
from agentrun.checkpoint.schema import ApprovalDecision, LapRecord, McpServerTools, McpToolInfo, RunState, Usage
from agentrun.controller.decide.tools import tools_changed_message
from agentrun.lap.discovery import listing_changes, offered_tools, tools_version
from agentrun.lap.errors import PermanentLapError, RetryableLapError
from agentrun.lap.interfaces import ModelCall, ModelResponse, ToolOutcome
from agentrun.lap.step import Effects, LapContext, run_lap

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "toolkit"))

URL = "http://ledger.tools.svc:8766/mcp"
BOOK = {"type": "object", "properties": {"invoice": {"type": "string"}, "amount_cents": {"type": "integer"}},
        "required": ["invoice", "amount_cents"]}
LOOKUP = {"type": "object", "properties": {"invoice": {"type": "string"}}, "required": ["invoice"]}


def _server(**kw: Any) -> dict[str, Any]:
    return {"name": "ledger", "url": URL, **kw}


def _spec(servers: list[dict[str, Any]] | None = None, **kw: Any) -> AgentRunSpec:
    doc = spec_doc([tool("notify", "http://127.0.0.1:9")], [], **kw)
    doc["agent"]["mcpServers"] = servers if servers is not None else [_server(requiresApproval=["book_*"],
                                                                              sideEffects=["book_*"])]
    return spec_of(doc)


def _listing(*tools: tuple[str, dict[str, Any]], server: str = "ledger", url: str = URL) -> McpServerTools:
    return McpServerTools(server=server, url=url, server_info={"name": "ledger", "version": "1"},
                          tools=[McpToolInfo(name=n, description=f"{n} it", input_schema=s) for n, s in tools])


class FakeMcp:
    """The MCP port in memory: ``listings`` is what the next list returns; ``calls`` what was sent."""

    def __init__(self, *listing: McpServerTools) -> None:
        self.listings = list(listing)
        self.lists = 0
        self.calls: list[tuple[str, str, dict[str, Any], str, bool]] = []
        self.outcome = ToolOutcome(status="ok", result='{"booking":1}')

    def list_tools(self, server: McpServer) -> McpServerTools:
        self.lists += 1
        return next(x for x in self.listings if x.server == server.name)

    def call(self, tool: Any, arguments: dict[str, Any], idempotency_key: str) -> ToolOutcome:
        self.calls.append((tool.server.name, tool.tool, arguments, idempotency_key, tool.side_effects))
        return self.outcome


def _resp(*calls: tuple[str, str, dict[str, Any]]) -> ModelResponse:
    return ModelResponse(content="x", tool_calls=tuple(ModelCall(id=i, name=n, arguments=a) for i, n, a in calls),
                         usage=Usage(input_tokens=10, output_tokens=1))


class Runner:
    def __init__(self, spec: AgentRunSpec, responses: list[ModelResponse], mcp: FakeMcp) -> None:
        self.spec, self.model, self.mcp, self.tools = spec, FakeModel(responses), mcp, FakeTools()
        self.journals: dict[int, MemoryJournal] = {}
        self.state = RunState(run=RUN)

    def lap(self, decision: ApprovalDecision | None = None, crash_at: str | None = None,
            spec: AgentRunSpec | None = None) -> LapRecord:
        lap = self.state.lap + 1

        def crash(point: str) -> None:
            if point == crash_at:
                raise Crash(point)

        spec = spec or self.spec
        fx = Effects(model=self.model, tools=self.tools, journal=self.journals.setdefault(lap, MemoryJournal()),
                     crash=crash, mcp=self.mcp)
        ctx = LapContext(spec=spec, run=RUN, lap=lap, attempt=1, agent_version="v1", decision=decision,
                         image="img:1")
        record = run_lap(ctx, self.state, fx)
        self.state = fold(self.state, record)
        return record


# ------------------------------------------------------------------------------ pure parts


def test_patterns_match_the_servers_own_tool_names() -> None:
    assert matches(["book_*"], "book_invoice") and not matches(["book_*"], "lookup_invoice")
    assert matches(["*"], "anything") and not matches([], "anything")
    assert matches(["lookup_[ab]"], "lookup_a") and not matches(["Book*"], "book")  # case-sensitive
    spec = _spec()
    ref = find_mcp_tool(spec.agent, "ledger__book_invoice")
    assert ref is not None and ref.tool == "book_invoice" and ref.requires_approval and ref.side_effects
    look = find_mcp_tool(spec.agent, "ledger__lookup_invoice")
    assert look is not None and not look.requires_approval and not look.side_effects
    assert find_mcp_tool(spec.agent, "other__book_invoice") is None and find_mcp_tool(spec.agent, "notify") is None
    # default: every tool has side effects; an allow list hides the others
    only = _spec([_server(tools=["lookup_invoice"])])
    assert find_mcp_tool(only.agent, "ledger__book_invoice") is None
    assert find_mcp_tool(only.agent, "ledger__lookup_invoice").side_effects  # type: ignore[union-attr]


def test_an_allow_listed_tool_the_server_does_not_list_names_the_field() -> None:
    spec = _spec([_server(), _server(name="crm", url="http://crm/mcp", tools=["find", "vanished"])])
    with pytest.raises(PermanentLapError) as e:
        offered_tools(spec.agent, [_listing(("book_invoice", BOOK)), _listing(("find", LOOKUP), server="crm")])
    assert str(e.value) == ("spec.agent.mcpServers[1].tools names 'vanished', which MCP server 'crm' "
                            "(http://crm/mcp) does not list; it lists: find")


def test_offered_tools_keep_the_allow_list_and_skip_names_the_model_cannot_take() -> None:
    spec = _spec([_server(tools=["book_invoice"])])
    toolset, skipped = offered_tools(spec.agent, [_listing(("book_invoice", BOOK), ("lookup_invoice", LOOKUP))])
    assert toolset.names() == ["notify", "ledger__book_invoice"] and skipped == []
    toolset, skipped = offered_tools(_spec([_server()]).agent, [_listing(("book_invoice", BOOK), ("has.dot", LOOKUP))])
    assert toolset.names() == ["notify", "ledger__book_invoice"] and skipped == ["ledger/has.dot"]
    got = toolset.get("ledger__book_invoice")
    assert got is not None and got.parameters == BOOK and got.description == "book_invoice it"


def test_the_discovery_diff_versions_a_changed_listing_only() -> None:
    v1 = tools_version(None, [_listing(("book_invoice", BOOK), ("lookup_invoice", LOOKUP))])
    assert v1 is not None and v1.version == 1 and v1.changes == []
    same = [_listing(("lookup_invoice", LOOKUP), ("book_invoice", BOOK))]  # order does not matter
    same[0].server_info["version"] = "2"  # nor the version the server reports
    assert tools_version(v1, same) is None
    changed = [_listing(("book_invoice", {**BOOK, "required": ["invoice"]}), ("void_invoice", LOOKUP))]
    v2 = tools_version(v1, changed)
    assert v2 is not None and v2.version == 2
    assert v2.changes == ["ledger: added void_invoice", "ledger: removed lookup_invoice", "ledger: changed book_invoice"]
    assert listing_changes(v2.servers, [_listing(server="crm", url="http://crm/mcp")]) == [
        "ledger: server removed", "crm: server added (0 tools)"]


def test_the_tools_changed_event_is_for_a_new_version_only() -> None:
    r = Runner(_spec(), [_resp(), _resp()], FakeMcp(_listing(("book_invoice", BOOK))))
    first = r.lap()
    assert first.mcp_tools is not None and first.mcp_tools.version == 1
    assert tools_changed_message(first) is None


# ------------------------------------------------------------------------------ the step


def test_the_listing_is_journaled_recorded_and_reused_by_a_replay() -> None:
    mcp = FakeMcp(_listing(("book_invoice", BOOK), ("lookup_invoice", LOOKUP)))
    r = Runner(_spec(), [_resp(("c1", "ledger__lookup_invoice", {"invoice": "INV-1"})),
                         _resp(("c2", "ledger__lookup_invoice", {"invoice": "INV-2"})), _resp()], mcp)
    with pytest.raises(Crash):
        r.lap(crash_at="after-model-journal")
    assert mcp.lists == 1 and set(r.journals[1].entries) == {"mcp-tools", "model"}
    mcp.listings = [_listing(("lookup_invoice", LOOKUP))]  # what the server lists now does not matter to the replay
    rec = r.lap()
    assert mcp.lists == 1, "the replay used the journaled listing"
    assert [t.name for t in r.model.requests[-1].tools] == ["notify", "ledger__book_invoice", "ledger__lookup_invoice"]
    assert rec.mcp_tools is not None and rec.mcp_tools.version == 1
    assert [t.name for t in rec.mcp_tools.servers[0].tools] == ["book_invoice", "lookup_invoice"]
    key = "r_8f2a1c0d111122223333444455556666:1:ledger__lookup_invoice:c1"
    assert mcp.calls == [("ledger", "lookup_invoice", {"invoice": "INV-1"}, key, False)]
    assert rec.tool_calls[0].status == "ok" and rec.tool_calls[0].result == '{"booking":1}'
    assert r.journals[1].entries["tool-c1"]["record"]["idempotencyKey"] == key
    # lap 2 lists again: changed, so a new version with what changed, and ONE ToolsChanged message
    rec2 = r.lap()
    assert mcp.lists == 2 and rec2.mcp_tools is not None and rec2.mcp_tools.version == 2
    assert rec2.mcp_tools.changes == ["ledger: removed book_invoice"]
    assert tools_changed_message(rec2) == ("lap 2 listed changed MCP tools, recorded as tools version 2 (was 1): "
                                           "ledger: removed book_invoice")
    assert r.state.mcp_tools == rec2.mcp_tools
    # lap 3: the same listing: nothing recorded, the state keeps version 2
    rec3 = r.lap()
    assert rec3.mcp_tools is None and r.state.mcp_tools is not None and r.state.mcp_tools.version == 2
    assert "mcpTools" not in rec3.to_api()


def test_a_run_without_mcp_servers_records_nothing_and_needs_no_client() -> None:
    spec = spec_of(spec_doc([tool("notify", "http://127.0.0.1:9")], []))
    r = Runner(spec, [_resp(("c1", "notify", {"doc": "d"}))], FakeMcp())
    r.mcp = None  # type: ignore[assignment]
    rec = r.lap()
    assert rec.mcp_tools is None and "mcpTools" not in rec.to_api() and "mcp-tools" not in r.journals[1].entries


def test_an_approval_gated_mcp_call_waits_then_runs_once_with_its_key() -> None:
    mcp = FakeMcp(_listing(("book_invoice", BOOK), ("lookup_invoice", LOOKUP)))
    args = {"invoice": "INV-9", "amount_cents": 500}
    r = Runner(_spec(), [_resp(("c1", "ledger__book_invoice", args)), _resp()], mcp)
    rec = r.lap()
    assert rec.outcome.type == "awaiting-approval" and mcp.calls == []
    pa = rec.pending_approval
    assert pa is not None and pa.tool == "ledger__book_invoice"
    # the operator, from the spec alone, computes the same target digest the lap recorded
    declared = find_mcp_tool(r.spec.agent, "ledger__book_invoice")
    assert pa.target_sha256 == target_sha256(declared, "img:1", arguments_sha256(args))
    assert call_target(declared, "img:1") == {"method": "MCP", "url": URL, "headersSecret": None, "image": "img:1"}
    ok = ApprovalDecision(call_id="c1", decision="approved", target_sha256=pa.target_sha256,
                          arguments_sha256=arguments_sha256(args))
    rec2 = r.lap(decision=ok)
    key = "r_8f2a1c0d111122223333444455556666:1:ledger__book_invoice:c1"
    assert mcp.calls == [("ledger", "book_invoice", args, key, True)]
    assert rec2.tool_calls[0].status == "ok" and rec2.tool_calls[0].idempotency_key == key


def test_an_approved_mcp_call_is_not_sent_when_its_server_url_changed() -> None:
    mcp = FakeMcp(_listing(("book_invoice", BOOK)), _listing(("book_invoice", BOOK), url="http://evil.example/mcp"))
    args = {"invoice": "INV-9", "amount_cents": 500}
    r = Runner(_spec(), [_resp(("c1", "ledger__book_invoice", args)), _resp()], mcp)
    pa = r.lap().pending_approval
    assert pa is not None
    ok = ApprovalDecision(call_id="c1", decision="approved", target_sha256=pa.target_sha256)
    moved = _spec([_server(url="http://evil.example/mcp", requiresApproval=["book_*"])])
    mcp.listings = [_listing(("book_invoice", BOOK), url="http://evil.example/mcp")]
    rec = r.lap(decision=ok, spec=moved)
    assert rec.outcome.type == "awaiting-approval" and "its target" in (rec.outcome.message or "")
    assert mcp.calls == [], "the approved call was not redirected"


def test_a_tool_that_disappears_under_a_waiting_call_fails_it_clearly() -> None:
    mcp = FakeMcp(_listing(("book_invoice", BOOK)))
    args = {"invoice": "INV-9", "amount_cents": 500}
    r = Runner(_spec(), [_resp(("c1", "ledger__book_invoice", args)), _resp()], mcp)
    pa = r.lap().pending_approval
    assert pa is not None
    mcp.listings = [_listing(("lookup_invoice", LOOKUP))]
    ok = ApprovalDecision(call_id="c1", decision="approved", target_sha256=pa.target_sha256)
    with pytest.raises(PermanentLapError, match=r"tool 'book_invoice' of the pending approval \(call c1\) is no "
                                                r"longer listed by MCP server 'ledger'; the call was not executed"):
        r.lap(decision=ok)
    assert mcp.calls == []


def test_an_mcp_error_result_reaches_the_model_as_a_tool_error() -> None:
    mcp = FakeMcp(_listing(("lookup_invoice", LOOKUP)))
    mcp.outcome = ToolOutcome(status="error", result="MCP tool error: no such invoice")
    r = Runner(_spec(), [_resp(("c1", "ledger__lookup_invoice", {"invoice": "X"}))], mcp)
    rec = r.lap()
    assert rec.tool_calls[0].status == "error"
    assert rec.messages[-1].content == "error: MCP tool error: no such invoice"


def test_invalid_arguments_and_unknown_mcp_tools_are_not_sent() -> None:
    mcp = FakeMcp(_listing(("lookup_invoice", LOOKUP)))
    r = Runner(_spec(), [_resp(("c1", "ledger__lookup_invoice", {"invoice": 5}), ("c2", "ledger__nope", {}))], mcp)
    rec = r.lap()
    assert [c.status for c in rec.tool_calls] == ["invalid-arguments", "unknown-tool"] and mcp.calls == []
    assert "declared tools: notify, ledger__lookup_invoice" in (rec.tool_calls[1].result or "")


# ------------------------------------------------------------------------------ the real client


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("mcp")
    from toolkit_servers import example_server, record

    db = tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"
    with example_server("mcp_tool_server.py", db) as url:
        yield url, lambda: record(url)


def test_the_real_client_lists_and_calls_with_the_key_in_header_and_meta(ledger: Any) -> None:
    from agentrun.api.mcp import McpToolRef
    from agentrun.lap.tools.mcp import McpToolRunner

    url, record = ledger
    server = McpServer.model_validate({"name": "ledger", "url": url + "/mcp", "sideEffects": ["book_*"]})
    runner = McpToolRunner()
    listing = runner.list_tools(server)
    assert sorted(t.name for t in listing.tools) == ["book_invoice", "lookup_invoice"]
    assert listing.server_info.get("name") == "agentrun-example-ledger"
    book = McpToolRef(server=server, tool="book_invoice")
    key = "r_8f2a1c0d111122223333444455556666:1:ledger__book_invoice:c1"
    args = {"invoice": "INV-1", "amount_cents": 500}
    first = runner.call(book, args, key)
    again = runner.call(book, args, key)  # a replay: the same key
    assert first.status == "ok" and first == again and '"booking":1' in first.result.replace(" ", "")
    assert record()["executions"] == {key: 1}
    # the same key with other arguments: the server's isError result reaches the model as a tool error
    other = runner.call(book, {"invoice": "INV-1", "amount_cents": 7}, key)
    assert other.status == "error" and other.result.startswith("MCP tool error: ") and key in other.result
    # results are bounded like HTTP tools'
    small = McpServer.model_validate({"name": "ledger", "url": url + "/mcp", "maxResultBytes": 1024})
    look = runner.call(McpToolRef(server=small, tool="lookup_invoice"), {"invoice": "INV-1" * 300}, "k")
    assert look.status == "ok" and "[agentrun: result truncated" in look.result
    assert len(look.result.split("\n[agentrun")[0].encode()) == 1024


def test_a_transport_failure_is_retryable_and_a_denied_address_is_refused(ledger: Any) -> None:
    from agentrun.api.mcp import McpToolRef
    from agentrun.lap.netguard import AddressRefused
    from agentrun.lap.tools.mcp import McpToolRunner

    url, _ = ledger
    dead = McpServer.model_validate({"name": "gone", "url": "http://127.0.0.1:9/mcp", "timeout": "2s"})
    runner = McpToolRunner(tries=2, backoff_seconds=0.01)
    with pytest.raises(RetryableLapError, match=r"tool 'gone__x' on MCP server 'gone' \(http://127.0.0.1:9/mcp\) "
                                                r"connection failed .*\(2 tries\); the lap is retried \(key k1\)"):
        runner.call(McpToolRef(server=dead, tool="x"), {}, "k1")
    with pytest.raises(RetryableLapError, match="tools/list on MCP server 'gone'"):
        runner.list_tools(dead)
    guarded = McpToolRunner(rules=AddressRules(allow_loopback=False, loopback_rule="AgentRunPolicy p"))
    with pytest.raises(AddressRefused, match="MCP server 'ledger': connection to host \"127.0.0.1\" refused"):
        guarded.list_tools(McpServer.model_validate({"name": "ledger", "url": url + "/mcp"}))


# ------------------------------------------------------------------------------ the whole lap


@pytest.mark.s3
def test_a_whole_lap_with_an_mcp_server_against_s3(ledger: Any, s3_env: dict[str, str]) -> None:
    """``execute_lap`` as the lap pod runs it (the client made in the setup thread from the spec and
    AGENTRUN_MCP_HEADERS_<SERVER>), against a real S3 API server and the real MCP server: the
    listing is recorded, the call executed once with its key, the header value never logged."""
    import io

    from lap_helpers import lap_env

    from agentrun.checkpoint.store import CheckpointStore, StoreConfig
    from agentrun.lap.config import parse_env
    from agentrun.lap.logs import LapLogger
    from agentrun.lap.runner import EXIT_OK, execute_lap

    url, record = ledger
    before = record()["executions"]
    args = {"invoice": "INV-LAP", "amount_cents": 42}
    doc = spec_doc([], [{"content": "booking", "toolCalls": [{"name": "ledger__book_invoice", "arguments": args}]}])
    doc["agent"]["mcpServers"] = [{"name": "ledger", "url": url + "/mcp", "headersSecretRef": {"name": "t", "key": "h"}}]
    env = lap_env(s3_env, doc, 1, AGENTRUN_MCP_HEADERS_LEDGER='{"Authorization": "Bearer s3cr3t-token"}')
    out = io.StringIO()
    result = execute_lap(parse_env(env), CheckpointStore(StoreConfig.from_env(env)), env, LapLogger({}, stream=out))
    assert result.code == EXIT_OK, result.message
    rec = result.record
    assert rec is not None and rec.mcp_tools is not None and rec.mcp_tools.version == 1
    assert rec.tool_calls[0].status == "ok" and '"INV-LAP"' in (rec.tool_calls[0].result or "")
    key = rec.tool_calls[0].idempotency_key
    assert record()["executions"] == {**before, key: 1}
    assert "s3cr3t-token" not in out.getvalue()
    state = CheckpointStore(StoreConfig.from_env(env)).load_state(RUN).state
    assert state.mcp_tools == rec.mcp_tools


# ------------------------------------------------------------------------------ the operator's side


def test_the_lap_job_gets_each_mcp_servers_header_secret_by_reference() -> None:
    from agentrun.controller.config import OperatorConfig
    from agentrun.controller.decide.jobs import RunIdentity, build_env

    spec = _spec([_server(headersSecretRef={"name": "ledger-token", "key": "headers"}),
                  _server(name="crm-eu", url="http://crm/mcp")])
    env = build_env(RunIdentity("ns", "r", "u"), spec, 1, 1, "v1", OperatorConfig(checkpoint_uri="s3://b/p"))
    mcp = [e for e in env if e["name"].startswith("AGENTRUN_MCP_HEADERS_")]
    assert mcp == [{"name": "AGENTRUN_MCP_HEADERS_LEDGER",
                    "valueFrom": {"secretKeyRef": {"name": "ledger-token", "key": "headers"}}}]


def test_a_duplicate_in_progress_is_retried_with_the_same_key_never_shown_to_the_model(tmp_path: Path) -> None:
    """The server answers a second call of a key still running "not executed" (the toolkit's
    MCP_NOT_EXECUTED_META_KEY): the lap does not hand the model an error (it could ask again under a
    new key and book twice); it retries with the same key and, while it stays in progress, fails the lap
    retryably; the next attempt gets the stored result. One execution by the server's record."""
    import threading

    from toolkit_servers import example_server, record

    from agentrun.api.mcp import McpToolRef
    from agentrun.lap.tools.mcp import McpToolRunner

    with example_server("mcp_tool_server.py", tmp_path / "ledger.sqlite3", "--delay", "3", "--wait-seconds",
                        "0.2") as url:
        server = McpServer.model_validate({"name": "ledger", "url": url + "/mcp"})
        book = McpToolRef(server=server, tool="book_invoice")
        key = "r_8f2a1c0d111122223333444455556666:1:ledger__book_invoice:c9"
        args = {"invoice": "INV-9", "amount_cents": 5}
        first: list[Any] = []
        t = threading.Thread(target=lambda: first.append(McpToolRunner().call(book, args, key)))
        t.start()
        time.sleep(0.8)
        with pytest.raises(RetryableLapError, match=r"not executed by the server \(idempotency-key-in-progress\)"
                                                    r".*\(2 tries\); the lap is retried \(key "):
            McpToolRunner(tries=2, backoff_seconds=0.01).call(book, args, key)
        t.join()
        again = McpToolRunner().call(book, args, key)
        rec = record(url)
    assert first[0].status == "ok" and again == first[0]
    assert rec["executions"] == {key: 1}, rec
