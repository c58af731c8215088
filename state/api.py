"""`Store`: the interface the gateway and the CLI program against, and `open_store`.

`Store` names every operation on sessions, messages, titles, lineage, listings, search,
handoffs, export/import, pruning and the key/value meta table; `SessionDB` (state/sqlite/store.py)
is the SQLite implementation and `PgStore` (state/pg/) the PostgreSQL one. What only a
file-backed SQLite store can do (WAL checkpoints, VACUUM, FTS5 optimize and integrity
checks) is the separate `Maintenance` protocol: callers ask `isinstance(store, Maintenance)`
before they offer it. `tests/state` holds the contract suite every backend must pass.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, Unpack, runtime_checkable

from .accounting import TokenUsage
from .errors import StoreConfigError, UnknownBackend
from .filters import SessionFilter
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

BACKENDS = ("sqlite", "postgres")  # the values `state.backend` accepts
DSN_ENV = "SWITCHBOARD_PG_DSN"  # where `state.dsn_env` points by default
DB_FILE = "state.db"  # the SQLite backend's file, inside the home directory


class Store(Protocol):
    """Every session operation switchboard uses. Raises the `state.errors` tree only."""

    backend: str  # the `state.backend` name of the implementation

    async def close(self) -> None: ...

    def write_stats(self) -> WriteStats:
        """A snapshot of the write path for metrics and /health (no I/O)."""
        ...

    # --- sessions
    async def create_session(
        self,
        session_id: str | None = None,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        title: str | None = None,
        started_at: float | None = None,
        **routing: Any,
    ) -> str: ...
    async def ensure_session(
        self,
        session_id: str,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        **routing: Any,
    ) -> bool: ...
    async def get_session(self, session_id: str) -> SessionRow | None: ...
    async def require_session(self, session_id: str) -> SessionRow: ...
    async def end_session(
        self, session_id: str, reason: str, *, now: float | None = None
    ) -> bool: ...
    async def reopen_session(self, session_id: str) -> bool: ...
    async def resolve_session_id(self, ref: str) -> str: ...
    async def resolve_session_ref(self, ref: str) -> str: ...
    async def update_system_prompt(self, session_id: str, prompt: str | None) -> None: ...
    async def update_session(self, session_id: str, **fields: Any) -> None: ...
    async def update_token_counts(self, session_id: str, **usage: Unpack[TokenUsage]) -> None: ...
    async def session_count(self, source: str | None = None) -> int: ...
    async def message_count(self, session_id: str | None = None) -> int: ...
    async def stats(self) -> UsageStats: ...

    # --- messages
    async def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int: ...
    async def append_messages(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> list[int]: ...
    async def append_and_read(
        self,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        dedupe: tuple[str, str] | None = None,
        last: int | None = None,
    ) -> tuple[list[int], list[dict[str, Any]]]: ...
    async def get_messages(
        self,
        session_id: str,
        *,
        limit: int | None = None,
        after_id: int | None = None,
        last: int | None = None,
    ) -> list[MessageRow]: ...
    async def get_messages_around(
        self, session_id: str, message_id: int, window: int = 5
    ) -> list[MessageRow]: ...
    async def get_messages_as_conversation(
        self, session_id: str, *, include_ancestors: bool = False, last: int | None = None
    ) -> list[dict[str, Any]]: ...
    async def count_messages_outside(
        self, session_id: str, first_id: int, last_id: int
    ) -> tuple[int, int]: ...
    async def clear_messages(self, session_id: str) -> int: ...
    async def has_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> bool: ...
    async def reply_to_platform_message(
        self, source: str, chat_id: str, platform_message_id: str
    ) -> StoredReply | None:
        """The stored user message with this platform id in this chat and its turn's
        reply (state/sqlite/replies.py); None when no such message was stored."""
        ...

    # --- titles
    async def set_session_title(self, session_id: str, title: str | None) -> str | None: ...
    async def set_title_if_unset(self, session_id: str, title: str) -> str | None: ...
    async def get_session_title(self, session_id: str) -> str | None: ...
    async def get_session_by_title(self, title: str) -> SessionRow | None: ...
    async def resolve_session_by_title(self, title: str) -> str | None: ...
    async def get_next_title_in_lineage(self, title: str) -> str: ...

    # --- lineage
    async def get_ancestors(self, session_id: str) -> list[SessionRow]: ...
    async def get_descendants(self, session_id: str) -> list[SessionRow]: ...
    async def get_children(self, session_id: str, kind: str | None = None) -> list[SessionRow]: ...
    async def get_compression_tip(self, session_id: str) -> str: ...
    async def resolve_resume_session_id(self, session_id: str) -> str: ...
    async def fork_session(
        self,
        parent_id: str,
        kind: str,
        *,
        new_id: str | None = None,
        title: str | None = None,
        copy_messages: bool = False,
        seed_messages: Iterable[Mapping[str, Any]] = (),
        end_reason: str | None = None,
        **routing: Any,
    ) -> str: ...
    async def count_dangling_parents(self) -> int: ...
    async def clear_dangling_parents(self) -> int: ...

    # --- listings
    async def list_sessions(
        self,
        source: str | None = None,
        *,
        exclude_sources: Iterable[str] = (),
        user_id: str | None = None,
        chat_id: str | None = None,
        include_children: bool = False,
        include_archived: bool = False,
        titled_only: bool = False,
        limit: int = 20,
        offset: int = 0,
    ) -> list[SessionRow]: ...
    async def sessions_by_start(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]: ...
    async def resolve_in_scope(self, ref: str, flt: SessionFilter) -> str | None: ...
    async def list_filtered(
        self, flt: SessionFilter, limit: int = 20, offset: int = 0
    ) -> list[SessionRow]: ...
    async def count_filtered(self, flt: SessionFilter) -> int: ...

    # --- handoff (terminal -> chat) and the gateway's session index
    async def request_handoff(
        self, session_id: str, platform: str, *, now: float | None = None
    ) -> bool: ...
    async def claim_handoff(
        self, platforms: Iterable[str], *, now: float | None = None
    ) -> HandoffClaim | None: ...
    async def finish_handoff(
        self,
        session_id: str,
        state: str | None,
        error: str | None = None,
        *,
        expect: str | None = None,
    ) -> bool: ...
    async def fail_stale_handoffs(
        self, older_than_s: float, *, now: float | None = None
    ) -> list[str]: ...
    async def live_sessions_by_key(self) -> list[LiveSession]: ...
    async def live_session_for_key(self, key: str) -> LiveSession | None: ...
    async def newest_live_session_by_key(self) -> dict[str, str]: ...
    async def session_states(
        self, ids: list[str]
    ) -> dict[str, tuple[float | None, str | None]]: ...
    async def untold_resets(self) -> list[UntoldReset]: ...

    # --- delete, prune, meta, schema
    async def delete_session(self, session_id: str) -> None: ...
    async def prune_sessions(
        self,
        older_than_days: float = 90,
        source: str | None = None,
        *,
        now: float | None = None,
        protected: Iterable[str] = (),
    ) -> int: ...
    async def prune_candidates(
        self,
        older_than_days: float,
        source: str | None = None,
        *,
        now: float | None = None,
        limit: int = 1000,
    ) -> list[str]: ...
    async def maybe_auto_prune_and_vacuum(
        self,
        retention_days: float = 90,
        min_interval_hours: float = 24,
        vacuum: bool = True,
        *,
        now: float | None = None,
        min_vacuum_bytes: int = 8 * 1024 * 1024,
        min_vacuum_share: float = 0.2,
    ) -> AutoPruneResult: ...
    # the inbox: inbound messages committed before the platform is acknowledged
    async def accept_inbound(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str | None = None,
        replica: int | None = None,
    ) -> tuple[int, str, bool]:
        """`session_key`/`replica`: recorded by a store several replicas share (the row's
        key and the incarnation that took it); a one-process store has no use for them."""
        ...

    async def accept_and_begin(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
    ) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
        """`accept_inbound` and, for a new row, `begin_turn`, committed together (the
        router's path for a message to an idle key)."""
        ...

    async def begin_turn(
        self,
        inbox_id: int,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """`fence`: apply only while that session-key lease holds, else raise LeaseLost
        (a store several replicas share; one process holds no leases and passes None)."""
        ...

    async def end_turn(
        self,
        inbox_id: int,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reply_state: str = "ready",
        fence: Fence | None = None,
        release: Release | None = None,
    ) -> list[int]:
        """The reply into the session, the row answered and the reply in the outbox as
        `reply_state`, in one transaction; with a `fence`, only while that lease holds, and
        with `release` that lease freed in the same commit (replicas only)."""
        ...

    async def mark_reply(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None: ...
    def mark_reply_soon(self, inbox_id: int, reply_state: str, ref: str | None = None) -> None:
        """`mark_reply` queued without waiting (the turn's path never waits on it); a
        failure is logged and leaves the row unconfirmed, as a crash would."""
        ...

    async def unsent_replies(self) -> list[UnsentReply]: ...
    async def undelivered_replies(self, session_id: str) -> dict[int, tuple[str, str | None]]:
        """A session's replies not delivered to their chat: message id -> (reply_state,
        the reason of a refused or expired one) (state/sqlite/outbox.py)."""
        ...

    async def finish_inbound(
        self, inbox_id: int, state: str, reason: str | None = None, *, fence: Fence | None = None
    ) -> None: ...
    async def open_inbound(self) -> list[InboxEntry]: ...
    async def inbox_counts(self) -> dict[str, int]: ...
    async def prune_inbox(self, older_than: float) -> int: ...

    # --- DM pairing (state/sqlite/pairing.py, state/pg/pairing.py)
    async def pairing_offer(
        self,
        platform: str,
        user_id: str,
        user_name: str | None,
        chat_id: str,
        code: str,
        *,
        now: float,
        ttl_s: float,
        user_interval_s: float,
        max_pending: int,
    ) -> str | None: ...
    async def pairing_decide(self, code: str, state: str, now: float) -> dict[str, Any] | None: ...
    async def pairing_revoke(self, platform: str, user_id: str, now: float) -> bool: ...
    async def pairing_approved(self, platform: str, user_id: str) -> bool: ...
    async def pairing_list(self, now: float) -> list[dict[str, Any]]: ...
    # --- the outbox of one-off sends (state/sqlite/sends.py, state/pg/sends.py)
    async def send_add(
        self, platform: str, chat_id: str, thread_id: str | None, text: str, now: float
    ) -> int: ...
    async def send_finish(
        self, send_id: int, state: str, error: str | None, message_ids: Sequence[str], now: float
    ) -> None: ...
    async def sends_claim_due(
        self, before: float, now: float, limit: int = 100
    ) -> list[dict[str, Any]]: ...
    async def sends_pending(self) -> int: ...

    async def get_meta(self, key: str) -> str | None: ...
    async def set_meta(self, key: str, value: str | None) -> None: ...
    async def schema_version(self) -> int: ...
    def latest_schema_version(self) -> int: ...
    async def catch_up(self, left: Callable[[int], None] | None = None) -> int:
        """Derive what rows other programs wrote into the store lack (SQLite: previews,
        the side index), in write batches until none wait; returns how many waited. What
        `open_store(..., serving=True)` leaves for after the daemon serves. `left` is told
        how many still wait, first before any batch and then after each one."""
        ...

    # --- the dashboard's queries (state/sqlite/keyset.py, family.py, cleanup.py, insights.py)
    async def session_page(
        self, q: Any
    ) -> tuple[list[dict[str, Any]], tuple[float, str] | None]: ...
    async def lineage_tree(self, session_id: str) -> dict[str, Any] | None: ...
    async def count_empty_sessions(self) -> int: ...
    async def delete_empty_sessions(self, protected: Iterable[str] = ()) -> int: ...
    async def insights(
        self, since: float, until: float, source: str | None = None
    ) -> dict[str, Any]: ...

    # --- export / import, search
    async def export_session(self, session_id: str) -> ExportRecord: ...
    def export_all(
        self,
        source: str | None = None,
        *,
        session_ids: list[str] | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[ExportRecord]: ...
    async def write_jsonl(self, fh: IO[str], **kwargs: Any) -> int: ...
    async def import_records(
        self, records: Iterable[Mapping[str, Any]], *, batch: int = 100
    ) -> ImportReport: ...
    async def search_messages(
        self,
        query: str,
        *,
        sources: Iterable[str] = (),
        exclude_sources: Iterable[str] = (),
        roles: Iterable[str] = (),
        scope: SessionFilter | None = None,
        exclude_session_ids: Iterable[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
    ) -> list[SearchHit]: ...


@runtime_checkable
class Maintenance(Protocol):
    """What a single-file SQLite store offers beyond `Store`: a backend without these
    (PostgreSQL runs its own VACUUM and has no WAL file to checkpoint) simply does not
    implement them, and `isinstance(store, Maintenance)` says so."""

    async def checkpoint(self, mode: str = "PASSIVE") -> tuple[int, int, int]: ...
    async def vacuum(self) -> tuple[int, int]: ...
    async def optimize_search_index(self) -> None: ...
    async def rebuild_search_index(self) -> int: ...
    async def check_search_index(self) -> list[str]: ...
    async def integrity_check(self, quick: bool = True) -> list[str]: ...


class ReplicaLink(Protocol):
    """A replica's control connection (`ClusterStore.control_link`): its incarnation's
    lock, the leader lock and the wake-ups on its own channel."""

    name: str
    incarnation: int  # this run's number, drawn at each (re)join
    space: int  # the lock space: one per database schema
    leading: bool  # holds the leader lock
    joined: bool  # this incarnation's lock is held: work may be done in its name
    live: int  # replicas live at the last look (this one included)

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def serve(
        self,
        on_wakeup: Callable[[Wakeup], None],
        on_incarnation: Callable[[int], None],
        *,
        slice_s: float = 1.0,
    ) -> None: ...


@runtime_checkable
class ClusterStore(Store, Protocol):
    """A `Store` that several `switchboard run` replicas share (PostgreSQL): session-key
    leases with fences, the shared route table, live background jobs, the rows and replies
    a gone replica left, platform shards and each replica's control link. The SQLite store
    is not one: a single daemon serialises keys with in-process locks and recovers its own
    rows at start-up (`open_inbound`, `unsent_replies`), so it needs none of this."""

    where: str  # the database, for errors (the DSN without its password)

    def control_link(self, name: str) -> ReplicaLink:
        """A replica's control connection (not yet open) to this store's database."""
        ...

    def linger(self, seconds: float) -> None:
        """How long a commit waits for more writes to join it (set while others are live)."""
        ...

    async def accept_and_take(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str,
        me: int,
        space: int,
        begin: BeginPlan | None = None,
    ) -> Accepted:
        """`accept_inbound` for replica `me` and, when the row is new, `take_lease` on
        `session_key` in the same commit (and the turn's begin when `begin` allows it)."""
        ...

    async def take_lease(self, key: str, me: int, space: int) -> dict[str, Any] | None:
        """`key`'s lease for incarnation `me`: the route with its open rows (`open`), unsent
        replies (`unsent`) and live jobs (`jobs`); None while a live replica holds it."""
        ...

    async def release_lease(
        self,
        fence: Fence,
        route: Mapping[str, Any] | None,
        answered: Sequence[tuple[int, int]] = (),
    ) -> bool: ...
    async def lease_holds(self, fence: Fence) -> bool: ...
    async def open_for_key(self, key: str) -> list[InboxEntry]: ...
    async def inbox_states(self, ids: Sequence[int]) -> dict[int, str]: ...
    async def routes(self, space: int) -> list[dict[str, Any]]: ...
    async def live_jobs(self, space: int) -> list[tuple[str, str]]: ...
    async def add_job(self, session_id: str, name: str, owner: int) -> None: ...
    async def drop_job(self, session_id: str, name: str) -> None: ...
    async def orphaned_inbound(self, space: int, me: int | None = None) -> list[InboxEntry]: ...
    async def orphaned_replies(self, space: int) -> list[UnsentReply]: ...
    async def claim_orphaned_reply(self, space: int, inbox_id: int, me: int) -> bool: ...
    async def claim_shards(
        self, platform: str, count: int, me: int, space: int, every_s: float
    ) -> tuple[dict[int, int], int]: ...
    async def release_shards(
        self, platform: str, count: int, me: int, owned: Mapping[int, int]
    ) -> int: ...
    async def cluster_report(self) -> dict[str, int]: ...


def default_replica_name() -> str:
    """A replica's name when the config gives none: host and process id."""
    return f"{socket.gethostname()}-{os.getpid()}"


def check_postgres(dsn: str, var: str) -> StoreConfigError | None:
    """What stops the PostgreSQL backend from starting before it connects: psycopg
    missing, the DSN variable unset, or a DSN that does not parse. None when fine."""
    try:
        from psycopg import ProgrammingError, conninfo
    except ImportError:
        return StoreConfigError(
            "state.backend",
            "postgres needs the psycopg package: pip install 'switchboard[postgres]'",
        )
    if not dsn.strip():
        return StoreConfigError("state.dsn_env", f"{var} is not set (the PostgreSQL DSN)")
    try:
        conninfo.conninfo_to_dict(dsn)
    except ProgrammingError:
        return StoreConfigError(
            "state.dsn_env",
            f"{var} does not hold a valid PostgreSQL DSN (key=value or postgresql://...)",
        )
    return None


async def open_store(
    settings: Mapping[str, Any], home: str | os.PathLike[str], *, serving: bool = False
) -> Store:
    """Open the store that `settings` (the validated `state` config section) names.
    `home` is the switchboard home; the SQLite backend keeps state.db there. The
    PostgreSQL backend reads its DSN from the variable `dsn_env` names (or, for tests and
    tools, from a `dsn` entry) and raises StoreConfigError (exit 78) when it cannot.
    `serving`: the daemon's store, opened in bounded time: a backlog of rows other
    programs wrote is left to `Store.catch_up`, which the daemon runs once it serves."""
    backend = settings.get("backend", "sqlite")
    if backend == "sqlite":
        from .sqlite.settings import WriterConfig
        from .sqlite.store import SessionDB

        writer = WriterConfig(
            **{k: settings[k] for k in ("synchronous", "queue_size") if k in settings},
            **(
                {"commit_linger_s": settings["commit_linger_ms"] / 1000}
                if "commit_linger_ms" in settings
                else {}
            ),
        )
        from .hermes.foreign import OPEN_LIMIT

        return await SessionDB.open(
            Path(home) / DB_FILE, config=writer, absorb_at_open=OPEN_LIMIT if serving else None
        )
    if backend == "postgres":
        var = settings.get("dsn_env") or DSN_ENV
        dsn = settings.get("dsn") or os.environ.get(var, "")
        problem = check_postgres(dsn, var)
        if problem is not None:
            raise problem
        from .pg.store import PgStore
        from .pg.writer import PgWriterConfig

        return await PgStore.open(
            dsn, config=PgWriterConfig(queue_size=settings.get("queue_size", 10_000))
        )
    raise UnknownBackend(backend, BACKENDS)
