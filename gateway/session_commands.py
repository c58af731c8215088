"""The session commands: /new /title /resume /sessions /search /branch /compress
/background /sethome. Each resolves only within the chat's own sessions (gateway.access),
so another user's session answers exactly like one that does not exist."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from gateway import access, turns
from gateway.adapters import replies_in_request
from gateway.commands import CommandContext, CommandRegistry
from gateway.errors import NothingToCompress
from gateway.handoff import HOME_KEY
from gateway.timefmt import ago
from gateway.wording import plural
from state import (
    AmbiguousSession,
    ChildKind,
    EndReason,
    QueryError,
    SessionFilter,
    SessionRow,
    StateError,
    TitleError,
    TitleTaken,
)

log = logging.getLogger("gateway.commands")
LIST_LIMIT = 10
NOT_FOUND = "No session found for that. Send /resume to see the ones you can resume."


def _cut(text: str | None, n: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def _label(row: Mapping[str, object]) -> str:
    return str(row.get("title") or _cut(str(row.get("preview") or "(empty)"), 40))


async def _title_problem(ctx: CommandContext, exc: TitleError) -> str:
    """A refused title in chat words. Titles are one namespace, but a clash names the
    session holding the title only when this chat may reach it (gateway.access): another
    owner's session answers as if it did not exist, so its id never leaves its owner."""
    if isinstance(exc, TitleTaken):
        row = await ctx.services.db.get_session(exc.owner)
        if row is not None and access.may_access(row, ctx.key):
            return (
                f"this chat's session {exc.owner} already has that title "
                f"(/resume {exc.title} goes back to it)"
            )
        return "that title is already in use"
    return str(exc)


async def cmd_new(ctx: CommandContext) -> str:
    entry, problem = await ctx.services.sessions.reset(
        ctx.key, ctx.msg.source, EndReason.SESSION_RESET, ctx.args or None
    )
    ctx.services.coordinator.forget_listing(ctx.key.format())
    if problem:
        why = await _title_problem(ctx, problem)
        return f"Started a new session, but the title was not set: {why}."
    return f"Started a new session{f' titled {ctx.args.strip()!r}' if ctx.args else ''}."


async def cmd_title(ctx: CommandContext) -> str:
    db = ctx.services.db
    if not ctx.args:
        title = await db.get_session_title(ctx.session_id)
        return (
            f"Title: {title}"
            if title
            else "This session has no title yet. Set one with /title <name>."
        )
    try:
        title = await db.set_session_title(ctx.session_id, ctx.args)
    except TitleError as exc:
        return f"Title not set: {await _title_problem(ctx, exc)}."
    return f"Title set: {title}"


async def _same_conversation(ctx: CommandContext) -> set[str]:
    """The current session and the sessions it continues through compression."""
    ids = {ctx.session_id}
    child = await ctx.services.db.require_session(ctx.session_id)
    for anc in await ctx.services.db.get_ancestors(ctx.session_id):
        compressed = (
            child.get("child_kind") == ChildKind.COMPRESSION
            or anc.get("end_reason") == EndReason.COMPRESSION
        )
        if not compressed:
            break
        ids.add(anc["id"])
        child = anc
    return ids


async def _resumable(ctx: CommandContext, flt: SessionFilter) -> list[SessionRow]:
    """Titled sessions this chat may resume, newest first, the current conversation excluded."""
    db = ctx.services.db
    current = await _same_conversation(ctx)
    rows = await db.list_filtered(
        SessionFilter(**{**flt.__dict__, "include_children": False, "titled_only": True}),
        limit=LIST_LIMIT + len(current),
    )
    return [r for r in rows if r["id"] not in current][:LIST_LIMIT]


async def cmd_resume(ctx: CommandContext) -> str:
    services, db = ctx.services, ctx.services.db
    args = ctx.args.strip()
    flt = access.scope(ctx.key)
    if args.startswith("--any"):
        if not services.settings.is_admin(ctx.msg.source):
            return "Only admins may resume sessions of other chats."
        flt, args = access.admin_scope(), args[len("--any") :].strip()
    if not args:
        rows = await _resumable(ctx, flt)
        if not rows:
            return "No titled sessions to resume here yet. Name one with /title."
        services.coordinator.remember_listing(ctx.key.format(), [str(r["id"]) for r in rows])
        now = time.time()
        lines = [
            f"{i}. {_label(r)} ({r.get('message_count') or 0} messages, {ago(r.get('last_active'), now)})"
            for i, r in enumerate(rows, 1)
        ]
        return (
            "Sessions you can resume:\n"
            + "\n".join(lines)
            + "\nSend /resume <number, title or id>."
        )
    target: str | None = None
    if args.isdigit() and len(args) <= 3:
        listing = services.coordinator.listing(ctx.key.format()) or [
            str(r["id"]) for r in await _resumable(ctx, flt)
        ]
        n = int(args)
        if not 1 <= n <= len(listing):
            return f"There is no number {n} in the list. Send /resume to see it."
        target = listing[n - 1]
    else:
        try:
            target = await db.resolve_in_scope(args, flt)
        except AmbiguousSession:
            return "That matches several of your sessions; use more of the id or the title."
    if target is None:
        return NOT_FOUND
    target = await db.resolve_resume_session_id(target)
    if target == ctx.session_id:
        return "You are already in that session."
    await services.sessions.switch(ctx.key, ctx.msg.source, target)
    row = await db.require_session(target)
    recap = [
        m for m in await db.get_messages(target, last=12) if m["role"] in ("user", "assistant")
    ][-4:]
    lines = [f"Resumed {_label(row)} ({plural(row.get('message_count') or 0, 'message')})."]
    for m in recap:
        who = "You" if m["role"] == "user" else "Agent"
        lines.append(f"{who}: {_cut(m.get('content'), 120)}")
    return "\n".join(lines)


async def cmd_sessions(ctx: CommandContext) -> str:
    rows = await ctx.services.db.list_filtered(
        access.scope(ctx.key, include_children=False), limit=LIST_LIMIT
    )
    current = await _same_conversation(ctx)
    if not rows:
        return "No sessions in this chat yet."
    now = time.time()
    lines = []
    for i, r in enumerate(rows, 1):
        mark = "  ← current" if r["id"] in current else ""
        title = r.get("title") or "(untitled)"
        lines.append(
            f"{i}. {title} — {_cut(r.get('preview'), 40) or '(empty)'} — {ago(r.get('last_active'), now)}{mark}"
        )
    ctx.services.coordinator.remember_listing(ctx.key.format(), [str(r["id"]) for r in rows])
    return "Your sessions:\n" + "\n".join(lines)


async def cmd_search(ctx: CommandContext) -> str:
    if not ctx.args.strip():
        return 'Usage: /search <words>  ("exact phrase", OR, NOT, prefix* work too)'
    try:
        hits = await ctx.services.db.search_messages(
            ctx.args, scope=access.scope(ctx.key), roles=("user", "assistant"), limit=30
        )
    except QueryError as exc:
        return f"Search not run: {exc}."
    seen: list[str] = []
    lines = []
    for h in hits:
        if h["session_id"] in seen:
            continue
        seen.append(h["session_id"])
        when = datetime.fromtimestamp(h["timestamp"], UTC).strftime("%Y-%m-%d")
        lines.append(
            f"{len(seen)}. {h.get('title') or '(untitled)'} — {when} — {_cut(h['snippet'], 140)}"
        )
        if len(seen) >= LIST_LIMIT:
            break
    if not lines:
        return "Nothing found."
    ctx.services.coordinator.remember_listing(ctx.key.format(), seen)
    return "\n".join(lines) + "\nSend /resume <number> to continue one."


async def cmd_branch(ctx: CommandContext) -> str:
    try:
        entry = await ctx.services.sessions.branch(
            ctx.key, ctx.msg.source, ctx.args.strip() or None
        )
    except TitleError as exc:
        return f"Not branched: {await _title_problem(ctx, exc)}."
    title = await ctx.services.db.get_session_title(entry.session_id)
    return f"Branched into a new session{f' ({title})' if title else ''}. /resume goes back to the original."


async def cmd_compress(ctx: CommandContext) -> str:
    try:
        entry, n = await ctx.services.sessions.compress(
            ctx.key, ctx.msg.source, ctx.args.strip() or None
        )
    except NothingToCompress:
        return "Nothing to compress yet."
    except (StateError, Exception) as exc:  # noqa: BLE001 - the session is untouched; say so
        log.error("compression failed for session_key=%s: %s", ctx.key.format(), exc)
        return "Compression failed; the session was left unchanged."
    title = await ctx.services.db.get_session_title(entry.session_id)
    return f"Compressed {plural(n, 'earlier message')} into a summary{f'; continuing as {title}' if title else ''}."


async def cmd_background(ctx: CommandContext) -> str:
    if not ctx.args.strip():
        return "Usage: /background <prompt>"
    job = turns.start_background(ctx.services, ctx.key, ctx.msg, ctx.session_id, ctx.args.strip())
    if replies_in_request(ctx.msg.source.platform):  # this answer ends the request
        return (
            f"Started background job {job}; its result comes in the notices of this "
            "chat's next answer (and to the request's callback_url, if it gave one)."
        )
    return f"Started background job {job}; the result will be posted here."


async def cmd_sethome(ctx: CommandContext) -> str:
    src = ctx.msg.source
    value = {
        "chat_id": src.chat_id,
        "thread_id": src.thread_id,
        "chat_type": src.chat_type,
        "set_by": src.user_id,
        "at": time.time(),
    }
    await ctx.services.db.set_meta(HOME_KEY.format(src.platform), json.dumps(value))
    where = f"thread {src.thread_id} of this chat" if src.thread_id else "this chat"
    return f"Home channel for {src.platform} set to {where}."


def register(reg: CommandRegistry) -> None:
    reg.add("new", "/new [title]", "start a fresh session", cmd_new)
    reg.add("title", "/title [name]", "show or set this session's title", cmd_title)
    reg.add(
        "resume",
        "/resume [title|id|N]",
        "go back to an earlier session (no argument: list)",
        cmd_resume,
    )
    reg.add("sessions", "/sessions", "this chat's sessions", cmd_sessions)
    reg.add("search", "/search <query>", "search this chat's past sessions", cmd_search)
    reg.add("branch", "/branch [title]", "fork this session and continue in the copy", cmd_branch)
    reg.add(
        "compress", "/compress [focus]", "summarise the older part of this session", cmd_compress
    )
    reg.add(
        "background", "/background <prompt>", "run a prompt as a background job", cmd_background
    )
    reg.add("sethome", "/sethome", "make this chat the platform's home channel", cmd_sethome)
