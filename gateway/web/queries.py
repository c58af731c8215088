"""Request parameters -> store queries, shared by the JSON API and the pages: listing
filters and cursors, search, insights with costs, and the import stream."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from gateway import adapters
from gateway.session_keys import CHAT_TYPES
from gateway.web.context import DashboardState as Dashboard
from state import PAGE_SORTS as SORTS
from state import SEARCH_SORTS, PageQuery, Store

PLATFORMS = adapters.sources()
MAX_DAYS = 3660
MAX_IMPORT_BYTES = 512 * 1024 * 1024


class BadParam(ValueError):
    """A query parameter that cannot be used; the message names it."""


def _choice(params: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    value = params.get(name) or None
    if value is not None and value not in choices:
        raise BadParam(f"{name} must be one of {', '.join(choices)}")
    return value


def _date(params: Mapping[str, str], name: str, end: bool = False) -> float | None:
    value = params.get(name)
    if not value:
        return None
    try:
        day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise BadParam(f"{name} must be a date like 2025-03-05") from None
    return (day + timedelta(days=1 if end else 0)).timestamp()


def _int(params: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    value = params.get(name)
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        raise BadParam(f"{name} must be a whole number") from None
    if not lo <= n <= hi:
        raise BadParam(f"{name} must be between {lo} and {hi}")
    return n


def encode_cursor(cursor: tuple[float, str] | None) -> str | None:
    return None if cursor is None else f"{cursor[0]!r}~{cursor[1]}"


def decode_cursor(text: str | None) -> tuple[float, str] | None:
    if not text:
        return None
    value, sep, sid = text.partition("~")
    try:
        if not sep or not sid:
            raise ValueError
        return float(value), sid
    except ValueError:
        raise BadParam("after must be a cursor returned by a previous page") from None


def page_query(params: Mapping[str, str]) -> PageQuery:
    """?platform= &chat_type= &titled=yes|no &status=live|ended &from= &to= (dates, the
    sort column) &sort=active|started &order=desc|asc &children=1 &after= &limit="""
    titled = _choice(params, "titled", ("yes", "no"))
    status = _choice(params, "status", ("live", "ended"))
    return PageQuery(
        source=_choice(params, "platform", PLATFORMS),
        chat_type=_choice(params, "chat_type", CHAT_TYPES),
        titled=None if titled is None else titled == "yes",
        live=None if status is None else status == "live",
        since=_date(params, "from"),
        until=_date(params, "to", end=True),
        include_children=params.get("children") in ("1", "yes", "true"),
        sort=_choice(params, "sort", tuple(SORTS)) or "active",
        descending=(_choice(params, "order", ("desc", "asc")) or "desc") == "desc",
        after=decode_cursor(params.get("after")),
        limit=_int(params, "limit", 50, 1, 500),
    )


async def session_page(d: Dashboard, params: Mapping[str, str]) -> dict[str, Any]:
    q = page_query(params)
    rows, cursor = await d.db.session_page(q)
    return {"sessions": rows, "next": encode_cursor(cursor)}


async def search(d: Dashboard, params: Mapping[str, str]) -> dict[str, Any]:
    """The /search query language (state/query.py) over every session, one page."""
    query = (params.get("q") or "").strip()
    if not query:
        raise BadParam("q is required")
    platform = _choice(params, "platform", PLATFORMS)
    role = _choice(params, "role", ("user", "assistant", "tool", "system"))
    limit = _int(params, "limit", 20, 1, 100)
    offset = _int(params, "offset", 0, 0, 10_000)
    hits = await d.db.search_messages(
        query,
        sources=(platform,) if platform else (),
        roles=(role,) if role else (),
        sort=_choice(params, "sort", SEARCH_SORTS) or "relevance",
        limit=limit,
        offset=offset,
    )
    return {"hits": hits, "next_offset": offset + limit if len(hits) == limit else None}


def period(params: Mapping[str, str], now: float | None = None) -> tuple[float, float, int]:
    """?days=N (default 30) ending now, as (since, until, days)."""
    days = _int(params, "days", 30, 1, MAX_DAYS)
    until = time.time() if now is None else now
    return until - days * 86400, until, days


def prices_of(configured: Mapping[str, Mapping[str, float]]) -> dict[str, tuple[float, float]]:
    """Validated `dashboard.prices` as (input, output) USD per million tokens, per model."""
    return {
        str(model): (float(p.get("input", 0)), float(p.get("output", 0)))
        for model, p in configured.items()
    }


def cost(models: list[dict[str, Any]], prices: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """The estimated USD of per-model rows, the one computation behind every cost shown
    (`sessions stats`, `switchboard insights`, the dashboard). A model priced in
    `dashboard.prices` costs its tokens at that price; one without a price costs what its
    sessions recorded (`recorded_cost_usd`: the agent's or provider's own figure, as in a
    home imported from Hermes); one with neither is listed as unpriced, never guessed.
    Each row gets its `cost_usd` (None: unpriced)."""
    total = 0.0
    unpriced: list[str] = []
    for m in models:
        price = prices.get(m["model"])
        recorded = float(m.get("recorded_cost_usd") or 0)
        if price is not None:
            m["cost_usd"] = round(
                (m["input_tokens"] * price[0] + m["output_tokens"] * price[1]) / 1e6, 6
            )
        elif recorded:
            m["cost_usd"] = round(recorded, 6)
        else:
            m["cost_usd"] = None
            if m["input_tokens"] or m["output_tokens"]:
                unpriced.append(m["model"] or "(unknown model)")
            continue
        total += m["cost_usd"]
    return {"estimated_usd": round(total, 6), "unpriced_models": unpriced}


def usd(value: float) -> str:
    """A cost as every view prints it: cents, or four decimals below one cent so that a
    small figure does not read as nothing."""
    return f"${value:,.2f}" if value == 0 or value >= 0.01 else f"${value:.4f}"


async def insights(
    d: Dashboard, params: Mapping[str, str], now: float | None = None
) -> dict[str, Any]:
    since, until, days = period(params, now)
    source = _choice(params, "platform", PLATFORMS)
    return await insights_for(d.db, d.settings.prices, since, until, source)


async def insights_for(
    db: Store,
    prices: Mapping[str, tuple[float, float]],
    since: float,
    until: float,
    source: str | None,
) -> dict[str, Any]:
    """The insights figures (the dashboard's and `switchboard insights`): the store's,
    with every calendar day filled in, token totals and the estimated cost."""
    out = await db.insights(since, until, source)
    have = {row["day"]: row["sources"] for row in out["per_day"]}
    first = datetime.fromtimestamp(since, UTC).date()
    last = datetime.fromtimestamp(until, UTC).date()
    out["per_day"] = [
        {"day": day.isoformat(), "sources": have.get(day.isoformat(), {})}
        for day in (first + timedelta(days=i) for i in range((last - first).days + 1))
    ]
    out["days"] = round((until - since) / 86400)
    out["input_tokens"] = sum(m["input_tokens"] for m in out["models"])
    out["output_tokens"] = sum(m["output_tokens"] for m in out["models"])
    out["cost"] = cost(out["models"], prices)
    return out


def _records(fh: BinaryIO, problems: list[str]) -> Iterator[dict[str, Any]]:
    for n, line in enumerate(fh, 1):
        rec = _record(line, n, problems)
        if rec is not None:
            yield rec


def _record(line: bytes, n: int, problems: list[str]) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except ValueError:
        problems.append(f"line {n}: not JSON; skipped")
        return None
    if not isinstance(rec, dict):
        problems.append(f"line {n}: not a JSON object; skipped")
        return None
    return rec


async def import_stream(d: Dashboard, chunks: AsyncIterator[bytes]) -> dict[str, Any]:
    """Import an uploaded JSONL export. The upload is spooled to a temporary file first:
    the store imports a whole export at once, so a child's parent later in the file is
    still found (an import in pieces would orphan it)."""
    problems: list[str] = []
    with tempfile.TemporaryFile() as fh:
        size = 0
        async for chunk in chunks:
            size += len(chunk)
            if size > MAX_IMPORT_BYTES:
                raise BadParam(f"the upload is larger than {MAX_IMPORT_BYTES // 2**20} MB")
            fh.write(chunk)
        fh.seek(0)
        report = await d.db.import_records(_records(fh, problems))
    return {
        "imported": report.imported,
        "skipped_existing": report.skipped_existing,
        "messages": report.messages,
        "renamed_titles": [list(pair) for pair in report.renamed_titles],
        "replaced_characters": report.replaced,  # NULs, lone surrogates kept as U+FFFD
        "errors": problems + list(report.errors),
    }
