"""PgCoordinator (gateway/topology/cluster.py) against a real PostgreSQL: two coordinators, each on
its own store and control connection, as two replicas would be."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest

from gateway.agent.echo import EchoAgent
from gateway.index import IndexEntry
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.pipeline import Router
from gateway.reset import Resetter
from gateway.reset.policy import PolicySet, ResetPolicy
from gateway.services import Services
from gateway.session_keys import SessionSource
from gateway.sessions import CompressionSettings
from gateway.topology.cluster import PgCoordinator
from gateway.topology.replicated import ReplicatedTopology
from gateway.topology.routes import PgRouteIndex
from state import ChildKind, EndReason, Fence, LeaseLost, StoreConfigError
from state.pg.control import application_name
from state.pg.store import PgStore
from tests import pgserver

Replica = tuple[PgStore, PgCoordinator]


@pytest.fixture
def server(pg_server: str) -> str:
    return pg_server


@pytest.fixture
async def replica(server: str) -> AsyncIterator[Callable[[str], Awaitable[Replica]]]:
    """`await replica(name)`: a store and a started coordinator on one fresh schema."""
    schema = pgserver.fresh_schema(server)
    dsn = pgserver.with_schema(server, schema)
    made: list[Replica] = []

    async def make(name: str) -> Replica:
        store = await PgStore.open(dsn)
        link = store.control_link(f"{name}-{schema}")  # unique on a shared server

        async def all_routes() -> list[dict[str, object]]:
            return await store.routes(link.space)

        coordinator = PgCoordinator(store, link, PgRouteIndex(all_routes))
        try:
            await coordinator.start()
        except BaseException:
            await store.close()
            raise
        made.append((store, coordinator))
        return store, coordinator

    try:
        yield make
    finally:
        for store, coordinator in made:
            await coordinator.close()
            await store.close()
        pgserver.drop_schema(server, schema)


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 (a flag another task's loop sets)
            await asyncio.sleep(0.05)


async def _blocked_by(server: str, pid: int) -> int:
    """How many backends wait for a lock the backend `pid` holds."""
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as watch:
        cur = await watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)
        )
        return int((await cur.fetchone() or (0,))[0])


def _kill_control(server: str, name: str) -> None:
    """What a SIGKILL (or a partition the keepalives noticed) does to a replica's locks."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (application_name(name),),
        )


async def test_a_key_held_by_a_live_replica_waits_and_is_taken_once_released(replica) -> None:
    _, a = await replica("a")
    _, b = await replica("b")
    order: list[str] = []
    a_holds = asyncio.Event()
    release = asyncio.Event()

    async def hold_a() -> None:
        async with a.lease("k") as lease:
            assert lease is not None
            order.append("a in")
            a_holds.set()
            await release.wait()
            order.append("a out")

    async def then_b() -> None:
        await a_holds.wait()
        async with b.lease("k") as lease:
            assert lease is not None
            order.append("b in")

    task_a, task_b = asyncio.create_task(hold_a()), asyncio.create_task(then_b())
    await a_holds.wait()
    await asyncio.sleep(0.5)  # b polls meanwhile; it must not get in
    assert order == ["a in"]
    release.set()
    await asyncio.wait_for(asyncio.gather(task_a, task_b), 10)
    assert order == ["a in", "a out", "b in"]


async def test_every_take_bumps_the_epoch_and_a_stale_fence_fails(replica) -> None:
    store, a = await replica("a")
    _, b = await replica("b")
    sid = await store.create_session(source="api", session_key="k")
    rid, _, _ = await store.accept_inbound(
        "api", "1", "m1", {"text": "x"}, session_key="k", replica=a.me
    )
    async with a.lease("k", rid) as first:
        assert first is not None and [r["id"] for r in first.open] == [rid]
        old = first.fence
        await store.begin_turn(rid, sid, {"role": "user", "content": "x"}, fence=old)
    async with b.lease("k") as second:
        assert second is not None and second.fence.epoch == old.epoch + 1
        with pytest.raises(LeaseLost):  # a's turn, resumed after b took over: refused
            await store.end_turn(rid, sid, [{"role": "assistant", "content": "late"}], fence=old)
        assert await store.message_count(sid) == 1  # the zombie's reply was not written
        await store.end_turn(rid, sid, [{"role": "assistant", "content": "ok"}], fence=second.fence)
    assert await store.message_count(sid) == 2


async def test_a_dead_replicas_lease_is_free_at_once_and_its_rows_are_orphans(
    replica, server: str
) -> None:
    store, a = await replica("a")
    _, b = await replica("b")
    rid, _, _ = await store.accept_inbound(
        "api", "1", "m1", {"text": "x"}, session_key="k", replica=a.me
    )
    assert await b.orphaned_inbound() == []  # a is live and will run it
    got = asyncio.Event()

    async def a_holds_forever() -> None:
        async with a.lease("k") as lease:
            assert lease is not None
            got.set()
            await asyncio.sleep(3600)

    holder = asyncio.create_task(a_holds_forever())
    await got.wait()
    try:
        _kill_control(server, a.link.name)
        # no TTL: as soon as a's connection is gone its lease is b's to take
        async with asyncio.timeout(10):
            async with b.lease("k") as lease:
                assert lease is not None and [r["id"] for r in lease.open] == [rid]
        assert [r["id"] for r in await b.orphaned_inbound()] == [rid]
    finally:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)


@pytest.mark.slow
async def test_exactly_one_replica_leads_and_leadership_moves_when_it_dies(replica) -> None:
    _, a = await replica("a")
    _, b = await replica("b")
    await _until(lambda: a.leading or b.leading)
    leader, other = (a, b) if a.leading else (b, a)
    await asyncio.sleep(1.5)  # the other keeps trying every slice and must keep failing
    assert leader.leading and not other.leading
    await leader.close()  # its connection ends, as a killed process's does
    await _until(lambda: other.leading)


async def test_routes_notices_and_listings_travel_with_the_lease(replica) -> None:
    store, a = await replica("a")
    _, b = await replica("b")
    sid = await store.create_session(source="api", session_key="k", chat_id="1")
    async with a.lease("k") as lease:
        assert lease is not None
        entry = IndexEntry(sid, 1.0, 2.0, {"platform": "api", "chat_id": "1"}, None, "api", "dm")
        a.routes.put("k", entry)
        a.set_notice("k", "reset for you")
        a.remember_listing("k", [sid])
    assert b.routes.get("k") is None  # nothing is read outside a lease
    async with b.lease("k") as lease:
        assert lease is not None
        got = b.routes.get("k")
        # the route as a wrote it; activity is the later of the route's and the session's
        assert got is not None and got.static_part() == entry.static_part()
        assert got.updated_at >= entry.updated_at
        assert b.listing("k") == [sid]
        assert b.take_notice("k") == "reset for you"
    async with a.lease("k"):
        assert a.take_notice("k") is None  # taken once, on whichever replica


async def test_a_route_whose_session_ended_heals_to_the_keys_live_session(replica) -> None:
    store, a = await replica("a")
    old = await store.create_session(source="api", session_key="k")
    async with a.lease("k"):
        a.routes.put("k", IndexEntry(old, 1.0, 1.0, {}, None, "api", "dm"))
    await store.end_session(old, "new_session")  # as if the replica died mid-/new
    new = await store.create_session(source="api", session_key="k")
    async with a.lease("k"):
        found = a.routes.get("k")
        assert found is not None and found.session_id == new


async def test_background_jobs_of_another_replica_hold_off_its_sessions(replica) -> None:
    _, a = await replica("a")
    _, b = await replica("b")
    a.job_started("s1", "bg1")
    async with asyncio.timeout(10):
        while True:
            await b.sync_jobs()
            if b.live_jobs("s1"):
                break
            await asyncio.sleep(0.05)
    assert b.live_jobs("s1") == ["bg1"] and "s1" in b.busy_session_ids()
    a.job_finished("s1", "bg1")
    async with asyncio.timeout(10):
        while b.live_jobs("s1"):
            await asyncio.sleep(0.05)
            await b.sync_jobs()


async def test_two_live_replicas_cannot_share_a_name(replica) -> None:
    await replica("same")
    with pytest.raises(StoreConfigError, match="cluster.replica_id"):
        await replica("same")


async def test_two_sweepers_reset_an_idle_session_once_and_the_notice_reaches_the_chat_once(
    replica,
) -> None:
    """Both replicas sweep at the same moment (as two leaders never would, but a sweep in
    flight when leadership moves does): the reset is decided again under the key's lease,
    so the session is reset once, the pre-reset hook runs once, and the chat's next message,
    on either replica, carries the notice once."""
    now = [time.time()]  # the store stamps rows with the real clock
    hooks: list[str] = []
    sent: list[OutboundMessage] = []
    a, b = [await _router(replica, name, now, sent, hooks) for name in ("a", "b")]
    routers = [a, b]
    for router in routers:  # the test's clock runs ahead: nothing may count as too old
        await router.recover(30 * 86400)

    async def said(text: str, router: Router, mid: str) -> None:
        await _said(router, sent, text, mid)

    await said("hello", a, "m1")
    first = sent[-1].session_id
    now[0] += 2 * 3600
    assert a.resetter is not None and b.resetter is not None
    done = await asyncio.gather(a.resetter.apply(), b.resetter.apply())
    assert sorted(done) == [0, 1] and hooks == [first]
    await said("again", b, "m2")
    notices = [o.text for o in sent if o.notice]
    assert len(notices) == 1 and "inactivity" in notices[0]
    assert sent[-1].session_id != first and sent[-1].text == "echo: again"
    await said("and again", a, "m3")
    assert len([o for o in sent if o.notice]) == 1 and sent[-1].session_id == sent[-2].session_id


async def _said(
    router: Router, sent: list[OutboundMessage], text: str, mid: str, platform: str = "api"
) -> None:
    """Chat 9 says `text` on `router`; back once it is answered and the key's lease freed."""
    before = len(sent)
    await router.handle(InboundMessage(SessionSource(platform, "9", "dm", "9"), text, mid))
    await _until(lambda: len(sent) > before and router.inflight == 0)


async def _reset_without_write_back(router: Router, session_id: str) -> tuple[str, str]:
    """What a leader SIGKILLed between a reset's commit and freeing the key's lease leaves:
    the session ended `idle` with a live `reset` child (one transaction, as the sweep's
    reset commits it), the route still naming the old session and no notice written.
    The child's id, and the notice the chat is owed (`/resume` with the title or id)."""
    db = router.services.db
    row = await db.get_session(session_id)
    assert row is not None
    child = await db.fork_session(session_id, ChildKind.RESET, end_reason=EndReason.IDLE)
    handle = row.get("title") or session_id
    return child, (
        f"A new session was started after a period of inactivity. Send /resume {handle} to go back."
    )


async def test_a_reset_whose_replica_died_before_the_write_back_is_announced_once(
    replica,
) -> None:
    """The notice is derived when the key is next leased (here, for the chat's next message
    on the other replica): the chat is told once, in the reset's wording, and the turn runs
    in the reset child."""
    now = [time.time()]
    sent: list[OutboundMessage] = []
    a, b = [await _router(replica, name, now, sent, []) for name in ("a", "b")]
    for router in (a, b):
        await router.recover(30 * 86400)
    await _said(a, sent, "hello", "m1")
    first = str(sent[-1].session_id)
    child, owed = await _reset_without_write_back(a, first)
    await _said(b, sent, "again", "m2")
    assert [o.text for o in sent if o.notice] == [owed]
    assert sent[-1].text == "echo: again" and sent[-1].session_id == child
    await _said(a, sent, "and again", "m3")
    await _said(b, sent, "once more", "m4")
    assert len([o for o in sent if o.notice]) == 1 and sent[-1].session_id == child


async def test_a_sweep_that_finds_an_unannounced_reset_keeps_its_notice_for_the_chat(
    replica,
) -> None:
    """The next leader's sweep is the first to lease the key after the crash: it resets
    nothing more (the child is empty), and the notice it derived is written back with the
    route, so the chat's next message, on any replica, gets it once."""
    now = [time.time()]
    sent: list[OutboundMessage] = []
    hooks: list[str] = []
    a, b = [await _router(replica, name, now, sent, hooks) for name in ("a", "b")]
    for router in (a, b):
        await router.recover(30 * 86400)
    await _said(a, sent, "hello", "m1")
    first = str(sent[-1].session_id)
    child, owed = await _reset_without_write_back(a, first)
    now[0] += 2 * 3600  # the route still shows the old session's activity: due, to the sweep
    assert b.resetter is not None
    assert await b.resetter.apply() == 0 and hooks == []
    await _said(a, sent, "again", "m2")
    assert [o.text for o in sent if o.notice] == [owed]
    assert sent[-1].session_id == child
    db = a.services.db
    assert [r["id"] for r in await db.get_children(first)] == [child]
    assert await db.get_children(child) == []  # reset once


async def test_an_unannounced_reset_tells_nothing_when_its_policy_does_not_notify(
    replica,
) -> None:
    now = [time.time()]
    sent: list[OutboundMessage] = []
    a = await _router(replica, "a", now, sent, [], notify=False)
    await a.recover(30 * 86400)
    await _said(a, sent, "hello", "m1")
    child, _ = await _reset_without_write_back(a, str(sent[-1].session_id))
    await _said(a, sent, "again", "m2")
    assert [o.text for o in sent] == ["echo: hello", "echo: again"]
    assert sent[-1].session_id == child


async def _router(
    replica: Callable[[str], Awaitable[Replica]],
    name: str,
    now: list[float],
    sent: list[OutboundMessage],
    hooks: list[str],
    *,
    notify: bool = True,
) -> Router:
    """A replica's router on its coordinator: the echo agent, replies into `sent`, an idle
    policy of 60 minutes with notices (unless `notify` is off), a pre-reset hook recording
    into `hooks`."""
    store, coordinator = await replica(name)

    async def send(out: OutboundMessage) -> SentRef:
        sent.append(out)
        return SentRef(out.platform, out.chat_id, ("1",))

    async def hook(session_id: str, reason: str) -> None:
        hooks.append(session_id)
        await asyncio.sleep(0.2)  # long enough for another sweep to queue behind it

    policies = PolicySet(default=ResetPolicy("idle", idle_minutes=60, notify=notify))

    def resetter(services: Services) -> Resetter:
        return Resetter(services, policies, hook=hook, clock=lambda: now[0])

    return Router(
        store,
        coordinator.routes,
        EchoAgent(),
        send,
        clock=lambda: now[0],
        topology=ReplicatedTopology(coordinator),
        resetter=resetter,
    )


async def test_a_row_left_open_before_replicas_is_run_by_the_takeover(replica) -> None:
    """A row without its key or taker (a single daemon before schema 3 left it open) is
    picked up by the takeover scan and answered once."""
    sent: list[OutboundMessage] = []
    router = await _router(replica, "a", [time.time()], sent, [])
    msg = InboundMessage(SessionSource("api", "5", "dm", "5"), "left over", "old1")
    await router.services.db.accept_inbound("api", "5", "old1", msg.as_payload())
    assert await router.recover(3600) == (1, 0)
    await _until(lambda: bool(sent) and router.inflight == 0)
    assert [o.text for o in sent] == ["echo: left over"]
    assert await router.recover(3600) == (0, 0)
    assert (await router.services.db.inbox_counts()) == {"answered": 1}


async def _three_accepted(
    store: PgStore, a: PgCoordinator
) -> tuple[dict[str, str], dict[str, int]]:
    """Keys k1-k3, each with a session and a row accepted by `a`: (sessions, inbox ids)."""
    sids, rows = {}, {}
    for key in ("k1", "k2", "k3"):
        sids[key] = await store.create_session(source="api", session_key=key)
        rows[key], _, _ = await store.accept_inbound(
            "api", key, "m", {"text": key}, session_key=key, replica=a.me
        )
    return sids, rows


async def test_a_stale_fence_fails_only_its_own_write_in_a_batch(replica) -> None:
    """Fenced writes are batched by the writer; one stale fence among them fails its own
    caller only (the batch is redone one write at a time)."""
    store, a = await replica("a")
    sids, rows = await _three_accepted(store, a)
    async with a.lease("k1") as l1, a.lease("k2") as l2, a.lease("k3") as l3:
        assert l1 is not None and l2 is not None and l3 is not None
        stale = Fence("k2", a.me, l2.fence.epoch - 1)
        fences = {"k1": l1.fence, "k2": stale, "k3": l3.fence}
        got = await asyncio.gather(
            *(
                store.begin_turn(rows[k], sids[k], {"role": "user", "content": k}, fence=fences[k])
                for k in ("k1", "k2", "k3")
            ),
            return_exceptions=True,
        )
    assert isinstance(got[1], LeaseLost)
    assert not isinstance(got[0], BaseException) and not isinstance(got[2], BaseException)
    assert [await store.message_count(sids[k]) for k in ("k1", "k2", "k3")] == [1, 0, 1]


async def test_turn_ends_that_free_their_leases_are_fenced_by_the_release(replica) -> None:
    """A batch whose fenced writes all free their leases (the HTTP API's turn ends) checks
    the fences by the release itself: a stale one fails its own write, frees nothing and
    leaves the key with its holder; the others are written and their keys free."""
    store, a = await replica("a")
    sids, rows = await _three_accepted(store, a)
    async with a.lease("k1") as l1, a.lease("k2") as l2, a.lease("k3") as l3:
        assert l1 is not None and l2 is not None and l3 is not None
        leases = {"k1": l1, "k2": l2, "k3": l3}
        fences = {"k1": l1.fence, "k2": Fence("k2", a.me, l2.fence.epoch - 1), "k3": l3.fence}
        backs = {k: a.hand_back(leases[k]) for k in leases}
        got = await asyncio.gather(
            *(
                store.end_turn(
                    rows[k],
                    sids[k],
                    [{"role": "assistant", "content": k}],
                    fence=fences[k],
                    release=backs[k].plan(),
                )
                for k in ("k1", "k2", "k3")
            ),
            return_exceptions=True,
        )
        assert isinstance(got[1], LeaseLost)
        assert not isinstance(got[0], BaseException) and not isinstance(got[2], BaseException)
        for k in ("k1", "k3"):
            backs[k].done()
        with psycopg.connect(store._dsn, autocommit=True) as conn:
            owners = dict(conn.execute("SELECT session_key, lease_owner FROM session_routes"))
        assert owners == {"k1": None, "k2": a.me, "k3": None}
    assert [await store.message_count(sids[k]) for k in ("k1", "k2", "k3")] == [1, 0, 1]
    assert (await store.inbox_counts()) == {"answered": 2, "received": 1}


async def test_one_statement_accepts_takes_new_keys_and_releases_a_batchs_leases(
    replica,
) -> None:
    """turns_many's accepts, the takes of the keys of the rows that went in and its turn
    ends' releases run as one statement: a new row's idle key is taken (by the key's first
    call only), a key another live replica holds is not, a redelivery takes nothing, the
    ended turn's key comes free; and a batch with a lost lease among its releases commits
    none of it."""
    from state.pg import cluster as pg_cluster
    from state.pg import db as pg_db
    from state.pg import turns as pg_turns

    store, a = await replica("a")
    _, b = await replica("b")
    sids, rows = await _three_accepted(store, a)
    space, now = a.link.space, time.time()

    def accept(key: str, pmid: str) -> pg_turns.AcceptTake:
        return pg_turns.AcceptTake("api", key, pmid, '{"text": "x"}', now, key, a.me, space, None)

    async with await psycopg.AsyncConnection.connect(store._dsn, autocommit=True) as conn:
        pg_db.binary_lists(conn)
        async with conn.transaction():
            route = await pg_cluster.take_lease(conn, "k1", a.me, space)
        assert route is not None
        fence = Fence("k1", a.me, int(route["lease_epoch"]))
        end = (rows["k1"], sids["k1"], [{"role": "assistant", "content": "done"}], None, "ready")

        async with b.lease("kb") as held:  # b holds kb meanwhile
            assert held is not None
            async with conn.transaction():
                done, wrote = await pg_turns.turns_many(
                    conn,
                    [
                        accept("kx", "x1"),
                        accept("kb", "b1"),
                        accept("k2", "m"),
                        accept("kx", "x2"),
                        accept("ky", "y1"),
                    ],
                    [(fence, "end", end, (None, []))],
                )
            assert len(wrote[0]) == 1  # the reply's message id
            new = [d[2] for d in done]
            assert new == [True, True, False, True, True]  # ("api", "k2", "m") was there
            assert done[2][0] == rows["k2"]
            taken = [d[3] is not None for d in done]
            assert taken == [True, False, False, False, True]  # kx's first call only; kb is b's
            kx = done[0][3]
            assert kx is not None and kx["session_key"] == "kx" and kx["lease_owner"] == a.me
            assert [r["id"] for r in kx["open"]] == [done[0][0], done[3][0]]
            cur = await conn.execute("SELECT session_key, lease_owner FROM session_routes")
            owners = dict(await cur.fetchall())
            assert owners == {"k1": None, "kx": a.me, "ky": a.me, "kb": b.me}

        # a release whose lease was lost: the whole batch fails, its accept with it
        async with conn.transaction():
            await pg_cluster.take_lease(conn, "k3", a.me, space)
        stale = Fence("k3", a.me, 0)
        end3 = (rows["k3"], sids["k3"], [{"role": "assistant", "content": "x"}], None, "ready")
        with pytest.raises(LeaseLost):
            async with conn.transaction():
                await pg_turns.turns_many(
                    conn, [accept("kz", "z1")], [(stale, "end", end3, (None, []))]
                )
        cur = await conn.execute("SELECT count(*) FROM inbox WHERE chat_id = 'kz'")
        assert (await cur.fetchone()) == (0,)
        cur = await conn.execute("SELECT lease_owner FROM session_routes WHERE session_key = 'k3'")
        assert (await cur.fetchone()) == (a.me,)
    assert await store.message_count(sids["k1"]) == 1 and await store.message_count(sids["k3"]) == 0


async def test_a_dead_runners_reply_is_sent_again_under_its_keys_lease(
    replica, server: str
) -> None:
    """The takeover scan sends a dead runner's unconfirmed reply while holding the reply's
    key, so no other replica's turn of that chat can send its own reply in between (a
    replica that wants the key meanwhile waits until the old reply is out)."""
    store, a = await replica("a")
    gate, sending = asyncio.Event(), asyncio.Event()
    sent: list[str] = []

    async def send(out: OutboundMessage) -> SentRef:
        sending.set()
        await gate.wait()
        sent.append(out.text)
        return SentRef(out.platform, out.chat_id, ("1",))

    router = Router(store, a.routes, EchoAgent(), send, topology=ReplicatedTopology(a))
    msg = InboundMessage(SessionSource("api", "7", "dm", "7"), "hello", "m7")
    key = router.key_for(msg).format()
    # a runner that committed the reply ('ready', not yet sent) and died holding the key
    d_store, d = await replica("d")
    sid = await d_store.create_session(source="api", session_key=key)
    rid, _, _ = await d_store.accept_inbound(
        "api", "7", "m7", msg.as_payload(), session_key=key, replica=d.me
    )
    route = await d_store.take_lease(key, d.me, d.link.space)
    assert route is not None
    fence = Fence(key, d.me, int(route["lease_epoch"]))
    await d_store.begin_turn(rid, sid, {"role": "user", "content": "hello"}, fence=fence)
    await d_store.end_turn(
        rid,
        sid,
        [{"role": "assistant", "content": "echo: hello"}],
        reply_state="ready",
        fence=fence,
    )
    _kill_control(server, d.link.name)

    _, b = await replica("b")
    scan = asyncio.create_task(router.recover(3600))
    order: list[str] = []

    async def b_takes_the_key() -> None:
        async with b.lease(key) as lease:
            assert lease is not None and lease.unsent == []  # already sent by a
            order.append("b holds the key")

    try:
        await asyncio.wait_for(sending.wait(), 10)
        taker = asyncio.create_task(b_takes_the_key())
        await asyncio.sleep(0.6)  # b polls meanwhile: the key is a's while the reply goes
        order.append("the old reply sent")
        gate.set()
        await asyncio.wait_for(asyncio.gather(scan, taker), 10)
    finally:
        gate.set()
        scan.cancel()
    assert order == ["the old reply sent", "b holds the key"]
    assert sent == ["echo: hello"]
    assert await router.recover(3600) == (0, 0) and sent == ["echo: hello"]  # once


async def test_an_accept_takes_an_idle_keys_lease_for_its_turn(replica) -> None:
    """The row's commit takes the key's lease when nothing here holds the key; the row's
    turn adopts it (the same epoch, no second take) and another replica waits meanwhile.
    A key another live replica holds is only accepted: its turn takes the lease later."""
    _, a = await replica("a")
    _, b = await replica("b")
    rid, _, new, _ = await a.accept("k", "api", "1", "m1", {"text": "x"}, lease=True)
    assert new and a.held("k") is None  # taken, kept for the turn (not held by a turn yet)
    async with b.lease_now("k") as other:
        assert other is None  # a's, though no turn of a runs yet
    async with a.lease("k", rid) as lease:
        assert lease is not None and [r["id"] for r in lease.open] == [rid]
        assert int(lease.fence.epoch) == 1  # the accept's take: no second one
    # now b holds the key; a's next accept commits the row and takes nothing
    got = asyncio.Event()
    release = asyncio.Event()

    async def b_holds() -> None:
        async with b.lease("k") as held:
            assert held is not None
            got.set()
            await release.wait()

    holder = asyncio.create_task(b_holds())
    await got.wait()
    rid2, _, new2, _ = await a.accept("k", "api", "1", "m2", {"text": "y"}, lease=True)
    assert new2 and rid2 not in a._adopted
    release.set()
    await holder
    async with a.lease("k", rid2) as lease:
        assert lease is not None and [r["id"] for r in lease.open] == [rid, rid2]


async def test_a_take_that_fails_locks_nothing(replica) -> None:
    """A replica asking for a key another holds must not lock its route row: the holder's
    fenced writes would wait for the asker's whole batch (and batches taking keys in other
    orders deadlocked). The failed take, left uncommitted here, and the holder's fence
    check on the same row, which must not wait."""
    from state.pg import cluster as pg_cluster

    store, a = await replica("a")
    _, b = await replica("b")
    async with a.lease("k") as held:
        assert held is not None
        async with await psycopg.AsyncConnection.connect(store._dsn) as conn:
            # b's take, in a transaction of its own that stays open
            assert await pg_cluster.take_lease(conn, "k", b.me, b.link.space) is None
            async with await psycopg.AsyncConnection.connect(store._dsn, autocommit=True) as other:
                await other.execute("SET lock_timeout = '2s'")
                # what a's next fenced write does first: the row FOR SHARE
                got = await (
                    await other.execute(
                        "SELECT lease_owner FROM session_routes WHERE session_key = 'k' FOR SHARE"
                    )
                ).fetchall()
            assert got == [(a.me,)]
            await conn.rollback()


async def test_a_row_taken_here_and_run_by_a_replica_that_died_is_answered_before_the_next(
    replica, server: str
) -> None:
    """a takes X while d holds the key; d runs X, commits its reply and dies before sending
    it, just after a's waiting task saw X still open. a's task then gets the lease with X's
    reply among the dead runner's unsent ones: it must go out before the reply to Y, the
    next message a took (the chaos test saw a Slack chat's replies cross this way). A take
    that meets the route row locked by another transaction does not wait for it (it would
    read the key's state from before that transaction): it fails, and a tries again."""
    sent: list[str] = []

    async def send(out: OutboundMessage) -> SentRef:
        sent.append(out.text)
        return SentRef(out.platform, out.chat_id, ("1",))

    store, a = await replica("a")
    router = Router(store, a.routes, EchoAgent(), send, topology=ReplicatedTopology(a))
    x = InboundMessage(SessionSource("api", "9", "dm", "9"), "X", "mx")
    y = InboundMessage(SessionSource("api", "9", "dm", "9"), "Y", "my")
    key = router.key_for(x).format()
    d_store, d = await replica("d")
    sid = await d_store.create_session(source="api", session_key=key)
    route = await d_store.take_lease(key, d.me, d.link.space)
    assert route is not None
    fence = Fence(key, d.me, int(route["lease_epoch"]))
    await router.handle(x)  # committed; its task waits for d's lease
    await router.handle(y)  # committed; queued behind X's task on a's own lock
    rows = {r["payload"]: int(r["id"]) for r in await store.open_inbound()}
    x_id = next(i for p, i in rows.items() if '"X"' in str(p))
    await d_store.begin_turn(x_id, sid, {"role": "user", "content": "X"}, fence=fence)
    async with await psycopg.AsyncConnection.connect(store._dsn) as blocker:
        # holds the route row, so a's next take (after its read that X is open) waits
        await blocker.execute(
            "SELECT 1 FROM session_routes WHERE session_key = %s FOR UPDATE", (key,)
        )
        me = blocker.info.backend_pid
        tried = store.write_stats().operations
        _kill_control(server, d.link.name)  # d is gone: its lease is anyone's
        await _until(lambda: store.write_stats().operations >= tried + 2)  # a took twice
        assert not await _blocked_by(server, me)  # and waited for nobody
        # d's reply to X is committed meanwhile, not sent
        await d_store.end_turn(
            x_id, sid, [{"role": "assistant", "content": "echo: X"}], reply_state="ready"
        )
        await blocker.rollback()
    await _until(lambda: len(sent) == 2 and router.inflight == 0)
    assert sent == ["echo: X", "echo: Y"]
    assert await store.inbox_counts() == {"answered": 2}


async def _settled_operations(store: PgStore) -> int:
    """The writer's operations so far, once nothing more is being written (the reply's
    mark and the lease's release follow the reply)."""
    last = -1
    while True:
        now = store.write_stats().operations
        if now == last and store.write_stats().queue_depth == 0:
            return now
        last = now
        await asyncio.sleep(0.2)


async def test_a_message_to_an_idle_key_begins_in_its_accept_unless_a_reset_is_due(
    replica,
) -> None:
    """A plain message whose accept takes its key's lease is stored in the key's session in
    that same commit (two writes for an HTTP API turn: accept with take and begin, end
    with release; see the next test). A message arriving when its session is due an idle
    reset does not: the reset comes first, with its notice."""
    now = [time.time()]
    sent: list[OutboundMessage] = []
    router = await _router(replica, "a", now, sent, [])
    await router.recover(30 * 86400)  # the clock below runs ahead: nothing is too old
    store = router.services.db
    assert isinstance(store, PgStore)
    await _said(router, sent, "hello", "m1")  # first contact: the session is made
    first = sent[-1].session_id
    before = await _settled_operations(store)
    await _said(router, sent, "again", "m2")
    assert await _settled_operations(store) - before == 2
    assert sent[-1].text == "echo: again" and sent[-1].session_id == first
    assert [m["content"] for m in await store.get_messages(str(first))] == [
        "hello",
        "echo: hello",
        "again",
        "echo: again",
    ]
    now[0] += 2 * 3600  # past the 60-minute idle policy
    await _said(router, sent, "later", "m3")
    assert [o.text for o in sent if o.notice] and "inactivity" in sent[-2].text
    assert sent[-1].text == "echo: later" and sent[-1].session_id != first
    assert [m["content"] for m in await store.get_messages(str(sent[-1].session_id))] == [
        "later",
        "echo: later",
    ]


async def _route(store: PgStore, key: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(store._dsn) as conn:
        cur = await conn.execute(
            "SELECT lease_owner, session_id, updated_at FROM session_routes WHERE session_key = %s",
            (key,),
        )
        row = await cur.fetchone()
    assert row is not None
    return {"owner": row[0], "session_id": row[1], "updated_at": row[2]}


async def _reply_state(store: PgStore, mid: str) -> str | None:
    async with await psycopg.AsyncConnection.connect(store._dsn) as conn:
        cur = await conn.execute(
            "SELECT reply_state FROM inbox WHERE platform_message_id = %s", (mid,)
        )
        row = await cur.fetchone()
    return None if row is None else row[0]


async def test_an_api_reply_frees_its_keys_lease_in_its_own_commit(replica) -> None:
    """An HTTP API reply is its request's response: nothing of the chat can overtake it, so
    its commit also frees the key's lease (writing the route back) and stores it as sent.
    The chat's next message finds the key free on any replica and its turn begins in its
    accept there. A chat platform's reply keeps the lease until it is sent, and is marked
    after the send: four writes, and the route is freed only after the send."""
    now = [time.time()]
    sent: list[OutboundMessage] = []
    a, b = [await _router(replica, name, now, sent, []) for name in ("a", "b")]
    for router in (a, b):
        await router.recover(30 * 86400)
    store_a, store_b = a.services.db, b.services.db
    assert isinstance(store_a, PgStore) and isinstance(store_b, PgStore)
    await _said(a, sent, "hello", "m1")
    first = sent[-1].session_id
    route = await _route(store_a, "agent:main:api:dm:9")
    assert route["owner"] is None and route["session_id"] == first
    stamped = route["updated_at"]
    assert await _reply_state(store_a, "m1") == "sent"
    now[0] += 60
    before = await _settled_operations(store_b)
    await _said(b, sent, "again", "m2")  # the other replica: the key is free at its accept
    assert await _settled_operations(store_b) - before == 2
    assert sent[-1].text == "echo: again" and sent[-1].session_id == first
    route = await _route(store_b, "agent:main:api:dm:9")
    assert route["owner"] is None and route["updated_at"] > stamped  # the turn's touch written
    assert [m["content"] for m in await store_b.get_messages(str(first))] == [
        "hello",
        "echo: hello",
        "again",
        "echo: again",
    ]
    # a chat platform: the reply is marked after its send and the lease freed after that
    await _said(a, sent, "hi", "t1", platform="telegram")
    before = await _settled_operations(store_a)
    await _said(a, sent, "more", "t2", platform="telegram")
    assert await _settled_operations(store_a) - before == 4
    assert await _reply_state(store_a, "t2") == "sent"
    assert (await _route(store_a, "agent:main:telegram:dm:9"))["owner"] is None


async def test_an_api_turn_that_compresses_its_session_keeps_the_lease_until_then(replica) -> None:
    """An automatic compression after the reply forks the session under the key's lease,
    so that turn's reply does not free the lease: the route names the compressed child
    when it is freed, and the chat's next message, on another replica, continues there."""
    now = [time.time()]
    sent: list[OutboundMessage] = []
    a, b = [await _router(replica, name, now, sent, []) for name in ("a", "b")]
    for router in (a, b):
        await router.recover(30 * 86400)
        router.sessions.compression = CompressionSettings(keep_last=2, auto_share=1e-9)
    store = a.services.db
    assert isinstance(store, PgStore)
    await _said(a, sent, "hello", "m1")  # two messages: nothing to compress yet
    first = sent[-1].session_id
    await _said(a, sent, "again", "m2")  # compressed after its reply
    await _until(lambda: a.inflight == 0)
    route = await _route(store, "agent:main:api:dm:9")
    child = route["session_id"]
    assert route["owner"] is None and child != first
    parent = await store.get_session(str(child))
    assert parent is not None and parent["parent_session_id"] == first
    await _said(b, sent, "more", "m3")
    assert sent[-1].text == "echo: more" and sent[-1].session_id == child
