"""The echo agent: deterministic and offline; the default, and what tests and demos use."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.agent.base import AgentReply, ChatMessage, TurnContext


class EchoAgent:
    name = "echo"
    model: str | None = "echo"

    async def respond(self, history: Sequence[ChatMessage], ctx: TurnContext) -> AgentReply:
        last = next((m for m in reversed(history) if m.get("role") == "user"), None)
        text = (last or {}).get("content") or ""
        reply = f"echo: {text}" if text else "echo: (empty message)"
        return AgentReply(
            text=reply,
            input_tokens=sum(len((m.get("content") or "").split()) for m in history),
            output_tokens=len(reply.split()),
            model="echo",
        )

    async def close(self) -> None:
        return None
