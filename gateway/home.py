"""The daemon's home directory: where it is (`SWITCHBOARD_HOME`), the lock that keeps a
second daemon out of it, and the installed version the daemon reports."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gateway.errors import AlreadyRunning, GatewayError


def version() -> str:
    """The installed switchboard's version ("unknown" when run from a bare source tree)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("switchboard")
    except PackageNotFoundError:
        return "unknown"


def default_home() -> Path:
    return Path(os.environ.get("SWITCHBOARD_HOME") or "~/.switchboard").expanduser()


class HomeLock:
    """An exclusive flock on `<home>/switchboard.lock`, holding the daemon's pid."""

    def __init__(self, home: Path) -> None:
        self.path = home / "switchboard.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise GatewayError(
                f"home {self.path.parent} is not writable ({exc.strerror}: {exc.filename}); "
                "the daemon keeps switchboard.lock, state.db and sessions.json there"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyRunning(str(self.path.parent), pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
