"""`Dispatch`: the two doors every operation of SessionDB goes through.

SessionDB is composed of one part per area (`SessionOps` in sessions.py, `MessageOps` in
messages.py, ...), each beside the SQL it runs. A part hands a function of a connection to
`_write` (the single writer, group-committed) or `_read` (a reader connection); the Hermes
facade's direct store (state/hermes/compat.py) runs the same functions on its own thread.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, TypeVarTuple, Unpack

from .readers import ReaderPool
from .writer import Writer

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Dispatch:
    """What every part of SessionDB shares: the file, the writer, the readers."""

    path: Path
    _writer: Writer
    _readers: ReaderPool
    _closed: bool

    async def _read(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._readers.run(fn, *args)

    async def _read_short(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        """`_read` for a read that is usually short: on the event loop's thread while it
        stays within a budget, else on a reader thread (ReaderPool.run_short)."""
        return await self._readers.run_short(fn, *args)

    async def _write(self, fn: Callable[[sqlite3.Connection, Unpack[Ts]], T], *args: *Ts) -> T:
        return await self._writer.submit(fn, *args)
