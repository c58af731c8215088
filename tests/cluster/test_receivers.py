"""One receiving connection among replicas (gateway.shards.Receiver), on Mattermost, whose
server sends every event to every websocket of the bot: three `switchboard run` replicas on
one PostgreSQL database open one websocket between them and answer each post once; when its
holder is SIGKILLed another takes it within seconds and catches up, from the positions the
dead one stored, a post made while no replica was connected; a holder that stalled while
another took the connection closes its own when it wakes. Times are printed, never
asserted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.shards import CLAIM_EVERY_S
from tests.cluster.harness import Replica, cut_off, query, stop_replicas, until
from tests.fakes import running
from tests.fakes.mattermost import DM, FakeMattermost


@pytest.fixture
async def mattermost() -> AsyncIterator[FakeMattermost]:
    async with running(FakeMattermost()) as fake:
        yield fake


@pytest.fixture
async def trio(tmp_path: Path, db: str, mattermost: FakeMattermost) -> AsyncIterator[list[Replica]]:
    extra = {
        "platforms": {
            "mattermost": {
                "enabled": True,
                "allow_all_users": True,
                "url": mattermost.url,
            }
        }
    }
    group = [
        Replica.on(
            db,
            f"r{i}",
            tmp_path / f"r{i}",
            3,
            extra_config=extra,
            env={"MATTERMOST_TOKEN": mattermost.token},
        )
        for i in (1, 2, 3)
    ]
    try:
        for r in group:
            await r.start()
        yield group
    finally:
        assert await stop_replicas(group) == []


def _owner(db: str) -> str | None:
    """The replica whose current incarnation owns Mattermost's receiving connection."""
    found = query(
        db,
        "SELECT r.name FROM platform_shards s JOIN replicas r "
        "ON r.incarnation = s.owner WHERE s.platform = 'mattermost'",
    )
    return str(found[0][0]) if found else None


async def _receiving(group: list[Replica]) -> list[str]:
    """The replicas whose /health says they receive."""
    async with aiohttp.ClientSession() as http:
        return [
            r.name for r in group if (await r.health(http))["adapters"]["mattermost"]["receiving"]
        ]


def _answers(fake: FakeMattermost) -> list[str]:
    return [p["message"] for p in fake.bot_posts()]


async def _settle() -> None:
    # a claim round, room for a second websocket or answer were there one
    await asyncio.sleep(CLAIM_EVERY_S + 0.5)


async def test_one_replica_receives_and_a_killed_ones_connection_is_taken_over(
    trio: list[Replica], db: str, mattermost: FakeMattermost
) -> None:
    await until(lambda: mattermost.sockets() == 1)
    await _settle()
    assert mattermost.sockets() == 1  # one websocket across three replicas
    holder = _owner(db)
    assert await _receiving(trio) == [holder]
    await mattermost.say("one", DM)
    await mattermost.wait_bot_posts(1, timeout=30)
    await _settle()
    assert _answers(mattermost) == ["echo: one"]

    # SIGKILL the holder; while no websocket is accepted a post is only stored (as a real
    # server keeps it): the next holder catches it up from the dead one's positions
    victim = next(r for r in trio if r.name == holder)
    mattermost.accept_sockets = False
    killed = time.monotonic()
    await victim.kill()
    await until(lambda: mattermost.sockets() == 0)
    await mattermost.say("in the gap", DM)
    await until(lambda: _owner(db) not in (None, holder))
    took = time.monotonic() - killed
    mattermost.accept_sockets = True
    await until(lambda: mattermost.sockets() == 1)
    await mattermost.say("after", DM)
    await mattermost.wait_bot_posts(3, timeout=30)
    await _settle()
    assert mattermost.sockets() == 1
    survivors = [r for r in trio if r is not victim]
    assert await _receiving(survivors) == [_owner(db)]
    assert _answers(mattermost) == ["echo: one", "echo: in the gap", "echo: after"]
    print(f"\nthe killed replica's connection was taken by another {took:.2f}s after SIGKILL")


async def test_a_replica_whose_connection_was_taken_closes_it(
    trio: list[Replica], db: str, mattermost: FakeMattermost
) -> None:
    await until(lambda: mattermost.sockets() == 1 and _owner(db) is not None)
    holder = next(r for r in trio if r.name == _owner(db))
    # the holder stalls and is cut off from the database: another takes the connection and
    # opens its own websocket while the stalled one's is still open
    holder.pause()
    assert cut_off(db, holder.name) == 1
    await until(lambda: _owner(db) not in (None, holder.name))
    await until(lambda: mattermost.sockets() == 2)
    holder.resume()
    resumed = time.monotonic()
    # woken up, the stalled replica sees the epoch moved and closes its websocket
    await until(lambda: mattermost.sockets() == 1)
    print(
        f"\nthe stalled replica closed its lost connection {time.monotonic() - resumed:.2f}s "
        "after waking"
    )
    assert await _receiving(trio) == [_owner(db)]
    assert "no longer ours" in holder.log_text()
    await mattermost.say("once", DM)
    await mattermost.wait_bot_posts(1, timeout=30)
    await _settle()
    assert _answers(mattermost) == ["echo: once"]
