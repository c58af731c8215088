"""Crash safety: SIGKILL the daemon at random moments under load (HTTP API clients and a
Telegram fake), restart, and check that nothing acknowledged was lost, nothing is damaged,
and every message ends answered exactly once, in order.

The HTTP API clients send each message with an Idempotency-Key and repeat one the kill cut
off after the restart, until it is answered: each key must end with exactly one stored
reply and one reply returned. Telegram (polling) redelivers what was not confirmed; a reply
it cannot vouch for is never sent twice: each message is answered at most once, the gaps
being exactly inbox rows left 'unconfirmed'. Each chat's messages and replies are stored
and shown in the order the chat sent them.

SWITCHBOARD_KILL_POINTS sets how many kills (20 by default; `pytest --long` makes it 100),
SWITCHBOARD_CRASH_SEED the random moments."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram

KILL_POINTS = int(os.environ.get("SWITCHBOARD_KILL_POINTS", "20"))
SEED = int(os.environ.get("SWITCHBOARD_CRASH_SEED", "20261129"))
FIGURES: dict[str, int] = {}
TELEGRAM_CHATS = (201, 202, 203)


async def start_daemon(home: Path, token: str = "") -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(TELEGRAM_BOT_TOKEN=token),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


def check_home(home: Path, acknowledged: list[str]) -> int:
    """The invariants after a crash (the daemon is not running). Returns messages checked."""
    conn = sqlite3.connect(home / "state.db")  # opening recovers the WAL, as a restart would
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.execute(
            "INSERT INTO sb_messages_fts(sb_messages_fts, rank) VALUES ('integrity-check', 1)"
        )
        conn.execute(
            "INSERT INTO messages_aux_fts(messages_aux_fts, rank) VALUES ('integrity-check', 1)"
        )
        users = {r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'user'")}
        replies = {
            r[0] for r in conn.execute("SELECT content FROM messages WHERE role = 'assistant'")
        }
        lost = [t for t in acknowledged if t not in users or f"echo: {t}" not in replies]
        assert lost == [], f"{len(lost)} acknowledged message(s) lost: {lost[:5]}"
        doubled = conn.execute(
            "SELECT session_key, COUNT(*) FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL "
            "GROUP BY session_key HAVING COUNT(*) > 1"
        ).fetchall()
        assert doubled == [], f"keys with two live sessions: {doubled}"
        index = home / "sessions" / "sessions.json"
        if index.exists():
            data = json.loads(index.read_text())  # parses: never torn
            known = {r[0] for r in conn.execute("SELECT id FROM sessions")}
            assert all(v["session_id"] in known for v in data.values())
        return len(acknowledged)
    finally:
        conn.close()


@dataclass
class Client:
    """An HTTP API client: one message after another, each with an Idempotency-Key; one a
    kill cut off is repeated with the same key after the restart until it is answered
    (a 409 'in_flight' while its recovered turn runs)."""

    name: str
    chat: str
    sent: list[str] = field(default_factory=list)  # keys, in order; the last may be open
    replies: dict[str, list[str]] = field(default_factory=dict)  # key -> replies returned

    async def run(self, http: aiohttp.ClientSession, url: str, attempts: int = 10**9) -> None:
        """Until the daemon is gone (or, with `attempts`, until the open key is answered)."""
        for _ in range(attempts):
            if not self.sent or self.sent[-1] in self.replies:
                if attempts < 10**9:
                    return
                self.sent.append(f"{self.name} m{len(self.sent)}")
            key = self.sent[-1]
            try:
                async with http.post(
                    f"{url}/v1/messages",
                    json={"chat_id": self.chat, "text": key},
                    headers={"Idempotency-Key": key},
                ) as r:
                    if r.status == 200:
                        self.replies.setdefault(key, []).append((await r.json())["reply"])
                        continue
                    assert r.status in (409, 503), (r.status, await r.text())
            except (TimeoutError, aiohttp.ClientError):
                if attempts == 10**9:
                    return
            await asyncio.sleep(0.02)

    def answered(self) -> list[str]:
        return [k for k in self.sent if k in self.replies]


def _read(home: Path, sql: str) -> list[tuple]:  # type: ignore[type-arg]
    conn = sqlite3.connect(home / "state.db")
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _settled(home: Path, fake: FakeTelegram, clients: list[Client]) -> bool:
    if fake.updates or any(c.sent[-1] not in c.replies for c in clients if c.sent):
        return False
    rows = _read(home, "SELECT state, reply_state FROM inbox")
    return all(s in ("answered", "dropped") and r not in ("ready", "sending") for s, r in rows)


@pytest.mark.timeout(max(600, 15 * KILL_POINTS))  # a kill and restart take 2-5 s on 2 cores
async def test_sigkill_under_load_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    fake = FakeTelegram()
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
        "sessions:\n  index_flush_seconds: 0.3\n"
    )
    url = f"http://127.0.0.1:{port}"
    clients = [Client(f"c{c}", f"chat{c % 3}") for c in range(4)]  # two share chat0
    pushed: dict[int, list[str]] = {chat: [] for chat in TELEGRAM_CHATS}
    checked = 0

    async def telegram_user(point: int) -> None:
        for i in range(10_000):
            chat = TELEGRAM_CHATS[i % len(TELEGRAM_CHATS)]
            text = f"k{point} t{chat} m{i}"
            pushed[chat].append(text)
            fake.push(fake.message(text, fake.dm_chat(chat), user_id=chat))
            await asyncio.sleep(0.01)

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for point in range(KILL_POINTS):
                proc = await start_daemon(home, fake.token)
                await wait_healthy(url, proc)
                load = [asyncio.create_task(c.run(http, url)) for c in clients]
                user = asyncio.create_task(telegram_user(point))
                await asyncio.sleep(rng.uniform(0.05, 0.8))
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                user.cancel()
                await asyncio.gather(*load, user, return_exceptions=True)
                for task in load:
                    assert task.exception() is None, task.exception()
                checked = check_home(home, [k for c in clients for k in c.answered()])
            # the last restart: it answers what was left, and its index agrees with state.db
            sending = len(_read(home, "SELECT id FROM inbox WHERE reply_state = 'sending'"))
            proc = await start_daemon(home, fake.token)
            try:
                await wait_healthy(url, proc)
                await asyncio.gather(*(c.run(http, url, attempts=1500) for c in clients))
                for _ in range(600):
                    if _settled(home, fake, clients):
                        break
                    await asyncio.sleep(0.05)
                for _ in range(10):  # a second reply would show up within these polls
                    await asyncio.sleep(0.05)
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "chat0", "text": "after the crashes"}
                ) as r:
                    assert (await r.json())["reply"] == "echo: after the crashes"
                async with http.get(f"{url}/health") as r:
                    health = await r.json()
            finally:
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        await fake.stop()
    answered = [k for c in clients for k in c.answered()]
    check_home(home, answered + ["after the crashes"])
    conn = sqlite3.connect(home / "state.db")
    live = dict(
        conn.execute(
            "SELECT session_key, id FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL"
        )
    )
    conn.close()
    index = {
        k: v["session_id"]
        for k, v in json.loads((home / "sessions" / "sessions.json").read_text()).items()
    }
    assert index == live
    assert checked > 50  # the load really ran
    stored: dict[str, list[tuple[str, str]]] = {}
    for chat, role, content in _read(
        home,
        "SELECT s.chat_id, m.role, m.content FROM messages m "
        "JOIN sessions s ON s.id = m.session_id ORDER BY m.id",
    ):
        stored.setdefault(chat, []).append((role, content))
    assert {s for (s,) in _read(home, "SELECT state FROM inbox")} == {"answered"}

    # HTTP API: every key ended with one reply returned, its own, and one stored exchange;
    # each chat's exchanges are whole (a reply right after its message) and each client's
    # messages are stored in the order it sent them
    for c in clients:
        assert c.answered() == c.sent and all(c.replies[k] == [f"echo: {k}"] for k in c.sent)
    for chat in ("chat0", "chat1", "chat2"):
        pairs = stored[chat]
        if chat == "chat0":
            pairs = pairs[:-2]  # "after the crashes"
        users = [t for role, t in pairs[0::2]]
        assert pairs == [p for t in users for p in (("user", t), ("assistant", f"echo: {t}"))]
        mine = [c for c in clients if c.chat == chat]
        assert sorted(users) == sorted(k for c in mine for k in c.sent)  # each exactly once
        for c in mine:
            assert [t for t in users if t.startswith(f"{c.name} ")] == c.sent

    # Telegram: every pushed message stored once, in order, with its reply; the chat shows
    # each reply at most once and in order, missing only replies left 'unconfirmed'
    unconfirmed = {
        r
        for (r,) in _read(
            home,
            "SELECT m.content FROM inbox i JOIN messages m "
            "ON m.id = i.reply_message_id "
            "WHERE i.reply_state = 'unconfirmed'",
        )
    }
    shown_total = 0
    for chat, texts in pushed.items():
        assert stored[str(chat)] == [
            p for t in texts for p in (("user", t), ("assistant", f"echo: {t}"))
        ]
        replies = [f"echo: {t}" for t in texts]
        shown = [m["text"] for m in fake.sent() if str(m["chat_id"]) == str(chat)]
        assert shown == [r for r in replies if r in shown], f"chat {chat}: out of order or twice"
        missing = set(replies) - set(shown)
        assert missing <= unconfirmed, f"chat {chat}: replies lost: {sorted(missing)[:5]}"
        shown_total += len(shown)
    assert health["unsent_replies"] == sending  # what the last start found unconfirmed
    telegram = sum(len(t) for t in pushed.values())
    FIGURES.update(kill_points=KILL_POINTS, messages_checked=checked + telegram)
    print(
        f"\nreliability: survived {KILL_POINTS} SIGKILLs; {len(answered)} HTTP API keys answered "
        f"once each; {telegram} Telegram messages stored once, {shown_total} replies shown, "
        f"{len(unconfirmed)} unconfirmed"
    )
