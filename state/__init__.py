"""switchboard's store: everything that touches state.db lives in this package.

The gateway programs against `Store` (state/api.py) and gets one from `open_store`; rows
come back as the typed dicts of state/records.py. Everything the package raises on purpose
is a `StateError`; callers match on the class, never on the text:

    StateError
    ├── DatabaseError          the file cannot be used (not a database, damaged, read-only, full)
    │   ├── SchemaTooNew       written by a newer switchboard
    │   └── StoreUnavailable   the server is away: not applied, or (at COMMIT) unknown
    ├── UnstorableData         a value the database can never hold (no use sending it again)
    ├── DatabaseBusy           another process held the write lock past the retry budget
    ├── WriterClosed           a write after close
    ├── LeaseLost              a fenced write whose session-key lease was taken over
    ├── UnknownBackend         `state.backend` names no store (a config error, exit 78)
    ├── StoreConfigError       the store cannot open as configured (`state.dsn_env`, exit 78)
    ├── SessionNotFound
    ├── AmbiguousSession       an id prefix or title that matches several sessions
    ├── SessionExists
    ├── LiveSessionExists      a session key's second live session (PostgreSQL refuses it)
    ├── TitleError             a refused title; the message is fit for a chat
    │   ├── TitleTooLong
    │   ├── TitleEmpty
    │   └── TitleTaken
    └── QueryError             a search query that cannot be run

Raw sqlite3 errors are mapped by SQLite's result code (state/writer.py), never by text;
PostgreSQL's unique violations by the constraint's name (state/pg/).
"""

from __future__ import annotations

from .api import BACKENDS, Maintenance, Store, open_store
from .errors import (
    AmbiguousSession,
    DatabaseBusy,
    DatabaseError,
    LeaseLost,
    LiveSessionExists,
    QueryError,
    SchemaTooNew,
    SessionExists,
    SessionNotFound,
    StateError,
    StoreConfigError,
    StoreUnavailable,
    TitleEmpty,
    TitleError,
    TitleTaken,
    TitleTooLong,
    UnknownBackend,
    UnstorableData,
    WriterClosed,
)
from .ids import new_session_id
from .listing import SessionFilter
from .records import (
    AutoPruneResult,
    ExportRecord,
    Fence,
    HandoffClaim,
    LiveSession,
    MessageRow,
    Release,
    SearchHit,
    SessionRow,
    UntoldReset,
    UsageStats,
    WriteStats,
)
from .sessions import ChildKind, EndReason
from .store import SessionDB
from .writer import WriterConfig

__all__ = [
    "BACKENDS",
    "AmbiguousSession",
    "AutoPruneResult",
    "ChildKind",
    "DatabaseBusy",
    "DatabaseError",
    "LeaseLost",
    "EndReason",
    "ExportRecord",
    "Fence",
    "HandoffClaim",
    "LiveSession",
    "UntoldReset",
    "LiveSessionExists",
    "Maintenance",
    "MessageRow",
    "Release",
    "QueryError",
    "SchemaTooNew",
    "SessionDB",
    "SessionExists",
    "SessionFilter",
    "SessionNotFound",
    "SessionRow",
    "SearchHit",
    "Store",
    "StateError",
    "StoreConfigError",
    "StoreUnavailable",
    "TitleEmpty",
    "TitleError",
    "TitleTaken",
    "TitleTooLong",
    "UnknownBackend",
    "UnstorableData",
    "UsageStats",
    "WriteStats",
    "WriterClosed",
    "WriterConfig",
    "new_session_id",
    "open_store",
]
