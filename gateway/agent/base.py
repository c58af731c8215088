"""The Agent interface: a history window in, a reply out. Backends know no platforms."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

ChatMessage = dict[str, Any]  # OpenAI chat format
ToolRunner = Callable[[str, dict[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class TurnContext:
    session_id: str
    session_key: str
    platform: str
    system_prompt: str | None = None
    run_tool: ToolRunner | None = None  # lets a backend call tools (session_search)


@dataclass(frozen=True)
class AgentReply:
    text: str
    input_tokens: int = 0
    output_tokens: int = 0
    tool_messages: Sequence[ChatMessage] = field(default_factory=tuple)  # to store before the reply
    model: str | None = None
    # the token counts are our estimate (estimate_tokens), not the backend's: the echo agent,
    # or a backend whose responses carry no usage
    tokens_estimated: bool = False


class Agent(Protocol):
    name: str
    model: str | None

    async def respond(self, history: Sequence[ChatMessage], ctx: TurnContext) -> AgentReply: ...

    async def summarize(self, history: Sequence[ChatMessage], focus: str | None) -> str:
        """A summary of `history` to continue from (compression)."""
        ...

    async def suggest_title(self, history: Sequence[ChatMessage]) -> str:
        """A 3-7 word title for the conversation so far."""
        ...

    async def before_reset(self, session_id: str, reason: str) -> None:
        """One chance to save what matters before an automatic reset (bounded in time)."""
        ...

    async def close(self) -> None: ...


def estimate_tokens(message: ChatMessage) -> int:
    """Cheap token estimate (about 4 characters per token) for history windows."""
    content = message.get("content") or ""
    extra = len(str(message.get("tool_calls") or ""))
    return (len(content) + extra) // 4 + 4


def window(
    history: Sequence[ChatMessage], budget_tokens: int, costs: Sequence[int] | None = None
) -> list[ChatMessage]:
    """The newest messages that fit in the budget; the oldest fall out first. A leading
    tool result without its call is dropped too, so the window is always valid to replay.
    `costs`: each message's `estimate_tokens`, when the caller has them already."""
    if costs is not None and sum(costs) <= budget_tokens:  # all of it fits: no walk
        out = list(history)
    else:
        out = []
        used = 0
        for i in range(len(history) - 1, -1, -1):
            msg = history[i]
            cost = costs[i] if costs is not None else estimate_tokens(msg)
            if out and used + cost > budget_tokens:
                break
            out.append(msg)
            used += cost
        out.reverse()
    while out and out[0].get("role") == "tool":
        out.pop(0)
    return out
