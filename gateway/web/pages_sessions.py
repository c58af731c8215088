"""The dashboard's session pages under /ui: the list with its filters, one session with
its lineage tree and messages, rename and delete (each confirmed, with the CSRF token), and
search across every message."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gateway.session_keys import CHAT_TYPES
from gateway.web import actions, queries
from gateway.web.context import dashboard_of
from gateway.web.html import Safe, highlight, join, t, url
from gateway.web.layout import (
    LONG_MESSAGE,
    NONE,
    csrf_input,
    or_none,
    page,
    select,
    time_cell,
    when,
)
from state import QueryError, SessionNotFound, TitleError

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
    return t('{}<div class="sub">{}</div>', or_none(name), kind or "")


async def sessions_list(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    params = request.query
    result = await queries.session_page(d, params)
    p = params.get
    filters = join(
        [
            select("platform", "Platform", queries.PLATFORMS, p("platform")),
            select("chat_type", "Chat type", CHAT_TYPES, p("chat_type")),
            select("titled", "Title", [("yes", "titled"), ("no", "untitled")], p("titled")),
            select("status", "Status", ("live", "ended"), p("status")),
            t(
                '<label>Show <select name="children">{}</select></label>',
                join(
                    t(
                        '<option value="{}"{}>{}</option>',
                        v,
                        Safe(" selected") if (p("children") or "") == v else "",
                        label,
                    )
                    for v, label in (("", "live sessions, lineage folded"), ("1", "every session"))
                ),
            ),
            t('<label>From <input type="date" name="from" value="{}"></label>', p("from") or ""),
            t('<label>To <input type="date" name="to" value="{}"></label>', p("to") or ""),
            t(
                '<label>Sort <select name="sort">{}</select></label>',
                join(
                    t(
                        '<option value="{}"{}>{}</option>',
                        v,
                        Safe(" selected") if (p("sort") or "active") == v else "",
                        label,
                    )
                    for v, label in (("active", "last activity"), ("started", "start time"))
                ),
            ),
            t(
                '<label>Order <select name="order">{}</select></label>',
                join(
                    t(
                        '<option value="{}"{}>{}</option>',
                        v,
                        Safe(" selected") if (p("order") or "desc") == v else "",
                        label,
                    )
                    for v, label in (("desc", "newest first"), ("asc", "oldest first"))
                ),
            ),
        ]
    )
    rows = join(
        t(
            '<tr><td class="title"><a href="{}">{}</a><div class="sub">{}</div></td><td>{}</td><td class="chat">{}</td>'
            '<td class="num">{}</td><td class="date">{}</td><td class="date">{}</td><td class="status">{}</td></tr>',
            url("/ui/sessions", r["id"]),
            r.get("title") or "(untitled)",
            r.get("preview") or r["id"],
            r.get("source"),
            _chat(r),
            r.get("message_count") or 0,
            time_cell(r.get("started_at")),
            time_cell(r.get("last_active")),
            _status(r),
        )
        for r in result["sessions"]
    )
    keep = {k: v for k, v in params.items() if k not in ("after", "deleted")}
    more = (
        t(
            '<a class="next" rel="next" href="{}">Next page →</a>',
            url("/ui/sessions", **keep, after=result["next"]),
        )
        if result["next"]
        else ""
    )
    first = (
        t('<a href="{}">← First page</a>', url("/ui/sessions", **keep))
        if params.get("after")
        else ""
    )
    notice = (
        t('<p class="notice" role="status">Deleted session {}.</p>', params["deleted"])
        if params.get("deleted")
        else ""
    )
    body = t(
        '{}<form method="get" class="filters" id="filters">{}<button>Apply</button> '
        '<a href="/ui/sessions">Reset</a></form>'
        '<table class="list" id="sessions"><thead><tr><th>Session</th><th>Platform</th><th>Chat</th>'
        '<th>Messages</th><th class="date">Started (UTC)</th><th class="date">Last active</th><th class="status">Status</th></tr></thead>'
        '<tbody>{}</tbody></table><p class="pager">{} {}</p>',
        notice,
        filters,
        rows or Safe('<tr><td colspan="7">No sessions match.</td></tr>'),
        first,
        more,
    )
    return page(request, "Sessions", body, "sessions")


# --- one session ---------------------------------------------------------------------------


def _tree(node: dict[str, Any], current: str, on_path: set[str]) -> Safe:
    kind = node.get("child_kind") or ("root" if node.get("parent_session_id") is None else "child")
    here = node["id"] == current
    label = t(
        '<a href="{}"{} class="node{}">{}</a> <span class="kind k-{}">{}</span> '
        "<small>{} · {} msgs{}{}</small>",
        url("/ui/sessions", node["id"]),
        Safe(' aria-current="page"') if here else "",
        " current" if here else "",
        node.get("title") or node["id"],
        kind,
        kind,
        when(node.get("started_at")),
        node.get("message_count") or 0,
        t(" · ended: {}", node["end_reason"])
        if node.get("end_reason")
        else Safe(" · live")
        if node.get("ended_at") is None
        else "",
        t(" · handoff to {} ({})", node.get("handoff_platform") or "?", node["handoff_state"])
        if node.get("handoff_state")
        else "",
    )
    if not node["children"]:
        return t('<li data-id="{}">{}</li>', node["id"], label)
    inner = join(_tree(c, current, on_path) for c in node["children"])
    is_open = Safe(" open") if node["id"] in on_path else ""
    return t(
        '<li data-id="{}"><details{}><summary>{} <small class="count">({} below)</small></summary><ul>{}</ul></details></li>',
        node["id"],
        is_open,
        label,
        len(node["children"]),
        inner,
    )


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
        text[:400],
        len(text),
        text,
    )


UNDELIVERED_WORDS = {
    "ready": "not delivered yet: held in the outbox",
    "sending": "not delivered yet: held in the outbox",
    "unconfirmed": "may not have reached the chat (the daemon stopped while sending it)",
    "failed": "not delivered",
    "refused": "not delivered: the platform refused it",
    "expired": "not delivered: it expired in the outbox",
}


def _undelivered(mark: Mapping[str, Any] | None) -> Safe | str:
    if mark is None:
        return ""
    state, reason = str(mark["state"]), mark.get("reason")
    return t(
        '<p class="undelivered" title="{}">{}</p>',
        reason or state,
        UNDELIVERED_WORDS.get(state, "not delivered"),
    )


def _message(
    m: Mapping[str, Any], target: int | None, undelivered: Mapping[int, Any] | None = None
) -> Safe:
    role = str(m.get("role") or "")
    calls = m.get("tool_calls")
    folded: list[Safe] = []
    if calls:
        for call in calls if isinstance(calls, list) else [calls]:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            name = fn.get("name") if isinstance(fn, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else call
            folded.append(
                t(
                    '<details class="tool"><summary>tool call: {}</summary><pre>{}</pre></details>',
                    name or "?",
                    args
                    if isinstance(args, str)
                    else json.dumps(args, ensure_ascii=False, indent=1),
                )
            )
    if role == "tool":
        body = t(
            '<details class="tool"><summary>tool result: {}</summary><pre>{}</pre></details>',
            m.get("tool_name") or m.get("tool_call_id") or "?",
            m.get("content") or "",
        )
    else:
        body = _content(m.get("content"))
    mark = " target" if target is not None and m["id"] == target else ""
    return t(
        '<article class="msg role-{}{}" id="m{}"><header><span class="role">{}</span> '
        '<a class="when" href="#m{}">{}</a></header>{}{}{}</article>',
        role,
        mark,
        m["id"],
        role,
        m["id"],
        when(m.get("timestamp")),
        _undelivered((undelivered or {}).get(int(m["id"]))),
        body,
        join(folded),
    )


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
        ("Id", s["id"]),
        ("Title", s.get("title") or "(untitled)"),
        ("Platform", or_none(s.get("source"))),
        ("Chat type", or_none(s.get("chat_type"))),
        ("Chat", or_none(s.get("chat_id"))),
        ("Chat name", or_none(_origin(s).get("chat_name"))),
        ("User", or_none(s.get("user_id"))),
        ("Model", or_none(s.get("model"))),
        ("Started", time_cell(s.get("started_at"))),
        ("Last active", time_cell(s.get("last_active"))),
        (
            "Status",
            ("ended: " + (s.get("end_reason") or ""))
            if s.get("ended_at")
            else "live, bound to a chat"
            if s["live"]
            else "live (not bound to a chat now)",
        ),
        ("Messages", s.get("message_count") or 0),
        ("Tokens in / out", f"{s.get('input_tokens') or 0} / {s.get('output_tokens') or 0}"),
    ]
    dl = join(t("<dt>{}</dt><dd>{}</dd>", k, v) for k, v in meta)
    tree = detail["lineage"]
    on_path = set(_path_to(tree, sid) or []) if tree else set()
    lineage = t('<ul class="tree" id="lineage">{}</ul>', _tree(tree, sid, on_path)) if tree else ""
    undelivered = detail.get("undelivered") or {}
    transcript = join(_message(m, at, undelivered) for m in detail["messages"])
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
        url("/ui/sessions", sid, "rename"),
        url("/api/sessions", sid, "export"),
        url("/ui/sessions", sid, "delete"),
    )
    body = t(
        '{}<section class="meta"><dl>{}</dl></section>'
        '<section><h2>Lineage</h2><p class="hint">root, compression chain, branches and resets; '
        'the current session is marked.</p><button type="button" class="js-only" id="expand-tree">Expand all</button>{}</section>'
        '<section><h2>Transcript</h2><div id="transcript">{}</div><p class="pager">{}</p></section>',
        ops,
        dl,
        lineage,
        transcript or Safe("<p>No messages.</p>"),
        join(nav, " "),
    )
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
        t('<p class="error" role="alert">{}</p>', error) if error else "",
        csrf_input(request),
        value,
        url("/ui/sessions", sid),
    )
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
            row.get("title") or "(untitled)",
            sid,
            actions.LIVE_REFUSAL,
            url("/ui/sessions", sid),
        )
        return page(request, "This session is live", body, "sessions")
    body = t(
        "<p>Delete <strong>{}</strong> ({}) and its {} messages? Sessions that grew from it are kept "
        "(they become roots). This cannot be undone.</p>"
        '<form method="post" class="confirm">{}<input type="hidden" name="confirm" value="yes">'
        '<button class="danger" id="confirm-delete">Delete for good</button> <a href="{}">Cancel</a></form>',
        row.get("title") or "(untitled)",
        sid,
        row.get("message_count") or 0,
        csrf_input(request),
        url("/ui/sessions", sid),
    )
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
                t(
                    '<li class="hit"><a href="{}#m{}">{}</a> <small>{} · {} · {}</small>'
                    '<blockquote class="snippet">{}</blockquote></li>',
                    url("/ui/sessions", h["session_id"], at=h["id"]),
                    h["id"],
                    h.get("title") or h["session_id"],
                    h.get("source"),
                    h.get("role"),
                    when(h.get("timestamp")),
                    highlight(h.get("snippet") or ""),
                )
                for h in found["hits"]
            )
            nxt = (
                t(
                    '<a rel="next" href="{}">More results →</a>',
                    url("/ui/search", **{**request.query, "offset": found["next_offset"]}),
                )
                if found["next_offset"] is not None
                else ""
            )
            results = (
                t('<ol class="hits" id="hits">{}</ol><p class="pager">{}</p>', items, nxt)
                if items
                else Safe("<p>Nothing found.</p>")
            )
    form = t(
        '<form method="get" class="filters"><label>Query <input type="search" name="q" value="{}" size="40" autofocus></label>{}{}{}'
        '<button>Search</button></form><p class="hint">words (all must match), "exact phrase", OR, NOT, prefix* '
        "— the same language as /search in a chat.</p>",
        query,
        select("platform", "Platform", queries.PLATFORMS, p("platform")),
        select("role", "Role", ("user", "assistant", "tool", "system"), p("role")),
        t(
            '<label>Sort <select name="sort">{}</select></label>',
            join(
                t(
                    '<option value="{}"{}>{}</option>',
                    v,
                    Safe(" selected") if (p("sort") or "relevance") == v else "",
                    v,
                )
                for v in ("relevance", "newest", "oldest")
            ),
        ),
    )
    return page(request, "Search", t("{}{}", form, results), "search")
