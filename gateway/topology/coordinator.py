"""Who may work on what, right now: per-key session locks, live jobs, the redelivery
memory, the `/resume N` listings and pending reset notices.

`Coordinator` is the interface; `LocalCoordinator` keeps it all in this process's memory,
which is exact for one daemon. gateway/topology/leases.py's `SharedCoordinator` adds what several
replicas need. This module imports nothing from the project.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

DEDUPE_MEMORY = 50_000  # redelivered platform message ids remembered
LISTING_MEMORY = 10_000  # chats whose last listing `/resume N` can still refer to

MessageKey = tuple[str, str, str]  # (platform, chat id, platform message id)


class Coordinator(Protocol):
    """The shared state the router, commands and the Resetter agree through."""

    def session_lock(self, key: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Serialise everything that touches one session key (turns, commands, resets),
        in arrival order."""
        ...

    def try_session_lock(self, key: str) -> Callable[[], None] | None:
        """Take the key's lock now, without waiting, when nobody holds or awaits it: the
        release function, else None (also when this coordinator cannot tell without
        waiting). The router's fast path: the caller runs the key's work and releases."""
        ...

    def has_notice(self, key: str) -> bool:
        """Is a notice waiting for the key's next message?"""
        ...

    def seen(self, msg: MessageKey) -> bool:
        """Was this platform message accepted before (a redelivery)?"""
        ...

    def remember(self, msg: MessageKey) -> None: ...

    def new_job_id(self) -> str:
        """A fresh name for a background job (`bg1`, `bg2`, ...)."""
        ...

    def job_started(self, session_id: str, job: str) -> None: ...

    def job_finished(self, session_id: str, job: str) -> None: ...

    def live_jobs(self, session_id: str) -> list[str]:
        """The session's running jobs (its turn, background jobs), sorted."""
        ...

    def busy_session_ids(self) -> set[str]: ...

    def remember_listing(self, key: str, session_ids: list[str]) -> None:
        """The sessions a chat was last shown, so `/resume N` means the N-th of them."""
        ...

    def listing(self, key: str) -> list[str] | None: ...

    def forget_listing(self, key: str) -> None: ...

    def set_notice(self, key: str, text: str) -> None:
        """A line the chat gets with its next message (why its session was reset)."""
        ...

    def take_notice(self, key: str) -> str | None: ...

    async def sync_jobs(self) -> None:
        """Refresh what other processes' live jobs are known here (before a reset sweep)."""
        ...


class _KeyLock:
    """A FIFO lock that can also be taken without awaiting when free (asyncio.Lock can
    only be taken by awaiting). A release hands the lock straight to the longest waiter."""

    __slots__ = ("held", "waiters")

    def __init__(self) -> None:
        self.held = False
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if not self.held and not self.waiters:
            self.held = True
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed the lock, then cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):  # a release may have skipped it already
                    self.waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # still held: now by the waiter
                return
        self.held = False


class KeyHold:
    """One key's in-process lock held for one inbox row, as a lease (one daemon): nothing
    can take it away (no fence), the row is the only one it runs and no dead runner's
    reply waits. `async with` takes the lock in arrival order; class-based, so a turn
    costs no generator for it."""

    __slots__ = ("_coordinator", "_key", "_lock", "open")

    fence = None
    unsent: list[Mapping[str, Any]] = []  # never appended to

    def __init__(self, coordinator: LocalCoordinator, key: str, inbox_id: int) -> None:
        self._coordinator = coordinator
        self._key = key
        self.open: list[Mapping[str, Any]] = [{"id": inbox_id}]  # an inbox row's id alone

    async def __aenter__(self) -> KeyHold:
        c = self._coordinator
        lock = c._locks.get(self._key)
        if lock is None:
            c._locks[self._key] = lock = _KeyLock()
        await lock.acquire()  # on cancellation the lock is passed on or never taken
        self._lock = lock
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._coordinator._release(self._key, self._lock)


class LocalCoordinator:
    """The in-process coordinator: plain dicts, lost on restart (state.db remembers what
    must survive one: stored messages dedupe redeliveries there too)."""

    def __init__(self) -> None:
        self._locks: dict[str, _KeyLock] = {}  # only keys held or awaited
        self._seen: OrderedDict[MessageKey, None] = OrderedDict()
        self._job_seq = 0
        self._jobs: dict[str, set[str]] = {}  # session id -> live job names
        self._listings: OrderedDict[str, list[str]] = OrderedDict()
        self._notices: dict[str, str] = {}

    @contextlib.asynccontextmanager
    async def session_lock(self, key: str) -> AsyncIterator[None]:
        lock = self._locks.get(key)
        if lock is None:
            self._locks[key] = lock = _KeyLock()
        await lock.acquire()  # on cancellation the lock is passed on or never taken
        try:
            yield
        finally:
            self._release(key, lock)

    def hold(self, key: str, inbox_id: int) -> KeyHold:
        """The key's lock as the lease of inbox row `inbox_id` (see KeyHold)."""
        return KeyHold(self, key, inbox_id)

    def try_session_lock(self, key: str) -> Callable[[], None] | None:
        if key in self._locks:  # held or awaited
            return None
        self._locks[key] = lock = _KeyLock()
        lock.held = True
        return lambda: self._release(key, lock)

    def _release(self, key: str, lock: _KeyLock) -> None:
        lock.release()
        if not lock.held and self._locks.get(key) is lock:  # nobody holds or awaits it
            del self._locks[key]

    def has_notice(self, key: str) -> bool:
        return key in self._notices

    def seen(self, msg: MessageKey) -> bool:
        return msg in self._seen

    def remember(self, msg: MessageKey) -> None:
        self._seen[msg] = None
        if len(self._seen) > DEDUPE_MEMORY:
            self._seen.popitem(last=False)

    def new_job_id(self) -> str:
        self._job_seq += 1
        return f"bg{self._job_seq}"

    def job_started(self, session_id: str, job: str) -> None:
        self._jobs.setdefault(session_id, set()).add(job)

    def job_finished(self, session_id: str, job: str) -> None:
        jobs = self._jobs.get(session_id)
        if jobs is not None:
            jobs.discard(job)
            if not jobs:
                del self._jobs[session_id]

    def live_jobs(self, session_id: str) -> list[str]:
        return sorted(self._jobs.get(session_id, ()))

    def busy_session_ids(self) -> set[str]:
        return set(self._jobs)

    def remember_listing(self, key: str, session_ids: list[str]) -> None:
        self._listings[key] = session_ids
        self._listings.move_to_end(key)
        while len(self._listings) > LISTING_MEMORY:
            self._listings.popitem(last=False)

    def listing(self, key: str) -> list[str] | None:
        return self._listings.get(key)

    def forget_listing(self, key: str) -> None:
        self._listings.pop(key, None)

    def set_notice(self, key: str, text: str) -> None:
        self._notices[key] = text

    def take_notice(self, key: str) -> str | None:
        return self._notices.pop(key, None)

    async def sync_jobs(self) -> None:
        """Every live job is this process's: nothing to read."""
