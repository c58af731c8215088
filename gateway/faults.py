"""Fault points for crash tests: `SWITCHBOARD_FAULT=<point>` makes the daemon SIGKILL itself
the first time it reaches that point (`SWITCHBOARD_FAULT_AT=N`: the Nth time). Unset, a
point costs one comparison. The points: `after_inbox_commit` (a message is taken, its turn
has not begun), `mid_agent` (the user's message is in its session, the agent is running),
`after_reply_commit` (the reply is stored, not yet sent), `after_send_before_mark` (the
platform took the reply; the outbox does not know yet). `SWITCHBOARD_FAULT_SIGNAL=STOP`
makes the point SIGSTOP the daemon instead (a stalled process, for fencing tests: it goes
on where it stopped once sent SIGCONT)."""

from __future__ import annotations

import os
import signal

POINTS = ("after_inbox_commit", "mid_agent", "after_reply_commit", "after_send_before_mark")
_armed = os.environ.get("SWITCHBOARD_FAULT") or None
_left = int(os.environ.get("SWITCHBOARD_FAULT_AT", "1") or 1)
_signal = signal.SIGSTOP if os.environ.get("SWITCHBOARD_FAULT_SIGNAL") == "STOP" else signal.SIGKILL
if _armed is not None and _armed not in POINTS:
    raise SystemExit(f"SWITCHBOARD_FAULT: unknown point {_armed!r} (known: {', '.join(POINTS)})")


def point(name: str) -> None:
    """Die (or stop) here, without any clean-up, if this point is armed and its turn has
    come."""
    global _left
    if _armed != name:
        return
    _left -= 1
    if _left == 0:  # once: a stopped daemon that goes on must not stop again here
        os.kill(os.getpid(), _signal)


def _unarmed(name: str) -> None:
    """`point` when no fault is armed: nothing to compare (it runs four times a turn)."""


if _armed is None:
    point = _unarmed  # noqa: F811
