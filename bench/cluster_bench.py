"""Cluster benchmark: `switchboard run` replicas on one PostgreSQL database
against the SQLite gateway, on the same echo workload through the HTTP API. Prints
figures; asserts nothing.

  python bench/cluster_bench.py            # 10 s windows, 1M messages for search
  python bench/cluster_bench.py --quick    # 4 s windows, 100k messages for search
  python bench/cluster_bench.py --dsn "host=... user=..."   # default: $SWITCHBOARD_PG_DSN,
                                           # else 127.0.0.1:5432 user postgres db postgres
  python bench/cluster_bench.py --only 5   # section 5 only (search on the kept corpus)
  python bench/cluster_bench.py --only 2   # the contended run of section 2 only
  python bench/cluster_bench.py --only 3   # section 3 on 2 and 3 replicas at 800 msg/s only
  python bench/cluster_bench.py --only 3 --rounds 5   # ... five windows each, alternated,
                                           # and the median p99 of each replica count
  python bench/cluster_bench.py --only 3 --neighbour 60/140x2   # ... beside two processes
                                           # that each burn a core 60 ms in every 200
  python bench/cluster_bench.py --only 6   # the long sessions of section 6 only
  python bench/cluster_bench.py --only 7 --rounds 3   # section 7: the commit linger A/B
  python bench/cluster_bench.py --only 8   # section 8: turn latency by rate beside the commits
  python bench/cluster_bench.py --source DIR --only 1   # section 1 with the daemons run
                                           # from another checkout (e.g. `git archive` of
                                           # the commit before), to compare the two
  python bench/cluster_bench.py --hop      # each chat's next message to the next replica

1. Throughput, 1 replica on PostgreSQL vs the SQLite gateway (the ratio), closed loop:
   64 clients over 512 chats. Also CPU per message: the daemons' own, and the PostgreSQL
   backends serving them (read from /proc), which is steadier than the rate on a shared box.
   Each window follows a warm-up of two messages per chat (every session created and titled)
   and, on PostgreSQL, an ANALYZE of the fresh database, so it measures steady turns.
   Where the server loads pg_stat_statements, the statements it ran per message too (a
   count the machine's load does not move).
2. 2 and 3 replicas, aggregate vs one (clients spread over the replicas, as a load
   balancer would; every replica shares the same cores here, so this measures overhead
   and the absence of collapse, not a speed-up). Each request goes to the next replica, so
   about (n-1)/n of a chat's messages land on another replica than its last one; with
   `--hop` every one does (chat c's message i to replica (c + i) % n): the lease moves
   with every message, the worst case for leases. Then the same chat's messages at once:
   64 clients over 16 chats (four in each), 1 and 3 replicas, so they meet on different
   replicas and wait for each other's lease (`--only 2`: that run alone).
3. Turn p50/p99 at 800 messages/s offered (open loop), on the SQLite gateway (the
   reference: the embedded store in one process, on the same cores), on 1 replica and on 3;
   and at half the rate 1 replica sustained in 1 (where 800/s is beyond this machine). With each, the
   CPU per message of the load generator (this process), the daemons and the server, and
   the cores they kept busy over the run: near all of them, latency is queueing. And where
   the slowest 1% were sent: a p99 made of one or two bursts (a stall of everything in
   flight for a moment) reads differently from one spread over the run.
4. Takeover: a replica is SIGKILLed under load; the time until every inbox row open at
   that moment (its pending keys) is answered by another replica.
5. Search p50/p95 on 1M messages on PostgreSQL (bench/pg_bench.py's queries and timing;
   the corpus is built once into a schema that is kept, `sb_bench_corpus_<n>`).
6. Long sessions: 1 replica, 64 clients over 64 chats whose sessions already hold 200
   messages (the default `history_messages`), so every turn's history is a full window:
   the rate and CPU per message (`--only 6`: this section alone).
7. The commit linger of replicas (`--only 7`, `--rounds N`): 1 replica, 3 replicas with
   `cluster.commit_linger_ms: 0` and 3 with the default, alternated; rate, CPU per
   message and the turn p50/p99 at 800 msg/s of each.
8. Where a turn's time goes (`--only 8`): 1 replica, open loop at 5 to 400 msg/s; the turn
   p50/p99 beside the writer's commits in the same window (rate, turns per commit, commit
   p50/p99, operations per commit, from the replica's /metrics), and the cores the daemon
   and its server kept busy: a commit costs about the same whatever it holds, so the CPU
   follows the commits more than the messages.

Each run gets a database of its own, dropped at the end; the load generator shares the
machine's cores with the daemons and the server, as the figures say. It sends through
bench/loops.py's LeanHttp (keep-alive HTTP/1.1, one write per request): aiohttp's client
took 0.40-0.45 ms of CPU per message from those cores, LeanHttp 0.21 (section 3's lines),
and 0.17-0.18 against 0.20-0.22 on the daemons' event loop, where the bench runs (uvloop
where installed, gateway/event_loops.py; two alternated pairs at 800 msg/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import (
    TextGen,  # noqa: E402
    pct,  # noqa: E402
)
from bench.loops import HttpError, LeanHttp, Neighbour, backend_pids, cpu_s, open_loop  # noqa: E402
from bench.pg_bench import search_times  # noqa: E402
from gateway import event_loops  # noqa: E402
from state import open_store  # noqa: E402
from tests.cluster.checks import open_work  # noqa: E402
from tests.cluster.harness import Cluster, Platforms, Replica  # noqa: E402
from tests.daemon import clean_env, free_port  # noqa: E402

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
CLIENTS, CHATS = 64, 512


# --- CPU from /proc -------------------------------------------------------------------------


def statements_run(dsn: str) -> int | None:
    """Statements the server has run in this DSN's database (pg_stat_statements), or None
    when the server does not load that module (shared_preload_libraries)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if not conn.execute(
            "SELECT 1 FROM pg_settings WHERE name = 'shared_preload_libraries' "
            "AND setting LIKE '%%pg_stat_statements%%'"
        ).fetchone():
            return None
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        row = conn.execute(
            "SELECT COALESCE(sum(calls), 0) FROM pg_stat_statements WHERE dbid = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return int(row[0]) if row else 0


@dataclass
class CpuMeter:
    """CPU seconds of the daemons and of their database backends over a window (and the
    statements the database ran, where the server keeps pg_stat_statements)."""

    daemons: list[int]
    dsn: str | None

    def sample(self) -> dict[int, float]:
        pids = list(self.daemons) + (backend_pids(self.dsn) if self.dsn else [])
        found = {p: cpu_s(p) for p in pids}
        run = statements_run(self.dsn) if self.dsn else None
        if run is not None:
            found[-1] = run  # the statement count rides under a pid no process has
        return found

    def spent(self, before: dict[int, float]) -> tuple[float, float, float | None]:
        """daemons' and server's CPU seconds, and statements run (None: not kept)."""
        now = self.sample()
        daemons = sum(now.get(p, 0) - before.get(p, 0) for p in self.daemons)
        server = sum(
            v - before.get(p, 0) for p, v in now.items() if p not in self.daemons and p != -1
        )
        run = now[-1] - before[-1] if -1 in now and -1 in before else None
        return daemons, server, run


# --- the load ---------------------------------------------------------------------------------


class Load:
    """The echo workload through `POST /v1/messages`, spread over `urls()` per request
    (`hop`: per chat, each message to the replica after the one its last went to)."""

    def __init__(
        self, urls: Callable[[], list[str]], hop: bool = False, chats: int = CHATS
    ) -> None:
        self.urls = urls
        self.hop = hop
        self.n_chats = chats  # fewer than the clients: several clients share each chat
        self.sent: Counter[int] = Counter()  # per chat, for `hop`
        self.turn = itertools.count()
        self.seq = itertools.count()
        self.done = 0
        self.failed = 0
        # each client's place in its chats, kept across windows, so a warm-up reaches them all
        self.chats: dict[tuple[int, int], itertools.cycle[int]] = {}
        self.timeline: list[tuple[float, float]] = []  # the last open loop's (sent s, ms)

    async def one(self, http: LeanHttp, chat: int) -> float | None:
        """One message; its round trip in ms (None: not answered with its echo)."""
        urls = self.urls()
        if self.hop:
            url = urls[(chat + self.sent[chat]) % len(urls)]
            self.sent[chat] += 1
        else:
            url = urls[next(self.turn) % len(urls)]
        text = f"m{next(self.seq)} in chat {chat}"
        t = time.perf_counter()
        try:
            status, body = await http.post_json(
                f"{url}/v1/messages", {"chat_id": f"c{chat}", "text": text}
            )
            ok = status == 200 and json.loads(body)["reply"] == f"echo: {text}"
        except (HttpError, TimeoutError):
            ok = False
        if not ok:
            self.failed += 1
            return None
        self.done += 1
        return (time.perf_counter() - t) * 1000

    async def closed(self, seconds: float, clients: int = CLIENTS) -> int:
        """Each client sends its next message when the last one is answered (clients own
        disjoint chats, or share them when there are fewer chats than clients); returns the
        messages answered within the window."""
        stop = time.monotonic() + seconds
        start = self.done

        async def client(c: int, http: LeanHttp) -> None:
            mine = range(c, self.n_chats, clients) if c < self.n_chats else [c % self.n_chats]
            chats = self.chats.setdefault((clients, c), itertools.cycle(mine))
            while time.monotonic() < stop:
                await self.one(http, next(chats))

        http = LeanHttp()
        try:
            await asyncio.gather(*(client(c, http) for c in range(clients)))
        finally:
            http.close()
        return self.done - start

    async def open(self, rate: float, seconds: float) -> list[float]:
        """Message i at i/rate seconds whatever happened to the earlier ones; the round
        trips in ms."""
        out: list[float] = []
        self.timeline = []  # (second sent, ms) per answer
        http = LeanHttp()

        async def send(i: int) -> None:
            ms = await self.one(http, i % CHATS)
            if ms is not None:
                out.append(ms)
                self.timeline.append((i / rate, ms))

        try:
            await open_loop(rate, int(rate * seconds), send)
        finally:
            http.close()
        return out


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=30), connector=aiohttp.TCPConnector(limit=0)
    )


async def throughput(
    urls: Callable[[], list[str]],
    meter: CpuMeter,
    seconds: float,
    analyze: Callable[[], None] | None = None,
    hop: bool = False,
    chats: int = CHATS,
) -> dict[str, float]:
    load = Load(urls, hop, chats)
    # warm-up: connections open, and every chat's session created and titled (two
    # messages each), so the window measures steady turns whatever the rate (a slower
    # setup would otherwise meet more first contacts in it)
    while load.done < 2 * chats:
        await load.closed(1.0)
    if analyze is not None:
        analyze()  # statistics, as autovacuum would have gathered on a database in service
    before = meter.sample()
    t = time.perf_counter()
    n = await load.closed(seconds)
    elapsed = time.perf_counter() - t
    daemons, server, run = meter.spent(before)
    found = {
        "rate": n / elapsed,
        "daemon_ms": daemons * 1000 / max(1, n),
        "server_ms": server * 1000 / max(1, n),
        "failed": load.failed,
    }
    if run is not None:
        found["statements"] = run / max(1, n)
    return found


def show(label: str, f: dict[str, float]) -> None:
    server = f"  + server {f['server_ms']:.2f}" if f["server_ms"] else ""
    run = f"   statements/msg {f['statements']:.2f}" if "statements" in f else ""
    print(
        f"  {label:<22} {f['rate']:7,.0f} msg/s   CPU/msg: daemons {f['daemon_ms']:.2f} ms"
        f"{server}{run}   (failed {int(f['failed'])})"
    )


# --- the runs ---------------------------------------------------------------------------------


# Runs `gateway` from another checkout: this virtualenv's editable install of this one
# is a meta-path finder that PYTHONPATH cannot outrank, so it is taken out first.
_BOOT = (
    "import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path "
    "if 'editable' not in repr(f)]; sys.path.insert(0, {root!r}); "
    "runpy.run_module('gateway', run_name='__main__', alter_sys=True)"
)


@dataclass
class Source:
    """Which code the daemons run: this checkout, or another one (`--source`)."""

    python: list[str] | None  # None: this checkout's `python -m gateway`
    cluster_keys: set[str] | None  # the `cluster` config keys it knows (None: this one's)

    @classmethod
    def of(cls, path: str | None) -> Source:
        if path is None:
            return cls(None, None)
        root = Path(path).resolve()
        example = (root / "config.example.yaml").read_text()
        cluster = yaml.safe_load(example).get("cluster") or {}
        return cls([sys.executable, "-c", _BOOT.format(root=str(root))], set(cluster))


async def sqlite_gateway(
    root: Path, seconds: float, source: Source, rate: float | None = None
) -> tuple[dict[str, float], str]:
    """The SQLite gateway's closed-loop figures, and with `rate` its open loop there too
    (section 3's reference: the embedded store on the same machine and load)."""
    home = root / "sqlite"
    home.mkdir()
    port = free_port()
    (home / "config.yaml").write_text(
        yaml.safe_dump({"platforms": {"api": {"port": port}}, "logging": {"level": "warning"}})
    )
    daemon = Replica("sqlite", home, port, clean_env(), python=source.python)
    await daemon.start()
    try:
        assert daemon.proc is not None
        meter = CpuMeter([daemon.proc.pid], None)
        found = await throughput(lambda: [daemon.url], meter, seconds)
        text = (
            ""
            if rate is None
            else (
                await open_run(lambda: [daemon.url], meter, rate, seconds, False, "SQLite gateway")
            )[0]
        )
        return found, text
    finally:
        await daemon.stop()


async def on_cluster(root: Path, server: str, n: int, name: str, source: Source) -> Cluster:
    cluster = Cluster(
        root / name,
        server,
        n,
        Platforms(),
        {"logging": {"level": "warning"}},
        cluster_keys=source.cluster_keys,
    )
    for r in cluster.replicas:
        r.python = source.python
    await cluster.start()
    return cluster


def analyzer(cluster: Cluster) -> Callable[[], None]:
    """ANALYZE the cluster's fresh database: without statistics the planner reads whole
    small tables where a database in service uses its indexes."""

    def run() -> None:
        with cluster.connect() as conn:
            conn.execute("ANALYZE")

    return run


async def warmed(cluster: Cluster, hop: bool = False) -> None:
    """Until every chat has had two messages (each chat's session made), then ANALYZE."""
    warm = Load(lambda: [r.url for r in cluster.replicas], hop)
    while warm.done < 2 * CHATS:
        await warm.closed(1.0)
    analyzer(cluster)()


LONG_CHATS, LONG_HISTORY = 64, 200  # section 6


async def long_sessions(root: Path, dsn: str, source: Source, seconds: float) -> None:
    """Section 6: turns whose history is a full window of LONG_HISTORY messages."""
    from psycopg import AsyncConnection

    from state.pg.appends import append_many

    print(
        f"\n6. long sessions: 1 replica, {CLIENTS} clients over {LONG_CHATS} chats whose "
        f"sessions hold {LONG_HISTORY} messages"
    )
    cluster = await on_cluster(root, dsn, 1, "long", source)
    try:
        urls = lambda: [r.url for r in cluster.replicas]  # noqa: E731
        warm = Load(urls, chats=LONG_CHATS)
        while warm.done < 2 * LONG_CHATS:  # every chat's session made
            await warm.closed(1.0)
        gen = TextGen(5)
        async with await AsyncConnection.connect(cluster.dsn, autocommit=True) as conn:
            found = await (
                await conn.execute(
                    "SELECT id FROM sessions WHERE source = 'api' AND ended_at IS NULL"
                )
            ).fetchall()
            roles = [("user", "assistant")[m % 2] for m in range(LONG_HISTORY)]
            async with conn.transaction():  # as if each conversation had gone on that long
                await append_many(
                    conn,
                    [
                        (
                            r[0],
                            [{"role": role, "content": gen.english(role)} for role in roles],
                            None,
                            None,
                        )
                        for r in found
                    ],
                )
        f = await throughput(urls, meter_of(cluster), seconds, analyzer(cluster), chats=LONG_CHATS)
        show("1 replica, PostgreSQL", f)
    finally:
        await cluster.close()


async def linger_rounds(root: Path, dsn: str, source: Source, seconds: float, rounds: int) -> None:
    """Section 7: 1 replica, 3 replicas whose commits do not wait (`commit_linger_ms: 0`)
    and 3 replicas with the default wait, alternated `rounds` times (this machine's rate
    drifts between runs more than the difference): each a closed-loop window, then 800
    msg/s offered."""
    print(
        f"\n7. the commit linger of replicas, {rounds} alternated rounds ({seconds:g} s "
        "closed loop, then 800 msg/s offered)"
    )
    variants = ((1, None), (3, 0), (3, None))  # (replicas, commit_linger_ms; None: default)
    for r in range(rounds):
        one = 0.0
        for i, (n, linger) in enumerate(variants):
            extra: dict[str, object] = {"logging": {"level": "warning"}}
            if linger is not None:
                extra["cluster"] = {"commit_linger_ms": linger}
            cluster = Cluster(
                root / f"l{r}-{i}", dsn, n, Platforms(), extra, cluster_keys=source.cluster_keys
            )
            for replica in cluster.replicas:
                replica.python = source.python
            await cluster.start()
            try:
                urls = lambda c=cluster: [x.url for x in c.replicas]  # type: ignore[misc]  # noqa: E731
                f = await throughput(urls, meter_of(cluster), seconds, analyzer(cluster))
                await drained(cluster)
                lat = await Load(urls).open(800.0, seconds)
            finally:
                await cluster.close()
            one = f["rate"] if n == 1 else one
            label = f"{n} replica(s), " + ("default wait" if linger is None else f"{linger} ms")
            show(label, f)
            print(
                f"  {'':<22} {f['rate'] / one:.2f}x of 1; at 800 msg/s p50 "
                f"{pct(lat, 0.5):.0f} ms, p99 {pct(lat, 0.99):.0f} ms"
                if lat
                else "  -"
            )


async def writer_metrics(url: str) -> dict[str, float]:
    """The writer's figures in a replica's /metrics (switchboard_writer_*, unprefixed)."""
    async with _session() as http, http.get(f"{url}/metrics") as r:
        text = await r.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("switchboard_writer_"):
            found[name.removeprefix("switchboard_writer_")] = float(value)
    return found


ANATOMY_RATES = (5.0, 50.0, 100.0, 200.0, 400.0)  # section 8


async def turn_anatomy(root: Path, dsn: str, source: Source, seconds: float) -> None:
    """Section 8: one replica's turn latency by offered rate beside its writer's commits
    (from /metrics): a turn waits for two commits at least (its message's accept, which
    begins the turn, and its end), plus the commit in flight when it arrives, so the
    commit's own duration sets the turn's latency floor."""
    print(
        f"\n8. where a turn's time goes: 1 replica, open loop, {seconds:g} s per rate; the "
        "writer's commits in the same window (/metrics)"
    )
    cluster = await on_cluster(root, dsn, 1, "anatomy", source)
    try:
        urls = lambda: [r.url for r in cluster.replicas]  # noqa: E731
        await warmed(cluster)
        url = cluster.replicas[0].url
        for rate in ANATOMY_RATES:
            await drained(cluster)
            before = await writer_metrics(url)
            meter = meter_of(cluster)
            cpu, wall = meter.sample(), time.perf_counter()
            lat = await Load(urls).open(rate, seconds)
            daemon_s, server_s, _ = meter.spent(cpu)
            wall = time.perf_counter() - wall
            after = await writer_metrics(url)
            commits = after["batches_total"] - before["batches_total"]
            print(
                f"  {rate:5.0f} msg/s: turn p50 {pct(lat, 0.5):6.1f} ms  p99 {pct(lat, 0.99):6.1f} "
                f"ms   commits {commits / seconds:5.0f}/s, {len(lat) / max(1.0, commits):.2f} "
                f"turns each, commit p50 {after['commit_ms_p50']:5.1f} ms  p99 "
                f"{after['commit_ms_p99']:5.1f} ms (last 512), operations p50 "
                f"{after['batch_size_p50']:.0f}; cores busy: daemon {daemon_s / wall:.2f}, "
                f"server {server_s / wall:.2f}"
            )
    finally:
        await cluster.close()


SHARED_CHATS = 16  # the contended run: 64 clients over 16 chats, four at once in each


async def contended(root: Path, dsn: str, source: Source, seconds: float, hop: bool) -> None:
    """1 and 3 replicas with several clients in each chat at once, so a chat's messages
    meet on different replicas and wait for each other's lease."""
    print(f"  the same chat's messages at once ({CLIENTS} clients over {SHARED_CHATS} chats):")
    rates: dict[int, dict[str, float]] = {}
    for n in (1, 3):
        cluster = await on_cluster(root, dsn, n, f"shared{n}", source)
        try:
            rates[n] = await throughput(
                lambda c=cluster: [r.url for r in c.replicas],  # type: ignore[misc]
                meter_of(cluster),
                seconds,
                analyzer(cluster),
                hop,
                SHARED_CHATS,
            )
            show(f"{n} replica(s), PostgreSQL", rates[n])
        finally:
            await cluster.close()
    print(f"  3 replicas: {rates[3]['rate'] / rates[1]['rate']:.2f}x the rate of 1")


def meter_of(cluster: Cluster) -> CpuMeter:
    return CpuMeter([r.proc.pid for r in cluster.replicas if r.proc is not None], cluster.dsn)


async def latency_run(
    cluster: Cluster,
    rate: float,
    seconds: float,
    hop: bool,
    show: bool = True,
    neighbour: Neighbour | None = None,
) -> tuple[str, float]:
    """Section 3's open loop at `rate` on a warm cluster (open_run): its lines, printed
    unless `show` is false, and its p99."""
    await drained(cluster)  # nothing queued from the run before
    text, p99 = await open_run(
        lambda: [r.url for r in cluster.replicas],
        meter_of(cluster),
        rate,
        seconds,
        hop,
        f"{len(cluster.replicas)} replica(s)",
        neighbour,
    )
    if show:
        print(text)
    return text, p99


async def open_run(
    urls: Callable[[], list[str]],
    meter: CpuMeter,
    rate: float,
    seconds: float,
    hop: bool,
    label: str,
    neighbour: Neighbour | None = None,
) -> tuple[str, float]:
    """An open loop at `rate`: the turn p50/p99 and the CPU per message of the load
    generator (this process), the daemons and the server, and the cores they kept busy from
    the first request to the last answer (and those a `neighbour` took, apart); those
    lines, and the p99 (inf when nothing was answered)."""
    speed = probe_ms()
    before, own, wall = meter.sample(), time.process_time(), time.perf_counter()
    stolen, theirs = steal_s(), neighbour.cpu_s() if neighbour else 0.0
    load = Load(urls, hop)
    lat = await load.open(rate, seconds)
    cpu = (time.process_time() - own, *meter.spent(before)[:2])
    took = time.perf_counter() - wall
    stolen = steal_s() - stolen
    if neighbour:
        theirs = neighbour.cpu_s() - theirs
    beside = f" (and {theirs / took:.2f} by the neighbour)" if neighbour else ""
    figures = f"p50 {pct(lat, 0.5):.1f} ms   p99 {pct(lat, 0.99):.1f} ms" if lat else "-"
    gen, daemons, server = (x * 1000 / max(1, len(lat)) for x in cpu)
    server_part = f" + server {server:.2f}" if meter.dsn else ""
    p99 = pct(lat, 0.99) if lat else float("inf")
    return (
        f"  {label} at {rate:,.0f} msg/s: {figures}   answered {len(lat):,}/"
        f"{int(rate * seconds):,} within 30 s\n  {'':<4}CPU/msg: load generator {gen:.2f} + "
        f"daemons {daemons:.2f}{server_part} ms; {sum(cpu) / took:.2f} of {os.cpu_count()} "
        f"cores busy over the run{beside}, {stolen / took:.2f} stolen by the host; probe "
        f"{speed:.0f} ms\n  {'':<4}{bursts(load.timeline)}"
    ), p99


def bursts(timeline: list[tuple[float, float]], span_s: float = 0.25) -> str:
    """Where the slowest 1% of a run's turns were sent: in how many of its quarter-seconds,
    and how many in the busiest. A p99 made of one or two bursts (a stall of everything
    in flight) differs from one spread over the run (a queue that stays long)."""
    if len(timeline) < 100:
        return "slowest 1%: too few answers"
    p99 = pct([ms for _, ms in timeline], 0.99)
    slow = Counter(int(t / span_s) for t, ms in timeline if ms >= p99)
    spans = int(max(t for t, _ in timeline) / span_s) + 1
    worst, most = slow.most_common(1)[0]
    return (
        f"slowest 1% ({sum(slow.values())} turns) sent in {len(slow)} of {spans} "
        f"quarter-seconds, {most} of them in the busiest (from {worst * span_s:.2f} s)"
    )


def probe_ms() -> float:
    """A fixed piece of pure-Python work, timed just before a run (the best of three): how
    fast one core of this machine is at that moment. The same code's figures move with it
    between runs minutes apart on these shared machines."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        total = 0
        for i in range(300_000):
            total += i * i % 7
        best = min(best, time.perf_counter() - t)
    return best * 1000


def steal_s() -> float:
    """CPU seconds the hypervisor has given other guests instead of this machine since boot
    (/proc/stat's `steal`, all CPUs): the same code's latency figures differ by several times
    between runs minutes apart on these shared machines, and this is one cause to see."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


async def drained(cluster: Cluster, limit_s: float = 300.0) -> None:
    """Until no inbox row is open: requests a client gave up on are still run, and would
    sit in front of the next measurement."""
    with cluster.connect() as conn:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if open_work(conn)["open_turns"] == 0:
                return
            await asyncio.sleep(0.2)


async def takeover_times(cluster: Cluster, kills: int) -> list[float]:
    """SIGKILL replica 0 under load, `kills` times; seconds until every inbox row open at
    the kill is answered (by the survivors), each time."""
    out = []
    victim = cluster.replicas[0]
    for _ in range(kills):
        load = Load(lambda: [r.url for r in cluster.live()])
        running = asyncio.create_task(load.closed(6.0, clients=32))
        await asyncio.sleep(2.0)
        await victim.kill()
        killed = time.perf_counter()
        with cluster.connect() as conn:
            open_ids = [
                int(r[0])
                for r in conn.execute("SELECT id FROM inbox WHERE state IN ('received', 'started')")
            ]
            while open_ids:
                still = conn.execute(
                    "SELECT count(*) FROM inbox WHERE id = ANY(%s) AND state IN "
                    "('received', 'started')",
                    (open_ids,),
                ).fetchone()
                if not still or still[0] == 0 or time.perf_counter() - killed > 60:
                    break
                await asyncio.sleep(0.01)
        out.append(time.perf_counter() - killed)
        print(
            f"  kill: {len(open_ids)} open rows at the kill, all answered after {out[-1]:.2f} s",
            flush=True,
        )
        await running
        await victim.start()
    return out


async def bulk_fill(
    dsn: str, messages: int, per_session: int = 10, chunk: int = 1_000, cjk_share: float = 0.05
) -> None:
    """Sessions of `per_session` messages (a CJK share as search_bench's corpus), written
    `chunk` sessions per transaction by the PostgreSQL store's own row functions (its
    session insert and the writer's merged append), so the rows are exactly the store's."""
    from psycopg import AsyncConnection

    from state.pg.appends import append_many
    from state.pg.sessions import insert_session

    gen = TextGen(11)
    t0 = time.time() - 365 * 86400
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:  # a commit per chunk
        row = await (await conn.execute("SELECT count(*) FROM sessions")).fetchone()
        start = int(row[0]) if row else 0
        for first in range(start, start + messages // per_session, chunk):
            calls = []
            async with conn.transaction():
                for s in range(first, first + chunk):
                    sid = f"20250101_000000_{s:08x}"
                    await insert_session(
                        conn,
                        {
                            "id": sid,
                            "source": ("telegram", "slack", "api")[s % 3],
                            "user_id": f"u{s % 997}",
                            "started_at": t0 + s * 30,
                        },
                    )
                    calls.append(
                        (
                            sid,
                            [
                                {
                                    "role": ("user", "assistant")[m % 2],
                                    "content": gen.cjk()
                                    if gen.rng.random() < cjk_share
                                    else gen.english(("user", "assistant")[m % 2]),
                                }
                                for m in range(per_session)
                            ],
                            None,
                            None,
                        )
                    )
                await append_many(conn, calls)
            done = (first + chunk - start) * per_session
            if done % 100_000 == 0:
                print(f"  corpus: {done:,}/{messages:,} messages", file=sys.stderr, flush=True)
        await conn.execute("ANALYZE")


async def search_on(server: str, messages: int) -> dict[str, list[float]]:
    """pg_bench's search timing on a corpus of `messages`, kept in a schema of its own
    between runs (building 1M messages takes minutes)."""
    schema = f"sb_bench_corpus_{messages}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    dsn = psycopg.conninfo.make_conninfo(server, options=f"-c search_path={schema}")
    store = await open_store({"backend": "postgres", "dsn": dsn}, ".")
    try:
        have = await store.message_count()
        if have < messages:
            print(
                f"  building the {messages:,}-message corpus in schema {schema} (once) ...",
                flush=True,
            )
            t = time.perf_counter()
            await bulk_fill(dsn, messages - have)
            print(f"  built in {time.perf_counter() - t:.0f} s", flush=True)
        return await search_times(store)
    finally:
        await store.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dsn", default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN))
    ap.add_argument("--skip-search", action="store_true")
    ap.add_argument("--source", help="run the daemons from this checkout (PYTHONPATH)")
    ap.add_argument(
        "--only",
        type=int,
        choices=(1, 2, 3, 5, 6, 7, 8),
        help="1, 5, 6, 7 or 8: that section only; 2: its contended run only; "
        "3: 2 and 3 replicas at 800 msg/s only",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        help="section 7's alternated rounds (default 3); with --only 3, the windows "
        "per replica count (default 1)",
    )
    ap.add_argument(
        "--hop",
        action="store_true",
        help="each chat's next message to the next replica (sections 1-3)",
    )
    ap.add_argument(
        "--neighbour",
        metavar="BUSY/IDLE[xPROCS]",
        help="with --only 3: processes burning a core in bursts beside the windows "
        "(ms on, ms off; e.g. 60/140x2)",
    )
    args = ap.parse_args()
    try:
        neighbour = Neighbour(args.neighbour) if args.neighbour else None
    except ValueError as exc:
        ap.error(str(exc))
    if neighbour and args.only != 3:
        ap.error("--neighbour goes with --only 3")
    source = Source.of(args.source)
    seconds = 4.0 if args.quick else 10.0
    corpus = 100_000 if args.quick else 1_000_000
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    print(
        f"switchboard cluster bench: {os.cpu_count()} cores shared by the load generator, the "
        f"daemons and PostgreSQL {version[0] if version else '?'}; echo agent over the HTTP API"
    )
    if args.only == 5:
        await search_section(args.dsn, corpus)
        return
    if args.only == 2:
        with tempfile.TemporaryDirectory() as tmp:
            await contended(Path(tmp), args.dsn, source, seconds, args.hop)
        return
    if args.only == 3:
        print("\n3. turn latency, open loop (target p99 <= 60 ms at 800 msg/s offered)")
        if neighbour:
            print(f"  beside a neighbour: {neighbour} (from each window's warm-up to its end)")
        p99s: dict[int, list[float]] = {2: [], 3: []}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds or 1):
                for n in (2, 3):
                    cluster = await on_cluster(Path(tmp), args.dsn, n, f"c{n}-{r}", source)
                    try:
                        with neighbour or contextlib.nullcontext():
                            await warmed(cluster, args.hop)
                            _, p99 = await latency_run(
                                cluster, 800.0, seconds, args.hop, neighbour=neighbour
                            )
                        p99s[n].append(p99)
                    finally:
                        await cluster.close()
        if (args.rounds or 1) > 1:
            for n, found in p99s.items():
                below = sum(1 for p in found if p <= 60.0)
                print(
                    f"  {n} replicas: p99 median {statistics.median(found):.1f} ms over "
                    f"{len(found)} windows, {below} of them within 60 ms"
                )
        return
    if args.only == 6:
        with tempfile.TemporaryDirectory() as tmp:
            await long_sessions(Path(tmp), args.dsn, source, seconds)
        return
    if args.only == 7:
        with tempfile.TemporaryDirectory() as tmp:
            await linger_rounds(Path(tmp), args.dsn, source, min(seconds, 8.0), args.rounds or 3)
        return
    if args.only == 8:
        with tempfile.TemporaryDirectory() as tmp:
            await turn_anatomy(Path(tmp), args.dsn, source, min(seconds, 6.0))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hop = ", each chat's next message to the next replica" if args.hop else ""
        print(f"\n1. throughput, {CLIENTS} clients over {CHATS} chats, {seconds:g} s windows{hop}")
        if args.source:
            print(f"  daemons from {args.source}")
        lite, lite_800 = await sqlite_gateway(root, seconds, source, None if args.only else 800.0)
        show("SQLite gateway", lite)
        rates: dict[int, dict[str, float]] = {}
        lines: dict[tuple[int, float], str] = {}  # (replicas, offered rate): section 3's
        for n in (1,) if args.only else (1, 2, 3):
            cluster = await on_cluster(root, args.dsn, n, f"c{n}", source)
            try:
                rates[n] = await throughput(
                    lambda c=cluster: [r.url for r in c.replicas],  # type: ignore[misc]
                    meter_of(cluster),
                    seconds,
                    analyzer(cluster),
                    args.hop,
                )
                show(f"{n} replica(s), PostgreSQL", rates[n])
                if not args.only:
                    # 800/s, the target rate, on 2 and 3 replicas (1 cannot sustain it on 2
                    # shared cores), and half of what 1 replica sustained on 1 and 3
                    half = round(rates[1]["rate"] / 2)
                    for rate in (800.0,) if n == 2 else (half, 800.0):
                        lines[n, rate], _ = await latency_run(
                            cluster, rate, seconds, args.hop, show=False
                        )
            finally:
                await cluster.close()
        print(
            f"  1 replica / SQLite: {rates[1]['rate'] / lite['rate']:.2f}x the rate, "
            f"{(rates[1]['daemon_ms'] + rates[1]['server_ms']) / lite['daemon_ms']:.2f}x "
            "the CPU per message (daemons + server)"
        )
        if not args.only:
            print("\n2. several replicas, aggregate vs one (target >= 0.9x)")
            for k in (2, 3):
                print(
                    f"  {k} replicas: {rates[k]['rate'] / rates[1]['rate']:.2f}x the rate, "
                    f"{(rates[k]['daemon_ms'] + rates[k]['server_ms']) / (rates[1]['daemon_ms'] + rates[1]['server_ms']):.2f}x "
                    "the CPU per message"
                )
            await contended(root, args.dsn, source, seconds, args.hop)
            print("\n3. turn latency, open loop (target p99 <= 60 ms at 800 msg/s offered)")
            print(lite_800)
            for text in lines.values():
                print(text)
        if args.only:
            return
        print("\n4. takeover: SIGKILL one of 2 replicas under load (target <= 3 s)")
        cluster = await on_cluster(root, args.dsn, 2, "take", source)
        try:
            took = await takeover_times(cluster, 3 if args.quick else 5)
        finally:
            await cluster.close()
        print(
            f"  median {statistics.median(took):.2f} s, max {max(took):.2f} s over {len(took)} kills"
        )
        await long_sessions(root, args.dsn, source, seconds)
        await turn_anatomy(root, args.dsn, source, min(seconds, 6.0))
    if not args.skip_search:
        await search_section(args.dsn, corpus)


async def search_section(dsn: str, corpus: int) -> None:
    print(f"\n5. search on PostgreSQL over {corpus:,} messages (target p95 <= 50 ms)")
    for kind, times in (await search_on(dsn, corpus)).items():
        print(f"  {kind:<10} p50 {pct(times, 0.5):7.2f} ms   p95 {pct(times, 0.95):7.2f} ms")


if __name__ == "__main__":
    event_loops.run(main(), "auto")
