"""Typing indicators shown while a turn runs: one loop per chat (or thread), renewed before
the platform lets it lapse, ended by the reply, the turn's end, a time limit or `close`.
Typing is a courtesy: a failed request is logged at debug level and never an error."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Generic, TypeVar

from gateway.messages import SEND_BY

K = TypeVar("K", bound=Hashable)

log = logging.getLogger("gateway.adapters.typing")

TYPING_FOR_AT_MOST_S = 120.0  # a turn longer than this shows no typing past it


class TypingLoops(Generic[K]):
    """The typing loops of one adapter, keyed by where they show (a chat id, or a pair of
    chat and thread). `show(key)` sends one indicator; `withdraw(key)`, when given, takes
    it back at once when the loop is stopped (run outside the stopping reply's send-by
    deadline, and never awaited by it). `alive()` false ends every loop at its next turn
    (the platform connection closed). With `per_turn`, each `start` counts a turn and the
    loop ends with the last one's `stop` (several turns of one room at once)."""

    def __init__(
        self,
        name: str,
        show: Callable[[K], Awaitable[None]],
        *,
        every_s: float,
        for_at_most_s: float = TYPING_FOR_AT_MOST_S,
        after_s: float = 0.0,
        withdraw: Callable[[K], Awaitable[None]] | None = None,
        alive: Callable[[], bool] = lambda: True,
        per_turn: bool = False,
    ) -> None:
        self._name = name
        self._show, self._withdraw, self._alive = show, withdraw, alive
        self._every_s, self._for_at_most_s, self._after_s = every_s, for_at_most_s, after_s
        self._loops: dict[K, asyncio.Task[None]] = {}
        self._turns: dict[K, int] | None = {} if per_turn else None  # key -> turns running
        self._chores: set[asyncio.Task[None]] = set()  # withdrawals in flight

    def __contains__(self, key: object) -> bool:
        return key in self._loops

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._loops))

    def __len__(self) -> int:
        return len(self._loops)

    def start(self, key: K) -> None:
        """Show typing at `key` until stopped (a loop already there goes on)."""
        if self._turns is not None:
            self._turns[key] = self._turns.get(key, 0) + 1
        if key not in self._loops:
            self._loops[key] = asyncio.create_task(self._loop(key), name=f"{self._name}:{key}")

    def stop(self, key: K) -> None:
        """End the loop at `key`, if one runs, and withdraw the indicator."""
        if self._turns is not None:
            left = self._turns.pop(key, 0) - 1
            if left > 0:  # another turn there still runs
                self._turns[key] = left
                return
        task = self._loops.pop(key, None)
        if task is None:
            return
        task.cancel()
        if self._withdraw is not None:
            context = contextvars.copy_context()  # begun by a send, but not part of its reply:
            context.run(SEND_BY.set, None)  # never stopped by that reply's SEND_BY
            chore = asyncio.create_task(
                self._quietly(self._withdraw, key), name=f"{self._name}-off:{key}", context=context
            )
            self._chores.add(chore)
            chore.add_done_callback(self._chores.discard)

    async def close(self, wait_s: float = 5.0) -> None:
        """End every loop (the adapter stops); withdrawals in flight get `wait_s` to end."""
        loops = list(self._loops.values())
        self._loops.clear()
        if self._turns is not None:
            self._turns.clear()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if self._chores:
            _done, late = await asyncio.wait(set(self._chores), timeout=wait_s)
            for task in late:
                task.cancel()

    async def _loop(self, key: K) -> None:
        deadline = time.monotonic() + self._for_at_most_s
        try:
            if self._after_s:
                await asyncio.sleep(self._after_s)
            while self._alive() and time.monotonic() < deadline:
                await self._quietly(self._show, key)
                await asyncio.sleep(self._every_s)
        finally:
            if self._loops.get(key) is asyncio.current_task():
                del self._loops[key]

    async def _quietly(self, call: Callable[[K], Awaitable[None]], key: K) -> None:
        try:
            await call(key)
        except Exception as exc:
            log.debug("%s: typing at %s failed: %s: %s", self._name, key, type(exc).__name__, exc)
