"""How the benchmarks offer load and read what it cost: an open loop, a process's CPU
time from /proc, and a neighbour of known size to run beside them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any


async def open_loop(
    rate: float, count: int, one: Callable[[int], Coroutine[Any, Any, None]]
) -> float:
    """Start `one(i)` at i/rate seconds for each i < count, whatever became of the earlier
    ones (a slow answer does not lower the rate offered), and wait for them all; the
    seconds from the first start to the last end."""
    tasks: set[asyncio.Task[None]] = set()  # only unfinished ones: no heap of done tasks
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """user + system CPU seconds of one process (0 when it is gone)."""
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


def backend_pids(dsn: str) -> list[int]:
    """The PostgreSQL backends connected to this DSN's database (the server on this
    machine: their CPU is read from /proc)."""
    import psycopg  # the postgres extra: only the benches that measure a server need it

    with psycopg.connect(dsn, autocommit=True) as conn:
        return [
            int(r[0])
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
        ]


class HttpError(Exception):
    """A request the lean client could not complete (connection lost, bad answer, time)."""


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HttpError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end]).split(b"\r\n")
        headers = {}
        for line in head[1:]:
            name, _, val = line.partition(b":")
            headers[name.strip().lower()] = val.strip()
        waiter = self.waiter
        if b"transfer-encoding" in headers or b"content-length" not in headers:
            self.waiter = None  # the caller closes the connection
            waiter.set_exception(HttpError("only answers with a Content-Length are read here"))
            return
        length = int(headers[b"content-length"])
        if len(self.buf) < end + 4 + length:
            return
        body = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        self.waiter = None
        waiter.set_result((int(head[0].split()[1]), body))


class LeanHttp:
    """A small HTTP/1.1 client for the benchmarks' load: keep-alive connections per host,
    a new one whenever all are busy (an open loop must not wait for a free connection), one
    write per request. It reads only what the load needs (status, a Content-Length body).
    Why not aiohttp's client, which the daemons' adapters use: it shares the cores with the
    daemons it measures, and it cost 0.40-0.45 ms of CPU per request here against 0.19-0.36
    for this (cluster_bench section 3 prints the load generator's share)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    async def post_json(self, url: str, body: object) -> tuple[int, bytes]:
        """POST `body` as JSON to `url` (http://host:port/path); (status, body)."""
        return await self.post(url, json.dumps(body).encode())

    async def post(
        self, url: str, data: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """POST `data` to `url` with `headers` (default: a JSON Content-Type); (status,
        body)."""
        rest = url.removeprefix("http://")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        key = (host, int(port or 80))
        lines = "".join(
            f"{name}: {value}\r\n"
            for name, value in (headers or {"Content-Type": "application/json"}).items()
        )
        request = (
            f"POST /{path} HTTP/1.1\r\nHost: {hostport}\r\n{lines}"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        idle = self._idle.setdefault(key, [])
        while idle and idle[-1].closed:
            idle.pop()
        loop = asyncio.get_running_loop()
        conn: _Conn | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                if idle:
                    conn = idle.pop()
                else:
                    _t, conn = await loop.create_connection(_Conn, *key)
                assert conn.transport is not None
                conn.waiter = loop.create_future()
                conn.transport.write(request)
                answer = await conn.waiter
        except BaseException as exc:
            if conn is not None and conn.transport is not None:
                conn.transport.close()  # an answer may still come: the connection is spent
            if isinstance(exc, OSError):  # refused, reset, or the time out (TimeoutError)
                raise HttpError(f"{type(exc).__name__}: {exc}") from exc
            raise
        idle.append(conn)
        return answer

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()


_BURN = """import sys, time
busy, idle = float(sys.argv[1]) / 1000, float(sys.argv[2]) / 1000
while True:
    end = time.perf_counter() + busy
    while time.perf_counter() < end:
        pass
    time.sleep(idle)
"""


class Neighbour:
    """A co-tenant of known size: `procs` processes that each burn a core for `busy_ms`,
    then sleep `idle_ms`, over and over (spec "BUSY/IDLE" or "BUSY/IDLExPROCS", e.g.
    "60/140x2": two processes, each busy 30% of the time in 60 ms bursts). The shared
    machines these benches run on have such neighbours of their own (a message broker's VM
    taking 80 ms of a core at once), whose timing nobody controls; this one is the same
    shape on purpose, so a figure measured beside it can be measured again."""

    def __init__(self, spec: str) -> None:
        timing, _, procs = spec.partition("x")
        busy, _, idle = timing.partition("/")
        try:
            self.busy_ms, self.idle_ms, self.procs = float(busy), float(idle), int(procs or 1)
        except ValueError:
            raise ValueError(
                f"a neighbour is BUSY/IDLE[xPROCS] in ms, e.g. 60/140x2 (got {spec!r})"
            ) from None
        if self.busy_ms <= 0 or self.idle_ms < 0 or not 1 <= self.procs <= 64:
            raise ValueError(
                f"a neighbour needs BUSY > 0, IDLE >= 0 and 1 to 64 processes (got {spec!r})"
            )
        self._running: list[subprocess.Popen[bytes]] = []

    def __str__(self) -> str:
        return (
            f"{self.procs} process(es) each busy {self.busy_ms:g} ms, then idle {self.idle_ms:g} ms"
        )

    def __enter__(self) -> Neighbour:
        argv = [sys.executable, "-c", _BURN, str(self.busy_ms), str(self.idle_ms)]
        self._running = [subprocess.Popen(argv) for _ in range(self.procs)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self._running:
            proc.kill()
        for proc in self._running:
            proc.wait()
        self._running = []

    def cpu_s(self) -> float:
        """CPU seconds its processes have used so far."""
        return sum(cpu_s(p.pid) for p in self._running)
