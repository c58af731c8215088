"""`switchboard sessions ...`: list, show, search, rename, delete, prune, stats, export,
import, optimize. Thin shells over the `state.Store` the home's config names (state.db, or
PostgreSQL); every one works while the daemon runs on the same store (SQLite's waits out
the daemon's write lock). `optimize` is SQLite's; `export` and `import` are
gateway/cli/transfer.py's."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from gateway import adapters
from gateway.cli.paths import configured_prices, home_of, open_configured
from gateway.cli.plain import err, out, plain, styled
from gateway.cli.transfer import cmd_export, cmd_import
from gateway.errors import EXIT_FAILURE, EXIT_IN_USE, EXIT_OK, EXIT_USAGE
from gateway.timefmt import ago
from gateway.wiring import replicated
from gateway.wording import plural
from state import (
    AmbiguousSession,
    Maintenance,
    SessionDB,
    SessionNotFound,
    Store,
    TitleError,
    content_text,
    encode_content,
)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


def _text_of(content: object) -> str:
    """A message's text for one line: its text parts when it is structured."""
    if content is None or isinstance(content, str):
        return content or ""
    return content_text(encode_content(content)) or "[structured content]"


async def _resolve(db: Store, ref: str) -> str:
    return await db.resolve_session_ref(ref)


async def run(
    args: argparse.Namespace, db_path: Path, state: Mapping[str, Any] | None = None
) -> int:
    """Run the subcommand on state.db at `db_path`, or on the store `state` (open_store's
    settings, for a home whose config puts the store elsewhere) names."""
    db = await open_configured(state, db_path)
    try:
        return int(await COMMANDS[args.sessions_command](db, args))
    except SessionNotFound as exc:
        err.print(f"switchboard: not found: {exc.ref}")
        return EXIT_FAILURE
    except AmbiguousSession as exc:
        err.print(f"switchboard: {exc}")
        return EXIT_USAGE
    finally:
        await db.close()


async def cmd_list(db: Store, args: argparse.Namespace) -> int:
    rows = await db.list_sessions(args.source, include_children=args.all, limit=args.limit + 1)
    more = len(rows) > args.limit
    rows = rows[: args.limit]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False))
        return EXIT_OK
    now = time.time()
    titled = any(r.get("title") for r in rows)
    table = Table(box=None, pad_edge=False)
    chats = any(r.get("chat_name") or r.get("chat_id") for r in rows)  # sessions from chats
    columns = (
        ["Title", "Preview", "Last Active", "ID"]
        if titled
        else ["Preview", "Last Active", "Src", "ID"]
    )
    at = 2 if titled else 1  # after the preview
    if chats:
        columns.insert(at, "Chat")
    for col in columns:
        table.add_column(col, no_wrap=col in ("ID", "Last Active"))
    for r in rows:
        preview = plain((r.get("preview") or "")[:60])
        when = ago(r.get("last_active"), now)
        cells: list[str | Text]
        if titled:
            cells = [plain(r.get("title") or ""), preview, when, plain(r["id"])]
        else:
            cells = [preview, when, plain(r["source"]), plain(r["id"])]
        if chats:  # the chat's name, else its id (plain text, never markup)
            cells.insert(at, plain(r.get("chat_name") or r.get("chat_id") or ""))
        table.add_row(*cells)
    out.print(table if rows else "No sessions.")
    if more:
        total = await db.session_count(args.source)
        out.print(f"[dim]… more sessions exist ({total} in all); use --limit or --source[/dim]")
    return EXIT_OK


async def cmd_show(db: Store, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    row = await db.require_session(sid)
    msgs = await db.get_messages(sid, last=args.messages)
    if args.json:
        print(
            json.dumps(
                {
                    "session": row,
                    "ancestors": await db.get_ancestors(sid),
                    "descendants": await db.get_descendants(sid),
                    "messages": msgs,
                },
                ensure_ascii=False,
                default=str,
            )
        )
        return EXIT_OK
    out.print(styled(plain(row.get("title") or "(untitled)", "bold"), "  ", plain(sid)))
    fields: Mapping[str, object] = row  # read by name below
    for label, key in (
        ("source", "source"),
        ("model", "model"),
        ("user", "user_id"),
        ("chat", "chat_id"),
        ("key", "session_key"),
        ("messages", "message_count"),
        ("tool calls", "tool_call_count"),
    ):
        if (value := fields.get(key)) is not None:
            out.print(styled(f"  {label:<11}", plain(value)))
    out.print(f"  {'started':<11}{_when(row.get('started_at'))}")
    reason = row.get("end_reason")
    out.print(
        styled(
            f"  {'ended':<11}{_when(row.get('ended_at'))}",
            *((" (", plain(reason), ")") if reason else ()),
        )
    )
    out.print(
        f"  {'tokens':<11}{row.get('input_tokens') or 0} in / {row.get('output_tokens') or 0} out"
    )
    ancestors = await db.get_ancestors(sid)
    tree = Tree(
        plain(ancestors[-1]["id"], "dim") if ancestors else styled(plain(sid, "bold"), " (this)")
    )
    node = tree
    for anc in reversed(ancestors[:-1]):
        node = node.add(plain(f"{anc['id']} {anc.get('title') or ''}", "dim"))
    if ancestors:
        node = node.add(
            styled(plain(sid, "bold"), " (this, ", plain(row.get("child_kind") or "child"), ")")
        )
    for child in await db.get_children(sid):
        node.add(
            plain(
                f"{child['id']} {child.get('title') or ''} ({child.get('child_kind') or 'child'})"
            )
        )
    out.print("lineage:")
    out.print(tree)
    out.print(f"last {plural(len(msgs), 'message')}:")
    for m in msgs:
        content = " ".join(_text_of(m.get("content")).split())
        role = f"{m['role']:>9}"
        out.print(
            styled(
                "  ",
                plain(role, "gold1" if m["role"] == "user" else "green"),
                " ",
                plain(content[:200]),
            )
        )
    return EXIT_OK


async def cmd_search(db: Store, args: argparse.Namespace) -> int:
    from state import QueryError

    try:
        hits = await db.search_messages(
            args.query, sources=args.source or (), roles=args.role or (), limit=args.limit
        )
    except QueryError as exc:
        err.print(f"switchboard: {exc}")
        return EXIT_USAGE
    if args.json:
        print(json.dumps(hits, ensure_ascii=False))
        return EXIT_OK
    if not hits:
        out.print("Nothing found.")
    for h in hits:
        out.print(
            styled(
                plain(h.get("title") or "(untitled)", "bold"),
                " ",
                plain(f"{h['session_id']} #{h['id']}"),
                " ",
                plain(f"{h['source']} {h['role']} {_when(h['timestamp'])}", "dim"),
            )
        )
        out.print(styled("  ", plain(h["snippet"])))
    return EXIT_OK


async def cmd_rename(db: Store, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    try:
        title = await db.set_session_title(sid, " ".join(args.title))
    except TitleError as exc:
        err.print(f"switchboard: {exc}")
        return EXIT_FAILURE
    if title is None:
        out.print(f"{sid}: title cleared", markup=False)
    else:
        out.print(f"{sid} is now titled {title!r}", markup=False)
    return EXIT_OK


def _confirm(question: str, yes: bool) -> bool | None:
    if yes:
        return True
    if not sys.stdin.isatty():
        return None  # cannot ask
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


async def cmd_delete(db: Store, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    row = await db.require_session(sid)
    if row.get("ended_at") is None and not args.force:
        # the dashboard refuses the same (409): a chat may be writing into it right now
        err.print(f"switchboard: {sid} is live; end it first (/new in its chat) or add --force")
        return EXIT_IN_USE
    answer = _confirm(
        f"Delete {sid} ({row.get('title') or 'untitled'}, {plural(row.get('message_count') or 0, 'message')})?",
        args.yes,
    )
    if answer is None:
        err.print("switchboard: refusing to delete without confirmation; add --yes")
        return EXIT_USAGE
    if not answer:
        return EXIT_OK
    await db.delete_session(sid)
    out.print(f"deleted {sid} (its children, if any, are now roots)", markup=False)
    return EXIT_OK


async def cmd_prune(db: Store, args: argparse.Namespace) -> int:
    candidates = await db.prune_candidates(args.older_than, args.source, limit=1_000_000)
    if args.dry_run or not candidates:
        out.print(
            f"{plural(len(candidates), 'ended session')} idle for more than {args.older_than:g} days"
            + (" would be pruned" if candidates else "")
        )
        return EXIT_OK
    answer = _confirm(f"Prune {plural(len(candidates), 'session')}?", args.yes)
    if answer is None:
        err.print("switchboard: refusing to prune without confirmation; add --yes (or --dry-run)")
        return EXIT_USAGE
    if not answer:
        return EXIT_OK
    n = await db.prune_sessions(args.older_than, args.source)
    out.print(f"pruned {plural(n, 'session')}")
    return EXIT_OK


async def cmd_stats(db: Store, args: argparse.Namespace) -> int:
    from gateway.web.queries import cost, usd

    s: dict[str, Any] = dict(await db.stats())
    # the cost `switchboard insights` and the dashboard show, over every session
    figures = await db.insights(0.0, time.time(), None)
    s["cost"] = cost(figures["models"], configured_prices(args, home_of(args)))
    if args.json:
        print(json.dumps(s, ensure_ascii=False))
        return EXIT_OK
    out.print(
        f"{plural(s['sessions'], 'session')} ({s['live_sessions']} live), {plural(s['messages'], 'message')}"
    )
    out.print(
        f"tokens {s['input_tokens']} in / {s['output_tokens']} out; "
        f"estimated cost {usd(s['cost']['estimated_usd'])}"
    )
    if s["cost"]["unpriced_models"]:
        out.print(
            f"no price configured (dashboard.prices) for: {', '.join(s['cost']['unpriced_models'])}",
            markup=False,
            style="dim",
        )
    if not replicated(db.backend):
        out.print(f"state.db {s['db_bytes'] / 1e6:.1f} MB (+ WAL {s['wal_bytes'] / 1e6:.1f} MB)")
    else:
        out.print(f"{db.backend} database {s['db_bytes'] / 1e6:.1f} MB")
    table = Table(
        "Source", "Sessions", "Messages", "Tokens in", "Tokens out", box=None, pad_edge=False
    )
    for p in s["per_source"]:
        table.add_row(
            plain(p["source"]),
            str(p["sessions"]),
            str(p["messages"]),
            str(p["input_tokens"]),
            str(p["output_tokens"]),
        )
    out.print(table)
    return EXIT_OK


async def cmd_browse(db: Store, args: argparse.Namespace) -> int:
    import asyncio

    from gateway.cli.browse import pick_curses, pick_numbered, resume_in_chat

    rows = await db.list_sessions(args.source, limit=args.limit)
    if not rows:
        out.print("No sessions.")
        return EXIT_OK
    if sys.stdin.isatty() and sys.stdout.isatty():
        doomed: list[str] = []

        def delete(row: Mapping[str, Any]) -> str | None:
            if row.get("ended_at") is None:  # as `sessions delete` without --force
                return f"{row['id']} is live: kept (`sessions delete --force` deletes it)"
            doomed.append(row["id"])
            return None

        chosen = pick_curses(rows, delete)
        for sid in doomed:
            await db.delete_session(sid)
    else:
        chosen = pick_numbered(rows, sys.stdin.readline, print)
    if chosen is None:
        return EXIT_OK
    await db.close()  # the chat process opens the store itself
    if not isinstance(db, SessionDB):
        err.print(
            f"switchboard: chosen {chosen['id']}; `switchboard chat` works on state.db only for now"
        )
        return EXIT_FAILURE
    await asyncio.to_thread(resume_in_chat, str(db.path.parent), chosen["id"])
    return EXIT_OK


async def cmd_optimize(db: Store, args: argparse.Namespace) -> int:
    if not isinstance(db, SessionDB) or not isinstance(db, Maintenance):
        err.print(
            f"switchboard: optimize is SQLite's; {db.backend} keeps its own indexes and space"
        )
        return EXIT_USAGE
    before = db.path.stat().st_size
    await db.optimize_search_index()
    _, after = await db.vacuum()
    out.print(
        f"optimized the search index and vacuumed: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB"
    )
    return EXIT_OK


COMMANDS = {
    "list": cmd_list,
    "show": cmd_show,
    "search": cmd_search,
    "rename": cmd_rename,
    "delete": cmd_delete,
    "prune": cmd_prune,
    "stats": cmd_stats,
    "export": cmd_export,
    "import": cmd_import,
    "optimize": cmd_optimize,
    "browse": cmd_browse,
}


def _int_at_least(lowest: int, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < lowest:
        raise argparse.ArgumentTypeError(f"must be {lowest} or more, not {n}")
    return n


def positive_int(text: str) -> int:
    """argparse type for --limit: a count of at least 1 (0 or less is a usage error)."""
    return _int_at_least(1, text)


def non_negative_int(text: str) -> int:
    return _int_at_least(0, text)


def non_negative_days(text: str) -> float:
    """argparse type for --older-than: a number of days, 0 or more (a negative age, inf or
    nan is a usage error: it would select sessions from the future, or none at all)."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of days: {text!r}") from None
    if not math.isfinite(days) or days < 0:
        raise argparse.ArgumentTypeError(f"must be a number of days, 0 or more, not {text}")
    return days


JSON_HELP = "print JSON instead of a table (for scripts)"


def source_help() -> str:
    return f"only sessions from this source ({', '.join((*adapters.names(), 'api', 'cli'))})"


def add_parser(sub: Any, add_command: Any) -> argparse.ArgumentParser:
    """`sessions` and its subcommands; `add_command(sub, name, summary)` makes each one
    (it adds the global options and the description)."""
    p = add_command(sub, "sessions", "list, search and manage sessions")
    sp = p.add_subparsers(dest="sessions_command", required=True, metavar="COMMAND")
    c = add_command(sp, "list", "list sessions, newest activity first")
    c.add_argument("--source", help=source_help())
    c.add_argument(
        "--limit", type=positive_int, default=20, help="show at most N sessions (default 20)"
    )
    c.add_argument(
        "--all",
        action="store_true",
        help="every session, lineage unfolded (default: live ones and folded lineage)",
    )
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c = add_command(sp, "show", "metadata, lineage and the last messages")
    c.add_argument("ref", help="id, id prefix or title")
    c.add_argument(
        "--messages",
        type=non_negative_int,
        default=20,
        metavar="N",
        help="how many of the last messages to show (default 20)",
    )
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c = add_command(sp, "search", "search every message")
    c.add_argument("query", help='words, "exact phrase", OR, NOT, prefix*')
    c.add_argument("--source", action="append", help="only this source (repeat for several)")
    c.add_argument(
        "--role",
        action="append",
        choices=["user", "assistant", "tool", "system"],
        help="only messages with this role (repeat for several)",
    )
    c.add_argument("--limit", type=positive_int, default=20, help="at most N hits (default 20)")
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c = add_command(sp, "rename", "set a session's title (an empty title clears it)")
    c.add_argument("ref", help="id, id prefix or title")
    c.add_argument("title", nargs="+", help="the new title (several words are joined)")
    c = add_command(sp, "delete", "delete an ended session (children become roots)")
    c.add_argument("ref", help="id, id prefix or title")
    c.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    c.add_argument(
        "--force",
        action="store_true",
        help="delete a live session too (its chat's next message starts a new one)",
    )
    c = add_command(sp, "prune", "delete ended sessions idle for long")
    c.add_argument(
        "--older-than",
        type=non_negative_days,
        default=90,
        metavar="DAYS",
        help="idle for more than DAYS days (default %(default)g)",
    )
    c.add_argument("--source", help=source_help())
    c.add_argument("--dry-run", action="store_true", help="only say how many would be pruned")
    c.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    c = add_command(sp, "stats", "totals, per source, tokens, cost, file size")
    c.add_argument("--json", action="store_true", help=JSON_HELP)
    c = add_command(sp, "export", "JSONL, one session (with messages and lineage) per line")
    c.add_argument("file", help="a path, or - for stdout")
    c.add_argument("--source", help=source_help())
    c.add_argument("--session-id", help="only this session (id, id prefix or title)")
    c = add_command(sp, "import", "import JSONL written by export (idempotent)")
    c.add_argument("file", help="a path, or - for stdin")
    add_command(sp, "optimize", "optimize the search index and VACUUM")
    c = add_command(
        sp, "browse", "pick a session (type to filter) and resume it in `switchboard chat`"
    )
    c.add_argument("--source", help=source_help())
    c.add_argument(
        "--limit", type=positive_int, default=200, help="offer at most N sessions (default 200)"
    )
    return p
