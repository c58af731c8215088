"""`state.hermes.compat.SessionDB`: a synchronous class with the method names and semantics of
Hermes Agent's SessionDB, over switchboard's store and schema.

The store's operations run on the calling thread over the facade's own connection (see
DirectStore in direct.py): no event loop and no thread hand-off per call, so sequential
calls cost what the SQL costs. The class is composed of one part per area (facade_*.py).
Title problems raise ValueError and open errors sqlite3.DatabaseError, as Hermes's callers
expect.
"""

from __future__ import annotations

import os
import sqlite3
import time  # noqa: F401  (Hermes's tests patch hermes_state.time.time, as its module has it)
from pathlib import Path
from typing import TypeVar

from .. import columns
from ..errors import DatabaseError as StateDatabaseError
from . import (
    foreign,  # noqa: F401 - registers the catch-up before every write
    hermes_transfer,
)
from .direct import open_direct
from .facade_admin import AdminPart
from .facade_gateway import GatewayPart
from .facade_listing import ListingPart
from .facade_messages import MessagePart
from .facade_sessions import SessionPart

T = TypeVar("T")
DEFAULT_DB_PATH = (
    Path(os.environ.get("SWITCHBOARD_HOME", "~/.switchboard")).expanduser() / "state.db"
)


# The Hermes Agent schema number a file this facade creates corresponds to: Hermes 0.19
# reads it and skips its own (historic) data migrations.
SCHEMA_VERSION = 22


def _schema_sql() -> str:
    """DDL of the tables, columns as the store declares them (Hermes callers build legacy
    files from it and check that every declared column exists)."""

    def table(name: str, columns: dict[str, str]) -> str:
        body = ",\n    ".join(f"{col} {decl}" for col, decl in columns.items())
        return f"CREATE TABLE IF NOT EXISTS {name} (\n    {body}\n);"

    return "\n".join(
        [
            "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);",
            "CREATE TABLE IF NOT EXISTS state_meta (key TEXT PRIMARY KEY, value TEXT);",
            table("sessions", columns.SESSION_COLUMNS),
            table("messages", columns.MESSAGE_COLUMNS),
        ]
    )


SCHEMA_SQL = _schema_sql()


class OpenError(sqlite3.DatabaseError):
    """The file cannot be opened as a state.db (a sqlite3.Error, as Hermes callers expect)."""


class SessionDB(GatewayPart, SessionPart, MessagePart, ListingPart, AdminPart):
    """Hermes Agent's SessionDB over a switchboard state.db. Its methods live in the parts,
    by area (facade_gateway.py, facade_sessions.py, facade_messages.py, facade_listing.py,
    facade_admin.py); this class opens the file."""

    _IMPORT_MAX_SESSION_BYTES = hermes_transfer.MAX_SESSION_BYTES
    _IMPORT_MAX_MESSAGES_PER_SESSION = hermes_transfer.MAX_MESSAGES_PER_SESSION

    def __init__(
        self, db_path: str | os.PathLike[str] | None = None, read_only: bool = False
    ) -> None:
        self.db_path = Path(db_path) if db_path is not None else DEFAULT_DB_PATH
        self.read_only = read_only
        path = self.db_path.expanduser().absolute()
        fresh = not path.exists()
        try:
            self._db = open_direct(path, read_only)
        except (StateDatabaseError, sqlite3.DatabaseError) as exc:
            # Hermes's callers catch sqlite3.Error around SessionDB() and degrade.
            raise OpenError(str(exc)) from exc
        self._lock = self._db.lock
        # Raw access for callers that run their own SQL (Hermes's `_conn`): autocommit, rows
        # addressable by name.
        self._conn = sqlite3.connect(
            f"file:{path}?mode={'ro' if read_only else 'rw'}",
            uri=True,
            isolation_level=None,
            check_same_thread=False,
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._fts_enabled = True  # switchboard's index is maintained by SQL triggers
        if fresh and not read_only:
            # A file created here needs none of Hermes's historic data migrations.
            self._conn.execute(
                "INSERT INTO schema_version(version) SELECT ? "
                "WHERE NOT EXISTS (SELECT 1 FROM schema_version)",
                (SCHEMA_VERSION,),
            )
