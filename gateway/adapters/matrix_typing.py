"""Typing notifications for the Matrix adapter: shown in a room while at least one turn for
it runs (renewed before the server lets it lapse), withdrawn when the last one ends.
Typing is a courtesy: a failed request is never an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

TYPING_TIMEOUT_MS = 30_000  # how long the server shows it without a renewal
TYPING_EVERY_S = 20.0

SetTyping = Callable[[str, int], Awaitable[None]]  # room, timeout in ms (0: stop)


class RoomTyping:
    def __init__(self, set_typing: SetTyping) -> None:
        self._set_typing = set_typing
        self._rooms: dict[str, tuple[int, asyncio.Task[None]]] = {}  # room -> turns, loop
        self._pending: set[asyncio.Task[None]] = set()

    def started(self, room: str) -> None:
        count, task = self._rooms.get(room, (0, None))
        if task is None or task.done():
            task = asyncio.create_task(self._loop(room), name=f"matrix.typing:{room}")
        self._rooms[room] = (count + 1, task)

    def ended(self, room: str) -> None:
        if room not in self._rooms:
            return
        count, task = self._rooms.pop(room)
        if count > 1:
            self._rooms[room] = (count - 1, task)
            return
        task.cancel()
        stop = asyncio.create_task(self._quietly(room, 0), name=f"matrix.typing-off:{room}")
        self._pending.add(stop)
        stop.add_done_callback(self._pending.discard)

    def close(self) -> None:
        for _count, task in self._rooms.values():
            task.cancel()
        self._rooms.clear()
        for task in list(self._pending):
            task.cancel()

    async def _loop(self, room: str) -> None:
        while True:
            await self._quietly(room, TYPING_TIMEOUT_MS)
            await asyncio.sleep(TYPING_EVERY_S)

    async def _quietly(self, room: str, timeout_ms: int) -> None:
        with contextlib.suppress(Exception):
            await self._set_typing(room, timeout_ms)
