"""Token and cost accounting with billing routes, and per-model usage (`session_model_usage`,
shared with Hermes Agent): what a session spent on each model/provider/task.

Rules (the same a Hermes caller relies on):
* a call is *accounted* when any token count, API call count or cost is non-zero;
* `model` is filled only where NULL; billing provider/base URL/mode are filled only by an
  accounted call, first writer wins, except that while no API call has been counted an
  accounted call naming a different model+provider replaces the whole route (a fallback
  that actually served the first request);
* incremental calls add (NULL counts as 0) and add their delta to the usage row of the route
  they used; absolute calls set the totals and record no usage row.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from typing import Any, Unpack

from ..accounting import TOKEN_KINDS, TokenUsage, token_update, totals_set, usage_route  # noqa: F401
from . import sessions
from .batches import chunks, statement
from .dispatch import Dispatch


def _route_fill(
    conn: sqlite3.Connection,
    session_id: str,
    model: str | None,
    route: Mapping[str, Any],
    accounted: bool,
) -> None:
    row = conn.execute(
        "SELECT model, billing_provider, COALESCE(api_call_count, 0) FROM sessions WHERE id = ?",
        (session_id,),
    ).fetchone()
    if row is None:
        return
    cur_model, cur_provider, calls = row
    provider = route.get("billing_provider")
    if (
        accounted
        and calls == 0
        and model
        and provider
        and (model, provider) != (cur_model, cur_provider)
    ):
        conn.execute(
            "UPDATE sessions SET model = ?, billing_provider = ?, billing_base_url = ?, "
            "billing_mode = ? WHERE id = ?",
            (model, provider, route.get("billing_base_url"), route.get("billing_mode"), session_id),
        )
        return
    if model:
        conn.execute(
            "UPDATE sessions SET model = ? WHERE id = ? AND model IS NULL", (model, session_id)
        )
    if accounted:
        for col in ("billing_provider", "billing_base_url", "billing_mode"):
            if route.get(col):
                conn.execute(
                    f"UPDATE sessions SET {col} = ? WHERE id = ? AND {col} IS NULL",
                    (route[col], session_id),
                )


def update_token_counts(
    conn: sqlite3.Connection,
    session_id: str,
    counts: Mapping[str, int],
    *,
    model: str | None = None,
    estimated_cost_usd: float | None = None,
    actual_cost_usd: float | None = None,
    api_call_count: int = 0,
    absolute: bool = False,
    route: Mapping[str, Any] | None = None,
    cost: Mapping[str, Any] | None = None,
) -> None:
    """Add to (or set) the session's totals; see the module rules. The session row must exist."""
    route = route or {}
    cost = cost or {}
    accounted = bool(
        any(counts.get(k) for k in TOKEN_KINDS)
        or api_call_count
        or estimated_cost_usd
        or actual_cost_usd
    )
    _route_fill(conn, session_id, model, route, accounted)
    sets, params = totals_set(
        counts, estimated_cost_usd, actual_cost_usd, api_call_count, absolute, cost, "?"
    )
    conn.execute(f"UPDATE sessions SET {', '.join(sets)} WHERE id = ?", (*params, session_id))
    if accounted and not absolute:
        srow = conn.execute(
            "SELECT model, billing_provider, billing_base_url, billing_mode FROM sessions "
            "WHERE id = ?",
            (session_id,),
        ).fetchone()
        add_usage(
            conn,
            session_id,
            "",
            usage_route(model, route, srow),
            counts,
            api_call_count,
            estimated_cost_usd,
            actual_cost_usd,
            cost,
        )


def add_usage(
    conn: sqlite3.Connection,
    session_id: str,
    task: str,
    route: Mapping[str, Any],
    counts: Mapping[str, int],
    api_calls: int,
    estimated: float | None,
    actual: float | None,
    cost: Mapping[str, Any] | None = None,
) -> None:
    """Add a delta to one (session, model, route, task) usage row."""
    now = time.time()
    cost = cost or {}
    key = (
        session_id,
        route.get("model") or "unknown",
        route.get("billing_provider") or "",
        route.get("billing_base_url") or "",
        route.get("billing_mode") or "",
        task or "",
    )
    deltas = [int(counts.get(k) or 0) for k in TOKEN_KINDS]
    conn.execute(
        "INSERT INTO session_model_usage(session_id, model, billing_provider, billing_base_url, "
        "billing_mode, task, api_call_count, input_tokens, output_tokens, cache_read_tokens, "
        "cache_write_tokens, reasoning_tokens, estimated_cost_usd, actual_cost_usd, "
        "cost_status, cost_source, first_seen, last_seen) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT(session_id, model, billing_provider, billing_base_url, billing_mode, task) "
        "DO UPDATE SET api_call_count = api_call_count + excluded.api_call_count, "
        "input_tokens = input_tokens + excluded.input_tokens, "
        "output_tokens = output_tokens + excluded.output_tokens, "
        "cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens, "
        "cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens, "
        "reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens, "
        "estimated_cost_usd = estimated_cost_usd + excluded.estimated_cost_usd, "
        "actual_cost_usd = actual_cost_usd + excluded.actual_cost_usd, "
        "cost_status = COALESCE(excluded.cost_status, cost_status), "
        "cost_source = COALESCE(excluded.cost_source, cost_source), "
        "last_seen = excluded.last_seen",
        (
            *key,
            int(api_calls or 0),
            *deltas,
            float(estimated or 0.0),
            float(actual or 0.0),
            cost.get("cost_status"),
            cost.get("cost_source"),
            now,
            now,
        ),
    )


# A group commit's turn tokens: the same effect as `update_token_counts` with input/output
# counts only (no model, route, cost or API calls), once per session. The session totals
# are added by the appends' own sessions UPDATE (one rewrite of each session row, not
# two); the usage rows here, in one upsert.
_USAGE_ROWS = "WITH j(sid, i, o) AS (VALUES "
_ADD_USAGE = (
    ") INSERT INTO session_model_usage(session_id, model, billing_provider, billing_base_url, "
    "billing_mode, task, api_call_count, input_tokens, output_tokens, cache_read_tokens, "
    "cache_write_tokens, reasoning_tokens, estimated_cost_usd, actual_cost_usd, "
    "cost_status, cost_source, first_seen, last_seen) "
    "SELECT s.id, COALESCE(NULLIF(s.model, ''), 'unknown'), COALESCE(s.billing_provider, ''), "
    "COALESCE(s.billing_base_url, ''), COALESCE(s.billing_mode, ''), '', 0, "
    "j.i, j.o, 0, 0, 0, 0.0, 0.0, NULL, NULL, ?, ? "
    "FROM j JOIN sessions s ON s.id = j.sid WHERE 1 "
    "ON CONFLICT(session_id, model, billing_provider, billing_base_url, billing_mode, task) "
    "DO UPDATE SET input_tokens = input_tokens + excluded.input_tokens, "
    "output_tokens = output_tokens + excluded.output_tokens, last_seen = excluded.last_seen"
)


def add_turn_usage(conn: sqlite3.Connection, counts: list[tuple[str, int, int]]) -> None:
    """The usage rows for (session id, input tokens, output tokens) of many sessions at once
    (each session at most once; zero counts are skipped). The session totals are the
    caller's (the appends' sessions UPDATE)."""
    accounted = [c for c in counts if c[1] or c[2]]
    if accounted:
        now = time.time()
        for n, params in chunks(accounted, 3):
            conn.execute(statement(_USAGE_ROWS, 3, n, _ADD_USAGE), [*params, now, now])


def model_usage(conn: sqlite3.Connection, session_id: str) -> list[dict[str, Any]]:
    """The session's usage rows, biggest spend first."""
    cur = conn.execute(
        "SELECT * FROM session_model_usage WHERE session_id = ? "
        "ORDER BY input_tokens + output_tokens DESC, model",
        (session_id,),
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


class UsageOps(Dispatch):
    """SessionDB's token and cost counters and per-model usage."""

    async def update_token_counts(self, session_id: str, **usage: Unpack[TokenUsage]) -> None:
        """Add to the counters (default), or set them (`absolute=True`), with the billing
        route and per-model usage rules above (the facade's one code path)."""
        update = token_update(usage)

        def write(conn: sqlite3.Connection) -> None:
            sessions.require_session(conn, session_id)
            update_token_counts(conn, session_id, **update)

        await self._write(write)

    async def model_usage(self, session_id: str) -> list[dict[str, Any]]:
        """What the session spent per model, billing route and task."""
        return list(await self._read(model_usage, session_id))
