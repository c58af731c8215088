"""Activity figures over a period: messages per day per platform, busiest hours, top
tools, sessions active and live, tokens per model, and how sessions ended.

Messages are read by one rowid range scan starting at the period's first message (found
through the sessions active in the period), so the cost follows the period's traffic, not
the whole table. Days and hours are UTC. Prices and cost are the
caller's business (gateway/web): this module returns raw token counts per model.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .messages import LAST_ACTIVE_RESOLUTION_S


@dataclass(frozen=True)
class Period:
    since: float
    until: float
    source: str | None = None


def _day(hour: int) -> str:
    return datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%d")


def insights(conn: sqlite3.Connection, p: Period) -> dict[str, Any]:
    src_sql, src_params = (" AND source = ?", [p.source]) if p.source else ("", [])
    # last_active trails the newest message by less than LAST_ACTIVE_RESOLUTION_S, so
    # sessions idle since before (the period's start minus that) hold no message inside it
    idle_before = p.since - LAST_ACTIVE_RESOLUTION_S
    source_of = dict(
        conn.execute(
            f"SELECT id, source FROM sessions WHERE last_active >= ? AND started_at < ?{src_sql}",
            (idle_before, p.until, *src_params),
        ).fetchall()
    )
    # Where the scan starts: at or below the id of every message in the period (ids are
    # arrival order, so one sequential rowid range scan then reads the period instead of
    # a lookup per message; rows outside the period are dropped by their timestamp). A
    # lower start only costs rows, never correctness: sessions that started inside the
    # period give their first message at all (an index-only probe); older ones walk their
    # messages to the first one inside the period.
    first = conn.execute(
        "SELECT MIN(CASE WHEN s.started_at >= ?3 "
        "THEN (SELECT MIN(m.id) FROM messages m WHERE m.session_id = s.id) "
        "ELSE (SELECT m.id FROM messages m WHERE m.session_id = s.id AND m.timestamp >= ?3 "
        "AND m.timestamp < ?4 ORDER BY m.id LIMIT 1) END) FROM sessions s "
        f"WHERE s.last_active >= ?1 AND s.started_at < ?2{src_sql.replace('?', '?5')}",
        (idle_before, p.until, p.since, p.until, *src_params),
    ).fetchone()[0]
    rows = []
    if first is not None:
        rows = conn.execute(
            "SELECT session_id, CAST(timestamp / 3600 AS INTEGER), "
            "CASE WHEN role = 'tool' THEN COALESCE(tool_name, '?') END, COUNT(*) FROM messages "
            # hour first: rows arrive nearly in time order, which the sorter handles fastest
            "WHERE id >= ? AND timestamp >= ? AND timestamp < ? GROUP BY 2, 1, 3",
            (first, p.since, p.until),
        ).fetchall()
    per_day: dict[str, dict[str, int]] = {}
    heat = [[0] * 24 for _ in range(7)]  # [weekday Monday=0][hour]
    tools: dict[str, int] = {}
    total = 0
    for session_id, hr, tool, n in rows:
        source = source_of.get(session_id)
        if source is None:  # another platform's (with a platform filter)
            continue
        day = _day(hr)
        per_day.setdefault(day, {})
        per_day[day][source] = per_day[day].get(source, 0) + n
        when = datetime.fromtimestamp(hr * 3600, UTC)
        heat[when.weekday()][when.hour] += n
        if tool is not None:
            tools[tool] = tools.get(tool, 0) + n
        total += n
    src_plain = " AND source = ?" if p.source else ""
    active = conn.execute(
        "SELECT COUNT(*), SUM(started_at >= ?) FROM sessions "
        f"WHERE last_active >= ? AND started_at < ?{src_plain}",
        (p.since, p.since, p.until, *src_params),
    ).fetchone()
    live = conn.execute(
        f"SELECT COUNT(*) FROM sessions WHERE ended_at IS NULL{src_plain}", src_params
    ).fetchone()[0]
    models = conn.execute(
        "SELECT COALESCE(model, ''), SUM(COALESCE(input_tokens, 0)), "
        "SUM(COALESCE(output_tokens, 0)), COUNT(*) FROM sessions "
        f"WHERE last_active >= ? AND started_at < ?{src_plain} GROUP BY 1 ORDER BY 2 DESC",
        (p.since, p.until, *src_params),
    ).fetchall()
    ends = conn.execute(
        "SELECT COALESCE(end_reason, ''), COUNT(*) FROM sessions "
        f"WHERE ended_at >= ? AND ended_at < ?{src_plain} GROUP BY 1 ORDER BY 2 DESC",
        (p.since, p.until, *src_params),
    ).fetchall()
    return {
        "since": p.since,
        "until": p.until,
        "source": p.source,
        "messages": total,
        "per_day": [
            {"day": day, "sources": dict(sorted(v.items()))} for day, v in sorted(per_day.items())
        ],
        "heatmap": heat,
        "top_tools": [
            {"tool": t, "calls": n} for t, n in sorted(tools.items(), key=lambda x: (-x[1], x[0]))
        ][:20],
        "sessions_active": int(active[0] or 0),
        "sessions_started": int(active[1] or 0),
        "sessions_live": int(live or 0),
        "models": [
            {"model": m, "input_tokens": int(i), "output_tokens": int(o), "sessions": int(n)}
            for m, i, o, n in models
        ],
        "end_reasons": [{"reason": r, "sessions": int(n)} for r, n in ends],
    }
