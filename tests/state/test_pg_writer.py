"""The PostgreSQL group-commit writer: one transaction per batch with a savepoint per
operation, errors that stay with their caller, cancellation, close, and a connection the
server drops (the batch is redone on a new one: nothing of it was committed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest

from state import SessionNotFound, WriterClosed, open_store
from state.pg.store import PgStore
from tests import pgserver


@pytest.fixture
async def pg(pg_dsn: str) -> AsyncIterator[PgStore]:
    name = pgserver.fresh_schema(pg_dsn)
    store = await open_store(
        {"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, name)}, "."
    )
    assert isinstance(store, PgStore)
    try:
        yield store
    finally:
        await store.close()
        pgserver.drop_schema(pg_dsn, name)


async def test_concurrent_writes_share_commits_and_a_failure_stays_with_its_caller(
    pg: PgStore,
) -> None:
    sid = await pg.create_session(source="api")
    before = pg.write_stats()
    results = await asyncio.gather(
        *(pg.append_message(sid, "user", f"m{i}") for i in range(50)),
        pg.append_message("no-such-session", "user", "lost"),
        pg.append_message(sid, "robot", "bad role"),
        return_exceptions=True,
    )
    ids = results[:50]
    assert all(isinstance(i, int) for i in ids) and ids == sorted(ids)  # queue order
    assert isinstance(results[50], SessionNotFound) and isinstance(results[51], ValueError)
    after = pg.write_stats()
    assert after.operations - before.operations == 52
    assert after.batches - before.batches < 52  # group commit: several writes per commit
    assert after.failed_operations - before.failed_operations == 2
    assert [m["content"] for m in await pg.get_messages(sid)] == [f"m{i}" for i in range(50)]
    assert (await pg.require_session(sid))["message_count"] == 50


async def test_a_cancelled_caller_does_not_break_the_writer(pg: PgStore) -> None:
    sid = await pg.create_session(source="api")
    task = asyncio.create_task(pg.append_message(sid, "user", "maybe"))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert await pg.append_message(sid, "user", "after") > 0
    assert (await pg.get_messages(sid))[-1]["content"] == "after"


async def test_close_runs_queued_writes_then_refuses_new_ones(pg: PgStore) -> None:
    sid = await pg.create_session(source="api")
    pending = [asyncio.create_task(pg.append_message(sid, "user", f"q{i}")) for i in range(20)]
    await asyncio.sleep(0)
    await pg.close()
    assert all(isinstance(i, int) for i in await asyncio.gather(*pending))
    with pytest.raises(WriterClosed):
        await pg.append_message(sid, "user", "late")


async def test_a_connection_the_server_drops_costs_no_write(pg: PgStore, pg_dsn: str) -> None:
    sid = await pg.create_session(source="api")
    writer_pid = pg._writer._conn.info.backend_pid  # type: ignore[union-attr]
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (writer_pid,))
    got = await asyncio.gather(*(pg.append_message(sid, "user", f"r{i}") for i in range(10)))
    assert all(isinstance(i, int) for i in got)
    assert pg._writer._conn.info.backend_pid != writer_pid  # type: ignore[union-attr]
    assert [m["content"] for m in await pg.get_messages(sid)] == [f"r{i}" for i in range(10)]
