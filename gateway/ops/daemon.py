"""Finding the daemon that runs on a home, from a terminal command: its pid (the home lock
holds it), a SIGHUP to reload its config, and its HTTP API's address and key."""

from __future__ import annotations

import fcntl
import os
import signal
from pathlib import Path

LOCK_NAME = "switchboard.lock"  # gateway.app.HomeLock


def running_pid(home: Path) -> int | None:
    """The pid of the daemon holding `<home>/switchboard.lock`, or None when none does.

    The daemon holds an exclusive flock for its life; a shared one taken here for an
    instant succeeds only when no daemon holds it (and is let go at once)."""
    try:
        fd = os.open(home / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def signal_reload(pid: int) -> bool:
    """SIGHUP: the daemon re-reads its config file. False when the process is gone."""
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return False
    return True
