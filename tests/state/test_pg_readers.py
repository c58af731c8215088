"""The reader pool's lending: a free connection is lent at once, a read that finds none
free waits for one up to `wait_s` and is then refused."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from state.errors import StoreUnavailable
from state.pg.readers import ReadPool


async def test_a_read_waits_for_a_busy_pool_then_is_refused(pg_dsn: str) -> None:
    async def connect() -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)

    pool = ReadPool(connect, "test", size=1, wait_s=0.2)
    try:
        async with pool.connection() as first:
            pid = first.info.backend_pid
            with pytest.raises(StoreUnavailable, match="no reader connection free"):
                async with pool.connection():
                    pass

            async def later() -> int:
                async with pool.connection() as conn:
                    return conn.info.backend_pid

            waiting = asyncio.create_task(later())
            await asyncio.sleep(0.05)
        assert await waiting == pid  # lent the connection given back
        async with pool.connection() as again:  # free: lent at once
            assert again.info.backend_pid == pid
    finally:
        await pool.close()
