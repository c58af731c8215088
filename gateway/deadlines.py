"""Time limits for many concurrent awaits, enforced by one timer.

asyncio.timeout() schedules and cancels a loop timer per use. The router puts a limit on
every agent turn, and at 3,000 turns/s those timers were about a tenth of the event loop's
work (bench/gateway_bench.py, profiled). Here a use costs a dict insert and delete; one
timer, set for the earliest deadline, cancels the tasks that overran, and they see
TimeoutError, as under asyncio.timeout(). The limit is checked when that timer fires, so a
turn can overrun by as long as the loop is blocked, as with asyncio.timeout().
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlines:
    def __init__(self) -> None:
        self._due: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def __len__(self) -> int:
        return len(self._due)

    async def run(self, aw: Awaitable[T], seconds: float) -> T:
        """Await `aw`; if it is not done within `seconds`, cancel it and raise TimeoutError.
        A cancellation from elsewhere stays a CancelledError."""
        task = asyncio.current_task()
        if task is None or task in self._due:  # not in a task, or nested: the simple way
            async with asyncio.timeout(seconds):
                return await aw
        loop = asyncio.get_running_loop()
        due = loop.time() + seconds
        cancelling = task.cancelling()
        self._due[task] = due
        if due < self._timer_at:
            self._arm(loop, due)
        try:
            return await aw
        except asyncio.CancelledError:
            if task in self._expired:
                self._expired.discard(task)
                if task.uncancel() <= cancelling:
                    raise TimeoutError from None
            raise
        finally:
            del self._due[task]
            if task in self._expired:  # overran, but finished before the cancel landed
                self._expired.discard(task)
                task.uncancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._timer_at = None, math.inf
        now = loop.time()
        following = math.inf
        for task, due in self._due.items():
            if due <= now:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif due < following:
                following = due
        if following < math.inf:
            self._arm(loop, following)
