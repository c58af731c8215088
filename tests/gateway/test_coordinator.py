"""The Coordinator contract: what the router, commands and the Resetter rely on.

The fixture is parametrised over implementations; a coordinator for several replicas
adds its parameter here and must pass the same tests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.topology import coordinator as coordinator_module
from gateway.topology.coordinator import Coordinator, LocalCoordinator


@pytest.fixture(params=["local"])
def coordinator(request: pytest.FixtureRequest) -> Iterator[Coordinator]:
    yield LocalCoordinator()


async def test_a_session_lock_serialises_one_key_in_arrival_order(
    coordinator: Coordinator,
) -> None:
    order: list[str] = []
    first_in = asyncio.Event()
    release = asyncio.Event()

    async def work(name: str, key: str, hold: bool = False) -> None:
        async with coordinator.session_lock(key):
            order.append(f"{name} in")
            if hold:
                first_in.set()
                await release.wait()
            order.append(f"{name} out")

    tasks = [asyncio.create_task(work("a", "k1", hold=True))]
    await first_in.wait()
    tasks += [asyncio.create_task(work(n, "k1")) for n in ("b", "c")]
    other = asyncio.create_task(work("x", "k2"))  # another key is never held up
    await asyncio.wait_for(other, 10)
    await asyncio.sleep(0)
    assert order == ["a in", "x in", "x out"]
    release.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order[3:] == ["a out", "b in", "b out", "c in", "c out"]


async def test_a_failure_inside_the_lock_releases_it(coordinator: Coordinator) -> None:
    with pytest.raises(RuntimeError):
        async with coordinator.session_lock("k"):
            raise RuntimeError("boom")
    async with asyncio.timeout(10):
        async with coordinator.session_lock("k"):
            pass


def test_redeliveries_are_remembered(coordinator: Coordinator) -> None:
    msg = ("telegram", "42", "7")
    assert not coordinator.seen(msg)
    coordinator.remember(msg)
    assert coordinator.seen(msg)
    assert not coordinator.seen(("telegram", "43", "7"))  # the chat is part of the id


def test_jobs_are_tracked_per_session(coordinator: Coordinator) -> None:
    first, second = coordinator.new_job_id(), coordinator.new_job_id()
    assert first != second
    coordinator.job_started("s1", "turn")
    coordinator.job_started("s1", first)
    coordinator.job_started("s2", second)
    assert coordinator.live_jobs("s1") == sorted(["turn", first])
    assert coordinator.busy_session_ids() == {"s1", "s2"}
    coordinator.job_finished("s1", "turn")
    coordinator.job_finished("s1", first)
    coordinator.job_finished("s1", first)  # twice is harmless
    assert coordinator.live_jobs("s1") == []
    assert coordinator.busy_session_ids() == {"s2"}


def test_listings_and_notices(coordinator: Coordinator) -> None:
    assert coordinator.listing("k") is None
    coordinator.remember_listing("k", ["a", "b"])
    coordinator.remember_listing("k", ["c"])
    assert coordinator.listing("k") == ["c"]
    coordinator.forget_listing("k")
    assert coordinator.listing("k") is None
    coordinator.set_notice("k", "A new session was started")
    assert coordinator.take_notice("k") == "A new session was started"
    assert coordinator.take_notice("k") is None  # said once


def test_the_local_memories_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "DEDUPE_MEMORY", 3)
    monkeypatch.setattr(coordinator_module, "LISTING_MEMORY", 2)
    local = LocalCoordinator()
    for i in range(4):
        local.remember(("p", "c", str(i)))
        local.remember_listing(f"k{i}", [str(i)])
    assert not local.seen(("p", "c", "0")) and local.seen(("p", "c", "1"))
    assert local.listing("k1") is None and local.listing("k2") == ["2"]
