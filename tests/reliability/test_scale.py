"""Size: a session with 100,000 messages and a store with 100,000 sessions still work, and
the agent sees its window, not the whole history."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.index import SessionIndex
from gateway.messages import InboundMessage
from gateway.pipeline import Router, RouterSettings
from gateway.session_keys import SessionSource
from state import SessionDB
from tests.gateway.conftest import Outbox, ScriptedAgent

N = 100_000


async def test_a_hundred_thousand_messages_in_one_session_and_sessions_in_the_store(
    tmp_path: Path,
) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    index = SessionIndex(tmp_path / "sessions.json", db, 0.5)
    await index.load()
    outbox, agent = Outbox(), ScriptedAgent()
    router = Router(db, index, agent, outbox.send, RouterSettings(history_messages=200))
    try:
        src = SessionSource("api", "big", "dm", "big")
        await router.handle(InboundMessage(src, "first", "p0"))
        await outbox.wait(1)
        sid = index.get("agent:main:api:dm:big").session_id  # type: ignore[union-attr]
        batch = [
            {
                "role": "user" if i % 2 == 0 else "assistant",
                "content": f"filler message {i} about nothing",
            }
            for i in range(2000)
        ]
        for _ in range(N // 2000):
            await db.append_messages(sid, batch)

        def many_sessions(conn):  # noqa: ANN001, ANN202 - one writer transaction, 100k rows
            now = time.time()
            conn.executemany(
                "INSERT INTO sessions(id, source, started_at, last_active, message_count) VALUES (?, 'api', ?, ?, 0)",
                [(f"20250101_000000_{i:08x}", now - i, now - i) for i in range(N)],
            )

        await db.writer.submit(many_sessions)
        await router.handle(InboundMessage(src, "still there?", "p1"))
        await outbox.wait(2, timeout=30)
        assert outbox.sent[-1].text == "echo: still there?"
        assert len(agent.seen[-1]) <= 200  # a window, not 100,002 messages
        assert agent.seen[-1][-1]["content"] == "still there?"
        assert await db.message_count(sid) == N + 4
        rows = await db.list_sessions(limit=20)
        assert len(rows) == 20  # speed is bench/state_bench.py's business, not a test's
        assert (await db.search_messages("still", limit=5))[0]["session_id"] == sid
        around = await db.get_messages_around(sid, (await db.get_messages(sid, last=1))[0]["id"], 3)
        assert len(around) == 4
    finally:
        await router.drain(10)
        await index.close()
        await db.close()
