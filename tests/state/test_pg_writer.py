"""The PostgreSQL group-commit writer: one transaction per batch with a savepoint per
operation, errors that stay with their caller, cancellation, close, and a connection the
server drops (the batch is redone on a new one: nothing of it was committed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from state import SessionNotFound, WriterClosed, open_store
from state.pg.store import PgStore
from state.pg.writer import register_batched
from tests import pgserver

T = TypeVar("T")


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


async def test_merged_appends_return_the_ids_the_rows_really_got(pg: PgStore) -> None:
    sids = [await pg.create_session(source="api") for _ in range(5)]
    results = await asyncio.gather(
        *(
            pg.append_messages(
                sids[i % 5],
                [
                    {"role": "user", "content": f"c{i} a"},
                    {"role": "assistant", "content": f"c{i} b"},
                ],
            )
            for i in range(100)
        )
    )
    for i, ids in enumerate(results):
        rows = await pg.get_messages_around(sids[i % 5], ids[0], 0)
        assert [r["content"] for r in rows] == [f"c{i} a"]
        rows = await pg.get_messages_around(sids[i % 5], ids[1], 0)
        assert [r["content"] for r in rows] == [f"c{i} b"]
    assert {(await pg.require_session(s))["message_count"] for s in sids} == {40}
    assert max(pg._writer.stats.batch_sizes) > 1
    assert pg._writer.stats.fallbacks == 0  # the merged path handled every batch


async def test_merged_appends_claim_platform_ids_under_their_sessions_chats(pg: PgStore) -> None:
    """A merged run of appends without `dedupe` claims its rows' platform ids under their
    sessions' chats (none for a session without a chat); a run with a session that is not
    there writes nothing for it and fails only that caller."""
    a = await pg.create_session(source="telegram", chat_id="ca")
    b = await pg.create_session(source="api")  # no chat: its platform ids are not claimed
    results = await asyncio.gather(
        pg.append_messages(
            a,
            [
                {"role": "user", "content": "x", "platform_message_id": "p1"},
                {"role": "assistant", "content": "y"},
            ],
        ),
        pg.append_messages(b, [{"role": "user", "content": "z", "platform_message_id": "p2"}]),
        pg.append_messages(a, [{"role": "user", "content": "w", "platform_message_id": "p3"}]),
    )
    assert [len(r) for r in results] == [2, 1, 1]
    assert pg._writer.stats.fallbacks == 0 and max(pg._writer.stats.batch_sizes) > 1
    async with pg._pool.connection() as conn:
        cur = await conn.execute(
            "SELECT source, chat_id, platform_message_id, message_id "
            "FROM platform_messages ORDER BY platform_message_id"
        )
        assert await cur.fetchall() == [
            ("telegram", "ca", "p1", results[0][0]),
            ("telegram", "ca", "p3", results[2][0]),
        ]

    got = await asyncio.gather(
        pg.append_messages(a, [{"role": "user", "content": "v"}]),
        pg.append_messages("no-such-session", [{"role": "user", "content": "lost"}]),
        return_exceptions=True,
    )
    assert isinstance(got[1], SessionNotFound) and len(got[0]) == 1  # type: ignore[arg-type]
    assert [(await pg.require_session(s))["message_count"] for s in (a, b)] == [4, 1]
    async with pg._pool.connection() as conn:
        cur = await conn.execute("SELECT count(*) FROM messages WHERE content = 'lost'")
        assert (await cur.fetchone()) == (0,)


async def test_merged_appends_dedupe_and_count_tokens(pg: PgStore) -> None:
    sid = await pg.create_session(source="telegram", chat_id="c1")
    msg = {"role": "user", "content": "hi", "platform_message_id": "p1"}
    calls = [pg.append_messages(sid, [msg], dedupe=("telegram", "c1")) for _ in range(3)]
    calls += [
        pg.append_messages(
            sid, [{"role": "assistant", "content": "r"}], input_tokens=2, output_tokens=3
        )
        for _ in range(4)
    ]
    results = await asyncio.gather(*calls)
    assert sum(1 for r in results[:3] if r) == 1
    assert all(len(r) == 1 for r in results[3:])
    row = await pg.require_session(sid)
    assert (row["message_count"], row["input_tokens"], row["output_tokens"]) == (5, 8, 12)
    assert await pg.append_messages(sid, [msg], dedupe=("telegram", "c1")) == []
    assert await pg.has_platform_message("telegram", "c1", "p1")
    assert pg._writer.stats.fallbacks == 0


async def test_tokens_without_messages_count_like_update_token_counts(pg: PgStore) -> None:
    """Tokens that come with an append of no messages, merged with another session's
    append (append_many's `rest`: add_tokens_many), reach the session's totals and a usage
    row on the session's billing route, as update_token_counts with the same counts does."""
    found = []
    other = await pg.create_session(source="telegram", chat_id="other")
    for how in ("append", "direct"):
        sid = await pg.create_session(source="telegram", chat_id=f"c-{how}", model="m1")
        await pg.update_token_counts(sid, input_tokens=1, billing_provider="p", api_call_count=1)
        if how == "append":
            got = await asyncio.gather(
                pg.append_messages(other, [{"role": "user", "content": "hi"}]),
                pg.append_messages(sid, [], input_tokens=4, output_tokens=6),
            )
            assert got[1] == []
            assert max(pg._writer.stats.batch_sizes) > 1  # they did share a commit
        else:
            await pg.update_token_counts(sid, input_tokens=4, output_tokens=6)
        row = await pg.require_session(sid)
        async with pg._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT model, billing_provider, input_tokens, output_tokens, api_call_count "
                "FROM session_model_usage WHERE session_id = %s ORDER BY 1, 2",
                (sid,),
            )
            usage = [tuple(r) for r in await cur.fetchall()]
        found.append(((row["input_tokens"], row["output_tokens"]), usage))
    assert found[0] == found[1]
    assert found[0] == ((5, 6), [("m1", "p", 5, 6, 1)])
    assert pg._writer.stats.fallbacks == 0


async def test_append_and_read_returns_the_history_of_its_own_transaction(pg: PgStore) -> None:
    a = await pg.create_session(source="telegram", chat_id="ca")
    b = await pg.create_session(source="telegram", chat_id="cb")
    await pg.append_messages(
        a, [{"role": "user", "content": "old"}, {"role": "assistant", "content": "reply"}]
    )

    def turn(sid: str, text: str, chat: str | None, last: int | None) -> object:
        msg = {"role": "user", "content": text, **({"platform_message_id": "1"} if chat else {})}
        return pg.append_and_read(
            sid, [msg], dedupe=("telegram", chat) if chat else None, last=last
        )

    (ids_a, hist_a), (ids_b, hist_b), (ids_dup, hist_dup), (_, hist_later) = await asyncio.gather(
        turn(a, "new a", "ca", 2),
        turn(b, "new b", "cb", 10),
        turn(a, "again", "ca", 2),
        turn(a, "later a", None, 3),
    )
    assert max(pg._writer.stats.batch_sizes) == 4  # all four merged into one batch
    assert len(ids_a) == 1 and [m["content"] for m in hist_a] == ["reply", "new a"]
    assert [m["content"] for m in hist_later] == ["reply", "new a", "later a"]
    assert len(ids_b) == 1 and hist_b == [{"role": "user", "content": "new b"}]
    assert (ids_dup, hist_dup) == ([], [])
    assert pg._writer.stats.fallbacks == 0


async def test_reads_survive_the_server_dropping_pooled_connections(
    pg: PgStore, pg_dsn: str
) -> None:
    sid = await pg.create_session(source="api", title="still here")

    async def pid(conn: psycopg.AsyncConnection) -> int:
        await asyncio.sleep(0.05)  # hold the connection so the others take their own
        return conn.info.backend_pid

    pids = set(await asyncio.gather(*(pg._read(pid) for _ in range(8))))
    assert len(pids) > 1
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        for p in pids:  # only this store's pooled connections
            admin.execute("SELECT pg_terminate_backend(%s)", (p,))
    rows = await asyncio.gather(*(pg.get_session(sid) for _ in range(8)))
    assert all(r is not None and r["title"] == "still here" for r in rows)


async def test_batched_turn_tokens_account_like_one_call_at_a_time(pg_dsn: str) -> None:
    """Appends with tokens that reach the writer together (the merged path: one session
    update, one usage insert) leave the same session totals and usage rows as the same
    appends made one at a time (update_token_counts per call), NULL totals included."""
    results = []
    for mode in ("one", "batched"):
        name = pgserver.fresh_schema(pg_dsn)
        dsn = pgserver.with_schema(pg_dsn, name)
        store = await open_store({"backend": "postgres", "dsn": dsn}, ".")
        assert isinstance(store, PgStore)
        try:
            plain = await store.create_session(session_id="plain", source="telegram")
            routed = await store.create_session(session_id="routed", source="telegram", model="m1")
            await store.update_token_counts(
                routed, input_tokens=1, billing_provider="p", api_call_count=1
            )
            calls = [
                (sid, [{"role": "assistant", "content": f"r{i}"}], i + 1, 2 * i)
                for i, sid in enumerate([plain, routed, plain, routed, plain])
            ] + [(routed, [], 7, 0)]  # tokens without a message
            if mode == "one":
                for sid, batch, tin, tout in calls:
                    await store.append_messages(sid, batch, input_tokens=tin, output_tokens=tout)
            else:
                await asyncio.gather(
                    *(
                        store.append_messages(sid, batch, input_tokens=tin, output_tokens=tout)
                        for sid, batch, tin, tout in calls
                    )
                )
                assert max(store._writer.stats.batch_sizes) > 1  # they did share commits
                assert store._writer.stats.fallbacks == 0
        finally:
            await store.close()
        with psycopg.connect(dsn) as conn:
            sessions = conn.execute(
                "SELECT id, message_count, input_tokens, output_tokens, cache_read_tokens, "
                "cache_write_tokens, reasoning_tokens, api_call_count, estimated_cost_usd, model, "
                "billing_provider FROM sessions ORDER BY id"
            ).fetchall()
            usage = conn.execute(
                "SELECT session_id, model, billing_provider, task, api_call_count, input_tokens, "
                "output_tokens, cache_read_tokens, estimated_cost_usd, actual_cost_usd, "
                "cost_status FROM session_model_usage ORDER BY 1, 2, 3"
            ).fetchall()
        pgserver.drop_schema(pg_dsn, name)
        results.append((sessions, usage))
    assert results[0] == results[1]
    assert results[1][0][0][:3] == ("plain", 3, 1 + 3 + 5)


# Three batchable kinds of operation for the placement test: where each kind runs in a
# batch (registered like the store's own: turn writes first, reply marks last).
_RAN: list[str] = []


async def _first(conn: object, tag: str) -> str:
    return (await _firsts(conn, [(tag,)]))[0]


async def _firsts(conn: object, calls: list[tuple[str, ...]]) -> list[str]:
    _RAN.append("first " + ",".join(c[0] for c in calls))
    return [f"F{c[0]}" for c in calls]


async def _plain(conn: object, tag: str) -> str:
    return (await _plains(conn, [(tag,)]))[0]


async def _plains(conn: object, calls: list[tuple[str, ...]]) -> list[str]:
    _RAN.append("plain " + ",".join(c[0] for c in calls))
    return [f"P{c[0]}" for c in calls]


async def _last(conn: object, tag: str) -> str:
    return (await _lasts(conn, [(tag,)]))[0]


async def _lasts(conn: object, calls: list[tuple[str, ...]]) -> list[str]:
    _RAN.append("last " + ",".join(c[0] for c in calls))
    return [f"L{c[0]}" for c in calls]


register_batched(_first, _firsts, place=-1)
register_batched(_plain, _plains)
register_batched(_last, _lasts, place=1)


async def test_placed_operations_run_first_or_last_merged_and_answer_their_own_callers(
    pg: PgStore,
) -> None:
    """A batch queued as plain, last, first, plain, first, last runs the firsts (merged),
    then the plains, then the lasts, and every caller gets its own call's result."""
    writer = pg._writer
    _RAN.clear()
    before = pg.write_stats()
    calls = [
        (_plain, "p1"),
        (_last, "l1"),
        (_first, "f1"),
        (_plain, "p2"),
        (_first, "f2"),
        (_last, "l2"),
    ]
    got = await asyncio.gather(*(writer.submit(fn, tag) for fn, tag in calls))
    assert pg.write_stats().batches - before.batches == 1  # one batch, as queued together
    assert got == ["Pp1", "Ll1", "Ff1", "Pp2", "Ff2", "Ll2"]
    assert _RAN == ["first f1,f2", "plain p1,p2", "last l1,l2"]


@pytest.mark.slow
async def test_a_lingering_commit_takes_what_comes_while_it_waits(pg: PgStore) -> None:
    """`linger` (set while other replicas are live): a batch waits after its first
    operation, so one queued a moment later shares its commit; without it, the first
    commits on its own. (The gap, 50 ms, is far inside the 2 s linger.)"""
    sid = await pg.create_session(source="api")

    async def two_apart() -> tuple[int, int]:
        before = pg.write_stats()
        first = asyncio.create_task(pg.append_message(sid, "user", "first"))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(pg.append_message(sid, "user", "second"))
        await asyncio.gather(first, second)
        after = pg.write_stats()
        return after.batches - before.batches, after.last_batch_size

    assert await two_apart() == (2, 1)
    pg.linger(2.0)
    assert await two_apart() == (1, 2)
    pg.linger(0.0)
    assert await two_apart() == (2, 1)
    assert [m["content"] for m in await pg.get_messages(sid)] == ["first", "second"] * 3


async def test_a_platform_id_another_writer_claims_mid_append_redoes_it_as_a_duplicate(
    pg_dsn: str,
) -> None:
    """The merged append's probe does not see a platform id another transaction is storing;
    its claim then waits for that transaction, finds the id taken, and the batch is redone
    one by one, where the append is a duplicate: nothing stored, no count moved."""
    name = pgserver.fresh_schema(pg_dsn)
    dsn = pgserver.with_schema(pg_dsn, name)
    store = await open_store({"backend": "postgres", "dsn": dsn}, ".")
    assert isinstance(store, PgStore)
    other = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        sid = await store.create_session(source="telegram", chat_id="c1")
        (mid,) = await store.append_messages(sid, [{"role": "user", "content": "first"}])
        await other.execute("BEGIN")
        await other.execute(
            "INSERT INTO platform_messages VALUES ('telegram', 'c1', 'p9', %s)", (mid,)
        )
        msg = {"role": "user", "content": "again", "platform_message_id": "p9"}
        # two appends queued together: one batch, which the merged path takes
        task = asyncio.ensure_future(
            asyncio.gather(
                store.append_messages(sid, [msg], dedupe=("telegram", "c1")),
                store.append_messages(sid, [{"role": "assistant", "content": "reply"}]),
            )
        )
        writer_pid = store._writer._conn.info.backend_pid  # type: ignore[union-attr]
        # until the writer's claim waits for the other's row
        await pgserver.until_waiting_on_a_lock(other, writer_pid, task)
        assert not task.done()
        await other.execute("COMMIT")
        dup, other_ids = await asyncio.wait_for(task, 10)
        assert dup == [] and len(other_ids) == 1
        assert await store.message_count(sid) == 2  # "first" and the reply, not "again"
        assert store._writer.stats.fallbacks == 1  # the merged path gave the batch up
        assert max(store._writer.stats.batch_sizes) == 2
        assert await store.has_platform_message("telegram", "c1", "p9")
    finally:
        await other.close()
        await store.close()
        pgserver.drop_schema(pg_dsn, name)


async def test_a_merged_append_locks_its_sessions_in_id_order(pg_dsn: str) -> None:
    """The merged append's one statement takes its sessions' row locks in id order: while
    another transaction holds the middle session, the writer holds the first and waits,
    the last still free (so two writers appending to the same sessions cannot deadlock);
    once the other commits, every append lands and the counts add up."""
    name = pgserver.fresh_schema(pg_dsn)
    dsn = pgserver.with_schema(pg_dsn, name)
    store = await open_store({"backend": "postgres", "dsn": dsn}, ".")
    assert isinstance(store, PgStore)
    other = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    probe = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        first, middle, last = sorted([await store.create_session(source="api") for _ in range(3)])
        await other.execute("BEGIN")
        await other.execute("SELECT 1 FROM sessions WHERE id = %s FOR UPDATE", (middle,))
        task = asyncio.ensure_future(
            asyncio.gather(
                *(
                    store.append_messages(sid, [{"role": "user", "content": f"to {sid}"}])
                    for sid in (last, middle, first)  # queued against the id order
                )
            )
        )
        writer_pid = store._writer._conn.info.backend_pid  # type: ignore[union-attr]
        await pgserver.until_waiting_on_a_lock(other, writer_pid, task)
        assert not task.done()
        held = []
        for sid in (first, last):
            await probe.execute("BEGIN")
            try:
                await probe.execute(
                    "SELECT 1 FROM sessions WHERE id = %s FOR UPDATE NOWAIT", (sid,)
                )
                held.append(False)
            except psycopg.errors.LockNotAvailable:
                held.append(True)
            await probe.execute("ROLLBACK")
        assert held == [True, False]
        await other.execute("COMMIT")
        got = await asyncio.wait_for(task, 10)
        assert [len(ids) for ids in got] == [1, 1, 1]
        assert [await store.message_count(s) for s in (first, middle, last)] == [1, 1, 1]
        assert store._writer.stats.fallbacks == 0 and store._writer.stats.busy_retries == 0
    finally:
        await probe.close()
        await other.close()
        await store.close()
        pgserver.drop_schema(pg_dsn, name)


async def test_the_writers_generic_plan_probes_routes_by_key_not_by_a_scan(pg: PgStore) -> None:
    """The writer's connection plans once per statement (plan_cache_mode) and prices a page
    read as memory does (random_page_cost): the lease take's generic plan probes the routes'
    primary key for its keys instead of reading and hashing the whole table. 2,000 routes:
    under the default random_page_cost (4) the plan scans them (tried)."""
    from state.pg import cluster

    take = f"WITH {cluster._take_ctes('$1::text[]')} SELECT session_key FROM taken".replace(
        "%(me)s", "$2"
    ).replace("%(space)s", "$3")

    async def plan(conn: psycopg.AsyncConnection) -> str:
        await conn.execute(
            "INSERT INTO session_routes (session_key, lease_owner, lease_epoch) "
            "SELECT 'k' || g, NULL, 0 FROM generate_series(1, 2000) AS g"
        )
        await conn.execute("ANALYZE session_routes")
        return await pgserver.generic_plan(
            conn, take.encode(), "'{k1,k2,k3}', 7, 0", "(text[], bigint, bigint)"
        )

    found = await pg._writer.submit(plan)
    assert "session_routes_pkey" in found
    assert "Seq Scan on session_routes" not in found


async def test_the_appends_generic_plan_probes_sessions_by_id_on_a_new_table(
    pg: PgStore,
) -> None:
    """The merged append's generic plan, made while the sessions table is new, small and
    never analyzed (a new store's first minute, before autovacuum's first ANALYZE; the
    writer keeps that plan as the table grows), updates the sessions through their primary
    key, not through a scan of every session at each batch; with the turns' inbox update
    in it, the inbox rows through theirs."""
    from state.pg import appends, db, inbox

    sql, _names = db.numbered(appends._rows(inbox._TURN_ROWS_AT))

    async def plan(conn: psycopg.AsyncConnection) -> str:
        await conn.execute(
            "INSERT INTO sessions (id, source, started_at) "
            "SELECT 's' || g, 'api', 0 FROM generate_series(1, 20) AS g"
        )
        return await pgserver.generic_plan(
            conn, sql, "'{s1,s2}', 1, '[]', '[]', '[]', '{s1,s2}', 0, 0, 0, '[]'"
        )

    found = await pg._writer.submit(plan)
    assert "Update on sessions" in found and "Update on inbox" in found
    assert "Seq Scan on sessions" not in found and "Seq Scan on inbox" not in found


async def test_a_leases_take_and_release_update_its_route_in_place(pg: PgStore) -> None:
    """Every turn takes and frees its key's lease: both updates of the route are HOT (no
    index entry written), so no index covers the lease's columns."""
    from state import Fence
    from state.pg import cluster

    async def cycle(conn: psycopg.AsyncConnection) -> tuple[int, int]:
        for _ in range(3):
            row = await cluster.take_lease(conn, "agent:main:api:dm:c1", 1, 0)
            assert row is not None
            fence = Fence("agent:main:api:dm:c1", 1, int(row["lease_epoch"]))
            assert await cluster.release_lease(conn, fence, None, [])
        cur = await conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
            "WHERE relname = 'session_routes' AND schemaname = current_schema()"
        )
        found = await cur.fetchone()
        assert found is not None
        return int(found[0]), int(found[1])

    updated, hot = await pg._writer.submit(cycle)
    assert updated == 5  # the first take inserts the route; then release, take, ... release
    assert hot == updated


async def test_a_replicas_turn_begins_in_three_round_trips_and_ends_in_two(pg: PgStore) -> None:
    """A replica's turn through the writer, its statements prepared: the accept that takes
    the key and begins the turn is three round trips (the BEGIN with the accept, the take
    and the open rows; the append with the inbox's update and the history read; COMMIT),
    the end that frees the lease two (the BEGIN with the release and the append with the
    inbox's update; COMMIT), by libpq's protocol trace of the writer's connection. What
    they wrote is a turn's: the histories, the rows started then answered with the
    messages' ids, the lease free."""
    import tempfile

    from psycopg import pq

    from state import BeginPlan, Fence

    key = "agent:main:api:dm:c1"
    sid = await pg.create_session("s1", "api")

    async def turn(n: int) -> tuple[Any, list[int]]:
        accepted = await pg.accept_and_take(
            "api",
            "c1",
            f"m{n}",
            {"text": f"q{n}"},
            session_key=key,
            me=1,
            space=0,
            begin=BeginPlan({"role": "user", "content": f"q{n}"}, 200, lambda _r, _i: sid),
        )
        assert accepted.new and accepted.route is not None and accepted.begun is not None
        fence = Fence(key, 1, int(accepted.route["lease_epoch"]))
        reply = [{"role": "assistant", "content": f"a{n}"}]
        ids = await pg.end_turn(accepted.inbox_id, sid, reply, fence=fence, release=(None, []))
        return accepted, ids

    for n in range(6):  # each statement prepared (after five runs)
        await turn(n)

    async def traced(step: Callable[[], Awaitable[T]]) -> tuple[T, tuple[int, int]]:
        with tempfile.TemporaryFile("w+") as fh:

            async def on(conn: psycopg.AsyncConnection) -> None:
                conn.pgconn.trace(fh.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

            async def off(conn: psycopg.AsyncConnection) -> None:
                conn.pgconn.untrace()

            await pg._writer.submit(on)
            got = await step()
            await pg._writer.submit(off)
            fh.seek(0)
            return got, pgserver.round_trips_and_begins(fh.read())

    accepted, begun_trips = await traced(
        lambda: pg.accept_and_take(
            "api",
            "c1",
            "m6",
            {"text": "q6"},
            session_key=key,
            me=1,
            space=0,
            begin=BeginPlan({"role": "user", "content": "q6"}, 200, lambda _r, _i: sid),
        )
    )
    assert begun_trips == (3, 1)
    assert accepted.route is not None and accepted.begun is not None
    mid, history = accepted.begun
    assert [m["content"] for m in history][-3:] == ["q5", "a5", "q6"]
    assert len(history) == 13
    fence = Fence(key, 1, int(accepted.route["lease_epoch"]))
    ids, ended_trips = await traced(
        lambda: pg.end_turn(
            accepted.inbox_id,
            sid,
            [{"role": "assistant", "content": "a6"}],
            fence=fence,
            release=(None, []),
        )
    )
    assert ended_trips == (2, 1)
    assert len(ids) == 1 and ids[0] > mid

    async def read(conn: psycopg.AsyncConnection) -> list[Any]:
        cur = await conn.execute(
            "SELECT state, session_id, message_id, reply_message_id, runner FROM inbox "
            "WHERE id = %s",
            (accepted.inbox_id,),
        )
        row = await cur.fetchone()
        cur = await conn.execute(
            "SELECT lease_owner FROM session_routes WHERE session_key = %s", (key,)
        )
        route = await cur.fetchone()
        return [row, route]

    row, route = await pg._writer.submit(read)
    assert row == ("answered", sid, mid, ids[0], 1)
    assert route == (None,)
    stored = await pg.get_messages(sid)
    assert [(m["id"], m["content"]) for m in stored[-2:]] == [(mid, "q6"), (ids[0], "a6")]


async def test_one_round_trip_writes_a_rerun_a_new_begin_and_an_empty_end_together(
    pg: PgStore,
) -> None:
    """A batch whose append carries its inbox update: a turn run again (its message stored
    before: not stored twice, the history up to it), a new turn's begin (its message
    stored, its row started with that id, the history through its row) and an end with
    no reply message (its row answered, no reply id) in one run of the writer's
    connection."""
    from state.pg import inbox as pg_inbox

    s1 = await pg.create_session("s1", "api")
    s2 = await pg.create_session("s2", "api")
    r1, _s, _n = await pg.accept_inbound("api", "1", "m1", {"text": "a"})
    first_mid, _h = await pg.begin_turn(r1, s1, {"role": "user", "content": "a"})
    r3, _s, _n = await pg.accept_inbound("api", "2", "m3", {"text": "c"})
    r3_mid, _h = await pg.begin_turn(r3, s2, {"role": "user", "content": "c"})
    r2, _s, _n = await pg.accept_inbound("api", "2", "m2", {"text": "b"})

    async def batch(conn: psycopg.AsyncConnection) -> list[Any]:
        return await pg_inbox.turn_writes_many(
            conn,
            [
                (pg_inbox.BEGIN, (r1, s1, {"role": "user", "content": "a"}, None)),
                (pg_inbox.BEGIN, (r2, s2, {"role": "user", "content": "b"}, None)),
                (pg_inbox.END, (r3, s2, [], None, "ready")),
            ],
        )

    (mid1, hist1), (mid2, hist2), ended = await pg._writer.submit(batch)
    assert mid1 == first_mid and [m["content"] for m in hist1] == ["a"]
    assert mid2 > r3_mid and [m["content"] for m in hist2] == ["c", "b"]
    assert ended == []
    assert await pg.message_count(s1) == 1 and await pg.message_count(s2) == 2

    async def rows(conn: psycopg.AsyncConnection) -> dict[int, tuple[Any, ...]]:
        cur = await conn.execute(
            "SELECT id, state, session_id, message_id, reply_state, reply_message_id FROM inbox"
        )
        return {r[0]: r[1:] for r in await cur.fetchall()}

    found = await pg._writer.submit(rows)
    assert found[r1] == ("started", s1, first_mid, None, None)
    assert found[r2] == ("started", s2, mid2, None, None)
    assert found[r3] == ("answered", s2, r3_mid, "ready", None)
