"""Instructions and CPU per answered message of the real daemon, through
`POST /v1/chat/completions`, a Telegram webhook or Slack's Events API. Prints figures;
asserts nothing.

  python bench/instructions.py                 # 1 daemon on SQLite, the openai agent
  python bench/instructions.py --via telegram  # ... the messages as Telegram webhook updates
  python bench/instructions.py --via telegram-polling  # ... Telegram updates long-polled
  python bench/instructions.py --via slack     # ... as Slack Events API requests
  python bench/instructions.py --agent echo    # ... the echo agent instead
  python bench/instructions.py --replicas 2    # 2 replicas on a fresh PostgreSQL database
  python bench/instructions.py --py-spy top    # ... and where the daemon's CPU goes

1. Instructions (callgrind's Ir) per answered message: each daemon runs under
   `valgrind --tool=callgrind`; one run answers the warm-up only, a second the warm-up and
   then N more; (Ir of the second - Ir of the first) / N. The difference cancels start-up
   and shutdown (SIGTERM, the drain). Instructions, not time: the machine's load does not
   move the figure; how concurrent requests meet (commits grouping turns) does a little,
   and so do timers firing over the longer run (--repeat shows the spread); sessions.json
   is written at shutdown only there, not every 2 s of valgrind's slow pace.
2. CPU seconds per answered message, outside valgrind, over a larger N: the daemons' user
   + system time from /proc over the measured messages (after a warm-up in the same run),
   in fresh runs; the median and the range over the rounds. Beside it, with --replicas,
   the CPU of the PostgreSQL backends serving them.

The agent is the `openai` backend against tests/fakes/openai.py's OpenAI-compatible
server, run in this process (or the echo agent). The load is fixed: message i goes to chat
i % chats with a fixed text; two messages per chat warm up (each session created and
titled), six more per chat are measured: every figure covers a chat's 3rd to 8th turn.
`--warm-per-chat K` warms each chat up with K messages instead, so the measured turns send
the model a history of about 2K messages (the store keeps a turn's question and answer).
With replicas, chat c's messages go to replica c % replicas (a balancer with session
affinity; --hop: each to the next). Each daemon runs with PYTHONHASHSEED=0.

--via picks the path the messages arrive by (bench/platforms.py): `api` (the default) is
`POST /v1/chat/completions`, a message answered with its response. `telegram` is the
Telegram adapter in webhook mode: each message a private chat's update POSTed to
/telegram/webhook with the `X-Telegram-Bot-Api-Secret-Token` header, the reply a
sendMessage to tests/fakes/telegram.py's Bot API in this process. `telegram-polling` is
the Telegram adapter in its default mode, long polling (one daemon): each message an
update queued at the fake Bot API, which the daemon's getUpdates takes. `slack` is the
Slack adapter on the Events API: each message a DM's event callback POSTed to
/slack/events, signed (`X-Slack-Signature`, `X-Slack-Request-Timestamp`), the reply a
chat.postMessage to tests/fakes/slack.py's Web API in this process. On those paths a
message is answered when its reply reaches the fake, and 8 in flight are 8 messages sent
whose replies have not arrived.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import yaml
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import platforms  # noqa: E402
from bench.loops import LeanHttp, backend_pids, cpu_s  # noqa: E402
from tests.cluster.harness import DSN_ENV, Replica, drop_database, fresh_database  # noqa: E402
from tests.daemon import clean_env, free_port  # noqa: E402
from tests.fakes.openai import FakeOpenAI  # noqa: E402

FLOOR = Path(__file__).resolve().parent / "floor.py"
DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
ANSWER = "Here is a short answer to your question."
WARM_PER_CHAT, MEASURED_PER_CHAT = 2, 6
BODY = json.dumps(
    {
        "id": "c1",
        "model": "fake-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": ANSWER},
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5},
    }
).encode()


VIA = {
    "api": "the HTTP API (POST /v1/chat/completions)",
    "telegram": "Telegram webhook updates (POST /telegram/webhook, replies to a fake Bot API)",
    "telegram-polling": "Telegram long polling (getUpdates from a fake Bot API, replies to it)",
    "slack": "the Slack Events API (POST /slack/events, replies to a fake Web API)",
}


def text_of(i: int, chats: int) -> str:
    return f"message {i} in chat {i % chats}: what should I cook tonight with rice and beans?"


class Fake(FakeOpenAI):
    """The loopback OpenAI-compatible server: ANSWER to every request, none recorded."""

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=BODY, content_type="application/json")


def config(
    port: int,
    agent: str,
    fake_url: str,
    name: str,
    replicas: int,
    paced: bool,
    platform: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A daemon's config.yaml; `platform`: `platforms.<via>` beside the api server."""
    cfg: dict[str, Any] = {
        "platforms": {"api": {"port": port}},
        "shutdown": {"drain_seconds": 5},
        "agent": {"backend": agent},
    }
    if paced:  # sessions.json written at shutdown only: no write per 2 s of valgrind's pace
        cfg["sessions"] = {"index_flush_seconds": 300, "index_activity_seconds": 3600}
    if agent == "openai":
        cfg["agent"]["openai"] = {
            "base_url": fake_url,
            "model": "fake-model",
            "api_key_env": "OPENAI_API_KEY",
            "max_retries": 0,
        }
    if replicas > 1:
        cfg["state"] = {"backend": "postgres", "dsn_env": DSN_ENV}
        cfg["cluster"] = {"replicas": replicas, "replica_id": name}
    if platform is not None:
        cfg["platforms"].update(platform)
    return cfg


class Run:
    """`replicas` daemons on a fresh home each (and one fresh database when more than one),
    `prefix` before each one's Python (valgrind, or nothing)."""

    def __init__(
        self, args: argparse.Namespace, root: Path, prefix: Callable[[int], list[str]] | None = None
    ) -> None:
        self.args, self.root, self.prefix = args, root, prefix or (lambda k: [])
        self.fake, self.http = Fake(), LeanHttp(timeout_s=600)
        self.replicas: list[Replica] = []
        self.db: tuple[str, str] | None = None
        self.replies = platforms.Replies()  # what reaches the platform fake of --via
        self.telegram = (
            platforms.RepliedTelegram(replies=self.replies)
            if args.via in ("telegram", "telegram-polling")
            else None
        )
        self.slack = platforms.RepliedSlack(replies=self.replies) if args.via == "slack" else None
        self.update_ids = 0

    def platform(self, url: str) -> dict[str, Any] | None:
        """`platforms.<via>` of the daemon serving the api at `url` (None for the api)."""
        if self.telegram is not None:
            hook = None if self.args.via == "telegram-polling" else f"{url}{platforms.WEBHOOK_PATH}"
            tg = platforms.telegram_config(self.telegram.base_url, hook)
            return {"telegram": tg}
        if self.slack is not None:
            return {"slack": platforms.slack_config(self.slack.base_url)}
        return None

    async def __aenter__(self) -> Run:
        fake_url = await self.fake.start()
        env = {"OPENAI_API_KEY": "bench-key", "PYTHONHASHSEED": "0"}
        if self.telegram is not None:
            await self.telegram.start()
            env |= platforms.telegram_env(self.telegram)
        if self.slack is not None:
            await self.slack.start()
            env |= platforms.slack_env()
        if self.args.replicas > 1 or self.args.floor == "postgres":
            self.db = fresh_database(self.args.dsn)
            env[DSN_ENV] = self.db[1]
        for k in range(self.args.replicas):
            name, home, port = f"r{k}", self.root / f"r{k}", free_port()
            home.mkdir(parents=True)
            cfg = config(
                port,
                self.args.agent,
                fake_url,
                name,
                self.args.replicas,
                paced=self.prefix(k) != [],
                platform=self.platform(f"http://127.0.0.1:{port}"),
            )
            if self.args.commit_linger_ms is not None:
                section = "cluster" if self.args.replicas > 1 else "state"
                cfg.setdefault(section, {})["commit_linger_ms"] = self.args.commit_linger_ms
            if self.args.floor:
                cfg["floor"] = self.args.floor
            (home / "config.yaml").write_text(yaml.safe_dump(cfg))
            rep = Replica(name, home, port, clean_env(**env))
            main = [str(FLOOR)] if self.args.floor else ["-m", "gateway"]
            rep.python = [*self.prefix(k), sys.executable, *main]
            self.replicas.append(rep)
        for rep in self.replicas:  # all at once: one does not idle while the next starts
            await rep.start(wait=False)
        await asyncio.gather(*(rep.healthy(timeout=1800) for rep in self.replicas))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.http.close()
        for rep in self.replicas:
            with contextlib.suppress(AssertionError):
                code = await rep.stop(timeout=1800)
                if code != 0 and not rep.kills:  # (--window kills them on purpose)
                    print(f"  ! {rep.name} exited {code}; its log: {rep.logs[-1]}")
        if self.replies.unexpected:
            print(f"  ! {self.replies.unexpected} replies reached the fake for no message sent")
        await self.fake.stop()
        for fake in (self.telegram, self.slack):
            if fake is not None:
                await fake.stop()
        if self.db is not None:
            drop_database(self.args.dsn, self.db[0])

    async def send(self, first: int, count: int, chats: int) -> int:
        """Messages first .. first+count-1 with `concurrency` in flight; answered ones."""
        seq = iter(range(first, first + count))
        answered = 0

        async def worker() -> None:
            nonlocal answered
            for i in seq:
                chat, k = i % chats, i // chats
                r = (chat + k if self.args.hop else chat) % len(self.replicas)
                reply = await self.one(self.replicas[r].url, i, chat, text_of(i, chats))
                if reply in (ANSWER, f"echo: {text_of(i, chats)}"):
                    answered += 1

        await asyncio.gather(*(worker() for _ in range(self.args.concurrency)))
        return answered

    async def one(self, url: str, i: int, chat: int, text: str) -> str | None:
        """Message i to the daemon at `url` by the --via path; its reply (None: none)."""
        if self.telegram is None and self.slack is None:
            body = {
                "model": "fake-model",
                "user": f"chat{chat}",
                "messages": [{"role": "user", "content": text}],
            }
            status, out = await self.http.post_json(f"{url}/v1/chat/completions", body)
            return (
                str(json.loads(out)["choices"][0]["message"]["content"]) if status == 200 else None
            )
        if self.telegram is not None and self.args.via == "telegram-polling":
            key = str(1_000_000 + chat)
            reply = self.replies.expect(key)
            message = self.telegram.message(text, self.telegram.dm_chat(int(key)), user_id=int(key))
            self.telegram.push(message)  # the daemon's getUpdates takes it
            return await asyncio.wait_for(reply, self.http.timeout_s)
        if self.telegram is not None:
            key = str(1_000_000 + chat)  # a private chat's id is its user's
            self.update_ids += 1
            data, headers = platforms.telegram_update(
                self.telegram, self.update_ids, int(key), text
            )
            path = platforms.WEBHOOK_PATH
        else:
            key = f"D{chat:07d}"
            data, headers = platforms.slack_event(i, key, f"U{chat:07d}", text)
            path = platforms.EVENTS_PATH
        reply = self.replies.expect(key)
        status, _ = await self.http.post(f"{url}{path}", data, headers)
        if status != 200:
            self.replies.forget(key, reply)
            return None
        return await asyncio.wait_for(reply, self.http.timeout_s)

    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.replicas if r.proc is not None]

    def server_cpu(self) -> dict[int, float]:
        if self.db is None:
            return {}
        return {p: cpu_s(p) for p in backend_pids(self.db[1])}


def spread(values: list[float], unit: float = 1.0) -> str:
    vals = [v * unit for v in values]
    return (
        f"median {statistics.median(vals):.3f}, range {min(vals):.3f}-{max(vals):.3f} "
        f"({', '.join(f'{v:.3f}' for v in vals)})"
    )


def total_ir(path: Path) -> int:
    """The instructions a callgrind output file counted (its `totals:` or `summary:`)."""
    text = path.read_text()
    found = re.search(r"^(?:totals|summary):\s*(\d+)", text, re.M)
    assert found, f"no totals in {path}"
    return int(found.group(1))


async def callgrind(args: argparse.Namespace, root: Path) -> None:
    chats, n = args.chats, args.chats * MEASURED_PER_CHAT
    warm = chats * args.warm_per_chat
    per_run: dict[int, list[float]] = collections.defaultdict(list)
    for rep_i in range(args.repeat):
        if args.window:
            for k, per_msg in enumerate(await window_run(args, root, rep_i)):
                per_run[k].append(per_msg)
            continue
        irs: dict[int, list[int]] = {}
        for measured in (0, n):
            out = root / f"cg{rep_i}-{measured}"

            def prefix(k: int, out: Path = out) -> list[str]:
                return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}-r{k}.out"]

            async with Run(args, out, prefix) as run:
                got = await run.send(0, warm, chats)
                before = run.server_cpu()
                got += await run.send(warm, measured, chats)
                server = sum(cpu_s(p) - v for p, v in before.items())
            assert got == warm + measured, f"{warm + measured - got} messages not answered"
            irs[measured] = [total_ir(Path(f"{out}-r{k}.out")) for k in range(args.replicas)]
            if args.keep:
                for k in range(args.replicas):
                    Path(f"{out}-r{k}.out").replace(
                        Path(args.keep) / f"cg{rep_i}-{measured}-r{k}.out"
                    )
            if measured:
                extra = (
                    f"; PostgreSQL backends {server / n * 1e3:.2f} ms CPU/msg over the "
                    "measured messages at valgrind's pace"
                    if run.db
                    else ""
                )
                print(
                    f"  run {rep_i + 1}: Ir {' + '.join(f'{v:,}' for v in irs[0])} (warm-up "
                    f"only), {' + '.join(f'{v:,}' for v in irs[n])} (+{n} messages){extra}"
                )
        for k in range(args.replicas):
            per_run[k].append((irs[n][k] - irs[0][k]) / n)
    total = [sum(per_run[k][i] for k in per_run) for i in range(args.repeat)]
    label = "" if args.replicas == 1 else f" of the {args.replicas} replicas together"
    print(
        f"instructions per answered message{label}: {spread(total, 1e-6)} M Ir "
        f"[N={n} after a warm-up of {warm}, {chats} chats, {args.concurrency} in flight, "
        f"{args.repeat} {'run(s), counters zeroed and dumped' if args.window else 'run pair(s)'}]"
    )
    for k in per_run if args.replicas > 1 else ():
        print(f"  replica r{k}: {spread(per_run[k], 1e-6)} M Ir per message of the run")


async def control(pid: int, flag: str) -> None:
    """callgrind_control `flag` (-z: zero the counters, -d: dump them) on a daemon."""
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control", flag, str(pid), stdout=DEVNULL, stderr=DEVNULL
    )
    assert await proc.wait() == 0, f"callgrind_control {flag} {pid} failed"


async def window_run(args: argparse.Namespace, root: Path, rep_i: int) -> list[float]:
    """--window: one run per daemon, its counters zeroed after the warm-up and dumped after
    the N measured messages (callgrind_control), so neither start-up nor the SIGTERM drain
    is in the figure: Ir of the dump / N, per daemon."""
    chats, n = args.chats, args.chats * MEASURED_PER_CHAT
    out = root / f"cg{rep_i}-window"

    def prefix(k: int) -> list[str]:
        return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}-r{k}.out"]

    async with Run(args, out, prefix) as run:
        got = await run.send(0, chats * args.warm_per_chat, chats)
        for pid in run.pids():
            await control(pid, "-z")
        got += await run.send(chats * args.warm_per_chat, n, chats)
        for pid in run.pids():
            await control(pid, "-d")
        dumps = [sorted(root.glob(f"{out.name}-r{k}.out.*")) for k in range(args.replicas)]
        assert all(dumps), f"no dump of callgrind's counters in {root}"
        irs = [total_ir(d[-1]) for d in dumps]
        if args.keep:
            for k, d in enumerate(dumps):
                d[-1].replace(Path(args.keep) / f"cg{rep_i}-window-r{k}.out")
        print(f"  run {rep_i + 1}: Ir {' + '.join(f'{v:,}' for v in irs)} (+{n} messages)")
        for rep in run.replicas:  # the figure is taken: no drain to wait for under valgrind
            await rep.kill()
    assert got == chats * (args.warm_per_chat + MEASURED_PER_CHAT), "messages not answered"
    return [ir / n for ir in irs]


async def cpu(args: argparse.Namespace, root: Path) -> None:
    n = args.cpu_messages
    chats = max(1, n // MEASURED_PER_CHAT)
    warm = chats * args.warm_per_chat
    daemons: list[float] = []
    servers: list[float] = []
    for rnd in range(args.rounds):
        async with Run(args, root / f"cpu{rnd}") as run:
            assert await run.send(0, warm, chats) == warm, "warm-up messages not answered"
            pids = run.pids()
            before = {p: cpu_s(p) for p in pids}
            server_before = run.server_cpu()
            spy = (
                await asyncio.create_subprocess_exec(
                    "py-spy",
                    "record",
                    "-p",
                    str(pids[0]),
                    "-f",
                    "raw",
                    "-o",
                    args.py_spy_raw,
                    "-r",
                    "200",
                    "--nonblocking",
                    stdout=DEVNULL,
                    stderr=DEVNULL,
                )
                if args.py_spy and rnd == 0
                else None
            )
            got = await run.send(warm, n, chats)
            daemons.append(sum(cpu_s(p) - before[p] for p in pids) / n)
            servers.append(sum(cpu_s(p) - v for p, v in server_before.items()) / n)
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
                await spy.wait()
            assert got == n, f"{n - got} messages not answered"
    label = "daemon" if args.replicas == 1 else f"{args.replicas} replicas together"
    print(
        f"CPU ms per answered message via {args.via}, {label}: {spread(daemons, 1e3)} "
        f"[N={n} after a warm-up of {warm}, {chats} chats, {args.concurrency} in flight, "
        f"{args.rounds} rounds]"
    )
    if args.replicas > 1:
        print(f"  per replica: {spread([d / args.replicas for d in daemons], 1e3)}")
        print(f"  PostgreSQL backends beside them: {spread(servers, 1e3)}")
    elif args.floor == "postgres":
        print(f"  PostgreSQL backend beside it: {spread(servers, 1e3)}")
    if args.py_spy:
        top_frames(Path(args.py_spy_raw), 10)


def top_frames(raw: Path, top: int) -> None:
    """py-spy's collapsed stacks: the functions most samples were in, and the deepest
    frame of gateway/ or state/ in each sample (our code and the library code it called)."""
    own: collections.Counter[str] = collections.Counter()
    ours: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [
            re.sub(r" \((?:.*/(?:site-packages|python3\.\d+)/)?(.*?):\d+\)$", r" (\1)", f)
            for f in stack.split(";")
        ]
        total += int(count)
        own[frames[-1]] += int(count)
        mine = [f for f in frames if re.search(r"\((gateway|state)/", f)]
        ours[mine[-1] if mine else "(no frame of ours)"] += int(count)
    print(f"py-spy, {total} samples of the daemon over the measured messages of round 1:")
    for title, counter in (("own", own), ("the deepest frame under gateway/ or state/", ours)):
        print(f"  top {top} by {title}:")
        for f, c in counter.most_common(top):
            print(f"    {c / total:6.1%}  {f}")


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--agent", choices=("openai", "echo"), default="openai")
    ap.add_argument(
        "--via",
        choices=tuple(VIA),
        default="api",
        help="how the messages arrive: the HTTP API's /v1/chat/completions (default), "
        "Telegram webhook updates, Slack Events API requests",
    )
    ap.add_argument("--replicas", type=int, default=1, help="2+: PostgreSQL (default 1: SQLite)")
    ap.add_argument(
        "--dsn",
        default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN),
        help="the PostgreSQL server for --replicas (a fresh database on it)",
    )
    ap.add_argument(
        "--chats",
        type=int,
        default=50,
        help=f"chats under callgrind: N = {MEASURED_PER_CHAT} x chats (default 50)",
    )
    ap.add_argument(
        "--warm-per-chat",
        type=int,
        default=WARM_PER_CHAT,
        help=f"messages each chat gets before the measured ones ({WARM_PER_CHAT}): the "
        "measured turns send a history of about twice that",
    )
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight (8)")
    ap.add_argument("--repeat", type=int, default=1, help="callgrind run pairs (1)")
    ap.add_argument(
        "--commit-linger-ms",
        type=float,
        help="state.commit_linger_ms (cluster.commit_linger_ms with --replicas); default: "
        "the config's default",
    )
    ap.add_argument("--cpu-messages", type=int, default=3000, help="N outside valgrind (3000)")
    ap.add_argument("--rounds", type=int, default=3, help="CPU rounds (3)")
    ap.add_argument(
        "--hop", action="store_true", help="each chat's next message to the next replica"
    )
    ap.add_argument("--only", choices=("callgrind", "cpu"), help="one of the two figures")
    ap.add_argument(
        "--window",
        action="store_true",
        help="callgrind: one run per pair, counters zeroed after the warm-up and dumped after "
        "the measured messages (start-up and shutdown left out)",
    )
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="keep callgrind's output files and py-spy's samples there",
    )
    ap.add_argument("--py-spy", choices=("top",), help="sample round 1 with py-spy, print the top")
    ap.add_argument(
        "--floor",
        choices=("http", "sqlite", "postgres"),
        help="run bench/floor.py in the gateway's place: the least a Python daemon on the "
        "same libraries does per message (http: no store; sqlite, postgres: plus two "
        "group-committed rows); --via api, one daemon, openai agent only",
    )
    args = ap.parse_args()
    if args.floor and (args.via != "api" or args.replicas != 1 or args.agent != "openai"):
        ap.error("--floor measures --via api, one daemon, the openai agent")
    if args.via == "telegram-polling" and args.replicas != 1:
        ap.error("--via telegram-polling runs one daemon (one poller per bot token)")
    store = "on PostgreSQL" if args.replicas > 1 or args.floor == "postgres" else "on SQLite"
    if args.floor == "http":
        store = "without a store"
    floor = f"bench/floor.py --floor {args.floor} in the daemon's place, " if args.floor else ""
    print(
        f"switchboard instructions bench: `{' '.join(sys.argv)}`; via {VIA[args.via]}, "
        f"{floor}"
        f"agent {args.agent}, "
        f"{args.replicas} daemon(s) {store}, "
        f"{os.cpu_count()} cores"
    )
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sb-instr-") as tmp:
        args.py_spy_raw = str(Path(args.keep or tmp) / "py-spy.txt")
        if args.only in (None, "callgrind"):
            await callgrind(args, Path(tmp))
        if args.only in (None, "cpu"):
            await cpu(args, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
