"""`switchboard insights`: the dashboard's activity figures in the terminal — messages per
day per platform as sparklines, sessions, tokens and estimated cost, top tools, how
sessions ended, busiest hours — or as JSON with `--json`."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gateway import adapters
from gateway.cli.paths import (
    configured_prices,
    home_of,
    open_configured,
    store_settings,
)
from gateway.cli.plain import plain, styled
from gateway.errors import EXIT_OK, EXIT_USAGE

SPARKS = "▁▂▃▄▅▆▇█"
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def sparkline(values: list[int]) -> str:
    """One block character per value, scaled to the largest (a blank for zero)."""
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(" " if v <= 0 else SPARKS[min(7, (v * 8 - 1) // top)] for v in values)


def add_parser(
    sub: Any, add_command: Callable[..., argparse.ArgumentParser]
) -> argparse.ArgumentParser:
    p = add_command(
        sub, "insights", "activity: messages per day, tokens and cost, tools, busiest hours"
    )
    p.add_argument("--days", type=int, default=30, help="the period: the last N days (default 30)")
    p.add_argument("--source", choices=adapters.sources(), help="only this platform")
    p.add_argument("--json", action="store_true", help="the figures as JSON")
    p.set_defaults(func=cmd_insights)
    return p


def cmd_insights(args: argparse.Namespace) -> int:
    if not 1 <= args.days <= 3660:
        print("switchboard: --days must be between 1 and 3660", file=sys.stderr)
        return EXIT_USAGE
    home = home_of(args)
    prices = configured_prices(args, home)
    data = asyncio.run(_figures(home, store_settings(args, home), prices, args.days, args.source))
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
    else:
        render(data, Console(highlight=False, emoji=False))
    return EXIT_OK


async def _figures(
    home: Path,
    state: dict[str, Any] | None,
    prices: dict[str, tuple[float, float]],
    days: int,
    source: str | None,
) -> dict[str, Any]:
    """The figures from the home's store: its state.db, or where `state` (store_settings)
    puts it, e.g. PostgreSQL."""
    from gateway.web.queries import insights_for

    until = time.time()
    db = await open_configured(state, home / "state.db")
    try:
        return await insights_for(db, prices, until - days * 86400, until, source)
    finally:
        await db.close()


def render(data: dict[str, Any], out: Console) -> None:
    from gateway.web.queries import usd

    where = f" on {data['source']}" if data["source"] else ""
    out.print(
        styled(
            ("switchboard insights", "bold"),
            plain(f": the last {data['days']} days{where} (UTC)\n"),
        )
    )
    summary = Table(box=None, show_header=False, pad_edge=False)
    summary.add_column(style="dim")
    summary.add_column(justify="right")
    cost = data["cost"]
    for label, value in (
        ("messages", f"{data['messages']:,}"),
        ("sessions active", f"{data['sessions_active']:,}"),
        ("sessions started", f"{data['sessions_started']:,}"),
        ("live now", f"{data['sessions_live']:,}"),
        ("tokens in", f"{data['input_tokens']:,}"),
        ("tokens out", f"{data['output_tokens']:,}"),
        ("estimated cost", usd(cost["estimated_usd"])),
    ):
        summary.add_row(label, value)
    out.print(summary)
    if cost["unpriced_models"]:
        models = ", ".join(cost["unpriced_models"])
        out.print(plain(f"no price configured (dashboard.prices) for: {models}", "dim"))
    days = data["per_day"]
    platforms = sorted({p for d in days for p in d["sources"]})
    per_day = Table(title="messages per day", title_justify="left", box=None, pad_edge=False)
    per_day.add_column("platform")
    per_day.add_column(f"{days[0]['day']} … {days[-1]['day']}" if days else "")
    per_day.add_column("total", justify="right")
    per_day.add_column("peak", justify="right")
    for p in [*platforms, "all"]:
        values = [
            sum(d["sources"].values()) if p == "all" else d["sources"].get(p, 0) for d in days
        ]
        per_day.add_row(
            plain(p), sparkline(values), f"{sum(values):,}", f"{max(values, default=0):,}"
        )
    out.print(per_day)
    for title, rows, heads in (
        (
            "tokens and cost by model",
            [
                (
                    m["model"] or "(unknown)",
                    f"{m['sessions']:,}",
                    f"{m['input_tokens']:,}",
                    f"{m['output_tokens']:,}",
                    "—" if m["cost_usd"] is None else usd(m["cost_usd"]),
                )
                for m in data["models"]
            ],
            ("model", "sessions", "in", "out", "cost"),
        ),
        (
            "top tools",
            [(t["tool"], f"{t['calls']:,}") for t in data["top_tools"]],
            ("tool", "calls"),
        ),
        (
            "how sessions ended",
            [(r["reason"] or "(none)", f"{r['sessions']:,}") for r in data["end_reasons"]],
            ("reason", "sessions"),
        ),
    ):
        table = Table(title=title, title_justify="left", box=None, pad_edge=False)
        for i, head in enumerate(heads):
            table.add_column(head, justify="right" if i else "left")
        for row in rows:
            table.add_row(*(plain(cell) for cell in row))
        out.print(table if rows else f"[dim]{title}: none[/]")
    heat = Table(title="busiest hours (UTC, 00-23)", title_justify="left", box=None, pad_edge=False)
    heat.add_column("day")
    heat.add_column("00    06    12    18   ")
    heat.add_column("total", justify="right")
    top = max((v for row in data["heatmap"] for v in row), default=0)
    for name, row in zip(WEEKDAYS, data["heatmap"], strict=True):
        line = "".join(" " if not v else SPARKS[min(7, (v * 8 - 1) // top)] for v in row)
        heat.add_row(name, line, f"{sum(row):,}")
    out.print(heat)
