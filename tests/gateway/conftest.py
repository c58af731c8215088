from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.base import AgentReply, ChatMessage, TurnContext
from gateway.agent.echo import EchoAgent
from gateway.index import SessionIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.pipeline import Router, RouterSettings
from gateway.session_keys import SessionSource
from state import SessionDB


@dataclass
class Outbox:
    sent: list[OutboundMessage] = field(default_factory=list)
    event: asyncio.Event = field(default_factory=asyncio.Event)

    async def send(self, msg: OutboundMessage) -> SentRef:
        self.sent.append(msg)
        self.event.set()
        return SentRef(msg.platform, msg.chat_id, ("1",))

    async def wait(self, n: int, timeout: float = 5.0) -> list[OutboundMessage]:
        async def _until() -> None:
            while len(self.sent) < n:
                self.event.clear()
                await self.event.wait()

        await asyncio.wait_for(_until(), timeout)
        return self.sent


class ScriptedAgent(EchoAgent):
    """Echo, with optional failure or delay per message text (for router tests)."""

    def __init__(self) -> None:
        self.fail_on: set[str] = set()
        self.delay_on: dict[str, float] = {}
        self.seen: list[list[ChatMessage]] = []

    async def respond(self, history: Sequence[ChatMessage], ctx: TurnContext) -> AgentReply:
        self.seen.append(list(history))
        text = history[-1].get("content") or ""
        for key, delay in self.delay_on.items():
            if key in text:
                await asyncio.sleep(delay)
        if any(key in text for key in self.fail_on):
            raise RuntimeError("model exploded")
        return await super().respond(history, ctx)


@dataclass
class RouterRig:
    db: SessionDB
    index: SessionIndex
    router: Router
    outbox: Outbox
    agent: ScriptedAgent


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[RouterRig]:
    db = await SessionDB.open(tmp_path / "state.db")
    index = SessionIndex(tmp_path / "sessions" / "sessions.json", db, flush_interval=0.05)
    await index.load()
    outbox = Outbox()
    agent = ScriptedAgent()
    router = Router(db, index, agent, outbox.send, RouterSettings())
    try:
        yield RouterRig(db, index, router, outbox, agent)
    finally:
        await router.drain(5)
        await index.close()
        await db.close()


def dm(
    text: str, chat: str = "42", mid: str | None = None, platform: str = "telegram"
) -> InboundMessage:
    return InboundMessage(SessionSource(platform, chat, "dm", chat, "Ann"), text, mid)


def group(
    text: str,
    user: str,
    chat: str = "-100",
    mid: str | None = None,
    thread: str | None = None,
    name: str = "",
) -> InboundMessage:
    return InboundMessage(
        SessionSource("telegram", chat, "group", user, name or f"user{user}", "Group", thread),
        text,
        mid,
    )


def refused_at_start(gateway: Any, platform: str, error: str, keys: list[str]) -> None:
    """A started daemon whose `platform` refused its credentials: that adapter is stopped
    (failed, with the platform's answer and the config keys to fix in /health) while the
    daemon runs on, degraded."""
    health = gateway.health()
    entry = health["adapters"][platform]
    assert health["status"] == "degraded" and gateway.db is not None, health
    assert str(entry["state"]).startswith("failed: "), entry
    assert re.search(error, str(entry["last_error"])), entry
    assert entry["config_keys"] == keys, entry
