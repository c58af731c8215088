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
from collections.abc import Callable
from typing import Any

from ..history import HistoryWindows

_KEEPS: set[Callable[..., Any]] = set()


def keeps_windows(*fns: Callable[..., Any]) -> None:
    """Mark writer operations that only append messages or touch no message at all."""
    _KEEPS.update(fns)


def keeps(fn: Callable[..., Any]) -> bool:
    return fn in _KEEPS


def windows_of(conn: sqlite3.Connection) -> HistoryWindows | None:
    """The writer connection's windows; None on any other connection (no caching there)."""
    return getattr(conn, "windows", None)


class WriterConnection(sqlite3.Connection):
    """The writer's connection, carrying its windows."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.windows = HistoryWindows()


def as_read(values: tuple[Any, ...]) -> dict[str, Any] | None:
    """A row of `row_values` (state/message_rows.py) as the history read in
    state/sqlite/messages.py gives it back, for a row stored exactly as given: text content
    (or none), no tool calls, text fields. The writer's appends extend the kept windows with
    it. None for any other row: the window that would take it is dropped and read again."""
    role, content, tool_call_id, tool_calls, tool_name = values[1:6]
    reasoning = values[9]
    if tool_calls is not None or (
        content is not None and (type(content) is not str or content.startswith("\x00"))
    ):
        return None
    msg: dict[str, Any] = {"role": role, "content": content}
    if role == "tool":
        if tool_call_id is not None:
            if type(tool_call_id) is not str:
                return None
            msg["tool_call_id"] = tool_call_id
        if tool_name is not None:
            if type(tool_name) is not str:
                return None
            msg["name"] = tool_name
    if reasoning is not None:
        if type(reasoning) is not str:
            return None
        msg["reasoning"] = reasoning
    return msg
