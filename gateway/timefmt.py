"""Relative times for people: "just now", "5m ago", "2h ago", "yesterday", "3d ago", a date."""

from __future__ import annotations

from datetime import UTC, datetime


def ago(ts: float | None, now: float) -> str:
    if not ts:
        return "never"
    d = max(0.0, now - ts)
    if d < 60:
        return "just now"
    if d < 3600:
        return f"{int(d // 60)}m ago"
    if d < 86400:
        return f"{int(d // 3600)}h ago"
    if d < 2 * 86400:
        return "yesterday"
    if d < 30 * 86400:
        return f"{int(d // 86400)}d ago"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")
