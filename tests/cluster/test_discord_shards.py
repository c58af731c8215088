"""Discord's gateway shards across replicas: two `switchboard run` replicas with
`shard_count: 2` on one PostgreSQL database connect each shard exactly once between them and
answer each message once; the shards of a killed replica are taken over by the other, which
also catches up what arrived in the gap; a replica that finds its shards taken (it stalled
while cut off) closes their connections; a replica started later gets its share of the
shards handed over, each shard connected once throughout and each message answered once.
Takeover and rebalancing times are printed, never asserted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.shards import CLAIM_EVERY_S
from tests.cluster.harness import Replica, cut_off, query, stop_replicas, until
from tests.fakes.discord import DM, GENERAL, GENERAL2, GUILD, GUILD2, FakeDiscord


def _replicas(tmp_path: Path, db: str, discord: FakeDiscord, shards: int) -> list[Replica]:
    """r1 and r2 (not started), Discord with `shards` shards on the fake."""
    extra = {
        "platforms": {
            "discord": {
                "enabled": True,
                "allow_all_users": True,
                "require_mention": False,
                "shard_count": shards,
                "base_url": discord.api,
                "gateway_url": discord.gateway,
            }
        }
    }
    return [
        Replica.on(
            db,
            f"r{i}",
            tmp_path / f"r{i}",
            2,
            extra_config=extra,
            env={"DISCORD_BOT_TOKEN": discord.token},
        )
        for i in (1, 2)
    ]


@pytest.fixture
async def pair(tmp_path: Path, db: str, discord: FakeDiscord) -> AsyncIterator[list[Replica]]:
    """r1 and r2, Discord with two shards on the fake, started one after the other; once
    r1 handed one shard over to r2."""
    group = _replicas(tmp_path, db, discord, 2)
    try:
        for r in group:
            await r.start()
        await until(
            lambda: (
                sorted(_owners(db).values()) == ["r1", "r2"]
                and discord.connected_shards() == [(0, 2), (1, 2)]
            )
        )
        yield group
    finally:
        assert await stop_replicas(group) == []


def _owners(db: str, count: int = 2) -> dict[int, str]:
    """shard id -> the name of the replica whose current incarnation owns it."""
    return {
        int(s): str(n)
        for s, n in query(
            db,
            "SELECT s.shard_id, r.name FROM platform_shards s JOIN replicas r "
            "ON r.incarnation = s.owner WHERE s.platform = 'discord' AND s.shard_count = %s",
            (count,),
        )
    }


def _epochs(db: str, count: int) -> dict[int, int]:
    return {
        int(s): int(e)
        for s, e in query(
            db,
            "SELECT shard_id, epoch FROM platform_shards WHERE platform = 'discord' "
            "AND shard_count = %s",
            (count,),
        )
    }


async def _shards_of(http: aiohttp.ClientSession, replica: Replica) -> dict[str, int]:
    health = await replica.health(http)
    return dict(health["adapters"]["discord"]["shards"])


def _answers(fake: FakeDiscord, channel: str) -> list[str]:
    return [p["content"] for p in fake.posted(channel)]


async def _say(fake: FakeDiscord, text: str, channel: str) -> dict[str, Any]:
    if channel == DM:
        message = fake.message(text, DM, guild=False)
    else:
        message = fake.message(text, channel, guild_id=GUILD2 if channel == GENERAL2 else GUILD)
    await fake.dispatch("MESSAGE_CREATE", message)
    return message


async def _settle() -> None:
    await asyncio.sleep(1.0)  # room for a second answer, were anything delivered twice


async def _each_channel_answered_once(discord: FakeDiscord) -> None:
    """A message in each guild's channel and in the DM: every one answered, once."""
    for text, channel in (("g1", GENERAL), ("g2", GENERAL2), ("dm", DM)):
        await _say(discord, text, channel)
    await discord.wait_posted(3, timeout=30)
    await _settle()
    assert (_answers(discord, GENERAL), _answers(discord, GENERAL2), _answers(discord, DM)) == (
        ["echo: g1"],
        ["echo: g2"],
        ["echo: dm"],
    )


async def test_each_shard_runs_once_and_a_killed_owners_shards_are_taken_over(
    pair: list[Replica], db: str, discord: FakeDiscord
) -> None:
    r1, r2 = pair
    await until(lambda: discord.connected_shards() == [(0, 2), (1, 2)])
    await _settle()
    assert discord.connected_shards() == [(0, 2), (1, 2)]  # once each, across both replicas
    owners = _owners(db)
    assert sorted(owners) == [0, 1]
    async with aiohttp.ClientSession() as http:
        runs = {r.name: await _shards_of(http, r) for r in pair}
    assert sorted(k for shards in runs.values() for k in shards) == ["0", "1"]
    for shard, name in owners.items():
        assert str(shard) in runs[name]
    await _each_channel_answered_once(discord)

    # SIGKILL the owner of shard 1 (the second guild); a message in its guild meanwhile
    # reaches no connection: the new owner's catch-up reads it from the channel's history
    # (the new owner runs shard 0 already, so the catch-up follows a shard's session, not
    # the replica's start)
    victim, survivor = (r1, r2) if owners[1] == "r1" else (r2, r1)
    killed = time.monotonic()
    await victim.kill()
    await until(lambda: (1, 2) not in discord.connected_shards())
    await _say(discord, "in the gap", GENERAL2)
    await until(lambda: discord.connected_shards() == [(0, 2), (1, 2)])
    took = time.monotonic() - killed
    assert set(_owners(db).values()) == {survivor.name}
    await _say(discord, "after", GENERAL2)
    await _say(discord, "dm after", DM)
    await until(lambda: len(discord.posted()) >= 6)
    await _settle()
    assert _answers(discord, GENERAL2) == ["echo: g2", "echo: in the gap", "echo: after"]
    assert _answers(discord, DM) == ["echo: dm", "echo: dm after"]
    assert _answers(discord, GENERAL) == ["echo: g1"]
    print(f"\nshards of the killed replica connected on the other {took:.2f}s after SIGKILL")


async def test_a_replica_whose_shards_were_taken_closes_their_connections(
    pair: list[Replica], db: str, discord: FakeDiscord
) -> None:
    await until(lambda: discord.connected_shards() == [(0, 2), (1, 2)])
    owners = _owners(db)
    # a replica that owns shards stalls (SIGSTOP) and is cut off from the database, as a
    # partition would do: its locks go, the other takes its shards and connects them too
    # (the stalled one's sockets are still open, so for a while there are two)
    holder = next(r for r in pair if r.name == owners[0])
    other = next(r for r in pair if r is not holder)
    held = sorted(s for s, n in owners.items() if n == holder.name)
    holder.pause()
    assert cut_off(db, holder.name) == 1
    await until(lambda: all(_owners(db).get(s) == other.name for s in held))
    wanted = sorted([(0, 2), (1, 2)] + [(s, 2) for s in held])
    await until(lambda: discord.connected_shards() == wanted)
    holder.resume()
    resumed = time.monotonic()
    # woken up, the stalled replica sees its shards' epochs moved and closes them
    await until(lambda: discord.connected_shards() == [(0, 2), (1, 2)])
    print(
        f"\nthe stalled replica closed its {len(held)} lost shard(s) "
        f"{time.monotonic() - resumed:.2f}s after waking"
    )
    # back under a new incarnation, it gets a share again: handed over, not taken twice
    twice = len(discord.identified_twice)
    await until(
        lambda: (
            sorted(_owners(db).values()) == sorted([holder.name, other.name])
            and discord.connected_shards() == [(0, 2), (1, 2)]
        )
    )
    owners = _owners(db)
    async with aiohttp.ClientSession() as http:
        for r in pair:
            held_now = sorted(str(s) for s, n in owners.items() if n == r.name)
            assert sorted(await _shards_of(http, r)) == held_now
    assert len(discord.identified_twice) == twice
    await _each_channel_answered_once(discord)
    assert "no longer ours" in holder.log_text()


async def test_a_replica_started_later_gets_its_share_handed_over(
    tmp_path: Path, db: str, discord: FakeDiscord
) -> None:
    """Four shards: r1 alone runs them all; once r2 runs too, r1 closes its highest two
    (GENERAL's guild is on shard 2, GENERAL2's on 3) and only then lets go of them, r2 takes
    and connects them and catches up what reached them in between."""
    r1, r2 = group = _replicas(tmp_path, db, discord, 4)
    every = [(k, 4) for k in range(4)]
    seen_twice: list[list[tuple[int, int]]] = []

    async def watch() -> None:  # every 20 ms: no shard connected twice
        while True:
            shards = discord.connected_shards()
            if len(set(shards)) != len(shards):
                seen_twice.append(shards)
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        await r1.start()
        await until(lambda: discord.connected_shards() == every)
        assert set(_owners(db, 4).values()) == {"r1"}
        # answered once each: the channels have positions, so a new owner catches them up
        await _say(discord, "before", GENERAL)
        await _say(discord, "before", GENERAL2)
        await discord.wait_posted(2, timeout=30)

        sent = {GENERAL: ["before"], GENERAL2: ["before"]}
        balanced = asyncio.Event()

        async def chatter() -> None:  # a message to each moving guild every 0.25 s
            n = 0
            while not balanced.is_set():
                n += 1
                for channel in (GENERAL, GENERAL2):
                    await _say(discord, f"during {n}", channel)
                    sent[channel].append(f"during {n}")
                await asyncio.sleep(0.25)

        talking = asyncio.create_task(chatter())
        joined = time.monotonic()
        await r2.start()
        await until(
            lambda: (
                sorted(_owners(db, 4).values()) == ["r1", "r1", "r2", "r2"]
                and discord.connected_shards() == every
            )
        )
        took = time.monotonic() - joined
        balanced.set()
        await talking
        async with aiohttp.ClientSession() as http:
            assert sorted(await _shards_of(http, r1)) == ["0", "1"]
            assert sorted(await _shards_of(http, r2)) == ["2", "3"]
            # what reached shards 2 and 3 while neither held them (timing decides how many)
            caught_up = (await r2.health(http))["adapters"]["discord"]["caught_up"]
        for channel in (GENERAL, GENERAL2):
            await _say(discord, "after", channel)
            sent[channel].append("after")
        total = sum(len(texts) for texts in sent.values())
        await until(lambda: len(discord.posted()) >= total)
        await _settle()
        for channel, texts in sent.items():  # each exactly once (order is not the point)
            assert sorted(_answers(discord, channel)) == sorted(f"echo: {t}" for t in texts)
        assert discord.identified_twice == [] and seen_twice == []
        # settled: two more rounds move nothing
        epochs = _epochs(db, 4)
        await asyncio.sleep(2 * CLAIM_EVERY_S + 0.5)
        assert _epochs(db, 4) == epochs
        assert "handed over" in r1.log_text()
        print(
            f"\nr2 ran 2 of 4 shards {took:.2f}s after it was started ({total - 4} "
            f"messages sent meanwhile, {caught_up} caught up by r2, each answered once)"
        )
    finally:
        watcher.cancel()
        assert await stop_replicas(group) == []
