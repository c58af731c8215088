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

Raw sqlite3 errors are mapped by SQLite's result code (state/sqlite/writer.py), never by text;
PostgreSQL's unique violations by the constraint's name (state/pg/).
"""

from __future__ import annotations

from .api import (
    BACKENDS,
    ClusterStore,
    Maintenance,
    ReplicaLink,
    Store,
    default_replica_name,
    open_store,
)
from .content import content_text, encode_content
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
from .filters import SessionFilter
from .hermes.hermes_import import HermesImport
from .hermes.hermes_import import Routing as HermesRouting
from .hermes.hermes_import import read_routing as read_hermes_routing
from .ids import new_session_id
from .records import (
    Accepted,
    AutoPruneResult,
    BeginPlan,
    ExportRecord,
    Fence,
    HandoffClaim,
    ImportReport,
    InboxEntry,
    LiveSession,
    MessageRow,
    OutboxItem,
    Release,
    SearchHit,
    SessionRow,
    StoredReply,
    UnsentReply,
    UntoldReset,
    UsageStats,
    Wakeup,
    WriteStats,
)
from .sqlite import backup as snapshots
from .sqlite.keyset import SORTS as PAGE_SORTS
from .sqlite.keyset import PageQuery
from .sqlite.search import SORTS as SEARCH_SORTS
from .sqlite.settings import WriterConfig
from .sqlite.snippets import MARK_CLOSE, MARK_OPEN
from .sqlite.store import SessionDB
from .text import storable, unstorable
from .vocab import (
    ANSWERED,
    APPROVED,
    DENIED,
    DROPPED,
    OPEN_STATES,
    PAIRING_PENDING,
    RECEIVED,
    REVOKED,
    SEND_FAILED,
    SEND_PENDING,
    SEND_SENT,
    STARTED,
    TAKEN,
    ChildKind,
    EndReason,
)

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
    "ANSWERED",
    "APPROVED",
    "DENIED",
    "DROPPED",
    "OPEN_STATES",
    "PAIRING_PENDING",
    "RECEIVED",
    "REVOKED",
    "SEND_FAILED",
    "SEND_PENDING",
    "SEND_SENT",
    "STARTED",
    "TAKEN",
    "MARK_CLOSE",
    "MARK_OPEN",
    "PAGE_SORTS",
    "SEARCH_SORTS",
    "Accepted",
    "BeginPlan",
    "ClusterStore",
    "HermesImport",
    "HermesRouting",
    "ImportReport",
    "InboxEntry",
    "OutboxItem",
    "PageQuery",
    "ReplicaLink",
    "StoredReply",
    "UnsentReply",
    "Wakeup",
    "content_text",
    "default_replica_name",
    "encode_content",
    "read_hermes_routing",
    "snapshots",
    "storable",
    "unstorable",
]
