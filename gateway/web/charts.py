"""Charts drawn on the server as SVG and HTML (no chart library, no script needed): a
stacked bar chart of messages per day per platform (square-root scale), and an
hour-by-weekday heat map.
Each bar and cell carries its figure in `data-value` and a <title> tooltip."""

from __future__ import annotations

import math
from typing import Any

from gateway.web.html import Safe, join, t

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
WIDTH, HEIGHT, PAD_L, PAD_B, PAD_T = 760, 220, 44, 24, 10
MIN_BAR = 3.0  # SVG units: the least height of a day with messages


def _label(value: float) -> str:
    return f"{value:g}" if value < 10 else f"{round(value):,}"


def _nice_max(n: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above n (the y axis top)."""
    if n <= 1:
        return 1
    mag = 10 ** (len(str(n)) - 1)
    return next(k * mag for k in (1, 2, 5, 10) if k * mag >= n)


def bar_height(total: int, top: int, plot_h: float) -> float:
    """A day's bar on a square-root scale, so that one busy day does not flatten the rest
    into slivers; a day with any message is at least MIN_BAR high, so it stays visible."""
    if total <= 0:
        return 0.0
    return max(MIN_BAR, plot_h * math.sqrt(total / top))


def per_day_chart(per_day: list[dict[str, Any]], platforms: list[str]) -> Safe:
    """Stacked bars, one per day, a colour (CSS class) per platform, on a square-root
    scale (bar_height): each day's platforms share its bar in proportion."""
    totals = [sum(d["sources"].values()) for d in per_day]
    top = _nice_max(max(totals, default=0))
    n = max(1, len(per_day))
    plot_w, plot_h = WIDTH - PAD_L - 4, HEIGHT - PAD_B - PAD_T
    bar = plot_w / n
    parts: list[Safe] = []
    for share in (0, 0.25, 1):  # of the top value: a quarter of it sits half way up
        y = PAD_T + plot_h * (1 - math.sqrt(share))
        parts.append(
            t(
                '<line class="grid" x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}"/>'
                '<text class="axis" x="{}" y="{:.1f}" text-anchor="end">{}</text>',
                PAD_L,
                WIDTH - 4,
                y,
                y,
                PAD_L - 4,
                y + 4,
                _label(top * share),
            )
        )
    for i, d in enumerate(per_day):
        x = PAD_L + i * bar
        y = PAD_T + plot_h
        total = totals[i]
        height = bar_height(total, top, plot_h)
        for platform in platforms:
            value = d["sources"].get(platform, 0)
            if not value:
                continue
            h = height * value / total
            y -= h
            parts.append(
                t(
                    '<rect class="bar p-{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" '
                    'data-day="{}" data-platform="{}" data-value="{}"><title>{} {}: {} messages</title></rect>',
                    platform,
                    x + bar * 0.1,
                    y,
                    max(bar * 0.8, 0.5),
                    h,
                    d["day"],
                    platform,
                    value,
                    d["day"],
                    platform,
                    value,
                )
            )
    step = max(1, n // 6)
    for i in range(0, n, step):
        parts.append(
            t(
                '<text class="axis" x="{:.1f}" y="{}" text-anchor="middle">{}</text>',
                PAD_L + (i + 0.5) * bar,
                HEIGHT - 6,
                per_day[i]["day"][5:],
            )
        )
    legend = join(t('<li><span class="swatch p-{}"></span>{}</li>', p, p) for p in platforms)
    return t(
        '<figure class="chart"><svg id="per-day" viewBox="0 0 {} {}" role="img" '
        'aria-label="messages per day per platform, square-root scale">{}</svg>'
        '<figcaption><ul class="legend">{}</ul><p class="hint">Square-root scale: quiet '
        "days stay visible beside busy ones.</p></figcaption></figure>",
        WIDTH,
        HEIGHT,
        join(parts),
        legend,
    )


def heatmap(grid: list[list[int]]) -> Safe:
    """Weekday rows, hour columns (UTC); shade level 0-5 by share of the busiest cell."""
    top = max((v for row in grid for v in row), default=0)
    head = join(t("<th scope=col>{:02d}</th>", h) for h in range(24))
    rows = []
    for day, row in zip(WEEKDAYS, grid, strict=True):
        cells = join(
            t(
                '<td class="l{}" data-value="{}" title="{} {:02d}:00 UTC: {} messages">{}</td>',
                0 if not v else 1 + min(4, v * 5 // (top + 1)),
                v,
                day,
                h,
                v,
                v or "",
            )
            for h, v in enumerate(row)
        )
        rows.append(t("<tr><th scope=row>{}</th>{}</tr>", day, cells))
    return t(
        '<table class="heat" id="heatmap"><thead><tr><th></th>{}</tr></thead><tbody>{}</tbody></table>',
        head,
        join(rows),
    )
