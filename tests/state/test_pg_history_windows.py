"""The history windows the PostgreSQL writer keeps (state/pg/windows.py): used, and never
wrong when another replica, a terminal command or a late transaction changed the session
(two stores on one database stand for two replicas). tests/state/test_history_windows.py
holds both backends to a full read over random turns; these check what only a shared
database can do to a kept window.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from state import Store
from state.history import HistoryWindows
from state.pg.store import PgStore
from tests import pgserver
from tests.state.conftest import OpenStore
from tests.state.test_history_windows import _plain, _turn


@pytest.fixture
def backend() -> str:
    return "postgres"


def _windows(store: Store) -> HistoryWindows:
    assert isinstance(store, PgStore)
    conn = store._writer._conn  # the writer's connection carries the kept windows
    assert conn is not None
    windows = conn.windows  # type: ignore[attr-defined]
    assert isinstance(windows, HistoryWindows)
    return windows


def _dsn(store: Store) -> str:
    assert isinstance(store, PgStore)
    return str(store._dsn)


async def _whole(store: Store, sid: str, upto: str, last: int) -> list[tuple[str, Any]]:
    whole = _plain(await store.get_messages_as_conversation(sid))
    end = whole.index(("user", upto)) + 1
    return whole[max(0, end - last) : end]


async def test_the_kept_window_serves_the_next_turn_and_reads_only_what_is_new(
    open_test_store: OpenStore,
) -> None:
    store = await open_test_store()
    sid = await store.create_session(source="telegram", chat_id="c1")
    windows = _windows(store)
    for n in range(6):
        await _turn(store, sid, n, last=4)
    assert windows.hits == 5 and windows.misses == 1 and len(windows) == 1
    assert _plain(await _turn(store, sid, 6, last=4)) == await _whole(store, sid, "question 6", 4)


async def test_turns_alternating_between_two_replicas_read_each_others_messages(
    open_test_store: OpenStore,
) -> None:
    """A chat's messages land on either replica (a round-robin balancer): each replica's
    kept window is behind by the other's turns, and reads them as new (fewer than `last`
    of them: more would make the whole window new)."""
    a, b = await open_test_store(), await open_test_store()
    sid = await a.create_session(source="telegram", chat_id="c1")
    for n in range(12):
        store = (a, b, b, a, b)[n % 5]
        history = await _turn(store, sid, n, last=10)
        assert _plain(history) == await _whole(a, sid, f"question {n}", 10), n
    assert _windows(a).hits >= 3 and _windows(b).hits >= 5


async def test_messages_cleared_or_appended_by_another_replica_are_seen(
    open_test_store: OpenStore,
) -> None:
    a, b = await open_test_store(), await open_test_store()
    sid = await a.create_session(source="telegram", chat_id="c1")
    for n in range(3):
        await _turn(a, sid, n, last=10)
    await b.clear_messages(sid)  # /new's history wipe, or a terminal command
    assert _plain(await _turn(a, sid, 3, last=10)) == [("user", "question 3")]
    # a background job's messages, stored by the other replica without the key's lease
    await b.append_messages(
        sid,
        [
            {"role": "user", "content": "[background] q"},
            {"role": "assistant", "content": "[background] a"},
        ],
    )
    assert _plain(await _turn(a, sid, 4, last=10)) == [
        ("user", "question 3"),
        ("assistant", "answer 3"),
        ("user", "[background] q"),
        ("assistant", "[background] a"),
        ("user", "question 4"),
    ]


async def test_a_message_committed_late_with_an_older_id_is_seen(
    open_test_store: OpenStore,
) -> None:
    """Ids come from a sequence when a row is inserted, not when it commits: a transaction
    that drew its id before a turn and commits after it leaves a message behind the kept
    window's newest. The count check notices it and the session is read whole."""
    store = await open_test_store()
    sid = await store.create_session(source="telegram", chat_id="c1")
    await _turn(store, sid, 0, last=10)
    with psycopg.connect(_dsn(store), autocommit=True) as late:
        (early_id,) = late.execute(
            "SELECT nextval(pg_get_serial_sequence('messages', 'id'))"
        ).fetchone()  # type: ignore[misc]
        await _turn(store, sid, 1, last=10)  # its ids come after early_id
        with late.transaction():
            late.execute(
                "INSERT INTO messages (id, session_id, role, content, timestamp) "
                "VALUES (%s, %s, 'user', 'late', %s)",
                (early_id, sid, time.time()),
            )
            late.execute(
                "UPDATE sessions SET message_count = message_count + 1 WHERE id = %s", (sid,)
            )
    history = await _turn(store, sid, 2, last=10)
    assert _plain(history) == [
        ("user", "question 0"),
        ("assistant", "answer 0"),
        ("user", "late"),
        ("user", "question 1"),
        ("assistant", "answer 1"),
        ("user", "question 2"),
    ]
    assert _plain(history) == await _whole(store, sid, "question 2", 10)


async def test_a_deleted_session_recreated_is_read_whole(open_test_store: OpenStore) -> None:
    a, b = await open_test_store(), await open_test_store()
    sid = await a.create_session(source="telegram", chat_id="c1")
    for n in range(2):
        await _turn(a, sid, n, last=10)
    await b.delete_session(sid)
    again = await b.create_session(source="telegram", chat_id="c1", session_id=sid)
    assert again == sid
    assert _plain(await _turn(a, sid, 2, last=10)) == [("user", "question 2")]


async def test_a_failed_operation_forgets_the_windows(open_test_store: OpenStore) -> None:
    store = await open_test_store()
    assert isinstance(store, PgStore)
    sid = await store.create_session(source="telegram", chat_id="c1")
    await _turn(store, sid, 0, last=10)
    windows = _windows(store)
    assert len(windows) == 1

    async def boom(conn: psycopg.AsyncConnection) -> None:
        await conn.execute(b"SELECT 1 / 0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        await store._writer.submit(boom)
    assert len(windows) == 0
    assert _plain(await _turn(store, sid, 1, last=10)) == [
        ("user", "question 0"),
        ("assistant", "answer 0"),
        ("user", "question 1"),
    ]


async def test_the_history_reads_generic_plan_searches_each_sessions_rows_on_a_new_table(
    open_test_store: OpenStore,
) -> None:
    """The writer's history read, planned generically while the messages table has never
    been analyzed (a new store's first minute; the writer keeps that plan), searches each
    window in the (session, id) index: not a backward walk of the primary key through every
    session's rows, filtered by session; with the window's end given, or as its inbox row's
    message (a read in the append's round trip)."""
    from state.pg import db, windows

    store = await open_test_store()
    assert isinstance(store, PgStore)
    sids = [await store.create_session(source="api") for _ in range(50)]
    for r in range(10):
        for sid in sids:
            await store.append_messages(sid, [{"role": "user", "content": f"q{r}"}])
    sql, _names = db.numbered(windows._READ)

    async def plan(conn: psycopg.AsyncConnection[Any]) -> str:
        given = await pgserver.generic_plan(conn, sql, "'[[\"s\", 400, 0, null]]', 40")
        by_row = await pgserver.generic_plan(conn, sql, "'[[\"s\", null, 0, 7]]', 40")
        return given + "\n" + by_row

    found = await store._writer.submit(plan)
    assert found.count("Index Scan Backward using idx_messages_session_order on messages") == 2
    assert "using messages_pkey" not in found, found
    assert "Seq Scan on inbox" not in found, found
