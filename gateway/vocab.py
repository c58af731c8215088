"""The gateway's vocabulary: each set of words the config, /health and the session
sources use, listed once. They are StrEnums, so a member is equal to (and encodes in JSON
and SQLite as) its plain string. The words state.db stores (end reasons, child kinds)
are state's: `state.EndReason`, `state.ChildKind`.

This module imports nothing from the project, so anything may use it.
"""

from __future__ import annotations

from enum import StrEnum


class ChatType(StrEnum):
    """What kind of conversation a message came from."""

    DM = "dm"
    GROUP = "group"
    CHANNEL = "channel"
    THREAD = "thread"


class ResetMode(StrEnum):
    """`session_reset.mode`: which thresholds reset a session."""

    NONE = "none"
    IDLE = "idle"
    DAILY = "daily"
    BOTH = "both"  # whichever passes first

    @property
    def idle(self) -> bool:
        return self in (ResetMode.IDLE, ResetMode.BOTH)

    @property
    def daily(self) -> bool:
        return self in (ResetMode.DAILY, ResetMode.BOTH)


class AdapterState(StrEnum):
    """An adapter's `state` in /health; a failure reads `failed: <why>` (`failed`)."""

    STOPPED = "stopped"
    RUNNING = "running"
    RETRYING = "retrying"  # the platform was unreachable at start: started again with backoff
    FAILED = "failed"
