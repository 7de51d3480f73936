"""The model's context window, rebuilt from the run state; compaction of old laps. Pure functions.

Token estimate (deterministic, provider independent): ``ceil(chars / 4)`` of a text; a message
costs 4 tokens plus its content, plus for each tool call 4 tokens plus its name and compact-JSON
arguments. See docs/lap-runner.md ("The window").

Budget split of ``spec.agent.window.maxTokens`` (minus the system prompt):
summary <= 1/4, pinned facts <= 1/4, and compaction brings the uncompacted messages down to
<= 1/2. Compaction runs at the start of a lap, when summary + pinned facts + uncompacted messages
exceed the budget, and is recorded in the lap's ``compaction``; it never drops the previous lap
(the model must see its last tool results) nor splits a tool call from its answer. Lap-0 messages
(the task) are never compacted (``agentrun.checkpoint.fold`` keeps them), so the task is always in
the window, cut to a quarter of the budget if it is longer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from agentrun.api.spec import AgentRunSpec
from agentrun.checkpoint.schema import Compaction, Message, RunState

APPROVAL_PREFIX = "[approval] "
"""Tool messages carrying a human decision start with this; they become pinned facts."""
PIN_PREFIX = "PIN:"
"""Lines of assistant text starting with this become pinned facts when their lap is compacted."""
MEMORY_HEADER_SUMMARY = "Summary of earlier laps:"
MEMORY_HEADER_PINNED = "Pinned facts:"
LINE_MAX_CHARS = 200
FACT_MAX_CHARS = 400
_OMITTED = re.compile(r"^\((\d+) earlier lines omitted\)$")


def text_tokens(text: str | None) -> int:
    """Estimated tokens of a text: ceil(len / 4)."""
    return math.ceil(len(text or "") / 4)


def _args_json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def message_tokens(message: Message) -> int:
    """Estimated tokens of a message (content, tool calls, 4 tokens overhead each)."""
    calls = sum(4 + text_tokens(c.name + _args_json(c.arguments)) for c in message.tool_calls)
    return 4 + text_tokens(message.content) + calls


def messages_tokens(messages: Iterable[Message]) -> int:
    return sum(message_tokens(m) for m in messages)


def message_budget(spec: AgentRunSpec) -> int:
    """Tokens available to memory + messages: maxTokens minus the system prompt (at least 64)."""
    system = spec.agent.window.system_prompt
    used = message_tokens(Message(role="system", content=system, lap=0)) if system else 0
    return max(64, spec.agent.window.max_tokens - used)


def memory_text(summary: str | None, pinned_facts: Sequence[str]) -> str | None:
    """The text that stands for compacted laps: the summary and the pinned facts."""
    parts: list[str] = []
    if pinned_facts:
        parts.append(MEMORY_HEADER_PINNED + "\n" + "\n".join(f"- {f}" for f in pinned_facts))
    if summary:
        parts.append(MEMORY_HEADER_SUMMARY + "\n" + summary)
    return "\n\n".join(parts) or None


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f" ...[{len(text) - limit} chars truncated]"
    return text[: max(0, limit - len(marker))] + marker


def _clip_message(message: Message, max_chars: int) -> Message:
    if message.content is None or len(message.content) <= max_chars:
        return message
    return message.model_copy(update={"content": _truncate(message.content, max_chars)})


def build_window(state: RunState, spec: AgentRunSpec, lap_messages: Sequence[Message] = ()) -> list[Message]:
    """The messages sent to the model: one system message (the current spec's system prompt, then
    the memory of compacted laps), then the stored uncompacted messages and this lap's messages.

    Stored ``system`` messages are a trace only: the system prompt always comes from the current
    spec, so a new agent version's prompt takes effect at its first lap. A message longer than a
    quarter of the budget is cut (in the window only; the store keeps it whole).
    """
    system_parts = [p for p in (spec.agent.window.system_prompt, memory_text(state.summary, state.pinned_facts)) if p]
    head = [Message(role="system", content="\n\n".join(system_parts), lap=0)] if system_parts else []
    max_chars = max(200, message_budget(spec))  # a quarter of the budget, in chars (4 chars/token)
    body = [_clip_message(m, max_chars) for m in [*state.messages, *lap_messages] if m.role != "system"]
    return head + body


def apply_compaction(state: RunState, compaction: Compaction | None) -> RunState:
    """The state with a compaction applied (the same effect as folding it): messages of laps
    1..throughLap leave (lap 0, the task, stays), summary and pinned facts are replaced."""
    if compaction is None:
        return state
    return state.model_copy(
        update={
            "summary": compaction.summary,
            "pinned_facts": list(compaction.pinned_facts),
            "compacted_through_lap": compaction.through_lap,
            "messages": [m for m in state.messages if m.lap == 0 or m.lap > compaction.through_lap],
        }
    )


def _answer_spans(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """(lap of the assistant call, lap of its tool answer) for every answered call."""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m.role != "tool" or m.tool_call_id is None:
            continue
        for prev in reversed(messages[:i]):
            if prev.role == "assistant" and any(c.id == m.tool_call_id for c in prev.tool_calls):
                spans.append((prev.lap, m.lap))
                break
    return spans


def compaction_candidates(messages: Sequence[Message], lap: int) -> list[int]:
    """Laps T that may end a compaction: 1 <= T < lap - 1, and no call of a lap <= T answered after T."""
    spans = _answer_spans(messages)
    laps = sorted({m.lap for m in messages if 1 <= m.lap < lap - 1})
    return [t for t in laps if not any(a <= t < b for a, b in spans)]


def _short_value(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _call_text(name: str, arguments: dict[str, Any], answer: str | None) -> str:
    args = ", ".join(f"{k}={_short_value(v)}" for k, v in sorted(arguments.items()))
    result = "(no result)" if answer is None else _truncate(" ".join(answer.split()), 60)
    return f"{name}({_truncate(args, 60)}) -> {result}"


def summarize_lap(lap: int, messages: Sequence[Message]) -> str | None:
    """One bounded line for a compacted lap, e.g. ``lap 12: extract_invoice(doc=doc_4410) -> ok``."""
    answers = {m.tool_call_id: m.content for m in messages if m.role == "tool"}
    parts: list[str] = []
    for m in messages:
        if m.role == "assistant":
            parts += [_call_text(c.name, c.arguments, answers.get(c.id)) for c in m.tool_calls]
            if m.content:
                parts.append(f'said "{_truncate(" ".join(m.content.split()), 80)}"')
    if not parts:
        return None
    return _truncate(f"lap {lap}: " + "; ".join(parts), LINE_MAX_CHARS)


def extract_pins(messages: Sequence[Message]) -> list[str]:
    """Pinned facts found in compacted messages: approval decisions and ``PIN:`` lines of the model.
    (The task needs no pin: lap-0 messages are never compacted.)"""
    pins: list[str] = []
    for m in messages:
        if m.role == "tool" and m.content and m.content.startswith(APPROVAL_PREFIX):
            pins.append(_truncate(m.content[len(APPROVAL_PREFIX):], FACT_MAX_CHARS))
        elif m.role == "assistant" and m.content:
            pins += [
                _truncate(line.strip()[len(PIN_PREFIX):].strip(), FACT_MAX_CHARS)
                for line in m.content.splitlines()
                if line.strip().startswith(PIN_PREFIX) and line.strip()[len(PIN_PREFIX):].strip()
            ]
    return pins


def bound_summary(lines: Sequence[str], max_chars: int) -> str:
    """Join summary lines, dropping the oldest ones (counted in a first line) to fit max_chars."""
    omitted = 0
    body = list(lines)
    if body and (m := _OMITTED.match(body[0])):
        omitted, body = int(m.group(1)), body[1:]
    while body:
        head = [f"({omitted} earlier lines omitted)"] if omitted else []
        text = "\n".join(head + body)
        if len(text) <= max_chars:
            return text
        body, omitted = body[1:], omitted + 1
    return f"({omitted} earlier lines omitted)"


def bound_pins(facts: Sequence[str], max_chars: int) -> list[str]:
    """Deduplicate (first occurrence wins) and drop the oldest facts to fit max_chars."""
    rest = list(dict.fromkeys(facts))
    while rest and sum(len(f) + 3 for f in rest) > max_chars:
        rest = rest[1:]
    return rest


def plan_compaction(
    state: RunState, spec: AgentRunSpec, lap: int, lap_messages: Sequence[Message] = ()
) -> Compaction | None:
    """The compaction lap ``lap`` must record before its model call, or None if the window fits.

    Deterministic in (state, spec, lap, lap_messages), so a replayed lap computes the same one.
    """
    budget = message_budget(spec)
    stored = [m for m in state.messages if m.role != "system"]
    memory = memory_text(state.summary, state.pinned_facts)
    memory_tokens = message_tokens(Message(role="system", content=memory, lap=0)) if memory else 0
    total = memory_tokens + messages_tokens(stored) + messages_tokens(lap_messages)
    if total <= budget:
        return None
    candidates = compaction_candidates(state.messages, lap)
    if not candidates:
        return None
    target = budget // 2 - messages_tokens(lap_messages)
    through = candidates[-1]
    for t in candidates:
        if messages_tokens(m for m in stored if m.lap == 0 or m.lap > t) <= target:
            through = t
            break
    dropped = [m for m in state.messages if 1 <= m.lap <= through]
    by_lap = sorted({m.lap for m in dropped})
    new_lines = [line for n in by_lap if (line := summarize_lap(n, [m for m in dropped if m.lap == n]))]
    old_lines = state.summary.splitlines() if state.summary else []
    quarter_chars = max(64, budget - 64)  # ~ a quarter of the budget in tokens (4 chars per token), less headers
    return Compaction(
        through_lap=through,
        summary=bound_summary(old_lines + new_lines, quarter_chars),
        pinned_facts=bound_pins([*state.pinned_facts, *extract_pins(dropped)], quarter_chars),
    )
