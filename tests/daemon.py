"""Running switchboard as a real subprocess in tests: a clean environment, the command line,
a free loopback port, and waiting until /health answers."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the daemon did not become healthy")
