"""A steady chat load through the HTTP API while the PostgreSQL server goes away and comes
back, as a platform would deliver it: every message carries an id, and an answer that is not
a 200 (a 503, a 409 `in_flight`, a dropped connection, a 10 s timeout) is delivered again
with the same id after a short pause. Shared by tests/cluster/test_pg_outage.py (which
asserts on what it records) and bench/pg_outage_bench.py (which prints it)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psycopg

REQUEST_TIMEOUT_S = 10.0


@dataclass
class Attempt:
    sent_at: float  # monotonic
    took_s: float
    status: int  # 0: no answer (dropped connection or timeout)
    code: str | None = None  # the error's code, e.g. storage_unavailable
    retry_after: str | None = None


@dataclass
class Message:
    chat: str
    mid: str
    text: str
    attempts: list[Attempt] = field(default_factory=list)
    reply: str | None = None  # the reply of the 200 that acknowledged it
    error: str | None = None  # that 200's `error` (e.g. "agent": the apology)

    @property
    def acked(self) -> bool:
        return self.reply is not None


@dataclass
class Outage:
    """What one run recorded: every message and every attempt, and the fault's times."""

    messages: list[Message] = field(default_factory=list)
    down_at: float = 0.0
    back_at: float = 0.0  # the server answers again (pg_ctl start returned)

    def attempts(self) -> list[Attempt]:
        return [a for m in self.messages for a in m.attempts]

    def statuses(self) -> Counter[str]:
        return Counter(f"{a.status} {a.code}" if a.code else str(a.status) for a in self.attempts())

    def during(self) -> list[Attempt]:
        """Attempts sent while the server was away."""
        return [a for a in self.attempts() if self.down_at <= a.sent_at < self.back_at]

    def first_answer_after_back(self) -> float | None:
        """Seconds from the server's return to the first 200 for a message sent after it."""
        oks = [
            a.sent_at + a.took_s
            for a in self.attempts()
            if a.status == 200 and a.sent_at >= self.back_at
        ]
        return min(oks) - self.back_at if oks else None


async def _deliver(
    http: aiohttp.ClientSession, url: str, msg: Message, stop_at: float, rng: random.Random
) -> None:
    while time.monotonic() < stop_at:
        sent = time.monotonic()
        status, code, retry_after, body = 0, None, None, None
        try:
            async with http.post(
                f"{url}/v1/messages",
                json={"chat_id": msg.chat, "text": msg.text, "message_id": msg.mid},
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            ) as resp:
                status, retry_after = resp.status, resp.headers.get("Retry-After")
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            status = 0 if body is None and status == 0 else status
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            code = body["error"].get("code")
        msg.attempts.append(Attempt(sent, time.monotonic() - sent, status, code, retry_after))
        if status == 200 and isinstance(body, dict):
            msg.reply, msg.error = body.get("reply"), body.get("error")
            return
        if status == 409 and code == "answered_elsewhere":
            return  # the platform side is told: nothing more to deliver
        await asyncio.sleep(rng.uniform(0.2, 0.5))


async def run(
    urls: Sequence[str],
    fault: Callable[[], Awaitable[None]],
    recover: Callable[[], Awaitable[None]],
    *,
    chats: int = 20,
    rate: float = 40.0,
    before_s: float = 4.0,
    down_s: float = 5.0,
    after_s: float = 8.0,
    seed: int = 1,
) -> Outage:
    """`chats` chats at `rate` messages/s in all (each chat waits for its previous message's
    answer), `fault()` after `before_s`, `recover()` `down_s` later, new messages for
    `after_s` more, then every message under way is delivered until acknowledged (30 s)."""
    out = Outage()
    rng = random.Random(seed)
    gap = chats / rate
    started = time.monotonic()
    new_until = started + before_s + down_s + after_s
    stop_at = new_until + 30.0

    async def chat(c: int) -> None:
        url = urls[c % len(urls)]
        i = 0
        await asyncio.sleep(rng.uniform(0, gap))
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < new_until:
                msg = Message(f"chat{c}", f"c{c}-m{i}", f"message {i} from chat {c}")
                out.messages.append(msg)
                began = time.monotonic()
                await _deliver(http, url, msg, stop_at, rng)
                i += 1
                await asyncio.sleep(max(0.0, gap - (time.monotonic() - began)))

    async def faults() -> None:
        await asyncio.sleep(before_s)
        out.down_at = time.monotonic()
        await fault()
        await asyncio.sleep(max(0.0, down_s - (time.monotonic() - out.down_at)))
        await recover()
        out.back_at = time.monotonic()

    await asyncio.gather(faults(), *(chat(c) for c in range(chats)))
    return out


def stored(dsn: str) -> tuple[Counter[str], dict[str, list[str]]]:
    """(user texts -> how often stored, user text -> the replies stored after it in its
    session, in order up to the next user message)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT session_id, role, content FROM messages ORDER BY session_id, id"
        ).fetchall()
    users: Counter[str] = Counter()
    replies: dict[str, list[str]] = {}
    last: str | None = None
    session = None
    for sid, role, content in rows:
        if sid != session:
            session, last = sid, None
        if role == "user":
            users[content] += 1
            replies.setdefault(content, [])
            last = content
        elif role == "assistant" and last is not None:
            replies[last].append(content)
    return users, replies
