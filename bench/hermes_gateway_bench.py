"""switchboard beside Hermes Agent 0.19.0's own gateway, end to end: the same turns through
each gateway's OpenAI-compatible `/v1/chat/completions`, one model server behind both.
Prints figures; asserts nothing.

  python bench/hermes_gateway_bench.py                 # 300 Hermes turns, 3,000 switchboard
  python bench/hermes_gateway_bench.py --hermes-turns 60 --sb-turns 600 --rounds 3

Hermes runs from its own virtualenv (its pinned dependencies conflict with switchboard's):
bench/out/hermes-venv, made once with `python -m venv` and `pip install hermes-agent==0.19.0
aiohttp` and reused after. When it cannot be installed the bench says so and exits 0.

The two gateways:

- Hermes: `hermes gateway run` with HERMES_HOME (and HOME) in a fresh directory, its API
  server platform enabled by environment (API_SERVER_ENABLED=true, API_SERVER_KEY a random
  32-character key, API_SERVER_HOST=127.0.0.1, API_SERVER_PORT a free port). Its
  config.yaml: `model: {provider: custom, base_url: <the fake>, default: fake-model,
  api_key, context_length: 128000}`, and these extras off so a turn is one model call:
  `platform_toolsets.api_server: []` (no tools in the request), `memory.memory_enabled`,
  `memory.user_profile_enabled` false and `memory.nudge_interval: 0` (no memory store, no
  background memory review), `skills.creation_nudge_interval: 0` (no skill review),
  `compression.enabled: false`, `auxiliary.title_generation.enabled: false`,
  `agent.environment_probe: false` (no toolchain probe for the prompt) and
  `agent.coding_context: off`. Hermes 0.19 sends no telemetry of its own (nothing to turn
  off). A session is the `X-Hermes-Session-Id` header (which needs the key): Hermes loads its
  history from its state.db.
- switchboard: `switchboard run` (`python -m gateway --home H run`) with the `openai` agent
  backend at the fake (`agent.openai.tools: []`, `agent.auto_title: false`) and the api
  platform with a bearer key (`platforms.api.key_env`). A session is the request's `user`;
  the history comes from its state.db.

The model is a fake OpenAI-compatible server in this process on 127.0.0.1 that answers at
once, a fixed short text naming the turn it answers (server-sent events when the request
asks to stream, as Hermes's requests do; plain JSON otherwise, as switchboard's are). It
also answers `GET /v1/models` and `GET /version` (as vLLM does): Hermes probes a loopback
endpoint for its server type, caching the answer for an hour only when it recognises one,
so without `/version` it would probe four more URLs on every turn. Every other path is a
404. The bench counts the requests each gateway makes per turn.

The work: N turns over N / --per-session sessions (10 turns each by default, so both
gateways see the same history lengths however many turns each runs), --concurrency requests
in flight, never two of one session at once; the client sends only the new user message. A
warm-up of --warmup turns in sessions of their own comes first (Hermes's first turn imports
most of its code). Three rounds, alternating which gateway goes first, since this machine's
speed drifts; each round starts both on fresh homes. --hermes-env NAME=VALUE adds a variable
to Hermes's environment (for example HERMES_SKIP_SSL_GUARD=1, which skips the CA bundle
check each of its agents makes when it is built, once per turn).

Per gateway and round: turns per second over the measured turns; CPU per turn, the gateway
process's user + system time from /proc/<pid>/stat with its children's (live descendants'
own times and the waited-for children's cutime/cstime) over the measured turns; RSS of the
process tree at the end. Every reply is checked against the text the model gave for that
turn, and after the gateway stops, its state.db (sqlite3) is read for every user message and
every reply, each session's turns in one stored session. The summary prints each figure's
spread over the rounds (min-max) and the ratios switchboard/Hermes, taken within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp
import yaml
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.daemon import clean_env, free_port  # noqa: E402

HERMES_VERSION = "0.19.0"
VENV = ROOT / "bench" / "out" / "hermes-venv"
MODEL = "fake-model"
TURN_RE = re.compile(r"\[turn ([A-Za-z0-9_-]+)\]")
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 300.0


def answer_for(token: str) -> str:
    return f"Cook the rice first, then the beans (turn {token})."


def text_for(token: str) -> str:
    return f"[turn {token}] what should I cook tonight with rice and beans?"


# ---------------------------------------------------------------------------- Hermes install


def hermes_bin() -> Path | None:
    """The `hermes` command of bench/out/hermes-venv, made and filled once; None (with the
    reason printed) when it cannot be."""
    if not (3, 11) <= sys.version_info[:2] < (3, 14):
        print(f"Hermes Agent {HERMES_VERSION} needs Python 3.11-3.13; this is {sys.version}")
        return None
    py, hermes = VENV / "bin" / "python", VENV / "bin" / "hermes"
    probe = (
        "import importlib.metadata as m, aiohttp; "
        f"assert m.version('hermes-agent') == {HERMES_VERSION!r}"
    )

    def ready() -> bool:
        if not (py.exists() and hermes.exists()):
            return False
        return subprocess.run([py, "-c", probe], capture_output=True).returncode == 0

    if ready():
        return hermes
    print(f"installing hermes-agent=={HERMES_VERSION} and aiohttp into {VENV} (once)", flush=True)
    try:
        VENV.parent.mkdir(parents=True, exist_ok=True)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        got = subprocess.run(
            [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
            + [f"hermes-agent=={HERMES_VERSION}", "aiohttp"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"Hermes Agent could not be installed: {exc}")
        return None
    if got.returncode != 0 or not ready():
        tail = "\n".join((got.stderr or got.stdout).strip().splitlines()[-8:])
        print(f"Hermes Agent could not be installed (pip exit {got.returncode}):\n{tail}")
        return None
    return hermes


# ---------------------------------------------------------------------------- the model


@dataclass
class Counts:
    chat: int = 0  # POST /v1/chat/completions
    streamed: int = 0
    with_tools: int = 0
    other: int = 0  # every other request (metadata probes)


class FakeModel:
    """An OpenAI-compatible chat completions server that answers at once."""

    def __init__(self) -> None:
        self.counts = Counts()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def take(self) -> Counts:
        counts, self.counts = self.counts, Counts()
        return counts

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _other(self, request: web.Request) -> web.Response:
        self.counts.other += 1
        if request.method == "GET" and request.path == "/v1/models":
            return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        if request.method == "GET" and request.path == "/version":
            return web.json_response({"version": "0.0-bench"})
        return web.json_response({"error": {"message": "not found"}}, status=404)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.counts.chat += 1
        self.counts.with_tools += bool(body.get("tools"))
        users = [m for m in body["messages"] if m.get("role") == "user"]
        last: dict[str, Any] = users[-1] if users else {}
        content = last.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        found = TURN_RE.search(content or "")
        text = answer_for(found.group(1)) if found else "An answer to an unknown turn."
        usage = {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": text},
                        }
                    ],
                    "usage": usage,
                }
            )
        self.counts.streamed += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": MODEL}
        chunks: list[dict[str, Any]] = [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage},
        ]
        data = b"".join(
            b"data: " + json.dumps({**base, "created": int(time.time()), **c}).encode() + b"\n\n"
            for c in chunks
        )
        await resp.write(data + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


# ---------------------------------------------------------------------------- /proc


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree(pid: int) -> list[int]:
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def tree_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of `pid` and its live descendants, in seconds."""
    total = 0
    for p in tree(pid):
        try:
            with open(f"/proc/{p}/stat") as fh:
                f = fh.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / CLK_TCK


def tree_rss_mb(pid: int) -> float:
    total = 0
    for p in tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


# ---------------------------------------------------------------------------- gateways


@dataclass
class Result:
    name: str
    turns: int
    seconds: float
    cpu_s: float
    rss_mb: float
    answered: int
    model: Counts
    store: str
    store_ok: bool
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.turns / self.seconds

    @property
    def cpu_ms(self) -> float:
        return self.cpu_s / self.turns * 1e3


class Gateway:
    name = ""

    def __init__(self, home: Path, model_url: str) -> None:
        self.home, self.model_url = home, model_url
        self.port = free_port()
        self.key = secrets.token_hex(16)
        self.proc: asyncio.subprocess.Process | None = None
        self.log = home / "bench-gateway.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def request(self, session: str, text: str) -> tuple[dict[str, str], dict[str, Any]]:
        raise NotImplementedError

    def stored(self) -> list[tuple[str, str, str]]:
        """(session id, role, content) of every message in the gateway's state.db."""
        raise NotImplementedError

    def open_log(self) -> BinaryIO:
        return open(self.log, "wb")  # noqa: SIM115 - the caller closes it

    async def start(self) -> None:
        argv, env = self.command()
        with self.open_log() as log:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.home
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < deadline:
                if self.proc.returncode is not None:
                    break
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"{self.base}/health") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.2)
        tail = self.log.read_text(errors="replace").strip().splitlines()[-15:]
        await self.stop()
        raise RuntimeError(f"{self.name} did not start; its log ends:\n" + "\n".join(tail))

    async def stop(self) -> int | None:
        if self.proc is None or self.proc.returncode is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 60)
        except TimeoutError:
            self.proc.kill()
            return await self.proc.wait()


class Hermes(Gateway):
    name = "Hermes"

    def __init__(self, home: Path, model_url: str, hermes: Path, extra_env: dict[str, str]) -> None:
        super().__init__(home, model_url)
        self.hermes, self.extra_env = hermes, extra_env
        self.hermes_home = home / "hermes-home"

    def command(self) -> tuple[list[str], dict[str, str]]:
        self.hermes_home.mkdir(parents=True)
        (self.home / "user-home").mkdir()
        config = {
            "model": {
                "default": MODEL,
                "provider": "custom",
                "base_url": self.model_url,
                "api_key": "bench-model-key",
                "context_length": 128000,
            },
            "platform_toolsets": {"api_server": []},
            "compression": {"enabled": False},
            "memory": {"memory_enabled": False, "user_profile_enabled": False, "nudge_interval": 0},
            "skills": {"creation_nudge_interval": 0},
            "auxiliary": {"title_generation": {"enabled": False}},
            "agent": {"environment_probe": False, "coding_context": "off"},
        }
        (self.hermes_home / "config.yaml").write_text(yaml.safe_dump(config))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self.home / "user-home"),
            "HERMES_HOME": str(self.hermes_home),
            "API_SERVER_ENABLED": "true",
            "API_SERVER_KEY": self.key,
            "API_SERVER_HOST": "127.0.0.1",
            "API_SERVER_PORT": str(self.port),
            **self.extra_env,
        }
        return [str(self.hermes), "gateway", "run"], env

    def request(self, session: str, text: str) -> tuple[dict[str, str], dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.key}", "X-Hermes-Session-Id": session}
        return headers, {"model": MODEL, "messages": [{"role": "user", "content": text}]}

    def stored(self) -> list[tuple[str, str, str]]:
        return _rows(self.hermes_home / "state.db")


class Switchboard(Gateway):
    name = "switchboard"

    def command(self) -> tuple[list[str], dict[str, str]]:
        self.home.mkdir(parents=True, exist_ok=True)
        config = {
            "agent": {
                "backend": "openai",
                "auto_title": False,
                "openai": {
                    "base_url": self.model_url,
                    "model": MODEL,
                    "api_key_env": "OPENAI_API_KEY",
                    "tools": [],
                },
            },
            "platforms": {"api": {"port": self.port, "key_env": "BENCH_API_KEY"}},
        }
        (self.home / "config.yaml").write_text(yaml.safe_dump(config))
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = clean_env(OPENAI_API_KEY="bench-model-key", BENCH_API_KEY=self.key, PYTHONPATH=path)
        return [sys.executable, "-m", "gateway", "--home", str(self.home), "run"], env

    def request(self, session: str, text: str) -> tuple[dict[str, str], dict[str, Any]]:
        body = {"model": MODEL, "user": session, "messages": [{"role": "user", "content": text}]}
        return {"Authorization": f"Bearer {self.key}"}, body

    def stored(self) -> list[tuple[str, str, str]]:
        return _rows(self.home / "state.db")


def _rows(db: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [
            (str(s), str(r), c or "")
            for s, r, c in conn.execute("SELECT session_id, role, content FROM messages")
        ]
    finally:
        conn.close()


# ---------------------------------------------------------------------------- the work


async def drive(
    gw: Gateway, http: aiohttp.ClientSession, turns: list[tuple[str, str]], concurrency: int
) -> int:
    """Send (session, token) turns in order, `concurrency` in flight, one per session at a
    time; the number whose reply is the model's answer for that turn."""
    locks: dict[str, asyncio.Lock] = {s: asyncio.Lock() for s, _ in turns}
    todo = iter(turns)
    answered = 0

    async def worker() -> None:
        nonlocal answered
        for session, token in todo:
            headers, body = gw.request(session, text_for(token))
            try:
                async with locks[session]:
                    async with http.post(
                        f"{gw.base}/v1/chat/completions", json=body, headers=headers
                    ) as resp:
                        raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError):
                continue  # not answered: the count says so
            if resp.status != 200:
                continue
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                if json.loads(raw)["choices"][0]["message"]["content"] == answer_for(token):
                    answered += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answered


def plan(prefix: str, turns: int, per_session: int) -> list[tuple[str, str]]:
    """Turn i goes to session i % sessions: sessions take turns, each gets `per_session`."""
    sessions = max(1, -(-turns // per_session))
    return [(f"{prefix}s{i % sessions}", f"{prefix}{i}") for i in range(turns)]


def check_store(rows: list[tuple[str, str, str]], turns: list[tuple[str, str]]) -> tuple[str, bool]:
    """Every turn's user message and reply stored exactly once, and each bench session's
    messages in one stored session of their own."""
    where: dict[tuple[str, str], list[str]] = {}
    for sid, role, content in rows:
        where.setdefault((role, content), []).append(sid)
    users = replies = 0
    sessions: dict[str, set[str]] = {}
    for session, token in turns:
        u = where.get(("user", text_for(token)), [])
        a = where.get(("assistant", answer_for(token)), [])
        users += len(u) == 1
        replies += len(a) == 1
        sessions.setdefault(session, set()).update(u + a)
    one_each = sum(len(s) == 1 for s in sessions.values())
    distinct = len({next(iter(s)) for s in sessions.values() if len(s) == 1}) == one_each
    ok = users == replies == len(turns) and one_each == len(sessions) and distinct
    text = (
        f"stored once: {users}/{len(turns)} user messages, {replies}/{len(turns)} replies; "
        f"{one_each}/{len(sessions)} sessions each in one stored session"
        f"{'' if distinct else ' (some share one)'}"
    )
    return text, ok


async def run_one(
    gw: Gateway, fake: FakeModel, turns: int, args: argparse.Namespace, tag: str
) -> Result:
    warm = plan(f"{tag}w", args.warmup, max(1, args.per_session // 5))
    work = plan(f"{tag}m", turns, args.per_session)
    t_start = time.perf_counter()
    await gw.start()
    started_s = time.perf_counter() - t_start
    assert gw.proc is not None
    pid = gw.proc.pid
    timeout = aiohttp.ClientTimeout(total=600)
    conn = aiohttp.TCPConnector(limit=args.concurrency)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as http:
            warm_ok = await drive(gw, http, warm, args.concurrency)
            fake.take()
            cpu0, t0 = tree_cpu_s(pid), time.perf_counter()
            answered = await drive(gw, http, work, args.concurrency)
            seconds, cpu = time.perf_counter() - t0, tree_cpu_s(pid) - cpu0
            counts = fake.take()
            rss = tree_rss_mb(pid)
    finally:
        code = await gw.stop()
    store, ok = check_store(gw.stored(), warm + work)
    return Result(
        gw.name,
        turns,
        seconds,
        cpu,
        rss,
        answered,
        counts,
        store,
        ok and warm_ok == len(warm),
        {"start_s": started_s, "exit": code, "warm_ok": warm_ok, "warm": len(warm)},
    )


def describe(r: Result) -> str:
    m = r.model
    return (
        f"  {r.name:<11} {r.turns} turns in {r.seconds:.1f} s: {r.rate:,.1f} turns/s, "
        f"{r.cpu_ms:.2f} ms CPU/turn, RSS {r.rss_mb:.0f} MB at the end\n"
        f"              replies {r.answered}/{r.turns} right (warm-up "
        f"{r.extra['warm_ok']}/{r.extra['warm']}); {r.store}"
        f"{'' if r.store_ok else '  <- INCOMPLETE'}\n"
        f"              per turn: {m.chat / r.turns:.2f} model calls ({m.streamed} streamed, "
        f"{m.with_tools} with tools), {m.other / r.turns:.2f} other requests to the model server;"
        f" started in {r.extra['start_s']:.1f} s, exit {r.extra['exit']} after SIGTERM"
        + (" (Hermes's choice: so systemd restarts it)" if r.name == "Hermes" else "")
    )


def spread(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}-{hi:{fmt}}" if len(values) > 1 else f"{lo:{fmt}}"


async def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--hermes-turns", type=int, default=300, help="measured Hermes turns (300)")
    ap.add_argument("--sb-turns", type=int, default=3000, help="measured switchboard turns (3000)")
    ap.add_argument("--per-session", type=int, default=10, help="turns per session (10)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    ap.add_argument("--warmup", type=int, default=20, help="warm-up turns per gateway (20)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating the order (3)")
    ap.add_argument(
        "--hermes-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="one more variable in Hermes's environment (repeatable), e.g. HERMES_SKIP_SSL_GUARD=1",
    )
    ap.add_argument(
        "--keep", action="store_true", help="keep the homes (and logs) under bench/out/"
    )
    args = ap.parse_args()
    bad = [e for e in args.hermes_env if "=" not in e or not e.partition("=")[0]]
    if bad:
        ap.error(f"--hermes-env takes NAME=VALUE (got {bad[0]!r})")
    hermes_env = dict(e.partition("=")[::2] for e in args.hermes_env)
    hermes = hermes_bin()
    if hermes is None:
        print("Hermes Agent is not available: nothing compared.")
        return
    print(
        f"switchboard beside Hermes Agent {HERMES_VERSION}, end to end: `{' '.join(sys.argv)}`; "
        f"{args.per_session} turns per session, {args.concurrency} in flight, "
        f"{args.warmup} warm-up turns, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}"
        + (f"; Hermes's environment also {hermes_env}" if hermes_env else ""),
        flush=True,
    )
    fake = FakeModel()
    await fake.start()
    results: list[dict[str, Result]] = []
    try:
        for rnd in range(args.rounds):
            order = ("hermes", "sb") if rnd % 2 == 0 else ("sb", "hermes")
            got: dict[str, Result] = {}
            print(f"round {rnd + 1} (load average {os.getloadavg()[0]:.1f}):", flush=True)
            for kind in order:
                with contextlib.ExitStack() as stack:
                    if args.keep:
                        home = Path(tempfile.mkdtemp(prefix=f"hgb-{kind}-", dir=VENV.parent))
                        print(f"  ({kind} home kept: {home})")
                    else:
                        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    if kind == "hermes":
                        gw: Gateway = Hermes(home, fake.url, hermes, hermes_env)
                        turns = args.hermes_turns
                    else:
                        gw = Switchboard(home / "sb", fake.url)
                        turns = args.sb_turns
                    got[kind] = await run_one(gw, fake, turns, args, f"r{rnd}")
                print(describe(got[kind]), flush=True)
            results.append(got)
    finally:
        await fake.stop()

    print(f"\nsummary, min-max over {len(results)} round(s):")
    print(f"  {'':<22}{'Hermes ' + HERMES_VERSION:>16}{'switchboard':>16}{'sb / Hermes':>16}")
    rows = (
        ("turns per second", lambda r: r.rate, ",.1f", ".1f"),
        ("CPU ms per turn", lambda r: r.cpu_ms, ".2f", ".3f"),
        ("RSS MB at the end", lambda r: r.rss_mb, ".0f", ".2f"),
    )
    for label, get, fmt, rfmt in rows:
        h = [get(g["hermes"]) for g in results]
        s = [get(g["sb"]) for g in results]
        ratio = [b / a for a, b in zip(h, s, strict=True)]
        print(f"  {label:<22}{spread(h, fmt):>16}{spread(s, fmt):>16}{spread(ratio, rfmt):>16}")
    bad = [
        f"round {i + 1} {r.name}"
        for i, g in enumerate(results)
        for r in g.values()
        if r.answered != r.turns or not r.store_ok
    ]
    print(
        "  every reply right and every message and reply stored once"
        if not bad
        else f"  NOT every reply right or stored: {', '.join(bad)}"
    )


if __name__ == "__main__":
    asyncio.run(main())
