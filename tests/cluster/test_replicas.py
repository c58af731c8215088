"""Several `switchboard run` replicas on one PostgreSQL database, as real
subprocesses: messages spread over the replicas are stored once, answered once and in each
chat's order; a killed replica's pending keys are answered by another; a stalled replica
that wakes up after a takeover fails its fence and sends nothing; the leader moves when it
dies. Figures (takeover times) are printed, never asserted."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import (
    Platforms,
    Replica,
    api_message,
    cut_off,
    held_leases,
    inbox_states,
    leaders,
    live_sessions_per_key,
    query,
    stop_replicas,
    stored_user_texts,
    telegram_update,
    until,
)
from tests.daemon import clean_env, switchboard
from tests.fakes.telegram import FakeTelegram

MakeReplicas = Callable[..., Awaitable[list[Replica]]]


@pytest.fixture
async def replicas(tmp_path: Path, db: str, telegram: FakeTelegram) -> AsyncIterator[MakeReplicas]:
    """`await replicas(n, env={name: {...}})`: n started replicas r1..rn on the test's
    database (Telegram in webhook mode on the fake). All are stopped after the test."""
    made: list[Replica] = []
    platforms = Platforms(telegram_base=telegram.base_url)

    async def make(n: int, env: dict[str, dict[str, str]] | None = None) -> list[Replica]:
        group = [Replica.on(db, f"r{i}", tmp_path / f"r{i}", n, platforms) for i in range(1, n + 1)]
        made.extend(group)
        # one at a time: the first migrates the fresh database
        for r in group:
            await r.start(extra_env=(env or {}).get(r.name))
        return group

    try:
        yield make
    finally:
        # SIGTERM drains and exits 0 (a replica the test killed has its signal's code)
        assert await stop_replicas(made) == []


async def test_messages_spread_over_three_replicas_are_answered_once_in_each_chats_order(
    replicas: MakeReplicas, db: str, telegram: FakeTelegram
) -> None:
    group = await replicas(3)
    chats, per_chat = 9, 8
    async with aiohttp.ClientSession() as http:

        async def one_chat(c: int) -> list[tuple[int, dict[str, object]]]:
            # each message to the next replica, the next sent once the last was answered
            return [
                await api_message(http, group[(c + i) % 3], f"c{c}", f"c{c}:{i}", f"m{i}")
                for i in range(per_chat)
            ]

        async def hot_burst() -> list[tuple[int, dict[str, object]]]:
            # one chat, 12 messages at once, over all replicas: they contend for one lease
            return list(
                await asyncio.gather(
                    *(
                        api_message(http, group[i % 3], "hot", f"hot:{i}", f"h{i}")
                        for i in range(12)
                    )
                )
            )

        async def telegram_chat() -> list[int]:
            chat = telegram.dm_chat(42)
            statuses = []
            for i in range(6):
                update = {"update_id": 500 + i, "message": telegram.message(f"tg:{i}", chat)}
                statuses.append(await telegram_update(http, group[i % 3], update))
                await telegram.wait_sent(i + 1, timeout=30)  # answered before the next
            return statuses

        results = await asyncio.gather(
            *(one_chat(c) for c in range(chats)), hot_burst(), telegram_chat()
        )
    *sequential, hot, tg_statuses = results
    for c, answers in enumerate(sequential):
        assert [s for s, _ in answers] == [200] * per_chat
        assert [b["reply"] for _, b in answers] == [f"echo: c{c}:{i}" for i in range(per_chat)]
        assert stored_user_texts(db, f"agent:main:api:dm:c{c}") == [
            f"c{c}:{i}" for i in range(per_chat)
        ]
    assert sorted(b["reply"] for s, b in hot if s == 200) == sorted(
        f"echo: hot:{i}" for i in range(12)
    )
    assert sorted(stored_user_texts(db, "agent:main:api:dm:hot")) == sorted(
        f"hot:{i}" for i in range(12)
    )
    assert tg_statuses == [200] * 6
    assert [m["text"] for m in telegram.sent()] == [f"echo: tg:{i}" for i in range(6)]
    # one live session per key, every row answered, no lease left behind
    assert set(live_sessions_per_key(db).values()) == {1}
    assert inbox_states(db) == {"answered": chats * per_chat + 12 + 6}
    # a replica that took the lease only to find its row answered frees it just after
    # that request's answer went out
    await until(lambda: held_leases(db) == [], timeout=10)
    # every replica took messages and ran turns
    runners = {r[0] for r in query(db, "SELECT DISTINCT runner FROM inbox")}
    takers = {r[0] for r in query(db, "SELECT DISTINCT replica FROM inbox")}
    assert len(takers) == 3 and len(runners) >= 2


async def test_a_killed_replicas_pending_messages_are_answered_by_another(
    replicas: MakeReplicas, db: str
) -> None:
    # r1 dies (SIGKILL, by its own fault point) as soon as one turn has its user message
    # stored and the agent about to run; the other chats' messages it took (committed,
    # acknowledged or not) are pending with it: r2 takes every one of them over
    r1, r2 = await replicas(2, env={"r1": {"SWITCHBOARD_FAULT": "mid_agent"}})
    chats = [f"k{i}" for i in range(6)]
    async with aiohttp.ClientSession() as http:
        sent = await asyncio.gather(
            *(api_message(http, r1, c, f"pending {c}", f"p-{c}") for c in chats),
            return_exceptions=True,
        )
        assert any(isinstance(s, aiohttp.ClientError) for s in sent)  # its callers were cut
        assert r1.proc is not None
        await asyncio.wait_for(r1.proc.wait(), 30)
        taken = [str(r[0]) for r in query(db, "SELECT chat_id FROM inbox")]
        assert taken, "r1 took none of the messages before dying"

        def answered() -> bool:
            return inbox_states(db) == {"answered": len(taken)}

        took = await until(answered, timeout=30)
        print(
            f"\n{len(taken)} pending message(s) of the killed replica answered by another "
            f"{took:.2f}s after the kill"
        )
        # each caller asks again (same Idempotency-Key) on the survivor: the stored answer
        for c in taken:
            status, body = await api_message(http, r2, c, f"pending {c}", f"p-{c}")
            assert (status, body["reply"], body["duplicate"]) == (200, f"echo: pending {c}", True)
    for c in taken:
        assert stored_user_texts(db, f"agent:main:api:dm:{c}") == [f"pending {c}"]
    replies = query(db, "SELECT COUNT(*) FROM messages WHERE role = 'assistant'")
    assert replies == [(len(taken),)]
    (r2_incarnation,) = query(db, "SELECT incarnation FROM replicas WHERE name = 'r2'")[0]
    # r1 died at its first turn's start, so every turn that answered ran on r2
    assert {r[0] for r in query(db, "SELECT runner FROM inbox")} == {r2_incarnation}


async def test_a_stalled_replica_that_wakes_after_a_takeover_sends_no_reply(
    replicas: MakeReplicas, db: str, telegram: FakeTelegram
) -> None:
    # r1 stops itself (SIGSTOP) mid-turn holding the chat's lease; its control connection
    # is cut as a partition would cut it; r2 takes the turn over and answers; then r1
    # goes on (SIGCONT): its reply commit fails the fence and nothing reaches the chat
    r1, r2 = await replicas(
        2, env={"r1": {"SWITCHBOARD_FAULT": "mid_agent", "SWITCHBOARD_FAULT_SIGNAL": "STOP"}}
    )
    chat = telegram.dm_chat(77)
    async with aiohttp.ClientSession() as http:
        update = {"update_id": 900, "message": telegram.message("stalled", chat)}
        delivered = asyncio.create_task(telegram_update(http, r1, update))
        # acknowledged once committed, before the turn: r1 answers 200, then stops
        assert await asyncio.wait_for(delivered, 30) == 200

        def started() -> bool:
            return inbox_states(db) == {"started": 1}

        await until(started, timeout=30)
        r1.paused = True  # it stopped itself
        assert cut_off(db, "r1") == 1
        await telegram.wait_sent(1, timeout=30)  # r2 answered
        r1.resume()
        await asyncio.sleep(3)  # r1 runs on: its end of the turn must be refused
        assert r1.proc is not None and r1.proc.returncode is None
    assert [m["text"] for m in telegram.sent()] == ["echo: stalled"]
    assert query(db, "SELECT COUNT(*) FROM messages WHERE role = 'assistant'") == [(1,)]
    assert "was taken over" in r1.log_text()
    assert inbox_states(db) == {"answered": 1}


async def test_the_leader_moves_when_it_dies(replicas: MakeReplicas, db: str) -> None:
    group = await replicas(3)
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(30):
            while len(now := await leaders(http, group)) != 1:  # noqa: ASYNC110 (asks /health)
                await asyncio.sleep(0.1)
        (old,) = now
        await old.kill()
        rest = [r for r in group if r is not old]
        started = time.monotonic()
        async with asyncio.timeout(30):
            while len(await leaders(http, rest)) != 1:  # noqa: ASYNC110 (asks /health)
                await asyncio.sleep(0.1)
        print(f"\nleadership moved {time.monotonic() - started:.2f}s after the leader died")


async def test_commits_linger_only_while_another_replica_is_live(
    replicas: MakeReplicas, db: str
) -> None:
    """cluster.commit_linger_ms (default 2) applies while other replicas share the database:
    both of two replicas say so in /health; once one is gone, the other stops waiting."""

    async def pacing(r: Replica, http: aiohttp.ClientSession) -> tuple[int, float]:
        found = (await r.health(http))["replica"]
        return found["live_replicas"], found["commit_linger_ms"]

    group = await replicas(2)
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(30):
            while [await pacing(r, http) for r in group] != [(2, 2)] * 2:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        lingering = await api_message(http, group[0], "c1", "lingering", "m1")
        await group[0].kill()
        async with asyncio.timeout(30):
            while await pacing(group[1], http) != (1, 0):  # noqa: ASYNC110 (asks /health)
                await asyncio.sleep(0.1)
        alone = await api_message(http, group[1], "c1", "alone", "m2")
    assert [lingering[1]["reply"], alone[1]["reply"]] == ["echo: lingering", "echo: alone"]
    assert stored_user_texts(db, "agent:main:api:dm:c1") == ["lingering", "alone"]


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (  # two pollers on one bot: Telegram answers the second with 409 Conflict
            "state:\n  backend: postgres\ncluster:\n  replicas: 2\nplatforms:\n  telegram:\n"
            "    enabled: true\n    allow_all_users: true\n    mode: polling\n",
            "platforms.telegram.mode",
        ),
        ("cluster:\n  replicas: 3\n", "cluster.replicas"),  # SQLite is one daemon's file
    ],
)
def test_a_configuration_replicas_cannot_share_exits_78_naming_the_key(
    tmp_path: Path, db: str, config: str, key: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(config)
    env = clean_env(SWITCHBOARD_PG_DSN=db, TELEGRAM_BOT_TOKEN="123:ABC")
    proc = subprocess.run(
        switchboard(home, "run"), capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 78, proc.stderr
    assert key in proc.stderr and "Traceback" not in proc.stderr


async def test_a_second_live_replica_with_the_same_id_exits_78(
    replicas: MakeReplicas, db: str, tmp_path: Path
) -> None:
    (first,) = await replicas(1)
    twin = Replica.on(db, first.name, tmp_path / "twin", 1)
    await twin.start(wait=False)
    assert twin.proc is not None
    code = await asyncio.wait_for(twin.proc.wait(), 60)
    out = twin.log_text()
    assert code == 78, out
    assert "cluster.replica_id" in out and "Traceback" not in out
