"""Token and cost accounting on PostgreSQL, with state/accounting.py's rules (billing route
fill, incremental or absolute totals, per-model usage rows)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from psycopg import AsyncConnection

from ..accounting import TOKEN_KINDS, TokenUsage, token_update, totals_set, usage_route
from . import db, sessions
from .dispatch import Dispatch

# Both usage inserts: the row's columns up to its costs, its key, and on a conflict the
# counters and costs adding up
_COLUMNS = (
    "session_id, model, billing_provider, billing_base_url, billing_mode, task, "
    "api_call_count, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, "
    "reasoning_tokens, estimated_cost_usd, actual_cost_usd"
)
_KEY = "(session_id, model, billing_provider, billing_base_url, billing_mode, task)"
_ACCUMULATE = ", ".join(
    f"{c} = u.{c} + excluded.{c}"
    for c in ("api_call_count", *TOKEN_KINDS, "estimated_cost_usd", "actual_cost_usd")
)


async def _route_fill(
    conn: AsyncConnection,
    session_id: str,
    model: str | None,
    route: Mapping[str, Any],
    accounted: bool,
) -> None:
    found = await db.tuples(
        conn,
        "SELECT model, billing_provider, COALESCE(api_call_count, 0) FROM sessions "
        "WHERE id = %s FOR UPDATE",
        (session_id,),
    )
    if not found:
        return
    cur_model, cur_provider, calls = found[0]
    provider = route.get("billing_provider")
    if (
        accounted
        and calls == 0
        and model
        and provider
        and (model, provider) != (cur_model, cur_provider)
    ):
        await db.run(
            conn,
            "UPDATE sessions SET model = %s, billing_provider = %s, billing_base_url = %s, "
            "billing_mode = %s WHERE id = %s",
            (model, provider, route.get("billing_base_url"), route.get("billing_mode"), session_id),
        )
        return
    if model:
        await db.run(
            conn,
            "UPDATE sessions SET model = %s WHERE id = %s AND model IS NULL",
            (model, session_id),
        )
    if accounted:
        for col in ("billing_provider", "billing_base_url", "billing_mode"):
            if route.get(col):
                await db.run(
                    conn,
                    f"UPDATE sessions SET {col} = %s WHERE id = %s AND {col} IS NULL",
                    (route[col], session_id),
                )


async def update_token_counts(
    conn: AsyncConnection,
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
    route = route or {}
    cost = cost or {}
    accounted = bool(
        any(counts.get(k) for k in TOKEN_KINDS)
        or api_call_count
        or estimated_cost_usd
        or actual_cost_usd
    )
    await _route_fill(conn, session_id, model, route, accounted)
    sets, params = totals_set(
        counts, estimated_cost_usd, actual_cost_usd, api_call_count, absolute, cost, "%s"
    )
    found = await db.tuples(
        conn,
        f"UPDATE sessions SET {', '.join(sets)} WHERE id = %s "
        "RETURNING model, billing_provider, billing_base_url, billing_mode",
        (*params, session_id),
    )
    if accounted and not absolute:
        use = usage_route(model, route, found[0] if found else None)
        await _add_usage(
            conn, session_id, use, counts, api_call_count, estimated_cost_usd, actual_cost_usd, cost
        )


async def _add_usage(
    conn: AsyncConnection,
    session_id: str,
    route: Mapping[str, Any],
    counts: Mapping[str, int],
    api_calls: int,
    estimated: float | None,
    actual: float | None,
    cost: Mapping[str, Any],
) -> None:
    now = time.time()
    key = (
        session_id,
        route.get("model") or "unknown",
        route.get("billing_provider") or "",
        route.get("billing_base_url") or "",
        route.get("billing_mode") or "",
        "",
    )
    deltas = [int(counts.get(k) or 0) for k in TOKEN_KINDS]
    await db.run(
        conn,
        f"INSERT INTO session_model_usage AS u ({_COLUMNS}, cost_status, cost_source, "
        f"first_seen, last_seen) VALUES ({db.marks(18)}) "
        f"ON CONFLICT {_KEY} DO UPDATE SET {_ACCUMULATE}, "
        "cost_status = COALESCE(excluded.cost_status, u.cost_status), "
        "cost_source = COALESCE(excluded.cost_source, u.cost_source), last_seen = excluded.last_seen",
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


def tokens_set() -> str:
    """SET clauses of an `UPDATE sessions s ... FROM unnest(...) AS u` adding the input and
    output tokens `u.i`, `u.o` where `u.tk`, as `update_token_counts` with only those two
    counts does: every total counted from 0 when NULL. Rows without `u.tk` keep theirs."""
    added = {"input_tokens": " + u.i", "output_tokens": " + u.o"}
    cols = [*TOKEN_KINDS, "api_call_count", "estimated_cost_usd"]
    return ", ".join(
        f"{c} = CASE WHEN u.tk THEN COALESCE(s.{c}, 0){added.get(c, '')} ELSE s.{c} END"
        for c in cols
    )


# What the usage rows need back from a tokens_set update: the session, its billing route
# and the update's `i`, `o` and `tk` (routed_usage's relation).
ROUTED_RETURNING = (
    "s.id, s.model, s.billing_provider, s.billing_base_url, s.billing_mode, u.i, u.o, u.tk"
)


def upsert_from(rows: str) -> str:
    """The incremental usage rows' upsert from `rows`, a relation of (sid, m, bp, bu, bm,
    i, o): session, model, billing provider, base URL and mode, input and output tokens;
    first and last seen are the statement's next two parameters. As `_add_usage` writes
    a call's row with tokens only."""
    return (
        f"INSERT INTO session_model_usage AS u ({_COLUMNS}, first_seen, last_seen) "
        f"SELECT sid, m, bp, bu, bm, '', 0, i, o, 0, 0, 0, 0.0, 0.0, %s, %s FROM {rows} "
        f"ON CONFLICT {_KEY} DO UPDATE SET {_ACCUMULATE}, last_seen = excluded.last_seen"
    )


def routed_usage(updated: str) -> str:
    """`updated`'s rows (ROUTED_RETURNING's columns) where `tk`, as upsert_from's relation:
    each on its session's billing route as `usage_route(None, {}, session)` picks it (the
    model, else "unknown"), in session order."""
    return (
        "(SELECT id AS sid, COALESCE(NULLIF(model, ''), 'unknown') AS m, "
        "COALESCE(billing_provider, '') AS bp, COALESCE(billing_base_url, '') AS bu, "
        f"COALESCE(billing_mode, '') AS bm, i, o FROM {updated} WHERE tk ORDER BY id) AS x"
    )


async def add_tokens_many(conn: AsyncConnection, deltas: Sequence[tuple[str, int, int]]) -> None:
    """`update_token_counts(sid, {"input_tokens": i, "output_tokens": o})` for many sessions
    in one statement (the turns' hot path, via appends.append_many, for calls whose
    messages were all duplicates), with its effect: the sessions' totals, then the usage
    rows on their billing routes. Such a call has no model, route or cost, so its
    billing-route fill writes nothing and is skipped; a session that is gone is skipped
    too. At most one delta per session."""
    now = time.time()
    await db.run(
        conn,
        f"WITH upd AS (UPDATE sessions s SET {tokens_set()} FROM unnest(%s::text[], "
        "%s::bigint[], %s::bigint[], %s::boolean[]) AS u(sid, i, o, tk) WHERE s.id = u.sid "
        f"RETURNING {ROUTED_RETURNING}) {upsert_from(routed_usage('upd'))}",
        (
            [d[0] for d in deltas],
            [d[1] for d in deltas],
            [d[2] for d in deltas],
            [True] * len(deltas),
            now,
            now,
        ),
    )


class UsageOps(Dispatch):
    """PgStore's token and cost counters."""

    async def update_token_counts(self, session_id: str, **usage: Unpack[TokenUsage]) -> None:
        """Add to the counters (default), or set them (`absolute=True`): state/accounting.py's
        reading of the call, the rules of update_token_counts above."""
        update = token_update(usage)

        async def write(conn: AsyncConnection) -> None:
            await sessions.require_session(conn, session_id)
            await update_token_counts(conn, session_id, **update)

        await self._write(write)
