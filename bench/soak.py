"""Soak: the real daemon (`switchboard run` on a temporary home, echo agent) fed
at a steady rate through the Telegram Bot API fake in webhook mode and the HTTP API, with
its resources printed as it goes. Prints figures; asserts nothing.

  python bench/soak.py                        # 30 minutes at 500 messages/s
  python bench/soak.py --minutes 5 --rate 500
  python bench/soak.py --quick                # 2 minutes at 200 messages/s

Open loop: message i is due at i/rate seconds whatever happened to the earlier ones, half as
signed webhook updates (40 connections, Telegram's default `max_connections`), half as
`POST /v1/messages` (256 connections), over a fixed set of chats (100 each by default, so
that at 500/s every session's history window, the 200 messages each turn reads, is full
within the first minute: the warm-up). A daemon that falls
behind shows as replies outstanding and an open inbox, not as a lower offered rate; `gen lag`
is how far this script itself ran behind its schedule (a CPU it shares with the daemon).

Every minute (or every quarter of a shorter run; `--every`) one table row: RSS and open
file descriptors of the daemon (/proc), state.db-wal and state.db sizes, the writer queue
(`/health`, now and the interval's maximum, sampled each second), the turn p99 of the
interval (the daemon's `switchboard_turn_seconds` histogram, so a bucket bound) and the
HTTP API's exact round-trip p99, open inbox rows (received/started, read-only sqlite3) and
replies not yet confirmed sent (the outbox), replies outstanding (sent - answered - refused) and the rates.
After the run it waits `--drain` seconds for the outstanding replies, stops the daemon with
SIGTERM and prints a summary: growth of RSS, fds and WAL after the first row (warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import pct  # noqa: E402
from bench.loops import cpu_seconds  # noqa: E402
from bench.platforms import (  # noqa: E402
    WEBHOOK_PATH,
    telegram_config,
    telegram_env,
    telegram_update,
)
from tests.daemon import clean_env, free_port, switchboard, wait_healthy  # noqa: E402
from tests.fakes.telegram import FakeTelegram  # noqa: E402

WEBHOOK_CONNECTIONS = 40  # Telegram's default setWebhook max_connections
API_CONNECTIONS = 256
COLUMNS = (
    "min",
    "offered/s",
    "sent/s",
    "answered/s",
    "RSS MB",
    "fds (api in/bot out/other)",
    "WAL MB",
    "db MB",
    "writer q now/max",
    "turn p99",
    "api p99 ms",
    "inbox open now/max",
    "outbox",
    "outstanding tg/api",
    "refused",
    "gen lag ms",
    "daemon CPU %",
    "load 1m",
)


@dataclass
class CountingTelegram(FakeTelegram):
    """The Bot API fake, counting echo replies; the call log is emptied as it goes (a long
    run would otherwise keep millions of calls in this process)."""

    answered: int = 0
    other_replies: int = 0
    cut: Counter[str] = field(default_factory=Counter)  # requests the daemon dropped mid-body

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            return await super()._handle(request)
        except ConnectionResetError:  # counted, not logged as a server error
            self.cut[request.match_info["method"]] += 1
            return web.Response(status=400)

    async def _m_sendMessage(self, params: dict[str, Any]) -> Any:
        if str(params.get("text", "")).startswith("echo: "):
            self.answered += 1
        else:
            self.other_replies += 1
        self.calls.clear()
        return await super()._m_sendMessage(params)


@dataclass
class Load:
    """The open-loop generator and what its clients saw."""

    rate: float
    chats: int
    fake: CountingTelegram
    base: str
    sent: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # "<platform> <status or error>"
    api_answered: int = 0
    api_seconds: list[float] = field(default_factory=list)  # round trips this interval
    lag_max: float = 0.0  # behind schedule this interval, seconds
    seconds: float = 0.0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    done_sending: asyncio.Event = field(default_factory=asyncio.Event)

    def outstanding(self) -> tuple[int, int]:
        tg_refused = sum(n for k, n in self.refused.items() if k.startswith("telegram"))
        api_refused = sum(n for k, n in self.refused.items() if k.startswith("api"))
        return (
            self.sent["telegram"] - self.fake.answered - tg_refused,
            self.sent["api"] - self.api_answered - api_refused,
        )

    async def run(self) -> None:
        hook = aiohttp.TCPConnector(limit=WEBHOOK_CONNECTIONS)
        api = aiohttp.TCPConnector(limit=API_CONNECTIONS)
        timeout = aiohttp.ClientTimeout(total=600)
        async with (
            aiohttp.ClientSession(connector=hook, timeout=timeout) as tg_http,
            aiohttp.ClientSession(connector=api, timeout=timeout) as api_http,
        ):
            loop = asyncio.get_running_loop()
            total, i, t0 = int(self.rate * self.seconds), 0, loop.time()
            while i < total:
                now = loop.time()
                self.lag_max = max(self.lag_max, now - (t0 + i / self.rate))
                due = min(total, int((now - t0) * self.rate) + 1)
                while i < due:  # counted as sent when issued, even if never started
                    self.sent["telegram" if i % 2 == 0 else "api"] += 1
                    coro = self._webhook(tg_http, i) if i % 2 == 0 else self._api(api_http, i)
                    task = asyncio.create_task(coro, name=f"soak.message:{i}")
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                    i += 1
                await asyncio.sleep(max(0.0, t0 + i / self.rate - loop.time()))
            self.done_sending.set()
            while self.tasks:  # the sessions close with their clients
                await asyncio.wait(set(self.tasks))

    async def _webhook(self, http: aiohttp.ClientSession, i: int) -> None:
        data, headers = telegram_update(
            self.fake, i + 1, 1_000_000 + (i // 2) % self.chats, f"soak {i}"
        )
        try:
            async with http.post(f"{self.base}{WEBHOOK_PATH}", data=data, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    self.refused[f"telegram {resp.status}"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.refused[f"telegram {type(exc).__name__}"] += 1

    async def _api(self, http: aiohttp.ClientSession, i: int) -> None:
        body = {
            "chat_id": f"soak{(i // 2) % self.chats}",
            "text": f"soak {i}",
            "message_id": str(i),
        }
        started = time.perf_counter()
        try:
            async with http.post(f"{self.base}/v1/messages", json=body) as resp:
                await resp.read()
                if resp.status == 200:
                    self.api_answered += 1
                    self.api_seconds.append(time.perf_counter() - started)
                else:
                    self.refused[f"api {resp.status}"] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.refused[f"api {type(exc).__name__}"] += 1


def proc_figures(pid: int) -> tuple[float, int]:
    """(RSS in MB, open file descriptors) of a process."""
    with open(f"/proc/{pid}/status") as fh:
        rss = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    return rss / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def fd_split(pid: int, api_port: int, bot_port: int) -> tuple[int, int, int]:
    """A process's open fds as (connections to its API port, connections to the Bot API
    fake, everything else: files, pipes, listening sockets), read from /proc."""
    peers: dict[str, tuple[int, int]] = {}  # socket inode -> (local port, remote port)
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as fh:
            for line in list(fh)[1:]:
                cols = line.split()
                local, remote = cols[1].rpartition(":")[2], cols[2].rpartition(":")[2]
                peers[cols[9]] = (int(local, 16), int(remote, 16))
    inbound = outbound = other = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            local, remote = peers.get(target[len("socket:[") : -1], (0, 0))
            if target.startswith("socket:[") and local == api_port and remote:
                inbound += 1
            elif target.startswith("socket:[") and remote == bot_port:
                outbound += 1
            else:
                other += 1
    return inbound, outbound, other


def load_average() -> str:
    with open("/proc/loadavg") as fh:
        return fh.read().split()[0]


def store_backlog(db: Path) -> tuple[int | None, int | None]:
    """(open inbox rows, replies not yet confirmed sent: the outbox lives on the inbox row
    as `reply_state`; None where the table is absent), read through a read-only connection."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        counts: list[int | None] = []
        for sql in (
            "SELECT count(*) FROM inbox WHERE state IN ('received', 'started')",
            "SELECT count(*) FROM inbox WHERE reply_state IN ('ready', 'sending')",
        ):
            try:
                counts.append(int(conn.execute(sql).fetchone()[0]))
            except sqlite3.OperationalError:
                counts.append(None)
        return counts[0], counts[1]
    finally:
        conn.close()


def turn_histogram(text: str) -> dict[str, float]:
    """The `switchboard_turn_seconds` buckets (le -> cumulative count) from /metrics."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('switchboard_turn_seconds_bucket{le="'):
            le, _, value = line[len('switchboard_turn_seconds_bucket{le="') :].partition('"} ')
            out[le] = float(value)
    return out


def p99_between(before: dict[str, float], after: dict[str, float]) -> str:
    """The bucket bound holding the p99 of the turns between two readings ("-": none)."""
    deltas = [(le, after[le] - before.get(le, 0.0)) for le in after]
    count = deltas[-1][1] if deltas else 0.0
    for le, cumulative in deltas if count > 0 else []:
        if cumulative >= 0.99 * count:
            return "> 60 s" if le == "+Inf" else f"<= {float(le):g} s"
    return "-"


def mb(path: Path) -> float:
    return path.stat().st_size / 1e6 if path.exists() else 0.0


@dataclass
class Monitor:
    """Samples the daemon each second and prints a row every `every` seconds."""

    proc: subprocess.Popen[bytes]
    home: Path
    base: str
    load: Load
    every: float
    rows: list[dict[str, float]] = field(default_factory=list)
    queue_now: int = 0
    queue_max: int = 0
    inbox_now: int | None = 0
    inbox_max: int = 0
    outbox_now: int | None = None
    cpu: float = 0.0  # the daemon's CPU seconds at the last row
    api_port: int = 0

    async def sample(self, http: aiohttp.ClientSession) -> None:
        try:
            async with http.get(f"{self.base}/health") as resp:
                self.queue_now = int((await resp.json()).get("writer_queue_depth") or 0)
                self.queue_max = max(self.queue_max, self.queue_now)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        try:
            self.inbox_now, self.outbox_now = await asyncio.to_thread(
                store_backlog, self.home / "state.db"
            )
            self.inbox_max = max(self.inbox_max, self.inbox_now or 0)
        except sqlite3.Error:
            pass

    async def watch(self, started: float, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            hist = turn_histogram(await self._metrics(http))
            mark, sent, answered = started, 0, 0
            self.cpu = cpu_seconds(self.proc.pid)
            print("| " + " | ".join(COLUMNS) + " |")
            print("|" + "---|" * len(COLUMNS), flush=True)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                if self.proc.poll() is not None:
                    return
                await self.sample(http)
                now = time.monotonic()
                if now - mark < self.every and not stop.is_set():
                    continue
                new_hist = turn_histogram(await self._metrics(http))
                sent, answered = self.row(now, started, mark, sent, answered, hist, new_hist)
                hist, mark = new_hist, now

    async def _metrics(self, http: aiohttp.ClientSession) -> str:
        try:
            async with http.get(f"{self.base}/metrics") as resp:
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return ""

    def row(
        self,
        now: float,
        started: float,
        mark: float,
        sent0: int,
        answered0: int,
        hist: dict[str, float],
        new_hist: dict[str, float],
    ) -> tuple[int, int]:
        load, span = self.load, max(now - mark, 1e-9)
        sent = sum(load.sent.values())
        answered = load.fake.answered + load.api_answered
        rss, fds = proc_figures(self.proc.pid)
        split = "/".join(map(str, fd_split(self.proc.pid, self.api_port, self.load.fake.port)))
        cpu = cpu_seconds(self.proc.pid)
        wal, db = mb(self.home / "state.db-wal"), mb(self.home / "state.db")
        p99 = p99_between(hist, new_hist) if hist else "-"
        api_p99 = f"{pct(load.api_seconds, 0.99) * 1000:.0f}" if load.api_seconds else "-"
        tg_out, api_out = load.outstanding()
        offered = 0.0 if load.done_sending.is_set() else load.rate
        cells = [
            f"{(now - started) / 60:.1f}",
            f"{offered:g}",
            f"{(sent - sent0) / span:.0f}",
            f"{(answered - answered0) / span:.0f}",
            f"{rss:.0f}",
            f"{fds} ({split})",
            f"{wal:.1f}",
            f"{db:.0f}",
            f"{self.queue_now}/{self.queue_max}",
            p99,
            api_p99,
            f"{self.inbox_now}/{self.inbox_max}",
            "-" if self.outbox_now is None else str(self.outbox_now),
            f"{tg_out}/{api_out}",
            str(sum(load.refused.values())),
            f"{load.lag_max * 1000:.0f}",
            f"{(cpu - self.cpu) / span * 100:.0f}",
            load_average(),
        ]
        self.cpu = cpu
        print("| " + " | ".join(cells) + " |", flush=True)
        self.rows.append(
            {"rss": rss, "fds": fds, "wal": wal, "db": db, "minute": (now - started) / 60}
        )
        self.queue_max, self.inbox_max, load.lag_max = self.queue_now, self.inbox_now or 0, 0.0
        load.api_seconds.clear()
        return sent, answered


def summary(
    mon: Monitor,
    load: Load,
    seconds: float,
    drained: float | None,
    rc: int | None,
    cpu_used: float,
) -> None:
    sent, answered = sum(load.sent.values()), load.fake.answered + load.api_answered
    refused = ", ".join(f"{k}: {n}" for k, n in sorted(load.refused.items())) or "none"
    cut = ", ".join(f"{k}: {n}" for k, n in sorted(load.fake.cut.items())) or "none"
    print(
        f"\nsummary: {sent} messages sent in {seconds / 60:g} min ({sent / seconds:.0f}/s, "
        f"{load.rate:g}/s offered), {answered} answered; refused: {refused}"
    )
    print(
        f"other Telegram replies: {load.fake.other_replies}; Bot API requests the daemon "
        f"abandoned mid-body: {cut}"
    )
    own = os.times()
    print(
        f"daemon CPU: {cpu_used:.1f} s, {cpu_used / max(answered, 1) * 1000:.2f} ms per answered "
        f"message (steadier than the rates on a shared machine); this script (load and the "
        f"Bot API fake): {own.user + own.system:.1f} s"
    )
    tg_out, api_out = load.outstanding()
    print(
        "drain: "
        + (
            f"every reply in {drained:.1f} s after the last message"
            if drained is not None
            else f"{tg_out} Telegram and {api_out} API replies still outstanding"
        )
    )
    if len(mon.rows) >= 2:
        warm, last = mon.rows[0], mon.rows[-1]
        for key, unit, prec in (
            ("rss", " MB", 1),
            ("fds", "", 0),
            ("wal", " MB", 1),
            ("db", " MB", 1),
        ):
            peak = max(r[key] for r in mon.rows)
            print(
                f"{key}: {warm[key]:.{prec}f}{unit} at row 1 ({warm['minute']:.1f} min, warm-up) -> "
                f"{last[key]:.{prec}f}{unit} at the end ({last[key] - warm[key]:+.{prec}f}; max {peak:.{prec}f})"
            )
    print(f"daemon exit code after SIGTERM: {rc}", flush=True)


def start_daemon(home: Path, fake: FakeTelegram) -> subprocess.Popen[bytes]:
    """`switchboard run` on `home`, its output in daemon.log beside it (a pipe nobody reads
    would fill up and stall it)."""
    env = clean_env(**telegram_env(fake))
    with open(home.parent / "daemon.log", "wb") as log:
        return subprocess.Popen(switchboard(home, "run"), stdout=log, stderr=log, env=env)


async def soak(minutes: float, rate: float, chats: int, every: float, drain: float) -> int:
    fake = CountingTelegram()
    await fake.start()
    with tempfile.TemporaryDirectory(prefix="switchboard-soak-") as tmp:
        home, port = Path(tmp) / "home", free_port()
        home.mkdir()
        tg = telegram_config(fake.base_url, f"https://bot.example{WEBHOOK_PATH}")
        (home / "config.yaml").write_text(
            yaml.safe_dump({"platforms": {"api": {"port": port}, "telegram": tg}})
        )
        proc = start_daemon(home, fake)
        base, rc = f"http://127.0.0.1:{port}", None
        try:
            await wait_healthy(base, proc, timeout=60)
            seconds = minutes * 60
            load = Load(rate, chats, fake, base, seconds=seconds)
            mon = Monitor(proc, home, base, load, every, api_port=port)
            print(
                f"soak: pid {proc.pid}, {rate:g} messages/s for {minutes:g} min, half Telegram "
                f"webhook, half HTTP API, {chats} chats each, a row every {every:g} s",
                flush=True,
            )
            stop = asyncio.Event()
            started, cpu_start = time.monotonic(), cpu_seconds(proc.pid)
            watcher = asyncio.create_task(mon.watch(started, stop), name="soak.monitor")
            generator = asyncio.create_task(load.run(), name="soak.load")
            await asyncio.wait(
                {generator, asyncio.create_task(load.done_sending.wait())},
                return_when=asyncio.FIRST_COMPLETED,
            )
            done_sending, drained = time.monotonic(), None
            while time.monotonic() - done_sending < drain:
                if proc.poll() is not None:
                    break
                if max(load.outstanding()) <= 0:
                    drained = time.monotonic() - done_sending
                    break
                await asyncio.sleep(0.2)
            stop.set()
            await watcher
            for task in (*load.tasks, generator):  # requests still waiting count as outstanding
                task.cancel()
            await asyncio.gather(generator, *load.tasks, return_exceptions=True)
            if proc.poll() is not None:
                print(f"the daemon exited during the run (code {proc.returncode})", file=sys.stderr)
                print((home.parent / "daemon.log").read_text()[-4000:], file=sys.stderr)
                return 1
            cpu_used = cpu_seconds(proc.pid) - cpu_start
            proc.send_signal(signal.SIGTERM)
            rc = await asyncio.to_thread(proc.wait, 60)
            summary(mon, load, seconds, drained, rc, cpu_used)
            return 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            await fake.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to send (30)")
    parser.add_argument("--rate", type=float, default=500.0, help="messages/s offered in all (500)")
    parser.add_argument("--quick", action="store_true", help="2 minutes at 200 messages/s")
    parser.add_argument("--chats", type=int, default=100, help="chats per platform (100)")
    parser.add_argument(
        "--every", type=float, help="seconds between rows (60; a quarter of a shorter run)"
    )
    parser.add_argument(
        "--drain",
        type=float,
        default=120.0,
        help="seconds to wait for outstanding replies at the end (120)",
    )
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.rate = 2.0, 200.0
    if args.minutes <= 0 or args.rate <= 0 or args.chats <= 0:
        parser.error("--minutes, --rate and --chats must be positive")
    every = args.every or (60.0 if args.minutes >= 2 else args.minutes * 15)
    return asyncio.run(soak(args.minutes, args.rate, args.chats, every, args.drain))


if __name__ == "__main__":
    sys.exit(main())
