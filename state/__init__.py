"""switchboard's store: everything that touches state.db lives in this package."""

from __future__ import annotations

from .errors import (
    AmbiguousSession,
    DatabaseBusy,
    DatabaseError,
    QueryError,
    SchemaTooNew,
    SessionExists,
    SessionNotFound,
    StateError,
    TitleEmpty,
    TitleError,
    TitleTaken,
    TitleTooLong,
    WriterClosed,
)
from .ids import new_session_id
from .listing import SessionFilter
from .sessions import ChildKind, EndReason
from .store import SessionDB
from .writer import WriterConfig

__all__ = [
    "AmbiguousSession",
    "ChildKind",
    "DatabaseBusy",
    "DatabaseError",
    "EndReason",
    "QueryError",
    "SchemaTooNew",
    "SessionDB",
    "SessionExists",
    "SessionFilter",
    "SessionNotFound",
    "StateError",
    "TitleEmpty",
    "TitleError",
    "TitleTaken",
    "TitleTooLong",
    "WriterClosed",
    "WriterConfig",
    "new_session_id",
]
