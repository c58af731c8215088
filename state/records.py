"""The shapes of what the store hands back: typed rows, stats and reports.

Rows stay plain dicts (callers index them by column name, and a state.db written by
Hermes Agent may carry more columns than listed), typed as `TypedDict`s so a wrong key is a
type error. The SQL that builds each shape sits in the operation module that returns it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypedDict

from .text import storable_value


class SessionRow(TypedDict, total=False):
    """One row of `sessions`, every column (listings give `chat_name` from `origin_json`
    in its place; `descendants` adds depth)."""

    id: str
    source: str
    user_id: str | None
    model: str | None
    model_config: str | None
    system_prompt: str | None
    parent_session_id: str | None
    started_at: float
    ended_at: float | None
    end_reason: str | None
    message_count: int
    tool_call_count: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    billing_provider: str | None
    billing_base_url: str | None
    billing_mode: str | None
    estimated_cost_usd: float | None
    actual_cost_usd: float | None
    cost_status: str | None
    cost_source: str | None
    pricing_version: str | None
    title: str | None
    session_key: str | None
    chat_id: str | None
    chat_type: str | None
    thread_id: str | None
    origin_json: str | None
    chat_name: str | None
    handoff_state: str | None
    handoff_platform: str | None
    handoff_error: str | None
    archived: int
    child_kind: str | None
    last_active: float | None
    preview: str | None
    title_key: str | None
    title_base: str | None
    title_number: int | None
    handoff_updated_at: float | None
    depth: int  # only in `descendants`


class MessageRow(TypedDict, total=False):
    """One row of `messages`; the JSON columns come back decoded."""

    id: int
    session_id: str
    role: str
    content: str | None
    tool_call_id: str | None
    tool_calls: Any
    tool_name: str | None
    timestamp: float
    token_count: int | None
    finish_reason: str | None
    reasoning: str | None
    reasoning_details: Any
    codex_reasoning_items: Any
    platform_message_id: str | None


class ContextMessage(TypedDict):
    id: int
    role: str
    content: str | None


class SearchHit(TypedDict, total=False):
    """One search result: the message, its session's columns, a snippet and its neighbours."""

    id: int
    session_id: str
    role: str
    timestamp: float
    source: str | None
    model: str | None
    title: str | None
    started_at: float | None
    snippet: str
    context_before: ContextMessage | None
    context_after: ContextMessage | None


class SourceUsage(TypedDict):
    source: str
    sessions: int
    messages: int
    input_tokens: int
    output_tokens: int
    estimated_cost_usd: float
    actual_cost_usd: float


class UsageStats(TypedDict):
    """Totals over the whole store (`switchboard sessions stats`)."""

    sessions: int
    live_sessions: int
    messages: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    estimated_cost_usd: float
    actual_cost_usd: float
    per_source: list[SourceUsage]
    db_bytes: int
    wal_bytes: int
    computed_at: float


class LiveSession(TypedDict):
    """The newest live session of a session key: what the gateway's index is rebuilt from."""

    session_key: str
    id: str
    started_at: float
    last_active: float | None
    origin_json: str | None
    source: str
    chat_type: str | None


class UntoldReset(TypedDict):
    """A live session key's empty `reset` child and the session it replaced (its parent,
    ended `idle` or `daily`): a reset the chat has not been told about yet."""

    session_key: str
    session_id: str  # the live reset child
    old_id: str
    old_title: str | None
    old_messages: int
    end_reason: str


class HandoffClaim(TypedDict):
    id: str
    platform: str


class AutoPruneResult(TypedDict):
    ran: bool
    pruned: int
    vacuumed: bool


FORMAT_VERSION = 1  # an export line's `format`
DERIVED_SESSION_COLUMNS = frozenset({"title_key"})  # never exported; recomputed on import


class ExportRecord(TypedDict):
    """One exported session with its messages (one JSONL line)."""

    format: int
    session: SessionRow
    messages: list[MessageRow]


@dataclass(frozen=True)
class Period:
    """The time window (and optionally the platform) activity figures cover."""

    since: float
    until: float
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """A turn's hold on its session key across replicas: the lease owner (a replica
    incarnation) and the lease epoch it took. A write carrying it is applied only while the
    key's lease still has this owner and epoch (else LeaseLost); one process needs none."""

    session_key: str
    owner: int
    epoch: int


# A lease freed with a fenced turn write (end_turn's `release`): the key's route as its
# holder leaves it (None: unchanged) and the inbox rows answered under the lease that
# other replicas took, as (their incarnation, inbox id), so they are woken
Release = tuple[Mapping[str, Any] | None, Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class WriteStats:
    """A snapshot of the write path, for metrics and /health. `recent_*` hold the latest
    commits (at most a few hundred), oldest first."""

    queue_depth: int
    batches: int
    operations: int
    failed_operations: int
    busy_retries: int
    last_batch_size: int
    last_commit_ms: float
    recent_commit_ms: tuple[float, ...] = ()
    recent_batch_sizes: tuple[int, ...] = ()


# inbox.accept's arguments after the connection: platform, chat id, platform message id,
# payload (JSON text) and the time taken
Accept = tuple[str, str, "str | None", str, float]
PAIRING_COLUMNS = (
    "platform",
    "user_id",
    "user_name",
    "chat_id",
    "code",
    "state",
    "requested_at",
    "expires_at",
    "decided_at",
)


class InboxEntry(TypedDict, total=False):
    """An open inbox row (`open_inbound`, a replica's `orphaned_inbound` and the `open` rows
    of a taken route): a message taken but not yet answered or dropped."""

    id: int
    payload: str
    state: str  # vocab.RECEIVED or vocab.STARTED
    session_id: str | None
    received_at: float
    platform: str
    chat_id: str
    platform_message_id: str | None
    message_id: int | None
    session_key: str | None  # replicas
    replica: int | None  # replicas: the incarnation that took it


class UnsentReply(TypedDict, total=False):
    """A reply committed but not confirmed sent (`unsent_replies`, `orphaned_replies`)."""

    id: int
    payload: str
    reply_state: str  # 'ready' (sent again) or 'sending' (the send may have happened)
    reply_message_id: int | None
    received_at: float
    session_id: str | None
    content: str | None
    session_key: str | None  # replicas


OUTBOX_COLUMNS = (
    "id",
    "platform",
    "chat_id",
    "thread_id",
    "text",
    "state",
    "attempts",
    "error",
    "message_ids",
    "created_at",
    "updated_at",
)


def outbox_item(values: Sequence[Any]) -> dict[str, Any]:
    """An outbox row (its values in OUTBOX_COLUMNS' order) as an OutboxItem."""
    out = dict(zip(OUTBOX_COLUMNS, values, strict=True))
    out["message_ids"] = json.loads(out["message_ids"]) if out["message_ids"] else []
    return out


class OutboxItem(TypedDict):
    """A one-off send in the outbox (`send_add`, `sends_claim_due`)."""

    id: int
    platform: str
    chat_id: str
    thread_id: str | None
    text: str
    state: str  # vocab.SEND_PENDING, SEND_SENT or SEND_FAILED
    attempts: int
    error: str | None
    message_ids: list[str]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Wakeup:
    """A notification on a replica incarnation's channel: `d` (an inbox row it took was
    answered elsewhere; `ref` is its id) or `k` (a key's lease is free; `ref` is the key)."""

    kind: str
    ref: str


# Where a taken key's turn may begin in the accept's own transaction: the route row and
# the new inbox id -> the session to store the message in, or None (the turn begins later).
# It runs inside the writer's transaction: no awaits, no shared state.
BeginsIn = Callable[[Mapping[str, Any], int], "str | None"]


class BeginPlan(NamedTuple):
    """What `accept_and_take` needs to begin the turn in the accept's own commit."""

    message: Mapping[str, Any]  # the user's message
    last: int | None  # the history's length
    begins_in: BeginsIn


class Accepted(NamedTuple):
    """`accept_and_take`'s answer."""

    inbox_id: int
    state: str
    new: bool
    route: dict[str, Any] | None  # the lease's route as `take_lease` returns it
    begun: tuple[int, list[dict[str, Any]]] | None  # the turn's begin, as begin_turn's


@dataclass(frozen=True)
class StoredReply:
    """A stored user message and its turn's reply (None: stored, not answered yet)."""

    session_id: str
    session_key: str | None
    message_id: int
    reply: str | None


@dataclass
class ImportReport:
    """What an import did: sessions and messages taken, skipped, renamed, refused."""

    imported: int = 0
    skipped_existing: int = 0
    messages: int = 0
    renamed_titles: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    replaced: int = 0  # NULs and lone surrogates kept as U+FFFD (state/text.py)

    def storable(self, record: Mapping[str, Any]) -> Mapping[str, Any]:
        """`record` as it may be stored: every NUL and lone surrogate in its strings
        replaced by U+FFFD, and counted."""
        clean, replaced = storable_value(record)
        self.replaced += replaced
        return clean


@dataclass
class WriterStats:
    """A writer's running counters (either backend): batches, operations, retries, commit times."""

    batches: int = 0
    operations: int = 0
    failed_operations: int = 0
    busy_retries: int = 0
    last_batch_size: int = 0
    last_commit_ms: float = 0.0
    fallbacks: int = 0  # batches redone one savepoint per operation
    commit_ms_total: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)  # recent, for metrics
    commit_ms: list[float] = field(default_factory=list)  # recent, for metrics

    def record(self, size: int, commit_ms: float) -> None:
        self.batches += 1
        self.operations += size
        self.last_batch_size = size
        self.last_commit_ms = commit_ms
        self.commit_ms_total += commit_ms
        self.batch_sizes.append(size)
        self.commit_ms.append(commit_ms)
        if len(self.batch_sizes) > 1024:
            del self.batch_sizes[:512]
            del self.commit_ms[:512]

    def snapshot(self, queue_depth: int) -> WriteStats:
        """The counters as the store reports them (`write_stats`), with the queue's depth."""
        return WriteStats(
            queue_depth=queue_depth,
            batches=self.batches,
            operations=self.operations,
            failed_operations=self.failed_operations,
            busy_retries=self.busy_retries,
            last_batch_size=self.last_batch_size,
            last_commit_ms=self.last_commit_ms,
            recent_commit_ms=tuple(self.commit_ms),
            recent_batch_sizes=tuple(self.batch_sizes),
        )
