"""Exactly-once answers through crashes, per platform: the daemon, a real
subprocess behind each platform's loopback fake (Telegram polling and webhook, Slack Events
API and Socket Mode, Discord, the HTTP API), is SIGKILLed at every named fault point in turn
(`SWITCHBOARD_FAULT`, `SWITCHBOARD_FAULT_AT`) while messages of several chats are in flight,
and each restart is the next kill's daemon: it recovers what the last one left and is
killed in turn. More messages arrive while it is down. The fakes deliver again what was not
acknowledged, as the platforms do. At the end:

- every message the platform sent is stored exactly once, in its chat's session, in the
  order the chat sent it, each followed by exactly one stored reply (its echo);
- every inbox row is answered;
- the chat shows every reply exactly once and in order (Slack, Discord: a reply resent
  after a kill carries its key and is shown once; the HTTP API: each Idempotency-Key got one
  reply); Telegram, which cannot dedupe a resend, at most once by default, the gaps being
  exactly inbox rows left 'unconfirmed' (and counted by /health), and at least once with
  `inbox.resend_unconfirmed_replies`.

CI runs each point once per chain (4 kills a chain); `pytest --long` four rounds with other
`SWITCHBOARD_FAULT_AT` values (16 a chain)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import aiohttp
import pytest

from gateway.faults import POINTS
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.discord import FakeDiscord
from tests.fakes.slack import SECRET, EventsDelivery, FakeSlack, event
from tests.fakes.telegram import FakeTelegram

ROUNDS = int(os.environ.get("SWITCHBOARD_FAULT_ROUNDS", "1"))  # `--long`: 4
CHATS = 3
BURST = 3  # messages per chat sent to each daemon, all at once
POLL_S = 0.05


def kills(rounds: int) -> list[tuple[str, int]]:
    """(point, N) for each daemon of a chain: every point once per round, the Nth time it
    is reached varying so that the kill lands on different messages of the burst (any N up
    to CHATS * BURST is reached: every message passes every point once)."""
    out = []
    for r in range(rounds):
        for i, point in enumerate(POINTS):
            out.append((point, 1 + (3 * i + 2 * r) % (CHATS * BURST)))
    return out


class Platform(Protocol):
    """One platform as the chats see it: its fake, how users' messages reach the daemon
    (again, until acknowledged) and what each chat shows."""

    # once per reply, as the chat sees it: "exactly", "at_most", "at_least", or "replayed"
    # (exactly, the client asking again for what the outbox could not confirm)
    promise: str

    async def start(self, port: int) -> None: ...

    def config(self, port: int) -> str: ...

    def env(self) -> dict[str, str]: ...

    def starting(self) -> None:
        """A daemon is about to start (`ready` waits for its connection)."""

    async def ready(self) -> None: ...

    async def send(self, chat: int, text: str) -> None: ...

    def delivered(self) -> bool: ...

    def shown(self, chat: int) -> list[str]: ...

    def chat_id(self, chat: int) -> str: ...

    async def stop(self) -> None: ...


@dataclass
class TelegramPolling:
    resend: bool = False
    fake: FakeTelegram = field(default_factory=FakeTelegram)

    @property
    def promise(self) -> str:
        return "at_least" if self.resend else "at_most"

    async def start(self, port: int) -> None:
        await self.fake.start()

    def config(self, port: int) -> str:
        return (
            f"  telegram:\n    enabled: true\n    allow_all_users: true\n"
            f"    base_url: {self.fake.base_url}\n"
        )

    def env(self) -> dict[str, str]:
        return {"TELEGRAM_BOT_TOKEN": self.fake.token}

    def starting(self) -> None:
        pass

    async def ready(self) -> None:
        pass  # updates wait in the fake until a poller confirms them

    async def send(self, chat: int, text: str) -> None:
        uid = 100 + chat
        self.fake.push(self.fake.message(text, self.fake.dm_chat(uid), user_id=uid))

    def delivered(self) -> bool:
        return not self.fake.updates

    def shown(self, chat: int) -> list[str]:
        return [m["text"] for m in self.fake.sent() if str(m["chat_id"]) == self.chat_id(chat)]

    def chat_id(self, chat: int) -> str:
        return str(100 + chat)

    async def stop(self) -> None:
        await self.fake.stop()


@dataclass
class TelegramWebhook(TelegramPolling):
    def config(self, port: int) -> str:
        return super().config(port) + (
            f"    mode: webhook\n    webhook_url: http://127.0.0.1:{port}/telegram/webhook\n"
        )

    def env(self) -> dict[str, str]:
        return {**super().env(), "TELEGRAM_WEBHOOK_SECRET": "hook-secret"}


@dataclass
class SlackEvents:
    promise: str = "exactly"
    fake: FakeSlack = field(default_factory=lambda: FakeSlack(ts_base=int(time.time()) + 100))
    delivery: EventsDelivery | None = None
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def start(self, port: int) -> None:
        await self.fake.start()
        self.delivery = EventsDelivery(f"http://127.0.0.1:{port}/slack/events")

    def config(self, port: int) -> str:
        return (
            f"  slack:\n    enabled: true\n    allow_all_users: true\n"
            f"    base_url: {self.fake.base_url}\n"
        )

    def env(self) -> dict[str, str]:
        return {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_SIGNING_SECRET": SECRET}

    def starting(self) -> None:
        pass

    async def ready(self) -> None:
        pass

    def _event(self, chat: int, text: str) -> dict:  # type: ignore[type-arg]
        n = next(self._seq)
        ts = f"{self.fake.ts_base - 100}.{n:06d}"  # before every reply's ts, as on Slack
        ev = {
            "type": "message",
            "channel": self.chat_id(chat),
            "channel_type": "im",
            "user": f"U{chat}",
            "text": text,
            "ts": ts,
            "event_ts": ts,
        }
        return event(ev, f"Ev{n}")

    async def send(self, chat: int, text: str) -> None:
        assert self.delivery is not None
        self.delivery.deliver(self._event(chat, text))

    def delivered(self) -> bool:
        return self.delivery is not None and not self.delivery.pending

    def shown(self, chat: int) -> list[str]:
        return self.fake.shown(self.chat_id(chat))

    def chat_id(self, chat: int) -> str:
        return f"D0DM{chat}"

    async def stop(self) -> None:
        if self.delivery is not None:
            await self.delivery.stop()
        await self.fake.stop()


@dataclass
class SlackSocket(SlackEvents):
    _links: int = 0

    def config(self, port: int) -> str:
        return super().config(port) + "    mode: socket\n"

    def env(self) -> dict[str, str]:
        return {"SLACK_BOT_TOKEN": "xoxb-fake-token", "SLACK_APP_TOKEN": "xapp-fake"}

    def starting(self) -> None:
        self._links = self.fake.connections_opened

    async def ready(self) -> None:
        await self.fake.wait_socket(self._links + 1, timeout=20)

    async def send(self, chat: int, text: str) -> None:
        payload = self._event(chat, text)
        await self.fake.socket_event(payload, envelope_id=f"env{payload['event_id']}")

    def delivered(self) -> bool:
        return not self.fake.unacked


@dataclass
class Discord:
    promise: str = "exactly"
    fake: FakeDiscord = field(default_factory=FakeDiscord)
    _identifies: int = 0

    async def start(self, port: int) -> None:
        await self.fake.start()

    def config(self, port: int) -> str:
        return (
            f"  discord:\n    enabled: true\n    allow_all_users: true\n"
            f"    base_url: {self.fake.api}\n    gateway_url: {self.fake.gateway}\n"
        )

    def env(self) -> dict[str, str]:
        return {"DISCORD_BOT_TOKEN": self.fake.token}

    def starting(self) -> None:
        self._identifies = self.fake.identifies

    async def ready(self) -> None:
        # the new daemon's IDENTIFY: from then on it reads what it missed (catch-up)
        deadline = time.monotonic() + 20
        while self.fake.identifies <= self._identifies:
            assert time.monotonic() < deadline, "the daemon did not connect to the gateway"
            await asyncio.sleep(0.01)

    async def send(self, chat: int, text: str) -> None:
        user = f"5000000000000001{chat:02d}"
        data = self.fake.message(text, self.chat_id(chat), user=user, name=f"u{chat}", guild=False)
        try:  # to a daemon that is down or dying it is only in the channel's history
            await self.fake.dispatch("MESSAGE_CREATE", data)
        except (ConnectionError, RuntimeError):
            pass

    def delivered(self) -> bool:
        return True  # the channel's history holds every message; catch-up reads it

    def shown(self, chat: int) -> list[str]:
        return self.fake.shown(self.chat_id(chat))

    def chat_id(self, chat: int) -> str:
        return f"6000000000000001{chat:02d}"

    async def stop(self) -> None:
        await self.fake.stop()


@dataclass
class HttpApi:
    """Each chat is a client sending its messages one after another, each with an
    Idempotency-Key, repeating one until it gets its reply (a 409 'in_flight' after a
    restart, a dropped connection): one reply returned per key. The API never sends a reply
    again (its outbox row may end 'unconfirmed'): a repeat is answered from the store."""

    promise: str = "replayed"
    url: str = ""
    queues: dict[int, list[str]] = field(default_factory=dict)
    replies: dict[int, list[str]] = field(default_factory=dict)
    busy: set[int] = field(default_factory=set)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    http: aiohttp.ClientSession | None = None

    async def start(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/messages"
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    def config(self, port: int) -> str:
        return ""

    def env(self) -> dict[str, str]:
        return {}

    def starting(self) -> None:
        pass

    async def ready(self) -> None:
        pass

    async def send(self, chat: int, text: str) -> None:
        self.queues.setdefault(chat, []).append(text)
        if chat not in self.busy:
            self.busy.add(chat)
            self.tasks.append(asyncio.create_task(self._client(chat)))

    async def _client(self, chat: int) -> None:
        assert self.http is not None
        queue = self.queues[chat]
        try:
            while queue:
                text = queue[0]
                for _ in range(1200):  # bounded: 60 s of retries
                    try:
                        async with self.http.post(
                            self.url,
                            json={"chat_id": self.chat_id(chat), "text": text},
                            headers={"Idempotency-Key": text},
                        ) as resp:
                            if resp.status == 200:
                                self.replies.setdefault(chat, []).append(
                                    (await resp.json())["reply"]
                                )
                                break
                            assert resp.status in (409, 503), (resp.status, await resp.text())
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    await asyncio.sleep(POLL_S)
                else:
                    raise AssertionError(f"no reply to {text!r}")
                queue.pop(0)
        finally:
            self.busy.discard(chat)

    def delivered(self) -> bool:
        for task in self.tasks:
            if task.done() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return not self.busy

    def shown(self, chat: int) -> list[str]:
        return self.replies.get(chat, [])

    def chat_id(self, chat: int) -> str:
        return f"chat{chat}"

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.http is not None:
            await self.http.close()


PLATFORMS = {
    "telegram_polling": TelegramPolling,
    "telegram_polling_resend": lambda: TelegramPolling(resend=True),
    "telegram_webhook": TelegramWebhook,
    "slack_events": SlackEvents,
    "slack_socket": SlackSocket,
    "discord": Discord,
    "http_api": HttpApi,
}


# --- what the store and the chats hold ------------------------------------------------


def _read(home: Path, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _sessions(home: Path) -> dict[str, list[tuple[str, str]]]:
    """Each chat's stored messages, in the order they were stored."""
    out: dict[str, list[tuple[str, str]]] = {}
    for chat, role, content in _read(
        home,
        "SELECT s.chat_id, m.role, m.content FROM messages m "
        "JOIN sessions s ON s.id = m.session_id ORDER BY m.id",
    ):
        out.setdefault(chat, []).append((role, content))
    return out


def _settled(home: Path, platform: Platform, sent: int) -> bool:
    if not platform.delivered():
        return False
    rows = _read(home, "SELECT state, reply_state FROM inbox")
    return len(rows) == sent and all(
        state == "answered" and reply in ("sent", "unconfirmed") for state, reply in rows
    )


async def _up(url: str, proc: asyncio.subprocess.Process) -> bool:
    """True once /health answers; False when the daemon died first (a restart reaches its
    fault point while recovering what the last one left)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(400):
            if proc.returncode is not None:
                return False
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(POLL_S)
    raise AssertionError("the daemon did not become healthy")


async def _health(url: str) -> dict:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
        return await resp.json()  # type: ignore[no-any-return]


async def _start(home: Path, platform: Platform, **env: str) -> asyncio.subprocess.Process:
    platform.starting()
    log = home / f"daemon-{len(list(home.glob('daemon-*.log')))}.log"  # each one's, for a failure
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return await asyncio.create_subprocess_exec(
            *switchboard(home, "run"),
            env=clean_env(**platform.env(), **env),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=fd,
        )
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", list(PLATFORMS))
async def test_killed_at_every_fault_point_each_message_is_stored_and_answered_once_in_order(
    tmp_path: Path, name: str
) -> None:
    platform: Platform = PLATFORMS[name]()  # type: ignore[operator]
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    url = f"http://127.0.0.1:{port}"
    await platform.start(port)
    resend = "true" if platform.promise == "at_least" else "false"
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n{platform.config(port)}"
        f"inbox:\n  resend_unconfirmed_replies: {resend}\n"
    )
    sent: dict[int, list[str]] = {c: [] for c in range(CHATS)}

    async def say(chat: int, text: str) -> None:
        sent[chat].append(text)
        await platform.send(chat, text)

    chain = kills(ROUNDS)
    killed_early = 0  # restarts killed while recovering, before they were healthy
    try:
        for n, (point, at) in enumerate(chain):
            # the first daemon answers a message in each chat first (Discord catches up
            # only channels it answered in): those pass every point once more
            at += CHATS if n == 0 else 0
            proc = await _start(
                home, platform, SWITCHBOARD_FAULT=point, SWITCHBOARD_FAULT_AT=str(at)
            )
            try:
                if not await _up(url, proc):
                    assert n > 0 and proc.returncode == -signal.SIGKILL, proc.returncode
                    killed_early += 1
                    continue
                await platform.ready()
                if n == 0:
                    for c in range(CHATS):
                        await say(c, f"hello from {c}")
                    for _ in range(400):
                        if all(platform.shown(c) for c in range(CHATS)):
                            break
                        await asyncio.sleep(POLL_S)
                for i in range(BURST):
                    for c in range(CHATS):
                        await say(c, f"k{n} c{c} m{i}")
                assert await asyncio.wait_for(proc.wait(), 60) == -signal.SIGKILL, point
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                for c in range(CHATS):  # while it is down
                    await say(c, f"k{n} c{c} while down")
        sending = len(_read(home, "SELECT id FROM inbox WHERE reply_state = 'sending'"))
        proc = await _start(home, platform)
        try:
            await wait_healthy(url, proc)
            await platform.ready()
            total = sum(len(v) for v in sent.values())
            for _ in range(1200):
                if _settled(home, platform, total):
                    break
                await asyncio.sleep(POLL_S)
            for _ in range(10):  # a duplicate would show up within these polls
                await asyncio.sleep(POLL_S)
            health = await _health(url)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await platform.stop()

    # stored exactly once, in the order each chat sent them, each with exactly one reply
    sessions = _sessions(home)
    for c in range(CHATS):
        expected = [pair for t in sent[c] for pair in (("user", t), ("assistant", f"echo: {t}"))]
        assert sessions.get(platform.chat_id(c)) == expected, (
            f"chat {c}: {sessions.get(platform.chat_id(c))}"
        )
    states = _read(home, "SELECT state, reply_state FROM inbox")
    assert len(states) == total and {s for s, _ in states} == {"answered"}
    unconfirmed = {
        r[0]
        for r in _read(
            home,
            "SELECT m.content FROM inbox i JOIN messages m "
            "ON m.id = i.reply_message_id "
            "WHERE i.reply_state = 'unconfirmed'",
        )
    }
    # what each chat shows
    for c in range(CHATS):
        replies = [f"echo: {t}" for t in sent[c]]
        shown = platform.shown(c)
        if platform.promise in ("exactly", "replayed"):
            assert shown == replies, f"chat {c}: {shown}"
        elif platform.promise == "at_most":
            missing = [r for r in replies if r not in shown]
            assert shown == [r for r in replies if r not in missing], f"chat {c}"
            assert set(missing) <= unconfirmed, f"chat {c}: lost replies {missing}"
        else:
            assert list(dict.fromkeys(shown)) == replies, f"chat {c}"
    print(
        f"\n{name}: {len(chain)} fault-point SIGKILLs ({killed_early} while recovering), "
        f"{total} messages stored and answered once, {len(unconfirmed)} replies unconfirmed"
    )
    if platform.promise in ("at_most", "replayed"):
        assert health["unsent_replies"] == sending  # the last start counted what it found
    else:
        assert unconfirmed == set() and health["unsent_replies"] == 0
