"""The newest history window of recently active sessions, kept by the writer between turns.

Every turn reads the newest `history_messages` (200) messages of its session for the agent.
Read whole, that is 200 rows turned into JSON by SQLite and back into dicts by Python, in
the writer's transaction, for every message: at 500 messages/s the largest cost in the
writer thread (py-spy: 40 % of it). Between two turns of a session only a few messages are
new (the reply, the next user message), so the writer keeps each session's last window and
reads only the rows after it (`state.sqlite.messages.conversations_after`).

The window is right only while no message at or before its newest id has changed. Three
things guard that, each of them clearing every window (a reset costs one full read per
session, nothing more):

* `state.sqlite.writer` clears them before any operation not registered with `keeps_windows`
  (only appends and inbox bookkeeping are: undo, retry, delete, prune, import, an edit go
  through the writer like everything else, and clear);
* a batch that fails or is rolled back clears them (a window may have been advanced by a
  statement that did not commit);
* `PRAGMA data_version` moves when another connection committed (the CLI, Hermes Agent
  writing the same file): checked at every read, inside the writer's transaction.

Callers get new lists of new dicts (one level deep: a `tool_calls` list inside is shared),
so an agent that edits its history in place does not edit the window.
"""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

# The windows kept, bounded by their size: characters of content plus a fixed overhead per
# message (the dict). About 16 MB for short messages; a session of huge messages evicts
# others sooner.
BUDGET = 16_000_000
PER_MESSAGE = 300

Message = dict[str, Any]

_KEEPS: set[Callable[..., Any]] = set()


def keeps_windows(*fns: Callable[..., Any]) -> None:
    """Mark writer operations that only append messages or touch no message at all."""
    _KEEPS.update(fns)


def keeps(fn: Callable[..., Any]) -> bool:
    return fn in _KEEPS


def _size(message: Message) -> int:
    content = message.get("content")
    if isinstance(content, str):
        return PER_MESSAGE + len(content)
    return PER_MESSAGE + len(str(content))


class HistoryWindows:
    """session id -> (newest message id, length asked for, the window, its size, a mark),
    least recently used first; all of it is touched only by the writer's thread (SQLite)
    or task (PostgreSQL). The mark is the caller's: the PostgreSQL writer keeps the
    session's message count there (state/pg/windows.py)."""

    def __init__(self, budget: int = BUDGET) -> None:
        self._budget = budget
        self._used = 0
        self._entries: OrderedDict[str, tuple[int, int, list[Message], int, int]] = OrderedDict()
        self._version: int | None = None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        if self._entries:
            self._entries.clear()
        self._used = 0

    def check(self, conn: sqlite3.Connection) -> None:
        """Forget everything when another connection committed since the last check."""
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        if version != self._version:
            self._version = version
            self.clear()

    def trim(self) -> None:
        """Forget the least recently used windows until the rest fit the budget. Called once
        a batch's windows are all advanced, never between: a batch asks `since` for each of
        its sessions before it advances any, and evicting one of them in between would leave
        its advance without the window `since` promised."""
        while self._used > self._budget:
            _sid, (_u, _n, _w, freed, _m) = self._entries.popitem(last=False)
            self._used -= freed

    def since(self, session_id: str, length: int) -> int:
        """The newest message id whose window (of `length`) is kept, else 0."""
        got = self._entries.get(session_id)
        return got[0] if got is not None and got[1] == length else 0

    def mark(self, session_id: str) -> int:
        """The mark kept with the session's window (0: none kept)."""
        got = self._entries.get(session_id)
        return got[4] if got is not None else 0

    def forget(self, session_id: str) -> None:
        old = self._entries.pop(session_id, None)
        if old is not None:
            self._used -= old[3]

    def advance(
        self, session_id: str, length: int, after: int, upto: int, new: list[Message],
        mark: int = 0,
    ) -> list[Message]:  # fmt: skip
        """The window ending at `upto`: the kept one (ending at `after`; 0: none) followed
        by `new`, the messages after it, cut to `length`. Kept for the next turn (within the
        budget once `trim` has run), with `mark`; returned as a copy."""
        old = self._entries.pop(session_id, None)
        if old is not None:
            self._used -= old[3]
        if after:
            if old is None or old[0] != after:  # `since` said otherwise a moment ago
                raise RuntimeError(f"no window of {session_id} ends at message {after}")
            window, size = old[2], old[3] + sum(map(_size, new))
            window += new
            if len(window) > length >= 0:
                cut = len(window) - length
                size -= sum(map(_size, window[:cut]))
                del window[:cut]
        else:
            window, size = new, sum(map(_size, new))
        if size <= self._budget // 4:  # one session never takes most of the budget
            self._entries[session_id] = (upto, length, window, size, mark)
            self._used += size
        self.hits += bool(after)
        self.misses += not after
        return list(map(dict.copy, window))


def windows_of(conn: sqlite3.Connection) -> HistoryWindows | None:
    """The writer connection's windows; None on any other connection (no caching there)."""
    return getattr(conn, "windows", None)


class WriterConnection(sqlite3.Connection):
    """The writer's connection, carrying its windows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.windows = HistoryWindows()
