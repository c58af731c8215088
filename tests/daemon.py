"""Running switchboard as a real subprocess in tests: a clean environment, the command line,
a free loopback port, waiting until /health answers, and a bench/ script run to its end."""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without what would steer the child: its home, systemd's notify socket."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SWITCHBOARD", "NOTIFY", "WATCHDOG"))
    }
    env.update(extra)
    return env


def switchboard(home: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", "--home", str(home), *args]


ROOT = Path(__file__).resolve().parent.parent


def run_bench(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """bench/<script> run to its end in a clean environment, its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
        cwd=ROOT,
    )


# Ports for the daemons a test starts come from below Linux's ephemeral range (32768 and up),
# where neither bind(port 0) nor an outgoing connection ever takes one, each pytest-xdist
# worker from its own block: a port handed out here is not taken by another worker's daemon,
# fake server or client socket before the daemon it was meant for binds it.
_PORTS_FROM = 20000
_PORTS_PER_WORKER = 1500


@functools.cache
def _ports() -> Iterator[int]:
    """This test process's block of ports, round and round (starting at a place its pid
    picks, so a run after a killed one does not meet the ports that one left busy)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")  # master: gw0
    first = _PORTS_FROM + (int(worker) if worker.isdigit() else 0) * _PORTS_PER_WORKER
    block = range(first, first + _PORTS_PER_WORKER)
    at = os.getpid() % _PORTS_PER_WORKER
    return itertools.cycle([*block[at:], *block[:at]])


def free_port() -> int:
    """A loopback port nothing listens on, from this test process's own block."""
    for port in itertools.islice(_ports(), _PORTS_PER_WORKER):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in this test process's block")


def _exit_detail(proc: subprocess.Popen[str] | asyncio.subprocess.Process) -> str | None:
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            return None
        return proc.stderr.read() if proc.stderr else ""
    return None if proc.returncode is None else f"exit {proc.returncode}"


async def wait_healthy(
    url: str, proc: subprocess.Popen[str] | asyncio.subprocess.Process, timeout: float = 20.0
) -> None:
    """Poll `<url>/health` until it answers 200; fail at once if the daemon exits."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            detail = _exit_detail(proc)
            assert detail is None, f"the daemon exited while starting: {detail}"
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        answering = (await resp.json()).get("pid")
                        assert answering == proc.pid, (
                            f"another process (pid {answering}) answers on {url}, "
                            f"not the daemon started (pid {proc.pid})"
                        )
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the daemon did not become healthy")
