"""The states both backends store and the gateway reads: an inbox row's turn, a one-off
send's, a reply's delivery, a pairing request's, a stale handoff's error, how a session ended or was forked,
and the lineage rules that follow from it (depth guard, inherited columns, what counts as
a compression child). Plain strings and two enums; no SQL."""

from __future__ import annotations

from enum import StrEnum

# an inbox row: taken, its turn begun, answered (the reply stored) or dropped unanswered
RECEIVED, STARTED, ANSWERED, DROPPED = "received", "started", "answered", "dropped"
OPEN_STATES = (RECEIVED, STARTED)

# a reply's delivery states that mean it has not reached its chat (ready / sending while
# the outbox holds it, unconfirmed after a crash, failed, refused or expired for good)
UNDELIVERED = ("ready", "sending", "unconfirmed", "failed", "refused", "expired")

# a one-off send in the outbox (`switchboard send` through the daemon)
SEND_PENDING, SEND_SENT, SEND_FAILED = "pending", "sent", "failed"

# a DM pairing row, and offer's answer when the drawn code is already pending elsewhere
PAIRING_PENDING, APPROVED, DENIED, REVOKED = "pending", "approved", "denied", "revoked"
TAKEN = "taken"

# a handoff a daemon claimed but never finished (it went away)
STALE_ERROR = "the gateway stopped during the handoff"


class ChildKind(StrEnum):
    """How a child session came from its parent (`sessions.child_kind`)."""

    COMPRESSION = "compression"
    BRANCH = "branch"
    RESET = "reset"
    DELEGATE = "delegate"


class EndReason(StrEnum):
    """Why a session ended (`sessions.end_reason`)."""

    USER_EXIT = "user_exit"
    COMPRESSION = "compression"
    BRANCHED = "branched"
    SESSION_SWITCH = "session_switch"
    SESSION_RESET = "session_reset"
    IDLE = "idle"  # reset by the idle policy
    DAILY = "daily"  # reset at the daily boundary


CHILD_KINDS: tuple[str, ...] = tuple(ChildKind)
END_REASONS: tuple[str, ...] = tuple(EndReason)


# Lineage: how deep a walk goes (a guard against a parent cycle another program wrote),
# and the columns a child inherits from its parent (routing included: it answers the
# same chat).
MAX_LINEAGE_DEPTH = 10_000
INHERITED_COLUMNS = (
    "user_id",
    "model",
    "model_config",
    "system_prompt",
    "session_key",
    "chat_id",
    "chat_type",
    "thread_id",
    "origin_json",
)


def is_compression_child(kind: str | None, end_reason: str | None) -> bool:
    """Whether a child continues its parent after compression. Rows written by other
    programs carry no child_kind; their parent's end_reason ('compression') says it."""
    return kind == ChildKind.COMPRESSION or (kind is None and end_reason == EndReason.COMPRESSION)
