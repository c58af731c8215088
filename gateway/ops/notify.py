"""systemd readiness without a dependency: datagrams to $NOTIFY_SOCKET (READY, STATUS,
WATCHDOG, STOPPING), and the watchdog pinged from the event loop itself so a stuck loop
gets the service restarted. Outside systemd everything here is a no-op."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket


def sd_notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send one notification; False when not under systemd or the socket is gone."""
    addr = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(state.encode())
        return True
    except OSError:
        return False


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Half of WATCHDOG_USEC in seconds, if systemd asked this process for pings."""
    e = env if env is not None else os.environ
    usec = e.get("WATCHDOG_USEC")
    pid = e.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.05, int(usec) / 2_000_000)
    except ValueError:
        return None


async def watchdog(interval: float) -> None:
    """Ping from the loop: if the loop stops turning, the pings stop, and systemd acts."""
    with contextlib.suppress(asyncio.CancelledError):
        while True:
            sd_notify("WATCHDOG=1")
            await asyncio.sleep(interval)
