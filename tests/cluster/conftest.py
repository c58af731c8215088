"""Fixtures for the cluster tests: the PostgreSQL server, the platform fakes, and a
factory that starts N replicas behind the balancer (and always stops both)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.balancer import Balancer
from tests.cluster.harness import Cluster, Platforms, drop_database, fresh_database
from tests.fakes import running
from tests.fakes.discord import GUILD, GUILD2, FakeDiscord, restore_discord_globals
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

StartCluster = Callable[..., Awaitable[tuple[Cluster, Balancer]]]


@pytest.fixture
async def db(pg_server: str) -> AsyncIterator[str]:
    """A fresh database on the server for one test (replicas share it), dropped after."""
    name, dsn = fresh_database(pg_server)
    try:
        yield dsn
    finally:
        drop_database(pg_server, name)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegram]:
    async with running(FakeTelegram()) as fake:
        yield fake


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    async with running(FakeSlack()) as fake:
        yield fake


@pytest.fixture
async def discord(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeDiscord]:
    """The Discord fake with two guilds, which two gateway shards divide."""
    restore_discord_globals(monkeypatch)
    async with running(FakeDiscord(guilds=(GUILD, GUILD2))) as fake:
        yield fake


@pytest.fixture
async def start_cluster(
    tmp_path: Path, pg_server: str, telegram: FakeTelegram, slack: FakeSlack
) -> AsyncIterator[StartCluster]:
    """`await start_cluster(n, **extra_config)`: n replicas on a fresh database, started,
    behind a started balancer. Both are stopped after the test; a replica that does not
    exit 0 on SIGTERM fails it."""
    made: list[tuple[Cluster, Balancer]] = []

    async def _start(n: int, start: bool = True, **extra: Any) -> tuple[Cluster, Balancer]:
        balancer = Balancer(lambda: [r.url for r in cluster.live()], timeout_s=15.0)
        await balancer.start()
        platforms = Platforms(telegram.base_url, slack.base_url, balancer.url)
        cluster = Cluster(tmp_path / f"cluster{len(made)}", pg_server, n, platforms, extra)
        made.append((cluster, balancer))
        if start:
            await cluster.start()
        return cluster, balancer

    try:
        yield _start
    finally:
        failed = []
        for cluster, balancer in made:
            await balancer.stop()
            codes = await cluster.close()
            failed += [
                f"{name} exited {code}" for name, code in codes.items() if code not in (0, None)
            ]
        assert failed == [], f"replicas did not drain cleanly on SIGTERM: {failed}"
