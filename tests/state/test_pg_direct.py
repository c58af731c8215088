"""Statements sent through libpq directly (state.pg.db.Direct, the writer's and the read
pool's connections) on a real server: the same answers, Python types and errors as
psycopg's cursor gives, prepared after the connection's threshold and no more of them than
its maximum, and a connection the server drops leaving the event loop clean."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
import pytest
import uvloop
from psycopg import pq

from state.pg import db
from state.pg.db import LoopConnection
from tests import pgserver
from tests.state.test_pg_query_helpers import ODD_TEXT, PADDING, _answers

T = TypeVar("T")

TYPED = (
    "SELECT %s::text AS t, %s::bigint AS i, %s::double precision AS f, %s::boolean AS b, "
    "%s::text[] AS arr, %s::jsonb AS j, %s::numeric AS num, NULL::text AS nothing, "
    "%s::bigint[] AS ints, 'x' || %s AS glued"
)
TYPED_PARAMS = (
    "caf\u00e9",
    2**62,
    0.1 + 0.2,
    True,
    ["a", None, "c\u202e"],
    '{"k": [1, 2]}',
    "12345678901234567890.5",
    [1, 2, 3],
    "<b>",
)


def _run(dsn: str, body: Callable[[LoopConnection], Awaitable[T]], *, direct: bool) -> T:
    async def scenario() -> T:
        conn = await LoopConnection.connect(dsn, autocommit=True)
        db.binary_lists(conn)
        if direct:
            db.go_direct(conn)
        try:
            return await body(conn)
        finally:
            await conn.close()

    return uvloop.run(scenario())  # the daemon's loop, on which the socket stays registered


async def _everything(conn: LoopConnection) -> list[Any]:
    out: list[Any] = []
    for pad in (PADDING, ""):
        out.append(await _answers(conn, pad))
    for _ in range(3):  # unnamed, then prepared
        out.append(await db.rows(conn, TYPED, TYPED_PARAMS))
        out.append(await db.tuples(conn, TYPED, TYPED_PARAMS))
    for text in ODD_TEXT:
        out.append(await db.value(conn, "SELECT %(t)s::text || %(t)s::text", {"t": text}))
    out.append(await db.row(conn, "SELECT 1 AS one WHERE false"))
    out.append(await db.value(conn, "SELECT NULL::text WHERE false"))
    out.append(await db.run(conn, "SELECT generate_series(1, %s)", (4,)))
    out.append(await db.tuples(conn, "SELECT '50%%', %s::text", ("%s",), prepare=False))
    for _ in range(6):  # binary columns, unnamed then prepared
        out.append(await db.tuples(conn, TYPED, TYPED_PARAMS, binary=True))
    return out


def test_the_direct_path_answers_as_psycopgs_cursor_does(pg_dsn: str) -> None:
    direct = _run(pg_dsn, _everything, direct=True)
    assert direct == _run(pg_dsn, _everything, direct=False)
    typed = direct[2][0]
    assert typed == {
        "t": "caf\u00e9",
        "i": 2**62,
        "f": 0.1 + 0.2,
        "b": True,
        "arr": ["a", None, "c\u202e"],
        "j": {"k": [1, 2]},
        "num": Decimal("12345678901234567890.5"),
        "nothing": None,
        "ints": [1, 2, 3],
        "glued": "x<b>",
    }
    assert [type(v) for v in direct[3][0]] == [type(v) for v in typed.values()]
    assert direct[8 : 8 + len(ODD_TEXT)] == [t + t for t in ODD_TEXT]
    assert direct[-10:-6] == [None, None, 4, [("50%", "%s")]]
    assert direct[-6:] == [direct[3]] * 6  # binary columns load to the same values


async def _prepared(conn: LoopConnection) -> list[str]:
    cur = await conn.execute(
        "SELECT statement FROM pg_prepared_statements WHERE name LIKE '\\_sb\\_%%' "
        "ORDER BY prepare_time, name",
        prepare=False,
    )
    return [str(r[0]) for r in await cur.fetchall()]


def test_statements_are_prepared_after_the_threshold_and_at_most_the_maximum(
    pg_dsn: str,
) -> None:
    async def body(conn: LoopConnection) -> dict[str, Any]:
        db.go_direct(conn, db.Direct(prepare_threshold=2, prepared_max=3))
        seen: dict[str, Any] = {}
        assert await db.value(conn, "SELECT %s::bigint + 1", (1,)) == 2
        seen["after one run"] = await _prepared(conn)
        assert await db.value(conn, "SELECT %s::bigint + 1", (2,)) == 3
        seen["after two runs"] = await _prepared(conn)
        for i in range(4):
            await db.tuples(conn, "SELECT %s::bigint - 1", (i,), prepare=False)
        seen["never"] = await _prepared(conn)
        for n in range(5):  # prepared at once; the oldest deallocated past three
            got = await db.tuples(conn, f"SELECT %s::bigint * {n}", (3,), prepare=True)
            assert got == [(3 * n,)]
        seen["capped"] = await _prepared(conn)
        # a statement deallocated runs unnamed again, then is prepared again, still right
        assert await db.value(conn, "SELECT %s::bigint + 1", (5,)) == 6
        seen["unnamed again"] = await _prepared(conn)
        assert await db.value(conn, "SELECT %s::bigint + 1", (6,)) == 7
        seen["back"] = await _prepared(conn)
        return seen

    seen = _run(pg_dsn, body, direct=False)  # (the body sets its own Direct up)
    assert seen["after one run"] == []
    assert seen["after two runs"] == ["SELECT $1::bigint + 1"]
    assert seen["never"] == ["SELECT $1::bigint + 1"]
    assert seen["capped"] == [f"SELECT $1::bigint * {n}" for n in (2, 3, 4)]
    assert seen["unnamed again"] == seen["capped"]
    assert seen["back"] == [
        "SELECT $1::bigint * 3",
        "SELECT $1::bigint * 4",
        "SELECT $1::bigint + 1",
    ]


def test_a_server_error_is_psycopgs_exception_and_the_connection_goes_on(pg_dsn: str) -> None:
    async def body(conn: LoopConnection) -> list[Any]:
        await db.run(conn, "CREATE TEMP TABLE d_unique (k text PRIMARY KEY)")
        await db.run(conn, "INSERT INTO d_unique VALUES (%s)", ("a",))
        with pytest.raises(psycopg.errors.UniqueViolation) as dup:
            await db.run(conn, "INSERT INTO d_unique VALUES (%s)", ("a",))
        assert db.violated(dup.value) == "d_unique_pkey"
        with pytest.raises(psycopg.errors.DivisionByZero):
            await db.value(conn, "SELECT 1 / %s::int", (0,))
        with pytest.raises(psycopg.errors.UndefinedTable):
            await db.rows(conn, "SELECT * FROM no_such_table WHERE k = %s", ("a",))
        await db.command(conn, b"BEGIN")
        with pytest.raises(psycopg.errors.UniqueViolation):
            await db.run(conn, "INSERT INTO d_unique VALUES (%s)", ("a",))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            await db.value(conn, "SELECT %s::text", ("x",))
        await db.command(conn, b"ROLLBACK")
        return await db.tuples(conn, "SELECT k FROM d_unique WHERE k = %s", ("a",))

    assert _run(pg_dsn, body, direct=True) == [("a",)]


def test_a_connection_the_server_drops_raises_and_leaves_the_loop_clean(pg_dsn: str) -> None:
    """The server's termination comes back as an error result: the statement raises
    psycopg's OperationalError, the socket is no longer registered with the loop, and new
    connections on the same loop (which may get the same socket number) work."""

    async def scenario() -> list[Any]:
        out: list[Any] = []
        for _ in range(3):
            conn = await LoopConnection.connect(pg_dsn, autocommit=True)
            db.go_direct(conn)
            out.append(await db.value(conn, "SELECT %s::text", ("before",)))
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                await db.value(conn, "SELECT %s::text", ("after",))
            out.append((conn.closed, conn._watched))
            await conn.close()
        return out

    got = uvloop.run(scenario())
    assert got == ["before", (True, -1)] * 3


def test_psycopgs_own_statements_and_rollbacks_leave_the_prepared_ones_alone(
    pg_dsn: str,
) -> None:
    """On a direct connection psycopg prepares nothing of its own, so the ROLLBACK of a
    batch redone one operation at a time (psycopg deallocates every prepared statement
    after a ROLLBACK once it has prepared one) leaves the direct path's statements in
    place; and statements deallocated behind its back anyway are prepared again (outside a
    transaction the statement that finds its own gone runs again at once; inside one it
    fails, as any statement would, and the next transaction prepares it again)."""

    async def body(conn: LoopConnection) -> list[Any]:
        out: list[Any] = []
        for i in range(8):
            out.append(await db.value(conn, "SELECT %s::bigint * 2", (i,)))
        for _ in range(8):  # the writer's fallback: BEGIN, a savepoint, ROLLBACK
            await conn.execute(b"BEGIN")
            async with conn.transaction():
                await conn.execute(b"SELECT 1")
            await conn.execute(b"ROLLBACK")
        out.append(await db.value(conn, "SELECT %s::bigint * 2", (10,)))
        out.append(len(await _prepared(conn)))
        cur = await conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE name NOT LIKE '\\_sb\\_%%'",
            prepare=False,
        )
        out.append((await cur.fetchall())[0][0])  # psycopg prepared none of its own
        await conn.execute(b"DEALLOCATE ALL")
        out.append(await db.value(conn, "SELECT %s::bigint * 2", (11,)))  # retried unnamed
        for i in range(6):  # prepared again
            await db.value(conn, "SELECT %s::bigint * 2", (i,))
        out.append(len(await _prepared(conn)))
        await db.command(conn, b"BEGIN")
        await conn.execute(b"DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            await db.value(conn, "SELECT %s::bigint * 2", (13,))
        await db.command(conn, b"ROLLBACK")
        for i in range(14, 20):
            out.append(await db.value(conn, "SELECT %s::bigint * 2", (i,)))
        out.append(len(await _prepared(conn)))
        return out

    got = _run(pg_dsn, body, direct=True)
    assert got == [*range(0, 16, 2), 20, 1, 0, 22, 1, *range(28, 40, 2), 1]


def test_a_direct_connection_keeps_each_statements_plan_mode_outside_transactions(
    pg_dsn: str,
) -> None:
    """A read connection's Direct keeps plan_cache_mode per statement: a statement runs
    under the mode it names, any other under the server's setting, one naming ANY_PLANS or
    without parameters under whichever is set; inside a transaction the mode stays as it
    is (a ROLLBACK would undo a SET made there behind the Direct's back)."""
    mode = "SELECT current_setting('plan_cache_mode') || %s"

    async def body(conn: LoopConnection) -> list[Any]:
        await db.configure(conn)
        direct = db.direct_of(conn)
        assert direct is not None and direct.home == b"auto"
        generic = db.GENERIC_PLANS
        out: list[Any] = []
        for plans in (None, generic, db.ANY_PLANS, None, db.ANY_PLANS, generic):
            out.append((await db.tuples(conn, mode, ("",), plans=plans))[0][0])
        out.append(await db.value(conn, "SELECT current_setting('plan_cache_mode')"))
        await db.command(conn, b"BEGIN")
        out.append((await db.tuples(conn, mode, ("",)))[0][0])  # not changed in a transaction
        await db.command(conn, b"ROLLBACK")
        out.append((await db.tuples(conn, mode, ("",)))[0][0])
        out.append(await db.value(conn, "SELECT current_setting('plan_cache_mode')"))
        return out

    got = _run(pg_dsn, body, direct=False)
    assert got == [
        "auto",
        "force_generic_plan",
        "force_generic_plan",
        "auto",
        "auto",
        "force_generic_plan",
        "force_generic_plan",
        "force_generic_plan",
        "auto",
        "auto",
    ]


def test_a_held_begin_goes_with_the_first_statement_and_the_transaction_holds(
    pg_dsn: str,
) -> None:
    """The writer's BEGIN held back goes with the transaction's first statement in one
    round trip; the transaction is real (a ROLLBACK undoes that statement, a COMMIT keeps
    it); psycopg's own savepoint sends the BEGIN first and runs inside the transaction; a
    failed first statement leaves the transaction aborted, as it would be after a BEGIN of
    its own; a COMMIT with nothing sent since sends nothing."""
    table = f"held_begin_{os.getpid()}"

    async def body(conn: LoopConnection) -> list[Any]:
        out: list[Any] = []
        await conn.execute(f"CREATE TEMP TABLE {table} (v int PRIMARY KEY)".encode())
        insert = f"INSERT INTO {table} VALUES (%s)"
        with tempfile.TemporaryFile("w+") as fh:
            conn.pgconn.trace(fh.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            await db.begin(conn)
            await db.run(conn, insert, (1,))
            out.append(conn.pgconn.transaction_status == pq.TransactionStatus.INTRANS)
            await db.command(conn, b"ROLLBACK")
            conn.pgconn.untrace()
            fh.seek(0)
            out.append(
                pgserver.round_trips_and_begins(fh.read())
            )  # BEGIN with the INSERT; ROLLBACK
        await db.begin(conn)
        await db.run(conn, insert, (2,))
        await db.command(conn, b"COMMIT")
        await db.begin(conn)  # psycopg's savepoint first: it sends the BEGIN before it
        async with conn.transaction():
            await db.run(conn, insert, (3,))
        await db.command(conn, b"ROLLBACK")
        await db.begin(conn)
        with pytest.raises(psycopg.errors.UniqueViolation):
            await db.run(conn, insert, (2,))
        out.append(conn.pgconn.transaction_status == pq.TransactionStatus.INERROR)
        await conn.execute(b"ROLLBACK")
        with tempfile.TemporaryFile("w+") as fh:
            conn.pgconn.trace(fh.fileno())
            await db.begin(conn)
            await db.command(conn, b"COMMIT")
            conn.pgconn.untrace()
            fh.seek(0)
            out.append(fh.read())
        out.append(await db.tuples(conn, f"SELECT v FROM {table} ORDER BY v"))
        return out

    got = _run(pg_dsn, body, direct=True)
    assert got == [True, (2, 1), True, "", [(2,)]]


def test_two_statements_in_one_round_trip_the_second_sees_what_committed_during_the_first(
    pg_dsn: str,
) -> None:
    """`rows_then` sends two statements in one round trip; the second takes its snapshot
    when it starts, so what another transaction committed while the first waited for its
    lock is there (as the open rows read after a lease take must see a release committed
    meanwhile); an error in the first raises it and the second does not run."""
    a, b = f"rt_a_{os.getpid()}", f"rt_b_{os.getpid()}"

    async def body(conn: LoopConnection) -> list[Any]:
        out: list[Any] = []
        other = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        try:
            for t in (a, b):
                await other.execute(f"CREATE TABLE {t} (k int PRIMARY KEY, v int)".encode())
                await other.execute(f"INSERT INTO {t} VALUES (1, 0)".encode())
            await other.execute(b"BEGIN")
            await other.execute(f"UPDATE {a} SET v = 1 WHERE k = 1".encode())
            me = conn.info.backend_pid
            await db.begin(conn)
            both = asyncio.ensure_future(
                db.rows_then(
                    conn,
                    (f"SELECT v FROM {a} WHERE k = %s FOR UPDATE", (1,)),
                    (f"SELECT v FROM {b} WHERE k = %s", (1,)),
                )
            )
            await pgserver.until_waiting_on_a_lock(other, me, both)
            await other.execute(f"UPDATE {b} SET v = 2 WHERE k = 1".encode())
            await other.execute(b"COMMIT")
            out.append(await both)
            await db.command(conn, b"COMMIT")
            with pytest.raises(psycopg.errors.DivisionByZero):
                await db.rows_then(
                    conn,
                    (f"UPDATE {b} SET v = v / %s WHERE k = 1", (0,)),
                    (f"UPDATE {b} SET v = %s WHERE k = 1", (7,)),
                )
            out.append(await db.tuples(conn, f"SELECT v FROM {b}"))
        finally:
            for t in (a, b):
                await other.execute(f"DROP TABLE IF EXISTS {t}".encode())
            await other.close()
        return out

    got = _run(pg_dsn, body, direct=True)
    assert got == [([{"v": 1}], [{"v": 2}]), [(2,)]]
