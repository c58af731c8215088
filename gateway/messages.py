"""The platform-neutral messages that flow between adapters and the router."""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from gateway.session_keys import SessionSource
from state import storable

PAYLOAD_V2 = 2  # the first item of an inbox payload list
LATE_SEND_S = 0.25  # see OutboundMessage.late (gateway/turns.py's RECHECK_AFTER_S)
# Replicas: time.monotonic() by which the reply this task sends must have left (its turn's
# last lease check + LATE_SEND_S; None: no limit). An adapter's HTTP session checks it when
# a request has its connection, the last await before the request is written
# (gateway.adapters.base.send_by_trace), and raises SetOutLate past it.
SEND_BY: ContextVar[float | None] = ContextVar("send_by", default=None)
# True in the outbox's drain: a platform call is tried once and its failure raised as it
# came (a RetryAfter too), since the outbox spaces the tries of what it holds itself
ONE_TRY: ContextVar[bool] = ContextVar("one_try", default=False)


class SetOutLate(Exception):
    """A reply's request was about to leave after SEND_BY: the process stood still on the
    way (SIGSTOP, a stalled VM) and another replica may hold the chat now. Nothing of that
    request was sent; the turn reads its lease again before sending (gateway/turns.py)."""


def set_out_late(exc: BaseException) -> bool:
    """Is `exc` a SetOutLate, or caused by one? (A client library wraps what its transport
    raised: aiohttp, when the check before a request's body stops it; PTB, around aiohttp.)"""
    seen: set[int] = set()
    found: BaseException | None = exc
    while found is not None and id(found) not in seen:
        if isinstance(found, SetOutLate):
            return True
        seen.add(id(found))
        found = found.__cause__ or found.__context__
    return False


@dataclass(frozen=True)
class InboundMessage:
    source: SessionSource
    text: str
    platform_message_id: str | None = None
    received_at: float = 0.0
    mentioned: bool = True  # adapters set False for group messages that do not address the bot
    reply_to: str | None = None  # the platform id to reply to (threading, quoting)

    def __post_init__(self) -> None:
        # Every adapter builds its messages here: a chat platform's text cannot be refused,
        # so what no store can hold (NUL, lone surrogates) becomes U+FFFD (state/text.py).
        text, replaced = storable(self.text)
        if replaced:
            object.__setattr__(self, "text", text)

    def as_payload(self) -> list[object]:
        """What the inbox keeps of the message, to run its turn again after a crash: a
        flat list (encoding it costs half of a dict's with its keys; it is written once per
        message and read only after a crash)."""
        src = self.source
        return [
            PAYLOAD_V2,
            src.platform,
            src.chat_id,
            src.chat_type,
            src.user_id,
            src.user_name,
            src.chat_name,
            src.thread_id,
            self.text,
            self.platform_message_id,
            self.received_at,
            self.mentioned,
            self.reply_to,
        ]

    @classmethod
    def from_payload(cls, data: object) -> InboundMessage:
        """The message back from `as_payload`'s list, or from the dict earlier versions
        wrote."""
        if isinstance(data, list) and data and data[0] == PAYLOAD_V2 and len(data) == 13:
            keys = (
                "platform",
                "chat_id",
                "chat_type",
                "user_id",
                "user_name",
                "chat_name",
                "thread_id",
            )
            data = {
                "source": dict(zip(keys, data[1:8], strict=True)),
                "text": data[8],
                "platform_message_id": data[9],
                "received_at": data[10],
                "mentioned": data[11],
                "reply_to": data[12],
            }
        if not isinstance(data, dict):
            raise ValueError("an inbox payload that is neither a list nor an object")
        source = data.get("source")
        if not isinstance(source, dict):
            raise ValueError("an inbox payload without a source")
        pmid, reply_to = data.get("platform_message_id"), data.get("reply_to")
        received = data.get("received_at")
        return cls(
            SessionSource.from_dict(source),
            str(data.get("text") or ""),
            None if pmid is None else str(pmid),
            float(received) if isinstance(received, (int, float)) else 0.0,
            bool(data.get("mentioned", True)),
            None if reply_to is None else str(reply_to),
        )


@dataclass(frozen=True)
class TokenUsage:
    """What a turn's agent call cost in tokens: the backend's figures, or our estimate
    (gateway.agent.base.estimate_tokens) when `estimated`."""

    prompt_tokens: int
    completion_tokens: int
    estimated: bool = False


@dataclass(frozen=True)
class OutboundMessage:
    platform: str
    chat_id: str
    text: str
    thread_id: str | None = None
    reply_to: str | None = None  # for request/response adapters: the inbound it answers
    session_id: str | None = None
    session_key: str | None = None
    # set on apologies: "agent" (message stored), "storage" (not stored: send it again) or
    # "unstorable" (not stored, and it never can be)
    error: str | None = None
    notice: bool = False  # a notice sent ahead of the answer (e.g. "a new session was started")
    # the same key on every send of one reply (the turn's, a start-up resend): an adapter
    # whose class sets `idempotent_replies` shows a reply sent twice under one key once
    dedupe_key: str | None = None
    resend: bool = False  # a start-up resend: the reply may already be in the chat
    # time.monotonic() when the turn last knew its lease held (a turn's reply on
    # replicas, after gateway/turns.py's may_send): see `late`
    since: float | None = None
    usage: TokenUsage | None = None  # a turn's reply: its agent call's tokens

    def late(self) -> bool:
        """Is this send starting more than LATE_SEND_S after that? Normally it starts
        within a few event-loop passes; later, the process stood still in between, and
        another replica may have taken the chat over and sent the reply again: an adapter
        that can look for a reply's dedupe key in the chat does so first, as a resend does."""
        return self.since is not None and time.monotonic() - self.since > LATE_SEND_S


@dataclass(frozen=True)
class SentRef:
    platform: str
    chat_id: str
    message_ids: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class OutboxRef(SentRef):
    """A reply whose fate the outbox records in its inbox row (gateway.pipeline.backlog),
    so its turn does not."""


@dataclass(frozen=True)
class HeldRef(OutboxRef):
    """A reply the platform has not taken yet: the outbox holds it (behind the chat's
    earlier replies, or after a failed send) and delivers it when the platform is back,
    until it expires."""


@dataclass(frozen=True)
class RefusedRef(OutboxRef):
    """A reply the platform refused for good: recorded with its reason, never retried."""


@dataclass(frozen=True)
class ThreadRef:
    platform: str
    chat_id: str
    thread_id: str
    name: str = ""
