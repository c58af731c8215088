"""The dashboard's page frame and the parts every page family uses: the layout with its
navigation, times and empty marks, the CSRF field, filters, and the error page a refused
action gets. The pages themselves are in pages.py (sign-in), pages_sessions.py and
pages_ops.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from aiohttp import web

from gateway.web import actions, auth, queries
from gateway.web.context import dashboard_of
from gateway.web.html import Safe, join, t
from state import SessionNotFound, StateError

PageHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LONG_MESSAGE = 1500  # characters; longer messages start collapsed
STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
NAV = (
    ("sessions", "Sessions"),
    ("search", "Search"),
    ("insights", "Insights"),
    ("ops", "Operations"),
)


def when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M")


# an empty field, marked rather than blank; screen readers say "none"
NONE = Safe(
    '<span class="none"><span aria-hidden="true">—</span><span class="sr-only">none</span></span>'
)


def or_none(value: object) -> object:
    return NONE if value is None or value == "" else value


def time_cell(ts: float | None) -> Safe:
    """A UTC time that never wraps inside a table cell, or the empty mark."""
    if ts is None:
        return NONE
    iso = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%MZ")
    return t('<time datetime="{}">{}</time>', iso, when(ts))


def csrf_input(request: web.Request) -> Safe:
    ws = auth.session_of(request)
    return t('<input type="hidden" name="csrf" value="{}">', ws.csrf if ws else "")


def page(
    request: web.Request, title: str, body: Safe, active: str = "", status: int = 200
) -> web.Response:
    nav = join(
        t(
            '<a href="/ui/{}"{}>{}</a>',
            slug,
            Safe(' aria-current="page"') if slug == active else "",
            label,
        )
        for slug, label in NAV
    )
    signed_in = auth.session_of(request) is not None
    # without a key (loopback) nobody signed in, so there is nothing to sign out of
    keyed = dashboard_of(request).settings.key is not None
    logout = (
        t(
            '<form method="post" action="/ui/logout" class="logout">{}<button>Sign out</button></form>',
            csrf_input(request),
        )
        if signed_in and keyed
        else ""
    )
    doc = t(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{} · switchboard</title>"
        '<link rel="stylesheet" href="/ui/static/app.css">'
        '<script src="/ui/static/app.js" defer></script></head>'
        '<body><header><strong class="brand">switchboard</strong><nav>{}</nav>{}</header>'
        "<main><h1>{}</h1>{}</main></body></html>",
        title,
        nav if signed_in else "",
        logout,
        title,
        body,
    )
    return web.Response(text=doc, content_type="text/html", charset="utf-8", status=status)


def problem(request: web.Request, status: int, message: str) -> web.Response:
    return page(
        request, "Not done", t('<p class="error" role="alert">{}</p>', message), status=status
    )


def with_errors(fn: PageHandler) -> PageHandler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except queries.BadParam as exc:
            return problem(request, 400, str(exc))
        except SessionNotFound as exc:
            return problem(request, 404, str(exc))
        except actions.Refused as exc:
            return problem(request, 409, str(exc))
        except StateError as exc:
            return problem(request, 503, str(exc))

    return wrapped


def select(
    name: str, label: str, options: tuple[str, ...] | list[tuple[str, str]], current: str | None
) -> Safe:
    opts = [("", "any")] + [(o, o) if isinstance(o, str) else o for o in options]
    inner = join(
        t(
            '<option value="{}"{}>{}</option>',
            v,
            Safe(" selected") if v == (current or "") else "",
            text,
        )
        for v, text in opts
    )
    return t('<label>{} <select name="{}">{}</select></label>', label, name, inner)
