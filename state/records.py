"""The shapes of what the store hands back: typed rows, stats and reports.

Rows stay plain dicts (callers index them by column name, and a state.db written by
Hermes Agent may carry more columns than listed), typed as `TypedDict`s so a wrong key is a
type error. The SQL that builds each shape sits in the operation module that returns it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict


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


class ExportRecord(TypedDict):
    """One exported session with its messages (one JSONL line)."""

    format: int
    session: SessionRow
    messages: list[MessageRow]


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
