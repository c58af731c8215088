"""The platform-neutral messages that flow between adapters and the router."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.session_keys import SessionSource


@dataclass(frozen=True)
class InboundMessage:
    source: SessionSource
    text: str
    platform_message_id: str | None = None
    received_at: float = 0.0
    mentioned: bool = True  # adapters set False for group messages that do not address the bot
    reply_to: str | None = None  # the platform id to reply to (threading, quoting)

    def as_payload(self) -> dict[str, object]:
        """What the inbox keeps of the message, to run its turn again after a crash."""
        return {
            "source": self.source.as_dict(), "text": self.text,
            "platform_message_id": self.platform_message_id, "received_at": self.received_at,
            "mentioned": self.mentioned, "reply_to": self.reply_to,
        }  # fmt: skip

    @classmethod
    def from_payload(cls, data: dict[str, object]) -> InboundMessage:
        source = data.get("source")
        if not isinstance(source, dict):
            raise ValueError("an inbox payload without a source")
        pmid, reply_to = data.get("platform_message_id"), data.get("reply_to")
        received = data.get("received_at")
        return cls(
            SessionSource.from_dict(source), str(data.get("text") or ""),
            None if pmid is None else str(pmid),
            float(received) if isinstance(received, (int, float)) else 0.0,
            bool(data.get("mentioned", True)), None if reply_to is None else str(reply_to),
        )  # fmt: skip


@dataclass(frozen=True)
class OutboundMessage:
    platform: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to: str | None = None  # for request/response adapters: the inbound it answers
    session_id: str | None = None
    session_key: str | None = None
    error: str | None = None  # set on apologies: "agent" (message stored) or "storage" (not stored)
    notice: bool = False  # a notice sent ahead of the answer (e.g. "a new session was started")
    # the same key on every send of one reply (the turn's, a start-up resend): an adapter
    # whose class sets `idempotent_replies` shows a reply sent twice under one key once
    dedupe_key: str | None = None
    resend: bool = False  # a start-up resend: the reply may already be in the chat


@dataclass(frozen=True)
class SentRef:
    platform: str
    chat_id: str
    message_ids: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class ThreadRef:
    platform: str
    chat_id: str
    thread_id: str
    name: str = ""
