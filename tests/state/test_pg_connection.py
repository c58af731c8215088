"""The store's PostgreSQL connection (`state.pg.db.LoopConnection`) on a real server, on
both event loops: its socket stays registered with the loop from one statement to the
next, and a cancelled query, a connection the server ends, a query larger than the
socket's buffer, a notification nobody waits for and socket numbers reused after a close
behave as on psycopg's own connection."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import uvloop

from state.pg.db import LoopConnection

GUARD_S = 30  # a wait that does not end by then is a hang, and fails the test


class _Counting:
    """A loop counting the sockets registered as readers."""

    readers_added = 0

    def add_reader(self, fd: Any, callback: Callable[..., object], *args: Any) -> None:
        _Counting.readers_added += 1
        super().add_reader(fd, callback, *args)  # type: ignore[misc]


class CountingAsyncio(_Counting, asyncio.SelectorEventLoop):
    pass


class CountingUvloop(_Counting, uvloop.Loop):
    pass


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": CountingAsyncio,
    "uvloop": CountingUvloop,
}


def on_each_loop(loop: str, scenario: Callable[[str], Awaitable[None]], dsn: str) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(scenario(dsn), GUARD_S)

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(guarded())


async def _one(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> Any:
    found = await (await conn.execute(sql, params)).fetchone()
    return None if found is None else found[0]


async def _until_active(dsn: str, pid: int) -> None:
    """Until the backend `pid` runs a statement (polling pg_stat_activity)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
        while True:
            state = await _one(watch, "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,))
            if state == "active":
                return
            await asyncio.sleep(0.02)


async def _sleeping(dsn: str, conn: psycopg.AsyncConnection[Any]) -> asyncio.Task[Any]:
    """A minute's `pg_sleep` on `conn` (its socket registered by a statement before it),
    once the server runs it."""
    assert await _one(conn, "SELECT 1") == 1
    running = asyncio.create_task(conn.execute("SELECT pg_sleep(60)"))
    await _until_active(dsn, conn.info.backend_pid)
    return running


async def _end_backend(dsn: str, pid: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        assert await _one(other, "SELECT pg_terminate_backend(%s)", (pid,)) is True
        while True:
            if not await _one(
                other, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
            ):
                return
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_socket_is_registered_once_for_many_statements_on_uvloop(
    loop: str, pg_dsn: str
) -> None:
    async def scenario(dsn: str) -> None:
        added = {}
        for cls in (psycopg.AsyncConnection, LoopConnection):
            _Counting.readers_added = 0
            async with await cls.connect(dsn, autocommit=True) as conn:
                got = [await _one(conn, "SELECT %s::int * 2", (i,)) for i in range(200)]
            assert got == [i * 2 for i in range(200)]
            added[cls] = _Counting.readers_added
        assert added[psycopg.AsyncConnection] >= 200  # psycopg registers it at every wait
        if loop == "uvloop":
            assert added[LoopConnection] <= added[psycopg.AsyncConnection] // 10
        else:  # on the standard library's loop it waits as psycopg's does
            assert added[LoopConnection] >= 200

    on_each_loop(loop, scenario, pg_dsn)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancelled_query_is_cancelled_on_the_server_and_the_connection_goes_on(
    loop: str, pg_dsn: str
) -> None:
    async def scenario(dsn: str) -> None:
        async with await LoopConnection.connect(dsn, autocommit=True) as conn:
            running = await _sleeping(dsn, conn)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
            assert await _one(conn, "SELECT 'after'") == "after"
            assert (
                await _one(
                    conn,
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%%'",
                )
                == 0
            )

    on_each_loop(loop, scenario, pg_dsn)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_connection_the_server_ends_fails_and_later_sockets_work(loop: str, pg_dsn: str) -> None:
    async def scenario(dsn: str) -> None:
        # ended while a statement waits for its answer
        conn = await LoopConnection.connect(dsn, autocommit=True)
        running = await _sleeping(dsn, conn)
        await _end_backend(dsn, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            await running
        await conn.close()
        # ended while idle, its socket registered: the next statement fails
        conn = await LoopConnection.connect(dsn, autocommit=True)
        assert await _one(conn, "SELECT 2") == 2
        await _end_backend(dsn, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            await _one(conn, "SELECT 3")
        await conn.close()
        # new connections get the socket numbers back, and each is answered
        for i in range(10):
            async with await LoopConnection.connect(dsn, autocommit=True) as again:
                assert await _one(again, "SELECT %s::int", (i,)) == i

    on_each_loop(loop, scenario, pg_dsn)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_query_larger_than_the_socket_buffer_and_a_notification_nobody_waits_for(
    loop: str, pg_dsn: str
) -> None:
    async def scenario(dsn: str) -> None:
        big = "x" * (8 << 20)  # psycopg waits to write it
        async with await LoopConnection.connect(dsn, autocommit=True) as conn:
            assert await _one(conn, "SELECT length(%s)", (big,)) == len(big)
            assert await _one(conn, "SELECT 'small again'") == "small again"
            channel = f"sb_test_{secrets.token_hex(4)}"  # another test's notices stay away
            await conn.execute(f"LISTEN {channel}")
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
                await other.execute(f"NOTIFY {channel}, 'hello'")
            await asyncio.sleep(0.1)  # the loop turns with the notice unread
            assert await _one(conn, "SELECT 'still answered'") == "still answered"
            gen = conn.notifies(timeout=10, stop_after=1)  # psycopg's wait with a timeout
            assert [n.payload async for n in gen] == ["hello"]
            assert await _one(conn, "SELECT 'and after'") == "and after"

    on_each_loop(loop, scenario, pg_dsn)
