"""Backpressure for the SQLite writer's queue: a bounded number of places, handed out in
order of arrival."""

from __future__ import annotations

import asyncio
import collections


class Room:
    """Places in the writer's queue: a counter and a FIFO of waiting callers.

    asyncio.Semaphore would do, but its acquire() scans every waiter on each call; this is
    on the path of every write. A freed place goes straight to the longest waiter, so
    `free > 0` implies nobody waits, and a newcomer cannot overtake the queue.
    """

    __slots__ = ("free", "_waiters")

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def take(self) -> None:
        if self.free > 0:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # handed a place, then cancelled: pass it on
            raise

    def give_back(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1
