"""`HistoryWindows`: the newest history window of each recently active session, bounded by
size, that both writers keep between turns so a turn reads only the rows after it. When a
window is still right is each writer's business (state/sqlite/windows.py, state/pg/windows.py)."""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from typing import Any

# The windows kept, bounded by their size: characters of content plus a fixed overhead per
# message (the dict). About 16 MB for short messages; a session of huge messages evicts
# others sooner.
BUDGET = 16_000_000
PER_MESSAGE = 300
# Sessions whose facts (source, last activity) are kept beside the windows: about 3 MB
# (140 bytes a session, the id's text included).
FACTS_KEPT = 20_000

Message = dict[str, Any]


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
        # Facts about sessions the writer met, valid exactly as long as the windows (cleared
        # with them): a session's source (fixed at creation), and the last_active it was
        # seen or set at (it only moves forward).
        self.sources: dict[str, str] = {}
        self.active_at: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        if self._entries:
            self._entries.clear()
        self._used = 0
        self.sources.clear()
        self.active_at.clear()

    def check(self, conn: sqlite3.Connection) -> None:
        """Forget everything when another connection committed since the last check (the
        SQLite writer asks at every read: `PRAGMA data_version`)."""
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
        if len(self.sources) > FACTS_KEPT:
            self.sources.clear()
        if len(self.active_at) > FACTS_KEPT:
            self.active_at.clear()

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

    def extend(self, session_id: str, message_id: int, message: Message | None) -> None:
        """A message the writer has just appended to the session: onto the end of its window,
        if one is kept (the window then ends at `message_id`). None, a message the caller
        cannot build as a read would: the window is forgotten instead."""
        got = self._entries.get(session_id)
        if got is None:
            return
        if message is None:
            self.forget(session_id)
            return
        _upto, length, window, size, mark = got
        added = _size(message)
        window.append(message)
        if len(window) > length >= 0:
            added -= _size(window[0])
            del window[0]
        self._entries[session_id] = (message_id, length, window, size + added, mark)
        self._used += added

    def advance(
        self,
        session_id: str,
        length: int,
        after: int,
        upto: int,
        new: list[Message],
        mark: int = 0,
    ) -> list[Message]:
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
