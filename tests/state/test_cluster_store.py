"""`state.ClusterStore`, the replica operations: what PostgreSQL offers on top of `Store`
so several `switchboard run` replicas share one database, and what SQLite does instead.

The PostgreSQL store is one (leases with fences, routes, jobs, orphaned rows, shards and
each replica's control link); the SQLite store is not, and needs none of it: one daemon
serialises a key with an in-process lock and recovers its own open rows and unsent replies
at start-up through `Store` alone (`open_inbound`, `unsent_replies`).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from state import OPEN_STATES, ClusterStore, Fence, Store


async def test_only_the_postgresql_store_is_a_cluster_store(store: Store, backend: str) -> None:
    assert isinstance(store, ClusterStore) == (backend == "postgres")


async def test_one_daemon_recovers_its_open_rows_and_unsent_replies_through_store_alone(
    store: Store, backend: str
) -> None:
    """The single-daemon path: what a crash left is read back with `Store`'s own methods,
    on every backend (a replica reads the same rows through `orphaned_inbound`)."""
    inbox_id, state, new = await store.accept_inbound("api", "c1", "m1", {"text": "hi"})
    assert new and state in OPEN_STATES
    sid = await store.create_session(source="api", chat_id="c1")
    user = {"role": "user", "content": "hi", "platform_message_id": "m1"}
    await store.begin_turn(inbox_id, sid, user)
    [row] = await store.open_inbound()
    assert (row["id"], row["state"], row["session_id"]) == (inbox_id, "started", sid)
    assert json.loads(row["payload"]) == {"text": "hi"}
    await store.end_turn(inbox_id, sid, [{"role": "assistant", "content": "hello"}])
    assert await store.open_inbound() == []
    [reply] = await store.unsent_replies()
    assert (reply["id"], reply["reply_state"], reply["content"]) == (inbox_id, "ready", "hello")


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_a_lease_is_one_replicas_at_a_time_and_a_taken_over_fence_no_longer_holds(
    store: Store,
) -> None:
    assert isinstance(store, ClusterStore)
    a, b = store.control_link("lease-a"), store.control_link("lease-b")
    await a.open()
    await b.open()
    try:
        assert a.joined and b.joined and a.space == b.space
        inbox_id, _state, new = await store.accept_inbound(
            "api", "c1", "m1", {"text": "hi"}, session_key="k", replica=a.incarnation
        )
        route = await store.take_lease("k", a.incarnation, a.space)
        assert route is not None and [r["id"] for r in route["open"]] == [inbox_id]
        fence = Fence("k", a.incarnation, int(route["lease_epoch"]))
        assert await store.lease_holds(fence)
        assert await store.take_lease("k", b.incarnation, b.space) is None  # a holds it
        assert await store.inbox_states([inbox_id]) == {inbox_id: "received"}
        await a.close()  # a replica gone: its lease is free, its row an orphan, once the
        # server has ended a's session (its locks go with it, a moment after the close)
        async with asyncio.timeout(10):
            while not (orphans := await store.orphaned_inbound(b.space, b.incarnation)):  # noqa: ASYNC110 (the server ends it)
                await asyncio.sleep(0.05)
        assert [o["id"] for o in orphans] == [inbox_id]
        taken = await store.take_lease("k", b.incarnation, b.space)
        assert taken is not None and int(taken["lease_epoch"]) > fence.epoch
        assert not await store.lease_holds(fence)
    finally:
        await a.close()
        await b.close()
