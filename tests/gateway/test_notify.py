"""systemd readiness against a fake NOTIFY_SOCKET: STATUS while starting, READY from the
daemon's own pid once state and adapters are up, WATCHDOG pings from the event loop,
STOPPING on SIGTERM, then exit 0. Reads are time-boxed: watchdog pings never go quiet."""

from __future__ import annotations

import select
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from gateway.ops.notify import sd_notify, watchdog_interval
from tests.daemon import clean_env, switchboard


def _read_for(sock: socket.socket, seconds: float) -> list[tuple[str, int | None]]:
    """(message, sender pid) for every datagram within the window."""
    out: list[tuple[str, int | None]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            break
        data, ancdata, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = None
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", payload[:12])[0]
        out.extend((line, pid) for line in data.decode().splitlines())
    return out


@pytest.mark.slow
def test_readiness_watchdog_and_stopping(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    sock.bind(str(sock_path))
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("platforms:\n  api:\n    port: 0\n")
    env = clean_env(NOTIFY_SOCKET=str(sock_path), WATCHDOG_USEC="200000")
    proc = subprocess.Popen(
        switchboard(home, "run"),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen: list[tuple[str, int | None]] = []
        deadline = time.monotonic() + 20
        while not any(m == "READY=1" for m, _ in seen) and time.monotonic() < deadline:
            seen += _read_for(sock, 0.2)
        ready = [pid for m, pid in seen if m == "READY=1"]
        assert ready == [proc.pid], seen
        statuses = [m for m, _ in seen if m.startswith("STATUS=")]
        assert statuses[0] == "STATUS=opening state.db" and "STATUS=starting adapters" in statuses
        assert statuses[-1] == "STATUS=running (api)"
        pings: list[str] = []
        deadline = time.monotonic() + 60  # counted, not timed: only silence fails
        while len(pings) < 3 and time.monotonic() < deadline:
            pings += [m for m, _ in _read_for(sock, 0.5) if m == "WATCHDOG=1"]
        assert len(pings) >= 3  # the loop keeps pinging the watchdog
        proc.send_signal(signal.SIGTERM)
        after = _read_for(sock, 3)
        assert ("STOPPING=1", proc.pid) in after
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        sock.close()


def test_notify_is_a_no_op_outside_systemd() -> None:
    assert sd_notify("READY=1", env={}) is False
    assert sd_notify("READY=1", env={"NOTIFY_SOCKET": "/nonexistent/socket"}) is False
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "1000000"}) == 0.5
    assert (
        watchdog_interval({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}) is None
    )  # another process's
