"""Home Assistant among replicas: three `switchboard run` replicas on one PostgreSQL
database each keep a websocket to the loopback fake (for sending), and one of them holds
the conversation subscription; each event is answered once. When the holder is SIGKILLed
another subscribes within seconds and answers the next event. Times are printed, never
asserted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.shards import CLAIM_EVERY_S
from tests.cluster.harness import Replica, query, stop_replicas, until
from tests.fakes import running
from tests.fakes.homeassistant import ENV, FakeHomeAssistant

EVENT = "switchboard_conversation"


@pytest.fixture
async def home() -> AsyncIterator[FakeHomeAssistant]:
    async with running(FakeHomeAssistant()) as fake:
        yield fake


@pytest.fixture
async def trio(tmp_path: Path, db: str, home: FakeHomeAssistant) -> AsyncIterator[list[Replica]]:
    extra = {
        "platforms": {"homeassistant": {"enabled": True, "allow_all_users": True, "url": home.url}}
    }
    group = [
        Replica.on(db, f"r{i}", tmp_path / f"r{i}", 3, extra_config=extra, env=ENV)
        for i in (1, 2, 3)
    ]
    try:
        for r in group:
            await r.start()
        yield group
    finally:
        assert await stop_replicas(group) == []


def _owner(db: str) -> str | None:
    found = query(
        db,
        "SELECT r.name FROM platform_shards s JOIN replicas r "
        "ON r.incarnation = s.owner WHERE s.platform = 'homeassistant'",
    )
    return str(found[0][0]) if found else None


async def _receiving(group: list[Replica]) -> list[str]:
    async with aiohttp.ClientSession() as http:
        return [
            r.name
            for r in group
            if r.running and (await r.health(http))["adapters"]["homeassistant"]["receiving"]
        ]


def _answers(home: FakeHomeAssistant) -> list[str]:
    return [str(r["text"]) for r in home.replies()]


async def test_one_replica_subscribes_and_a_killed_ones_subscription_is_taken_over(
    trio: list[Replica], db: str, home: FakeHomeAssistant
) -> None:
    await until(lambda: home.open_sockets() == 3 and len(home.subscribed(EVENT)) == 1)
    await asyncio.sleep(CLAIM_EVERY_S + 0.5)  # a claim round: room for a second subscription
    assert len(home.subscribed(EVENT)) == 1
    holder = _owner(db)
    assert await _receiving(trio) == [holder]
    await home.fire({"text": "one", "user": "bob"})
    await home.wait_replies(1, timeout=30)

    victim = next(r for r in trio if r.name == holder)
    killed = time.monotonic()
    await victim.kill()
    await until(lambda: len(home.subscribed(EVENT)) == 0)
    await until(lambda: len(home.subscribed(EVENT)) == 1 and _owner(db) not in (None, holder))
    took = time.monotonic() - killed
    await home.fire({"text": "two", "user": "bob"})
    await home.wait_replies(2, timeout=30)
    await asyncio.sleep(CLAIM_EVERY_S + 0.5)
    assert _answers(home) == ["echo: one", "echo: two"]
    survivors = [r for r in trio if r is not victim]
    assert await _receiving(survivors) == [_owner(db)]
    assert home.id_errors == []
    print(f"\nthe killed replica's subscription was taken by another {took:.2f}s after SIGKILL")
