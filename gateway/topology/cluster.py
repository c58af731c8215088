"""`PgCoordinator`: the Coordinator of several `switchboard run` replicas on one PostgreSQL
database, with session-key leases instead of in-process locks.

Within the process a key is still serialised by an asyncio lock (arrival order); across
processes by the key's lease in `session_routes` (state/pg/cluster.py): taken when free or
when its owner's control connection is gone, never by a timer, so a 300 s turn keeps it.
A replica waiting for a key sleeps until a NOTIFY on its own channel (the lease was freed
with its rows open, or one of its rows was answered elsewhere) or a short poll. Whoever
holds a key runs the key's open inbox rows in id order, so a message taken by another
replica meanwhile is not overtaken. Turn writes carry the lease's `Fence`. Listings and
notices live in the route (gateway/topology/routes.py); background jobs in `live_jobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from gateway.topology.coordinator import LocalCoordinator, MessageKey
from gateway.topology.leases import HandBack, InboxRow, Lease, ReplyRow, ResetNotice, Stored
from gateway.topology.routes import PgRouteIndex
from state import (
    OPEN_STATES,
    BeginPlan,
    ClusterStore,
    Fence,
    Release,
    ReplicaLink,
    StateError,
    StoreUnavailable,
    Wakeup,
)

log = logging.getLogger("gateway.cluster")

# the first poll while waiting for a key, doubling up to POLL_MAX_S; short, since a take
# that meets a release not yet committed fails without waiting for it
POLL_FIRST_S = 0.05
POLL_MAX_S = 2.0
RELEASE_ATTEMPTS = 20  # about half a minute of retries
TURN_JOB = "turn"  # a turn runs under its key's lease: only background jobs need rows


class PgCoordinator:
    """Coordinator for replicas sharing one PostgreSQL store (see the module docstring)."""

    def __init__(self, store: ClusterStore, link: ReplicaLink, routes: PgRouteIndex) -> None:
        self.store = store
        self.link = link
        self.routes = routes
        self._local = LocalCoordinator()  # in-process order, redelivery memory, job names
        self._held: dict[str, Lease] = {}
        self._waiters: dict[str, set[asyncio.Event]] = {}  # "k:<key>" / "d:<id>" -> events
        self._remote_jobs: dict[str, set[str]] = {}  # session id -> jobs on other replicas
        self._writes: set[asyncio.Task[None]] = set()
        self._serve: asyncio.Task[None] | None = None
        # inbox id -> the lease its accept took, with the key's local lock (see accept)
        self._adopted: dict[int, tuple[Lease, Callable[[], None]]] = {}

    # --- lifecycle --------------------------------------------------------------------

    @property
    def me(self) -> int:
        return self.link.incarnation

    @property
    def leading(self) -> bool:
        return self.link.leading

    async def start(self) -> None:
        await self.link.open()
        self._serve = asyncio.create_task(
            self.link.serve(self._wake, self._rejoined), name="gateway.cluster.control"
        )

    async def close(self) -> None:
        adopted, self._adopted = self._adopted, {}
        for lease, unlock in adopted.values():  # turns that never started (shutdown)
            await self._release(lease)
            unlock()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self._serve is not None:
            self._serve.cancel()
            await asyncio.gather(self._serve, return_exceptions=True)
            self._serve = None
        await self.link.close()

    def _wake(self, note: Wakeup) -> None:
        for event in self._waiters.get(f"{note.kind}:{note.ref}", ()):
            event.set()

    def _rejoined(self, incarnation: int) -> None:
        # the old incarnation's leases are anyone's now; turns still holding them will
        # fail their fences and withhold their replies
        log.warning(
            "rejoined as incarnation %d; %d held lease(s) are void", incarnation, len(self._held)
        )

    # --- leases -----------------------------------------------------------------------

    async def accept(
        self,
        key: str,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        lease: bool,
        begin: BeginPlan | None = None,
    ) -> tuple[int, str, bool, Stored | None]:
        """Commit an inbound message, its row naming its key and this replica: (inbox id,
        state, new, begun). With `lease`, when no work here holds or awaits the key, the
        key's lease is taken in the same commit and kept, with the key's local lock, for the
        row's turn (`lease(key, inbox_id)` adopts it): a turn then costs a write less; and
        with `begin`, when its test allows, the turn's begin too (`begun`: the message's id
        and the history, as begin_turn returns them), a second write less."""
        if not self.link.joined:  # this incarnation's lock is gone: nothing in its name
            raise StoreUnavailable(self.store.where, "the control connection is down (rejoining)")
        unlock = self._local.try_session_lock(key) if lease else None
        if unlock is None:
            inbox_id, state, new = await self.store.accept_inbound(
                platform,
                chat_id,
                platform_message_id,
                payload,
                session_key=key,
                replica=self.me,
            )
            return inbox_id, state, new, None
        try:
            inbox_id, state, new, route, begun = await self.store.accept_and_take(
                platform,
                chat_id,
                platform_message_id,
                payload,
                session_key=key,
                me=self.me,
                space=self.link.space,
                begin=begin,
            )
        except BaseException:
            unlock()
            raise
        if route is None:  # not new, or a live replica holds the key: taken at the turn
            unlock()
        else:
            self._adopted[inbox_id] = (self._lease_of(key, route), unlock)
        return inbox_id, state, new, begun

    @contextlib.asynccontextmanager
    async def lease(self, key: str, inbox_id: int | None = None) -> AsyncIterator[Lease | None]:
        """Hold `key` on this replica and across replicas. Yields None instead when
        `inbox_id` was answered elsewhere while waiting (nothing left to do for it)."""
        adopted = self._adopted.pop(inbox_id, None) if inbox_id is not None else None
        if adopted is not None:  # taken with the row's accept, the local lock with it
            lease, unlock = adopted
            try:
                async with self._holding(lease):
                    yield lease
            finally:
                unlock()
            return
        async with self._local.session_lock(key):
            taken = await self._take(key, inbox_id)
            if taken is None:
                yield None
                return
            async with self._holding(taken):
                yield taken

    @contextlib.asynccontextmanager
    async def lease_now(self, key: str) -> AsyncIterator[Lease | None]:
        """`lease` without waiting: None when work here or another live replica holds
        the key (or the database is away)."""
        unlock = self._local.try_session_lock(key)
        if unlock is None:
            yield None
            return
        try:
            try:
                row = (
                    await self.store.take_lease(key, self.me, self.link.space)
                    if self.link.joined
                    else None
                )
            except StateError as exc:
                log.warning("could not take the lease on session_key=%s: %s", key, exc)
                row = None
            if row is None:
                yield None
                return
            async with self._holding(self._lease_of(key, row)) as lease:
                yield lease
        finally:
            unlock()

    @contextlib.asynccontextmanager
    async def _holding(self, lease: Lease) -> AsyncIterator[Lease]:
        key = lease.fence.session_key
        self._held[key] = lease
        try:
            yield lease
        finally:
            del self._held[key]
            if not lease.freed:
                await self._release(lease)

    def hand_back(self, lease: Lease, answered: Sequence[tuple[int, int]] = ()) -> HandBack:
        key = lease.fence.session_key

        def plan() -> Release:
            return self.routes.changes(key, peek=True), [*lease.answered, *answered]

        def done() -> None:
            self.routes.changes(key)  # written by that commit
            lease.freed = True

        return HandBack(plan, done)

    def fence(self, key: str) -> Fence | None:
        held = self._held.get(key)
        return None if held is None else held.fence

    def held(self, key: str) -> Lease | None:
        return self._held.get(key)

    async def _take(self, key: str, inbox_id: int | None) -> Lease | None:
        event = asyncio.Event()
        names = [f"k:{key}"] + ([f"d:{inbox_id}"] if inbox_id is not None else [])
        for name in names:
            self._waiters.setdefault(name, set()).add(event)
        poll = POLL_FIRST_S
        waited = False
        try:
            while True:
                event.clear()
                # after a wait (woken or polled) for a row the holder may have run: a read,
                # before a take that would hold the key (and keep it from the others) only to
                # find it done
                if waited and inbox_id is not None and not await self.row_open(inbox_id):
                    return None
                waited = True
                try:
                    if not self.link.joined:  # a lease taken now would be void at the rejoin
                        raise StoreUnavailable(self.store.where, "the control connection is down")
                    row = await self.store.take_lease(key, self.me, self.link.space)
                except StateError as exc:  # the database is away: keep the turn, retry
                    log.warning("could not take the lease on session_key=%s: %s", key, exc)
                    await asyncio.sleep(poll)
                    poll = min(poll * 2, POLL_MAX_S)
                    continue
                if row is not None:
                    return self._lease_of(key, row)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), poll)
                poll = min(poll * 2, POLL_MAX_S)
        finally:
            for name in names:
                waiting = self._waiters.get(name)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[name]

    def _lease_of(self, key: str, row: dict[str, Any]) -> Lease:
        """A taken lease from its route row (take_lease's shape); the route and the key's
        session's live jobs on other replicas are refreshed from it."""
        self.routes.refresh(key, row)
        sid = row.get("session_id") or row.get("live_id")
        if sid:
            self._remote_jobs[str(sid)] = set(row["jobs"]) - set(self._local.live_jobs(str(sid)))
        fence = Fence(key, self.me, int(row["lease_epoch"]))
        return Lease(fence, list(row["open"]), unsent=list(row.get("unsent") or []))

    async def _release(self, lease: Lease) -> None:
        """Free the lease, writing the route; retried while the database is away, since
        other replicas wait on it (they take it anyway once this incarnation ends)."""
        key = lease.fence.session_key
        changes = self.routes.changes(key)
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                freed = await self.store.release_lease(lease.fence, changes, lease.answered)
                break
            except StateError as exc:
                log.warning("could not free the lease on session_key=%s: %s", key, exc)
                await asyncio.sleep(min(0.1 * 2**attempt, POLL_MAX_S))
        else:
            log.error("gave up freeing the lease on session_key=%s", key)
            return
        if not freed:
            log.warning(
                "the lease on session_key=%s (epoch %d) had been taken over", key, lease.fence.epoch
            )

    async def holds(self, fence: Fence) -> bool:
        if fence.owner != self.me:  # rejoined as a new incarnation: the old one's are void
            return False
        try:
            return await self.store.lease_holds(fence)
        except StateError as exc:
            log.warning("could not read the lease on session_key=%s: %s", fence.session_key, exc)
            return True

    async def row_open(self, inbox_id: int) -> bool:
        states = await self.store.inbox_states([inbox_id])
        return states.get(inbox_id) in OPEN_STATES

    # --- takeover -----------------------------------------------------------------------

    async def orphaned_inbound(self) -> Sequence[InboxRow]:
        return await self.store.orphaned_inbound(self.link.space, self.me)

    async def orphaned_replies(self) -> Sequence[ReplyRow]:
        return await self.store.orphaned_replies(self.link.space)

    async def claim_reply(self, inbox_id: int) -> bool:
        return await self.store.claim_orphaned_reply(self.link.space, inbox_id, self.me)

    def use_reset_notice(self, notice: ResetNotice) -> None:
        self.routes.reset_notice = notice

    async def sync_jobs(self) -> None:
        """Every live replica's background jobs (before a reset sweep)."""
        remote: dict[str, set[str]] = {}
        for sid, name in await self.store.live_jobs(self.link.space):
            if name not in self._local.live_jobs(sid):
                remote.setdefault(sid, set()).add(name)
        self._remote_jobs = remote

    # --- the Coordinator protocol ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str) -> AsyncIterator[None]:
        """The key's lease, for work that is not an inbox row (a reset, a handoff)."""
        async with self.lease(key):
            yield

    def try_session_lock(self, key: str) -> Callable[[], None] | None:
        return None  # a lease cannot be taken without waiting on the database

    def has_notice(self, key: str) -> bool:
        return self.routes.notice(key, None) is not None

    def seen(self, msg: MessageKey) -> bool:
        return self._local.seen(msg)

    def remember(self, msg: MessageKey) -> None:
        self._local.remember(msg)

    def new_job_id(self) -> str:
        return f"{self._local.new_job_id()}.{self.me}"  # unique across replicas

    def job_started(self, session_id: str, job: str) -> None:
        self._local.job_started(session_id, job)
        if job != TURN_JOB:
            self._write(self.store.add_job(session_id, job, self.me), f"job+:{job}")

    def job_finished(self, session_id: str, job: str) -> None:
        self._local.job_finished(session_id, job)
        if job != TURN_JOB:
            self._write(self.store.drop_job(session_id, job), f"job-:{job}")

    def _write(self, coro: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"gateway.cluster.{name}")
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a live-job row could not be written: %s", task.exception())

    def live_jobs(self, session_id: str) -> list[str]:
        return sorted(
            set(self._local.live_jobs(session_id)) | self._remote_jobs.get(session_id, set())
        )

    def busy_session_ids(self) -> set[str]:
        return self._local.busy_session_ids() | {s for s, j in self._remote_jobs.items() if j}

    def remember_listing(self, key: str, session_ids: list[str]) -> None:
        self.routes.set_listing(key, session_ids)

    def listing(self, key: str) -> list[str] | None:
        return self.routes.listing(key)

    def forget_listing(self, key: str) -> None:
        if self.routes.listing(key) is not None:
            self.routes.set_listing(key, None)

    def set_notice(self, key: str, text: str) -> None:
        self.routes.notice(key, text)

    def take_notice(self, key: str) -> str | None:
        return self.routes.notice(key, None, take=True)
