"""The dashboard's HTML pages under /ui, rendered on the server (every value through
gateway/web/html.py). Reading works without JavaScript; every change goes through a form
with the session's CSRF token and a confirmation step."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.session_keys import CHAT_TYPES
from gateway.web import actions, auth, charts, queries
from gateway.web.context import DashboardState as Dashboard
from gateway.web.context import dashboard_of
from gateway.web.html import Safe, highlight, join, t, url
from gateway.web.ratelimit import client_key
from state import QueryError, SessionNotFound, StateError, TitleError

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
NONE = Safe('<span class="none"><span aria-hidden="true">—</span><span class="sr-only">none</span></span>')


def _or_none(value: object) -> object:
    return NONE if value is None or value == "" else value


def _time(ts: float | None) -> Safe:
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
        t('<a href="/ui/{}"{}>{}</a>', slug, Safe(' aria-current="page"') if slug == active else "", label)
        for slug, label in NAV
    )  # fmt: skip
    signed_in = auth.session_of(request) is not None
    # without a key (loopback) nobody signed in, so there is nothing to sign out of
    keyed = dashboard_of(request).settings.key is not None
    logout = (
        t('<form method="post" action="/ui/logout" class="logout">{}<button>Sign out</button></form>',
          csrf_input(request)) if signed_in and keyed else ""
    )  # fmt: skip
    doc = t(
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>{} · switchboard</title>"
        '<link rel="stylesheet" href="/ui/static/app.css">'
        '<script src="/ui/static/app.js" defer></script></head>'
        '<body><header><strong class="brand">switchboard</strong><nav>{}</nav>{}</header>'
        "<main><h1>{}</h1>{}</main></body></html>",
        title, nav if signed_in else "", logout, title, body,
    )  # fmt: skip
    return web.Response(text=doc, content_type="text/html", charset="utf-8", status=status)


def _problem(request: web.Request, status: int, message: str) -> web.Response:
    return page(
        request, "Not done", t('<p class="error" role="alert">{}</p>', message), status=status
    )


def _errors(fn: PageHandler) -> PageHandler:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except queries.BadParam as exc:
            return _problem(request, 400, str(exc))
        except SessionNotFound as exc:
            return _problem(request, 404, str(exc))
        except actions.Refused as exc:
            return _problem(request, 409, str(exc))
        except StateError as exc:
            return _problem(request, 503, str(exc))

    return wrapped


def _select(
    name: str, label: str, options: tuple[str, ...] | list[tuple[str, str]], current: str | None
) -> Safe:
    opts = [("", "any")] + [(o, o) if isinstance(o, str) else o for o in options]
    inner = join(
        t('<option value="{}"{}>{}</option>', v, Safe(" selected") if v == (current or "") else "", text)
        for v, text in opts
    )  # fmt: skip
    return t('<label>{} <select name="{}">{}</select></label>', label, name, inner)


# --- sign-in ------------------------------------------------------------------------------


def _next(raw: str | None) -> str:
    # only our own pages: never an absolute or scheme-relative URL
    return (
        raw
        if raw and raw.startswith("/ui/") and not raw.startswith("//") and "\\" not in raw
        else "/ui/sessions"
    )


async def login_form(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    target = _next(request.query.get("next"))
    if d.settings.key is None:  # loopback without a key: a session for the CSRF token
        return _signed_in(d, target)
    return page(request, "Sign in", _login_body(target, ""))


def _login_body(target: str, error: str) -> Safe:
    return t(
        '{}<form method="post" action="/ui/login" class="login">'
        '<input type="hidden" name="next" value="{}">'
        '<label>Key <input type="password" name="key" autocomplete="current-password" required autofocus></label>'
        "<button>Sign in</button></form>"
        "<p class=hint>The key is the one in the environment variable that dashboard.key_env "
        "(or platforms.api.key_env) names.</p>",
        t('<p class="error" role="alert">{}</p>', error) if error else "", target,
    )  # fmt: skip


def _signed_in(d: Dashboard, target: str) -> web.Response:
    ws = d.sessions.create()
    response = web.HTTPSeeOther(target)
    auth.set_cookie(response, ws, d.settings.secure_cookie)
    raise response


async def login(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    form = await request.post()
    target = _next(str(form.get("next") or ""))
    if d.settings.key is None:
        return _signed_in(d, target)
    client = client_key(request.remote)
    wait = d.sign_in_limiter.retry_after(client)
    if wait is not None:
        response = page(
            request, "Sign in",
            _login_body(target, f"Too many wrong keys from your address: try again in {wait} s."),
            status=429,
        )  # fmt: skip
        response.headers["Retry-After"] = str(wait)
        return response
    if auth.key_matches(str(form.get("key") or ""), d.settings.key):
        d.sign_in_limiter.succeeded(client)
        return _signed_in(d, target)
    d.sign_in_limiter.failed(client)
    return page(request, "Sign in", _login_body(target, "That key is not right."), status=401)


async def logout(request: web.Request) -> web.StreamResponse:
    dashboard_of(request).sessions.drop(request.cookies.get(auth.COOKIE))
    response = web.HTTPSeeOther("/ui/login")
    response.del_cookie(auth.COOKIE, path="/")
    raise response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise web.HTTPNotFound()
    try:
        data = resources.files("gateway.web").joinpath("static", name).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise web.HTTPNotFound() from None
    return web.Response(
        body=data, content_type=STATIC_TYPES[suffix], headers={"Cache-Control": "max-age=300"}
    )


# --- sessions -----------------------------------------------------------------------------


def _status(row: Mapping[str, Any]) -> Safe:
    if row.get("ended_at") is None:
        return Safe('<span class="badge live">live</span>')
    return t(
        '<span class="badge ended">ended</span> <small>{}</small>', row.get("end_reason") or ""
    )


def _chat(row: Mapping[str, Any]) -> Safe:
    """The chat's name (`chat_name`, as its platform or the API caller gave it), else its
    id; its type beneath."""
    name = row.get("chat_name") or row.get("chat_id")
    kind = row.get("chat_type")
    if not name and not kind:
        return NONE
    return t('{}<div class="sub">{}</div>', _or_none(name), kind or "")


async def sessions_list(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    params = request.query
    result = await queries.session_page(d, params)
    p = params.get
    filters = join([
        _select("platform", "Platform", queries.PLATFORMS, p("platform")),
        _select("chat_type", "Chat type", CHAT_TYPES, p("chat_type")),
        _select("titled", "Title", [("yes", "titled"), ("no", "untitled")], p("titled")),
        _select("status", "Status", ("live", "ended"), p("status")),
        t('<label>Show <select name="children">{}</select></label>', join(
            t('<option value="{}"{}>{}</option>', v, Safe(" selected") if (p("children") or "") == v else "", label)
            for v, label in (("", "live sessions, lineage folded"), ("1", "every session")))),
        t('<label>From <input type="date" name="from" value="{}"></label>', p("from") or ""),
        t('<label>To <input type="date" name="to" value="{}"></label>', p("to") or ""),
        t('<label>Sort <select name="sort">{}</select></label>', join(
            t('<option value="{}"{}>{}</option>', v, Safe(" selected") if (p("sort") or "active") == v else "", label)
            for v, label in (("active", "last activity"), ("started", "start time")))),
        t('<label>Order <select name="order">{}</select></label>', join(
            t('<option value="{}"{}>{}</option>', v, Safe(" selected") if (p("order") or "desc") == v else "", label)
            for v, label in (("desc", "newest first"), ("asc", "oldest first")))),
    ])  # fmt: skip
    rows = join(
        t('<tr><td class="title"><a href="{}">{}</a><div class="sub">{}</div></td><td>{}</td><td class="chat">{}</td>'
          '<td class="num">{}</td><td class="date">{}</td><td class="date">{}</td><td class="status">{}</td></tr>',
          url("/ui/sessions", r["id"]), r.get("title") or "(untitled)", r.get("preview") or r["id"],
          r.get("source"), _chat(r), r.get("message_count") or 0,
          _time(r.get("started_at")), _time(r.get("last_active")), _status(r))
        for r in result["sessions"]
    )  # fmt: skip
    keep = {k: v for k, v in params.items() if k not in ("after", "deleted")}
    more = (
        t('<a class="next" rel="next" href="{}">Next page →</a>', url("/ui/sessions", **keep, after=result["next"]))
        if result["next"] else ""
    )  # fmt: skip
    first = (
        t('<a href="{}">← First page</a>', url("/ui/sessions", **keep))
        if params.get("after")
        else ""
    )
    notice = (
        t('<p class="notice" role="status">Deleted session {}.</p>', params["deleted"]) if params.get("deleted") else ""
    )  # fmt: skip
    body = t(
        '{}<form method="get" class="filters" id="filters">{}<button>Apply</button> '
        '<a href="/ui/sessions">Reset</a></form>'
        '<table class="list" id="sessions"><thead><tr><th>Session</th><th>Platform</th><th>Chat</th>'
        '<th>Messages</th><th class="date">Started (UTC)</th><th class="date">Last active</th><th class="status">Status</th></tr></thead>'
        '<tbody>{}</tbody></table><p class="pager">{} {}</p>',
        notice, filters, rows or Safe('<tr><td colspan="7">No sessions match.</td></tr>'), first, more,
    )  # fmt: skip
    return page(request, "Sessions", body, "sessions")


# --- one session ---------------------------------------------------------------------------


def _tree(node: dict[str, Any], current: str, on_path: set[str]) -> Safe:
    kind = node.get("child_kind") or ("root" if node.get("parent_session_id") is None else "child")
    here = node["id"] == current
    label = t(
        '<a href="{}"{} class="node{}">{}</a> <span class="kind k-{}">{}</span> '
        '<small>{} · {} msgs{}{}</small>',
        url("/ui/sessions", node["id"]), Safe(' aria-current="page"') if here else "",
        " current" if here else "", node.get("title") or node["id"], kind, kind,
        when(node.get("started_at")), node.get("message_count") or 0,
        t(" · ended: {}", node["end_reason"]) if node.get("end_reason") else Safe(" · live") if node.get("ended_at") is None else "",
        t(" · handoff to {} ({})", node.get("handoff_platform") or "?", node["handoff_state"]) if node.get("handoff_state") else "",
    )  # fmt: skip
    if not node["children"]:
        return t('<li data-id="{}">{}</li>', node["id"], label)
    inner = join(_tree(c, current, on_path) for c in node["children"])
    is_open = Safe(" open") if node["id"] in on_path else ""
    return t(
        '<li data-id="{}"><details{}><summary>{} <small class="count">({} below)</small></summary><ul>{}</ul></details></li>',
        node["id"], is_open, label, len(node["children"]), inner,
    )  # fmt: skip


def _path_to(node: dict[str, Any], target: str) -> list[str] | None:
    if node["id"] == target:
        return [node["id"]]
    for child in node["children"]:
        found = _path_to(child, target)
        if found is not None:
            return [node["id"], *found]
    return None


def _content(text: str | None) -> Safe:
    text = text or ""
    if len(text) <= LONG_MESSAGE and text.count("\n") < 30:
        return t('<div class="text">{}</div>', text)
    return t(
        '<details class="long"><summary><span class="text">{}…</span> <em>({} characters; show all)</em></summary>'
        '<div class="text">{}</div></details>',
        text[:400], len(text), text,
    )  # fmt: skip


def _message(m: Mapping[str, Any], target: int | None) -> Safe:
    role = str(m.get("role") or "")
    calls = m.get("tool_calls")
    folded: list[Safe] = []
    if calls:
        for call in calls if isinstance(calls, list) else [calls]:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            name = fn.get("name") if isinstance(fn, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else call
            folded.append(t('<details class="tool"><summary>tool call: {}</summary><pre>{}</pre></details>',
                            name or "?", args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=1)))  # fmt: skip
    if role == "tool":
        body = t('<details class="tool"><summary>tool result: {}</summary><pre>{}</pre></details>',
                 m.get("tool_name") or m.get("tool_call_id") or "?", m.get("content") or "")  # fmt: skip
    else:
        body = _content(m.get("content"))
    mark = " target" if target is not None and m["id"] == target else ""
    return t(
        '<article class="msg role-{}{}" id="m{}"><header><span class="role">{}</span> '
        '<a class="when" href="#m{}">{}</a></header>{}{}</article>',
        role, mark, m["id"], role, m["id"], when(m.get("timestamp")), body, join(folded),
    )  # fmt: skip


def _origin(row: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = row.get("origin_json")
    try:
        origin = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return origin if isinstance(origin, Mapping) else {}


async def session_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    sid = request.match_info["id"]
    try:
        after = int(request.query["after"]) if request.query.get("after") else None
        at = int(request.query["at"]) if request.query.get("at") else None
    except ValueError:
        raise queries.BadParam("after and at must be message ids") from None
    detail = await actions.session_detail(d, sid, after_id=after, at=at)
    s = detail["session"]
    meta = [
        ("Id", s["id"]), ("Title", s.get("title") or "(untitled)"), ("Platform", _or_none(s.get("source"))),
        ("Chat type", _or_none(s.get("chat_type"))), ("Chat", _or_none(s.get("chat_id"))),
        ("Chat name", _or_none(_origin(s).get("chat_name"))), ("User", _or_none(s.get("user_id"))),
        ("Model", _or_none(s.get("model"))), ("Started", _time(s.get("started_at"))),
        ("Last active", _time(s.get("last_active"))),
        ("Status", ("ended: " + (s.get("end_reason") or "")) if s.get("ended_at") else
                   "live, bound to a chat" if s["live"] else "live (not bound to a chat now)"),
        ("Messages", s.get("message_count") or 0),
        ("Tokens in / out", f"{s.get('input_tokens') or 0} / {s.get('output_tokens') or 0}"),
    ]  # fmt: skip
    dl = join(t("<dt>{}</dt><dd>{}</dd>", k, v) for k, v in meta)
    tree = detail["lineage"]
    on_path = set(_path_to(tree, sid) or []) if tree else set()
    lineage = t('<ul class="tree" id="lineage">{}</ul>', _tree(tree, sid, on_path)) if tree else ""
    transcript = join(_message(m, at) for m in detail["messages"])
    nav = []
    if not detail["from_start"]:
        nav.append(t('<a href="{}">← From the start</a>', url("/ui/sessions", sid)))
    if detail["next_after"]:
        nav.append(
            t(
                '<a rel="next" href="{}">More messages →</a>',
                url("/ui/sessions", sid, after=detail["next_after"]),
            )
        )
    ops = t(
        '<p class="actions"><a href="{}">Rename</a> <a href="{}">Export (JSONL)</a> <a class="danger" href="{}">Delete…</a></p>',
        url("/ui/sessions", sid, "rename"), url("/api/sessions", sid, "export"), url("/ui/sessions", sid, "delete"),
    )  # fmt: skip
    body = t(
        '{}<section class="meta"><dl>{}</dl></section>'
        '<section><h2>Lineage</h2><p class="hint">root, compression chain, branches and resets; '
        'the current session is marked.</p><button type="button" class="js-only" id="expand-tree">Expand all</button>{}</section>'
        '<section><h2>Transcript</h2><div id="transcript">{}</div><p class="pager">{}</p></section>',
        ops, dl, lineage, transcript or Safe("<p>No messages.</p>"), join(nav, " "),
    )  # fmt: skip
    return page(request, str(s.get("title") or s["id"]), body, "sessions")


async def rename_form(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    sid = request.match_info["id"]
    row = await d.db.get_session(sid)
    if row is None:
        raise SessionNotFound(sid)
    error = ""
    value = row.get("title") or ""
    if request.method == "POST":
        form = await request.post()
        value = str(form.get("title") or "")
        try:
            await actions.rename(d, sid, value)
        except TitleError as exc:
            error = str(exc)
        else:
            raise web.HTTPSeeOther(url("/ui/sessions", sid))
    body = t(
        '{}<form method="post" class="rename">{}<label>New title <input name="title" value="{}" maxlength="200"></label> '
        '<button>Rename</button> <a href="{}">Cancel</a></form><p class="hint">An empty title clears it.</p>',
        t('<p class="error" role="alert">{}</p>', error) if error else "", csrf_input(request), value,
        url("/ui/sessions", sid),
    )  # fmt: skip
    return page(
        request, "Rename " + str(row.get("title") or sid), body, "sessions", 400 if error else 200
    )


async def delete_form(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    sid = request.match_info["id"]
    row = await d.db.get_session(sid)
    if row is None:
        raise SessionNotFound(sid)
    if request.method == "POST":
        form = await request.post()
        if form.get("confirm") != "yes":
            raise queries.BadParam("not confirmed")
        await actions.delete(d, sid)
        raise web.HTTPSeeOther(url("/ui/sessions", deleted=sid))
    if d.is_live(sid):  # the delete would be refused: say so before anyone asks
        body = t(
            '<p id="live-session"><strong>{}</strong> ({}) cannot be deleted now: {}.</p>'
            '<p><a href="{}">Back to the session</a></p>',
            row.get("title") or "(untitled)", sid, actions.LIVE_REFUSAL, url("/ui/sessions", sid),
        )  # fmt: skip
        return page(request, "This session is live", body, "sessions")
    body = t(
        '<p>Delete <strong>{}</strong> ({}) and its {} messages? Sessions that grew from it are kept '
        "(they become roots). This cannot be undone.</p>"
        '<form method="post" class="confirm">{}<input type="hidden" name="confirm" value="yes">'
        '<button class="danger" id="confirm-delete">Delete for good</button> <a href="{}">Cancel</a></form>',
        row.get("title") or "(untitled)", sid, row.get("message_count") or 0, csrf_input(request),
        url("/ui/sessions", sid),
    )  # fmt: skip
    return page(request, "Delete session?", body, "sessions")


# --- search ---------------------------------------------------------------------------------


async def search_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    p = request.query.get
    query = p("q") or ""
    results: Safe = Safe("")
    if query.strip():
        try:
            found = await queries.search(d, request.query)
        except QueryError as exc:
            results = t('<p class="error" role="alert">Search not run: {}.</p>', str(exc))
        else:
            items = join(
                t('<li class="hit"><a href="{}#m{}">{}</a> <small>{} · {} · {}</small>'
                  '<blockquote class="snippet">{}</blockquote></li>',
                  url("/ui/sessions", h["session_id"], at=h["id"]), h["id"], h.get("title") or h["session_id"],
                  h.get("source"), h.get("role"), when(h.get("timestamp")), highlight(h.get("snippet") or ""))
                for h in found["hits"]
            )  # fmt: skip
            nxt = (
                t('<a rel="next" href="{}">More results →</a>',
                  url("/ui/search", **{**request.query, "offset": found["next_offset"]}))
                if found["next_offset"] is not None else ""
            )  # fmt: skip
            results = t('<ol class="hits" id="hits">{}</ol><p class="pager">{}</p>', items, nxt) if items else Safe("<p>Nothing found.</p>")  # fmt: skip
    form = t(
        '<form method="get" class="filters"><label>Query <input type="search" name="q" value="{}" size="40" autofocus></label>{}{}{}'
        '<button>Search</button></form><p class="hint">words (all must match), "exact phrase", OR, NOT, prefix* '
        "— the same language as /search in a chat.</p>",
        query, _select("platform", "Platform", queries.PLATFORMS, p("platform")),
        _select("role", "Role", ("user", "assistant", "tool", "system"), p("role")),
        t('<label>Sort <select name="sort">{}</select></label>', join(
            t('<option value="{}"{}>{}</option>', v, Safe(" selected") if (p("sort") or "relevance") == v else "", v)
            for v in ("relevance", "newest", "oldest"))),
    )  # fmt: skip
    return page(request, "Search", t("{}{}", form, results), "search")


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
    cards = join(t('<div class="card" id="fig-{}"><span>{}</span><strong>{}</strong></div>', key, label, value)
                 for label, value, key in figures)  # fmt: skip
    unpriced = (
        t('<p class="hint">No price configured for: {} (dashboard.prices).</p>', ", ".join(cost["unpriced_models"]))
        if cost["unpriced_models"] else ""
    )  # fmt: skip
    models = join(
        t('<tr><td>{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td></tr>',
          m["model"] or "(unknown)", m["sessions"], _fmt_tokens(m["input_tokens"]), _fmt_tokens(m["output_tokens"]),
          "—" if m["cost_usd"] is None else queries.usd(m["cost_usd"]))
        for m in data["models"]
    )  # fmt: skip
    tools = join(
        t('<tr><td>{}</td><td class="num">{}</td></tr>', x["tool"], x["calls"])
        for x in data["top_tools"]
    )
    ends = join(
        t('<tr><td>{}</td><td class="num">{}</td></tr>', x["reason"] or "(none)", x["sessions"])
        for x in data["end_reasons"]
    )
    daily = join(
        t("<tr><td>{}</td>{}<td class=num>{}</td></tr>", day["day"],
          join(t('<td class="num">{}</td>', day["sources"].get(pl, 0)) for pl in platforms), sum(day["sources"].values()))
        for day in data["per_day"]
    )  # fmt: skip
    p = request.query.get
    form = t(
        '<form method="get" class="filters"><label>Days <select name="days">{}</select></label>{}<button>Show</button></form>',
        join(t('<option value="{}"{}>{}</option>', n, Safe(" selected") if str(data["days"]) == str(n) else "", n)
             for n in sorted({7, 30, 90, 365, data["days"]})),
        _select("platform", "Platform", queries.PLATFORMS, p("platform")),
    )  # fmt: skip
    body = t(
        '{}<div class="cards">{}</div>{}'
        "<h2>Messages per day per platform</h2>{}"
        '<details><summary>The figures</summary><table class="list" id="per-day-table"><thead><tr><th>Day</th>{}<th>Total</th></tr></thead><tbody>{}</tbody></table></details>'
        "<h2>Busiest hours (UTC)</h2>{}"
        '<div class="cols"><section><h2>Tokens and cost by model</h2><table class="list" id="models"><thead><tr><th>Model</th><th>Sessions</th><th>In</th><th>Out</th><th>Cost</th></tr></thead><tbody>{}</tbody></table></section>'
        '<section><h2>Top tools</h2><table class="list" id="tools"><thead><tr><th>Tool</th><th>Calls</th></tr></thead><tbody>{}</tbody></table></section>'
        '<section><h2>How sessions ended</h2><table class="list" id="ends"><thead><tr><th>Reason</th><th>Sessions</th></tr></thead><tbody>{}</tbody></table></section></div>',
        form, cards, unpriced, charts.per_day_chart(data["per_day"], platforms),
        join(t("<th>{}</th>", pl) for pl in platforms), daily, charts.heatmap(data["heatmap"]),
        models or Safe('<tr><td colspan="5">None.</td></tr>'), tools or Safe('<tr><td colspan="2">None.</td></tr>'),
        ends or Safe('<tr><td colspan="2">None.</td></tr>'),
    )  # fmt: skip
    return page(request, f"Insights — last {data['days']} days", body, "insights")


# --- operations -----------------------------------------------------------------------------


async def ops_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    h: dict[str, Any] = d.health() if d.health else {"status": "ok"}
    adapters = join(
        t("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", name, a.get("state"),
          ", ".join(f"{k}={v}" for k, v in a.items() if k != "state"))
        for name, a in (h.get("adapters") or {}).items()
    )  # fmt: skip
    err = h.get("last_error")
    health = t(
        '<dl class="health" id="health"><dt>Status</dt><dd class="status-{}">{}</dd><dt>Uptime</dt><dd>{} s</dd>'
        "<dt>Writer queue</dt><dd>{}</dd><dt>Live sessions</dt><dd>{}</dd><dt>Turns in flight</dt><dd>{}</dd>"
        "<dt>Last error</dt><dd>{}</dd></dl>"
        '<table class="list"><thead><tr><th>Adapter</th><th>State</th><th>Details</th></tr></thead><tbody>{}</tbody></table>',
        h.get("status"), h.get("status"), h.get("uptime_seconds", ""), h.get("writer_queue_depth", ""),
        h.get("sessions", ""), h.get("turns_in_flight", ""),
        json.dumps(err, ensure_ascii=False) if isinstance(err, (dict, list)) else (err or "none"), adapters,
    )  # fmt: skip
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
        health, csrf_input(request), plats,
    )  # fmt: skip
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
        return page(request, "Pruned", t('<p class="notice" role="status">Pruned {} session(s).</p><p><a href="/ui/ops">Back</a></p>', done["pruned"]), "ops")  # fmt: skip
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
        found["would_prune"], f" on {platform}" if platform else "", f"{days:g}", csrf_input(request),
        f"{days:g}", platform or "",
    )  # fmt: skip
    return page(request, "Prune sessions?", body, "ops")


async def empty_view(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    if request.method == "POST":
        form = await request.post()
        if form.get("confirm") != "yes":
            raise queries.BadParam("not confirmed")
        done = await actions.delete_empty(d, False)
        return page(request, "Deleted", t('<p class="notice" role="status">Deleted {} empty session(s).</p><p><a href="/ui/ops">Back</a></p>', done["deleted"]), "ops")  # fmt: skip
    found = await actions.delete_empty(d, True)
    body = t(
        '<p><strong id="empty-count">{}</strong> ended session(s) have no messages.</p>'
        '<form method="post" class="confirm">{}<input type="hidden" name="confirm" value="yes">'
        '<button class="danger">Delete them</button> <a href="/ui/ops">Cancel</a></form>',
        found["empty"], csrf_input(request),
    )  # fmt: skip
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
            errors = join([t("<li>{} character(s) no store can hold (NUL, lone surrogates) "
                             "kept as U+FFFD</li>", report["replaced_characters"]), errors])  # fmt: skip
        return page(request, "Imported", t(
            '<p class="notice" role="status">Imported {} session(s) and {} message(s); {} already present.</p>'
            "<ul>{}</ul><ul>{}</ul><p><a href=\"/ui/sessions\">Sessions</a></p>",
            report["imported"], report["messages"], report["skipped_existing"], renamed, errors), "ops")  # fmt: skip
    raise queries.BadParam("no file was uploaded")


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/sessions")


def register(router: web.UrlDispatcher) -> None:
    for method, path, handler in (
        ("GET", "/", home),
        ("GET", "/login", login_form), ("POST", "/login", login), ("POST", "/logout", logout),
        ("GET", "/static/{name}", static),
        ("GET", "/sessions", sessions_list), ("GET", "/sessions/{id}", session_view),
        ("GET", "/sessions/{id}/rename", rename_form), ("POST", "/sessions/{id}/rename", rename_form),
        ("GET", "/sessions/{id}/delete", delete_form), ("POST", "/sessions/{id}/delete", delete_form),
        ("GET", "/search", search_view), ("GET", "/insights", insights_view), ("GET", "/ops", ops_view),
        ("GET", "/ops/prune", prune_view), ("POST", "/ops/prune", prune_view),
        ("GET", "/ops/empty", empty_view), ("POST", "/ops/empty", empty_view),
        ("POST", "/ops/import", import_view),
    ):  # fmt: skip
        router.add_route(method, path, _errors(handler))
