"""The dashboard's insights and operations pages under /ui: usage by day, platform and
model; the store's state; and the confirmed maintenance actions (prune, empty, import)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.web import actions, auth, charts, queries
from gateway.web.context import dashboard_of
from gateway.web.html import Safe, join, t
from gateway.web.layout import csrf_input, page, select

# --- insights -------------------------------------------------------------------------------


def _fmt_tokens(n: int) -> str:
    return f"{n:,}"


async def insights_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    data = await queries.insights(d, request.query)
    platforms = sorted({s for day in data["per_day"] for s in day["sources"]})
    cost = data["cost"]
    figures = [
        ("Messages", f"{data['messages']:,}", "messages"),
        ("Sessions active", f"{data['sessions_active']:,}", "sessions_active"),
        ("Sessions started", f"{data['sessions_started']:,}", "sessions_started"),
        ("Live now", f"{data['sessions_live']:,}", "sessions_live"),
        ("Tokens in", _fmt_tokens(data["input_tokens"]), "input_tokens"),
        ("Tokens out", _fmt_tokens(data["output_tokens"]), "output_tokens"),
        ("Estimated cost", queries.usd(cost["estimated_usd"]), "cost"),
    ]
    cards = join(
        t(
            '<div class="card" id="fig-{}"><span>{}</span><strong>{}</strong></div>',
            key,
            label,
            value,
        )
        for label, value, key in figures
    )
    unpriced = (
        t(
            '<p class="hint">No price configured for: {} (dashboard.prices).</p>',
            ", ".join(cost["unpriced_models"]),
        )
        if cost["unpriced_models"]
        else ""
    )
    models = join(
        t(
            '<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>',
            m["model"] or "(unknown)",
            m["sessions"],
            _fmt_tokens(m["input_tokens"]),
            _fmt_tokens(m["output_tokens"]),
            "—" if m["cost_usd"] is None else queries.usd(m["cost_usd"]),
        )
        for m in data["models"]
    )
    tools = join(
        t('<tr><td>{}</td><td class="num">{}</td></tr>', x["tool"], x["calls"])
        for x in data["top_tools"]
    )
    ends = join(
        t('<tr><td>{}</td><td class="num">{}</td></tr>', x["reason"] or "(none)", x["sessions"])
        for x in data["end_reasons"]
    )
    daily = join(
        t(
            "<tr><td>{}</td>{}<td class=num>{}</td></tr>",
            day["day"],
            join(t('<td class="num">{}</td>', day["sources"].get(pl, 0)) for pl in platforms),
            sum(day["sources"].values()),
        )
        for day in data["per_day"]
    )
    p = request.query.get
    form = t(
        '<form method="get" class="filters"><label>Days <select name="days">{}</select></label>{}<button>Show</button></form>',
        join(
            t(
                '<option value="{}"{}>{}</option>',
                n,
                Safe(" selected") if str(data["days"]) == str(n) else "",
                n,
            )
            for n in sorted({7, 30, 90, 365, data["days"]})
        ),
        select("platform", "Platform", queries.PLATFORMS, p("platform")),
    )
    body = t(
        '{}<div class="cards">{}</div>{}'
        "<h2>Messages per day per platform</h2>{}"
        '<details><summary>The figures</summary><table class="list" id="per-day-table"><thead><tr><th>Day</th>{}<th>Total</th></tr></thead><tbody>{}</tbody></table></details>'
        "<h2>Busiest hours (UTC)</h2>{}"
        '<div class="cols"><section><h2>Tokens and cost by model</h2><table class="list" id="models"><thead><tr><th>Model</th><th>Sessions</th><th>In</th><th>Out</th><th>Cost</th></tr></thead><tbody>{}</tbody></table></section>'
        '<section><h2>Top tools</h2><table class="list" id="tools"><thead><tr><th>Tool</th><th>Calls</th></tr></thead><tbody>{}</tbody></table></section>'
        '<section><h2>How sessions ended</h2><table class="list" id="ends"><thead><tr><th>Reason</th><th>Sessions</th></tr></thead><tbody>{}</tbody></table></section></div>',
        form,
        cards,
        unpriced,
        charts.per_day_chart(data["per_day"], platforms),
        join(t("<th>{}</th>", pl) for pl in platforms),
        daily,
        charts.heatmap(data["heatmap"]),
        models or Safe('<tr><td colspan="5">None.</td></tr>'),
        tools or Safe('<tr><td colspan="2">None.</td></tr>'),
        ends or Safe('<tr><td colspan="2">None.</td></tr>'),
    )
    return page(request, f"Insights — last {data['days']} days", body, "insights")


# --- operations -----------------------------------------------------------------------------


async def ops_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    h: dict[str, Any] = d.health() if d.health else {"status": "ok"}
    adapters = join(
        t(
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            name,
            a.get("state"),
            ", ".join(f"{k}={v}" for k, v in a.items() if k != "state"),
        )
        for name, a in (h.get("adapters") or {}).items()
    )
    err = h.get("last_error")
    health = t(
        '<dl class="health" id="health"><dt>Status</dt><dd class="status-{}">{}</dd><dt>Uptime</dt><dd>{} s</dd>'
        "<dt>Writer queue</dt><dd>{}</dd><dt>Live sessions</dt><dd>{}</dd><dt>Turns in flight</dt><dd>{}</dd>"
        "<dt>Last error</dt><dd>{}</dd></dl>"
        '<table class="list"><thead><tr><th>Adapter</th><th>State</th><th>Details</th></tr></thead><tbody>{}</tbody></table>',
        h.get("status"),
        h.get("status"),
        h.get("uptime_seconds", ""),
        h.get("writer_queue_depth", ""),
        h.get("sessions", ""),
        h.get("turns_in_flight", ""),
        json.dumps(err, ensure_ascii=False) if isinstance(err, (dict, list)) else (err or "none"),
        adapters,
    )
    plats = join(t('<option value="{}">{}</option>', pl, pl) for pl in queries.PLATFORMS)
    body = t(
        "<h2>Health</h2>{}"
        '<h2>Export</h2><p><a href="/api/export" download>Download every session (JSONL)</a></p>'
        '<h2>Import</h2><form method="post" action="/ui/ops/import" enctype="multipart/form-data" class="confirm">{}'
        '<label><input type="checkbox" name="confirm" value="yes" required> Import the sessions in this file '
        '(existing ones are skipped)</label> <label>Export file (JSONL) <input type="file" name="file" accept=".jsonl,application/x-ndjson" required></label> '
        "<button>Import</button></form>"
        '<h2>Prune</h2><form method="get" action="/ui/ops/prune"><label>Ended and idle for more than '
        '<input type="number" name="days" value="90" min="1" max="36500"> days</label> '
        '<label>Platform <select name="platform"><option value="">any</option>{}</select></label> <button>Preview…</button></form>'
        '<h2>Empty sessions</h2><form method="get" action="/ui/ops/empty"><button>Find ended sessions without messages…</button></form>',
        health,
        csrf_input(request),
        plats,
    )
    return page(request, "Operations", body, "ops")


def _days(raw: object) -> float:
    try:
        days = float(str(raw))
    except ValueError:
        raise queries.BadParam("days must be a number") from None
    if not 1 <= days <= 36500:
        raise queries.BadParam("days must be between 1 and 36500")
    return days


def _platform(raw: object) -> str | None:
    value = str(raw or "") or None
    if value is not None and value not in queries.PLATFORMS:
        raise queries.BadParam(f"platform must be one of {', '.join(queries.PLATFORMS)}")
    return value


async def prune_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    if request.method == "POST":
        form = await request.post()
        if form.get("confirm") != "yes":
            raise queries.BadParam("not confirmed")
        done = await actions.prune(
            d, _days(form.get("days")), _platform(form.get("platform")), False
        )
        return page(
            request,
            "Pruned",
            t(
                '<p class="notice" role="status">Pruned {} session(s).</p><p><a href="/ui/ops">Back</a></p>',
                done["pruned"],
            ),
            "ops",
        )
    days, platform = (
        _days(request.query.get("days", "90")),
        _platform(request.query.get("platform")),
    )
    found = await actions.prune(d, days, platform, True)
    body = t(
        '<p><strong id="prune-count">{}</strong> ended session(s){} idle for more than {} days would be deleted '
        "(live sessions are kept; children become roots).</p>"
        '<form method="post" class="confirm">{}<input type="hidden" name="confirm" value="yes">'
        '<input type="hidden" name="days" value="{}"><input type="hidden" name="platform" value="{}">'
        '<button class="danger">Prune for good</button> <a href="/ui/ops">Cancel</a></form>',
        found["would_prune"],
        f" on {platform}" if platform else "",
        f"{days:g}",
        csrf_input(request),
        f"{days:g}",
        platform or "",
    )
    return page(request, "Prune sessions?", body, "ops")


async def empty_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    if request.method == "POST":
        form = await request.post()
        if form.get("confirm") != "yes":
            raise queries.BadParam("not confirmed")
        done = await actions.delete_empty(d, False)
        return page(
            request,
            "Deleted",
            t(
                '<p class="notice" role="status">Deleted {} empty session(s).</p><p><a href="/ui/ops">Back</a></p>',
                done["deleted"],
            ),
            "ops",
        )
    found = await actions.delete_empty(d, True)
    body = t(
        '<p><strong id="empty-count">{}</strong> ended session(s) have no messages.</p>'
        '<form method="post" class="confirm">{}<input type="hidden" name="confirm" value="yes">'
        '<button class="danger">Delete them</button> <a href="/ui/ops">Cancel</a></form>',
        found["empty"],
        csrf_input(request),
    )
    return page(request, "Delete empty sessions?", body, "ops")


async def _file_chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(64 * 1024):
        yield chunk


async def import_view(request: web.Request) -> web.StreamResponse:
    """Multipart: the CSRF token and the confirmation must come before the file part."""
    d = dashboard_of(request)
    ws = auth.session_of(request)
    reader = await request.multipart()
    fields: dict[str, str] = {}
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            break
        if part.name != "file":
            fields[part.name or ""] = (await part.read(decode=True))[:4096].decode(errors="replace")
            continue
        if ws is None or not auth.key_matches(fields.get("csrf", ""), ws.csrf):
            return web.Response(
                text="403: CSRF token missing or wrong; reload the page\n", status=403
            )
        if fields.get("confirm") != "yes":
            raise queries.BadParam("tick the box to confirm the import")
        report = await queries.import_stream(d, _file_chunks(part))
        errors = join(t("<li>{}</li>", e) for e in report["errors"][:50])
        renamed = join(t("<li>{} → {}</li>", a, b) for a, b in report["renamed_titles"][:50])
        if report["replaced_characters"]:
            errors = join(
                [
                    t(
                        "<li>{} character(s) no store can hold (NUL, lone surrogates) "
                        "kept as U+FFFD</li>",
                        report["replaced_characters"],
                    ),
                    errors,
                ]
            )
        return page(
            request,
            "Imported",
            t(
                '<p class="notice" role="status">Imported {} session(s) and {} message(s); {} already present.</p>'
                '<ul>{}</ul><ul>{}</ul><p><a href="/ui/sessions">Sessions</a></p>',
                report["imported"],
                report["messages"],
                report["skipped_existing"],
                renamed,
                errors,
            ),
            "ops",
        )
    raise queries.BadParam("no file was uploaded")
