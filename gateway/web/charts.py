"""Charts drawn on the server as SVG and HTML (no chart library, no script needed): a
stacked bar chart of messages per day per platform, and an hour-by-weekday heat map.
Each bar and cell carries its figure in `data-value` and a <title> tooltip."""

from __future__ import annotations

from typing import Any

from gateway.web.html import Safe, join, t

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
WIDTH, HEIGHT, PAD_L, PAD_B, PAD_T = 760, 220, 44, 24, 10


def _nice_max(n: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten at or above n (the y axis top)."""
    if n <= 1:
        return 1
    mag = 10 ** (len(str(n)) - 1)
    return next(k * mag for k in (1, 2, 5, 10) if k * mag >= n)


def per_day_chart(per_day: list[dict[str, Any]], platforms: list[str]) -> Safe:
    """Stacked bars, one per day, a colour (CSS class) per platform."""
    totals = [sum(d["sources"].values()) for d in per_day]
    top = _nice_max(max(totals, default=0))
    n = max(1, len(per_day))
    plot_w, plot_h = WIDTH - PAD_L - 4, HEIGHT - PAD_B - PAD_T
    bar = plot_w / n
    parts: list[Safe] = []
    for frac in (0, 0.5, 1):
        y = PAD_T + plot_h * (1 - frac)
        parts.append(t('<line class="grid" x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}"/>'
                       '<text class="axis" x="{}" y="{:.1f}" text-anchor="end">{}</text>',
                       PAD_L, WIDTH - 4, y, y, PAD_L - 4, y + 4, int(top * frac)))  # fmt: skip
    for i, d in enumerate(per_day):
        x = PAD_L + i * bar
        y = PAD_T + plot_h
        for platform in platforms:
            value = d["sources"].get(platform, 0)
            if not value:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(t(
                '<rect class="bar p-{}" x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" '
                'data-day="{}" data-platform="{}" data-value="{}"><title>{} {}: {} messages</title></rect>',
                platform, x + bar * 0.1, y, max(bar * 0.8, 0.5), h, d["day"], platform, value,
                d["day"], platform, value))  # fmt: skip
    step = max(1, n // 6)
    for i in range(0, n, step):
        parts.append(t('<text class="axis" x="{:.1f}" y="{}" text-anchor="middle">{}</text>',
                       PAD_L + (i + 0.5) * bar, HEIGHT - 6, per_day[i]["day"][5:]))  # fmt: skip
    legend = join(t('<li><span class="swatch p-{}"></span>{}</li>', p, p) for p in platforms)
    return t(
        '<figure class="chart"><svg id="per-day" viewBox="0 0 {} {}" role="img" '
        'aria-label="messages per day per platform">{}</svg>'
        '<figcaption><ul class="legend">{}</ul></figcaption></figure>',
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
            t('<td class="l{}" data-value="{}" title="{} {:02d}:00 UTC: {} messages">{}</td>',
              0 if not v else 1 + min(4, v * 5 // (top + 1)), v, day, h, v, v or "")
            for h, v in enumerate(row)
        )  # fmt: skip
        rows.append(t("<tr><th scope=row>{}</th>{}</tr>", day, cells))
    return t(
        '<table class="heat" id="heatmap"><thead><tr><th></th>{}</tr></thead><tbody>{}</tbody></table>',
        head,
        join(rows),
    )
