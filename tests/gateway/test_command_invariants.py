"""Random sequences of commands and messages keep the store's invariants."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.index import SessionIndex
from gateway.messages import InboundMessage
from gateway.pipeline import Router
from gateway.session_keys import SessionSource
from gateway.sessions import CompressionSettings
from state import SessionDB

from .conftest import Outbox, ScriptedAgent

CHATS = [
    SessionSource("telegram", "1", "dm", "1", "Ann"),
    SessionSource("telegram", "2", "dm", "2", "Bob"),
    SessionSource("telegram", "-9", "group", "1", "Ann"),
    SessionSource("telegram", "-9", "group", "2", "Bob"),
]
TITLES = ["alpha", "Alpha", "alpha #2", "beta", "x" * 120, "\u200b"]
ACTIONS = st.one_of(
    st.just("hello there"),
    st.sampled_from(TITLES).map(lambda t: f"/title {t}"),
    st.sampled_from(["", *TITLES]).map(lambda t: f"/new {t}".strip()),
    st.sampled_from(["", "1", "2", "alpha", "beta", "alpha #2"]).map(
        lambda t: f"/resume {t}".strip()
    ),
    st.sampled_from(["", "alpha", "beta"]).map(lambda t: f"/branch {t}".strip()),
    st.just("/compress"),
    st.just("/sessions"),
    st.just("/search hello"),
)


async def _run(steps: list[tuple[int, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = await SessionDB.open(Path(tmp) / "state.db")
        index = SessionIndex(Path(tmp) / "sessions.json", db, 0.05)
        await index.load()
        outbox = Outbox()
        router = Router(db, index, ScriptedAgent(), outbox.send)
        router.sessions.compression = CompressionSettings(keep_last=2)
        try:
            for n, (chat, text) in enumerate(steps, 1):
                await router.handle(InboundMessage(CHATS[chat], text, f"m{n}"))
                await outbox.wait(n, timeout=10)
            await router.drain(10)
            await _check(db, index)
        finally:
            await index.close()
            await db.close()


async def _check(db: SessionDB, index: SessionIndex) -> None:
    def facts(conn):  # noqa: ANN001, ANN202
        live = conn.execute(
            "SELECT session_key, id FROM sessions WHERE ended_at IS NULL AND session_key IS NOT NULL"
        ).fetchall()
        no_reason = conn.execute(
            "SELECT COUNT(*) FROM sessions WHERE ended_at IS NOT NULL AND end_reason IS NULL"
        ).fetchone()[0]
        dup_titles = conn.execute(
            "SELECT COUNT(*) FROM (SELECT title_key FROM sessions WHERE title_key IS NOT NULL GROUP BY title_key HAVING COUNT(*) > 1)"
        ).fetchone()[0]
        bad_counts = conn.execute(
            "SELECT COUNT(*) FROM sessions s WHERE COALESCE(s.message_count, 0) != (SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id)"
        ).fetchone()[0]
        return live, no_reason, dup_titles, bad_counts

    live, no_reason, dup_titles, bad_counts = await db._read(facts)
    by_key: dict[str, list[str]] = {}
    for key, sid in live:
        by_key.setdefault(key, []).append(sid)
    index_map = {k: e.session_id for k, e in index.items()}
    assert {k: [v] for k, v in index_map.items()} == by_key  # exactly one live session per key
    assert no_reason == 0
    assert dup_titles == 0
    assert bad_counts == 0


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(CHATS) - 1), ACTIONS), min_size=1, max_size=25))
def test_random_command_sequences_keep_the_invariants(steps: list[tuple[int, str]]) -> None:
    asyncio.run(_run(steps))
