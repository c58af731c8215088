"""Activity figures over a period: messages per day per platform, busiest hours, top
tools, sessions active and live, tokens per model, and how sessions ended.

Message figures come from the hourly tallies the writer keeps (state/sqlite/activity.py): the
cost follows the period's hours, not its messages. A message counts for the platform of
its session and the hour of its timestamp. Days and hours are UTC. Prices and cost are the
caller's business (gateway/pricing.py): this module returns raw token counts per model and
the cost its sessions recorded.
"""

from __future__ import annotations

import math
import sqlite3
from datetime import UTC, datetime
from typing import Any

from ..accounting import RECORDED_COST  # noqa: F401
from ..records import Period
from . import activity


def _day(hour: int) -> str:
    return datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%d")


def _message_rows(conn: sqlite3.Connection, p: Period) -> list[tuple[int, str, str, int]]:
    """(hour, source, tool, messages) for the period: the whole hours inside it from the
    tallies, the partial first and last hours from their messages (a rowid range that the
    tallies bound, so a few hundred rows however big the table)."""
    first_full = math.ceil(p.since / 3600)
    end_full = math.floor(p.until / 3600)
    src_sql, src_params = (" AND source = ?", [p.source]) if p.source else ("", [])
    out: list[tuple[int, str, str, int]] = []
    if first_full < end_full:
        out += conn.execute(
            "SELECT hour, source, tool, messages FROM activity_hourly "
            f"WHERE hour >= ? AND hour < ? AND messages > 0{src_sql}",
            (first_full, end_full, *src_params),
        ).fetchall()
        edges = [(p.since, first_full * 3600.0), (end_full * 3600.0, p.until)]
    else:  # inside one hour
        edges = [(p.since, p.until)]
    for lo, hi in edges:
        if lo >= hi:
            continue
        bounds = conn.execute(
            "SELECT MIN(first_id), MAX(last_id) FROM activity_hourly WHERE hour = ?",
            (activity.hour_of(lo),),
        ).fetchone()
        if bounds[0] is None:
            continue
        out += conn.execute(
            f"SELECT CAST(m.timestamp / 3600 AS INTEGER), s.source, {activity.tool_sql('m')}, "
            "COUNT(*) FROM messages m CROSS JOIN sessions s ON s.id = m.session_id "
            "WHERE m.id >= ? AND m.id <= ? AND m.timestamp >= ? AND m.timestamp < ?"
            f"{src_sql.replace('source', 's.source')} GROUP BY 1, 2, 3",
            (bounds[0], bounds[1], lo, hi, *src_params),
        ).fetchall()
    return out


def insights(conn: sqlite3.Connection, p: Period) -> dict[str, Any]:
    src_params = [p.source] if p.source else []
    src_plain = " AND source = ?" if p.source else ""
    # two passes over sessions instead of four: the models' rows give the active and
    # started counts; one scan gives the live sessions and the period's end reasons
    models = conn.execute(
        "SELECT COALESCE(model, ''), SUM(COALESCE(input_tokens, 0)), "
        "SUM(COALESCE(output_tokens, 0)), COUNT(*), SUM(started_at >= ?), "
        f"SUM({RECORDED_COST}) FROM sessions "
        f"WHERE last_active >= ? AND started_at < ?{src_plain} GROUP BY 1 ORDER BY 2 DESC",
        (p.since, p.since, p.until, *src_params),
    ).fetchall()
    by_end = conn.execute(
        "SELECT COALESCE(end_reason, ''), SUM(ended_at >= ? AND ended_at < ?), "
        "SUM(ended_at IS NULL) FROM sessions "
        f"WHERE (ended_at IS NULL OR (ended_at >= ? AND ended_at < ?)){src_plain} GROUP BY 1",
        (p.since, p.until, p.since, p.until, *src_params),
    ).fetchall()
    return assemble(p, _message_rows(conn, p), models, by_end)


def assemble(
    p: Period,
    message_rows: list[tuple[int, str, str, int]],
    models: list[tuple[Any, ...]],
    by_end: list[tuple[Any, ...]],
) -> dict[str, Any]:
    """The figures from (hour, source, tool, messages) rows, the per-model session rows
    (model, input, output, sessions, started, recorded cost) and the end-reason rows (reason, ended in
    the period, live): pure, so every store shapes them the same way."""
    per_day: dict[int, dict[str, int]] = {}  # days since the epoch (UTC)
    heat = [[0] * 24 for _ in range(7)]  # [weekday Monday=0][hour]
    tools: dict[str, int] = {}
    total = 0
    for hr, source, tool, n in message_rows:
        days_since_epoch = hr // 24
        day = per_day.get(days_since_epoch)
        if day is None:
            day = per_day[days_since_epoch] = {}
        day[source] = day.get(source, 0) + n
        heat[(days_since_epoch + 3) % 7][hr % 24] += n  # 1970-01-01 was a Thursday
        if tool:
            tools[tool] = tools.get(tool, 0) + n
        total += n
    active = (sum(m[3] for m in models), sum(m[4] or 0 for m in models))
    live = sum(n or 0 for _, _, n in by_end)
    ends = sorted(((r, n) for r, n, _ in by_end if n), key=lambda x: (-x[1], x[0]))
    return {
        "since": p.since,
        "until": p.until,
        "source": p.source,
        "messages": total,
        "per_day": [
            {"day": _day(day * 24), "sources": dict(sorted(v.items()))}
            for day, v in sorted(per_day.items())
        ],
        "heatmap": heat,
        "top_tools": [
            {"tool": t, "calls": n} for t, n in sorted(tools.items(), key=lambda x: (-x[1], x[0]))
        ][:20],
        "sessions_active": int(active[0] or 0),
        "sessions_started": int(active[1] or 0),
        "sessions_live": int(live or 0),
        "models": [
            {
                "model": m,
                "input_tokens": int(i),
                "output_tokens": int(o),
                "sessions": int(n),
                "recorded_cost_usd": float(c or 0),
            }
            for m, i, o, n, _, c in models
        ],
        "end_reasons": [{"reason": r, "sessions": int(n)} for r, n in ends],
    }
