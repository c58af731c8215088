"""A reply held in one replica's outbox while Telegram is down is delivered once by the
replica that takes its chat over when the first dies: two `switchboard run` replicas on
PostgreSQL, Telegram in webhook mode on its loopback fake."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from tests.cluster.harness import Platforms, Replica, query, stop_replicas, telegram_update, until
from tests.fakes.telegram import FakeTelegram

# a held reply's next try is far off: the kill finds it held, not mid-try
OUTBOX = {"outbox": {"first_retry_seconds": 600, "retry_seconds": 600}}


async def test_a_dead_replicas_held_reply_is_delivered_once_by_the_taker(
    tmp_path: Path, db: str, telegram: FakeTelegram
) -> None:
    root = tmp_path
    platforms = Platforms(telegram_base=telegram.base_url)
    r1, r2 = (Replica.on(db, f"r{i}", root / f"r{i}", 2, platforms, OUTBOX) for i in (1, 2))
    try:
        for r in (r1, r2):
            await r.start()
        telegram.outage.down("502")
        chat = telegram.dm_chat(55)
        async with aiohttp.ClientSession() as http:
            update = {"update_id": 700, "message": telegram.message("held", chat)}
            assert await telegram_update(http, r1, update) == 200

            async def held() -> bool:
                h = await r1.health(http)
                return bool(h["outbox"]["pending"].get("telegram") == 1)

            deadline = time.monotonic() + 60  # the adapter's own retries, then the outbox
            while not await held():
                assert time.monotonic() < deadline, "the reply was never held"
                await asyncio.sleep(0.1)
        states = query(db, "SELECT reply_state FROM inbox")
        assert states == [("ready",)]
        await r1.kill()
        telegram.outage.up()
        await telegram.wait_sent(1, timeout=60)  # r2's takeover scan sends it
        await until(lambda: query(db, "SELECT reply_state FROM inbox") == [("sent",)], 30)
        assert [m["text"] for m in telegram.sent()] == ["echo: held"]
    finally:
        assert await stop_replicas([r1, r2]) == []
    assert [m["text"] for m in telegram.sent()] == ["echo: held"]  # once
