"""`switchboard sessions ...`: list, show, search, rename, delete, prune, stats, export,
import, optimize. Thin shells over `state.SessionDB`; every one works while the daemon runs
on the same state.db (the store waits out the daemon's write lock)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.tree import Tree

from gateway.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from gateway.timefmt import ago
from state import AmbiguousSession, SessionDB, SessionNotFound, TitleError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False)


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


async def _resolve(db: SessionDB, ref: str) -> str:
    return await db.resolve_session_ref(ref)


async def run(args: argparse.Namespace, db_path: Path) -> int:
    db = await SessionDB.open(db_path)
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


async def cmd_list(db: SessionDB, args: argparse.Namespace) -> int:
    rows = await db.list_sessions(args.source, include_children=args.all, limit=args.limit + 1)
    more = len(rows) > args.limit
    rows = rows[: args.limit]
    if args.json:
        print(json.dumps(rows, ensure_ascii=False))
        return EXIT_OK
    now = time.time()
    titled = any(r.get("title") for r in rows)
    table = Table(box=None, pad_edge=False)
    columns = (
        ["Title", "Preview", "Last Active", "ID"]
        if titled
        else ["Preview", "Last Active", "Src", "ID"]
    )
    for col in columns:
        table.add_column(col, no_wrap=col in ("ID", "Last Active"))
    for r in rows:
        preview = (r.get("preview") or "")[:60]
        if titled:
            table.add_row(r.get("title") or "", preview, ago(r.get("last_active"), now), r["id"])
        else:
            table.add_row(preview, ago(r.get("last_active"), now), r["source"], r["id"])
    out.print(table if rows else "No sessions.")
    if more:
        total = await db.session_count(args.source)
        out.print(f"[dim]… more sessions exist ({total} in all); use --limit or --source[/dim]")
    return EXIT_OK


async def cmd_show(db: SessionDB, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    row = await db.require_session(sid)
    msgs = await db.get_messages(sid, last=args.messages)
    if args.json:
        print(json.dumps({"session": row, "ancestors": await db.get_ancestors(sid),
                          "descendants": await db.get_descendants(sid), "messages": msgs}, ensure_ascii=False, default=str))  # fmt: skip
        return EXIT_OK
    out.print(f"[bold]{row.get('title') or '(untitled)'}[/bold]  {sid}")
    for label, key in (("source", "source"), ("model", "model"), ("user", "user_id"), ("chat", "chat_id"),
                       ("key", "session_key"), ("messages", "message_count"), ("tool calls", "tool_call_count")):  # fmt: skip
        if row.get(key) is not None:
            out.print(f"  {label:<11}{row[key]}")
    out.print(f"  {'started':<11}{_when(row.get('started_at'))}")
    out.print(
        f"  {'ended':<11}{_when(row.get('ended_at'))}"
        + (f" ({row['end_reason']})" if row.get("end_reason") else "")
    )
    out.print(
        f"  {'tokens':<11}{row.get('input_tokens') or 0} in / {row.get('output_tokens') or 0} out"
    )
    ancestors = await db.get_ancestors(sid)
    tree = Tree(f"[dim]{ancestors[-1]['id']}[/dim]" if ancestors else f"[bold]{sid}[/bold] (this)")
    node = tree
    for anc in reversed(ancestors[:-1]):
        node = node.add(f"[dim]{anc['id']} {anc.get('title') or ''}[/dim]")
    if ancestors:
        node = node.add(f"[bold]{sid}[/bold] (this, {row.get('child_kind') or 'child'})")
    for child in await db.get_children(sid):
        node.add(f"{child['id']} {child.get('title') or ''} ({child.get('child_kind') or 'child'})")
    out.print("lineage:")
    out.print(tree)
    out.print(f"last {len(msgs)} messages:")
    for m in msgs:
        content = " ".join((m.get("content") or "").split())
        out.print(
            f"  [{'gold1' if m['role'] == 'user' else 'green'}]{m['role']:>9}[/] {content[:200]}"
        )
    return EXIT_OK


async def cmd_search(db: SessionDB, args: argparse.Namespace) -> int:
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
        out.print(f"[bold]{h.get('title') or '(untitled)'}[/bold] {h['session_id']} #{h['id']} "
                  f"[dim]{h['source']} {h['role']} {_when(h['timestamp'])}[/dim]")  # fmt: skip
        out.print(f"  {h['snippet']}")
    return EXIT_OK


async def cmd_rename(db: SessionDB, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    try:
        title = await db.set_session_title(sid, " ".join(args.title))
    except TitleError as exc:
        err.print(f"switchboard: {exc}")
        return EXIT_FAILURE
    out.print(f"{sid} is now titled {title!r}")
    return EXIT_OK


def _confirm(question: str, yes: bool) -> bool | None:
    if yes:
        return True
    if not sys.stdin.isatty():
        return None  # cannot ask
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


async def cmd_delete(db: SessionDB, args: argparse.Namespace) -> int:
    sid = await _resolve(db, args.ref)
    row = await db.require_session(sid)
    answer = _confirm(
        f"Delete {sid} ({row.get('title') or 'untitled'}, {row.get('message_count') or 0} messages)?",
        args.yes,
    )
    if answer is None:
        err.print("switchboard: refusing to delete without confirmation; add --yes")
        return EXIT_USAGE
    if not answer:
        return EXIT_OK
    await db.delete_session(sid)
    out.print(f"deleted {sid} (its children, if any, are now roots)")
    return EXIT_OK


async def cmd_prune(db: SessionDB, args: argparse.Namespace) -> int:
    candidates = await db.prune_candidates(args.older_than, args.source, limit=1_000_000)
    if args.dry_run or not candidates:
        out.print(
            f"{len(candidates)} ended session(s) idle for more than {args.older_than:g} days"
            + (" would be pruned" if candidates else "")
        )
        return EXIT_OK
    answer = _confirm(f"Prune {len(candidates)} session(s)?", args.yes)
    if answer is None:
        err.print("switchboard: refusing to prune without confirmation; add --yes (or --dry-run)")
        return EXIT_USAGE
    if not answer:
        return EXIT_OK
    n = await db.prune_sessions(args.older_than, args.source)
    out.print(f"pruned {n} session(s)")
    return EXIT_OK


async def cmd_stats(db: SessionDB, args: argparse.Namespace) -> int:
    s = await db.stats()
    if args.json:
        print(json.dumps(s, ensure_ascii=False))
        return EXIT_OK
    out.print(f"{s['sessions']} sessions ({s['live_sessions']} live), {s['messages']} messages")
    out.print(
        f"tokens {s['input_tokens']} in / {s['output_tokens']} out; cost ${s['estimated_cost_usd']:.4f} estimated"
    )
    out.print(f"state.db {s['db_bytes'] / 1e6:.1f} MB (+ WAL {s['wal_bytes'] / 1e6:.1f} MB)")
    table = Table(
        "Source", "Sessions", "Messages", "Tokens in", "Tokens out", box=None, pad_edge=False
    )
    for p in s["per_source"]:
        table.add_row(
            p["source"],
            str(p["sessions"]),
            str(p["messages"]),
            str(p["input_tokens"]),
            str(p["output_tokens"]),
        )
    out.print(table)
    return EXIT_OK


async def cmd_export(db: SessionDB, args: argparse.Namespace) -> int:
    ids = [await _resolve(db, args.session_id)] if args.session_id else None
    if args.file == "-":
        n = await db.write_jsonl(sys.stdout, source=args.source, session_ids=ids)
    else:
        with open(args.file, "w", encoding="utf-8") as fh:
            n = await db.write_jsonl(fh, source=args.source, session_ids=ids)
        err.print(f"exported {n} session(s) to {args.file}")
    return EXIT_OK


def _records(path: Path, progress: Progress) -> Iterator[dict[str, Any]]:
    size = path.stat().st_size
    task = progress.add_task(f"importing {path.name}", total=size)
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            progress.update(task, advance=len(line))
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                err.print(f"line {n}: not JSON; skipped")
                continue
            if isinstance(rec, dict):
                yield rec


async def cmd_import(db: SessionDB, args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        err.print(f"switchboard: not found: {path}")
        return EXIT_FAILURE
    with Progress(console=err, transient=True, disable=not err.is_terminal) as progress:
        report = await db.import_records(_records(path, progress))
    out.print(f"imported {report.imported} session(s), {report.messages} message(s); "
              f"{report.skipped_existing} already present")  # fmt: skip
    for old, new in report.renamed_titles:
        out.print(f"  title {old!r} was taken; kept as {new!r}")
    for problem in report.errors:
        err.print(f"  {problem}")
    return EXIT_OK


async def cmd_browse(db: SessionDB, args: argparse.Namespace) -> int:
    import asyncio

    from gateway.browse import pick_curses, pick_numbered, resume_in_chat

    rows = await db.list_sessions(args.source, limit=args.limit)
    if not rows:
        out.print("No sessions.")
        return EXIT_OK
    if sys.stdin.isatty() and sys.stdout.isatty():
        doomed: list[str] = []
        chosen = pick_curses(rows, lambda row: doomed.append(row["id"]))
        for sid in doomed:
            await db.delete_session(sid)
    else:
        chosen = pick_numbered(rows, sys.stdin.readline, print)
    if chosen is None:
        return EXIT_OK
    await db.close()  # the chat process opens the store itself
    await asyncio.to_thread(resume_in_chat, str(db.path.parent), chosen["id"])
    return EXIT_OK


async def cmd_optimize(db: SessionDB, args: argparse.Namespace) -> int:
    before = db.path.stat().st_size
    await db.optimize_search_index()
    _, after = await db.vacuum()
    out.print(
        f"optimized the search index and vacuumed: {before / 1e6:.2f} MB -> {after / 1e6:.2f} MB"
    )
    return EXIT_OK


COMMANDS = {
    "list": cmd_list, "show": cmd_show, "search": cmd_search, "rename": cmd_rename, "delete": cmd_delete,
    "prune": cmd_prune, "stats": cmd_stats, "export": cmd_export, "import": cmd_import, "optimize": cmd_optimize,
    "browse": cmd_browse,
}  # fmt: skip


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("sessions", help="list, search and manage sessions")
    sp = p.add_subparsers(dest="sessions_command", required=True)
    c = sp.add_parser("list", help="newest activity first")
    c.add_argument("--source")
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--all", action="store_true", help="include compression and reset children")
    c.add_argument("--json", action="store_true")
    c = sp.add_parser("show", help="metadata, lineage and the last messages")
    c.add_argument("ref", help="id, id prefix or title")
    c.add_argument("--messages", type=int, default=20)
    c.add_argument("--json", action="store_true")
    c = sp.add_parser("search", help="search every message")
    c.add_argument("query")
    c.add_argument("--source", action="append")
    c.add_argument("--role", action="append", choices=["user", "assistant", "tool", "system"])
    c.add_argument("--limit", type=int, default=20)
    c.add_argument("--json", action="store_true")
    c = sp.add_parser("rename", help="set a session's title")
    c.add_argument("ref")
    c.add_argument("title", nargs="+")
    c = sp.add_parser("delete", help="delete a session (children become roots)")
    c.add_argument("ref")
    c.add_argument("--yes", action="store_true")
    c = sp.add_parser("prune", help="delete ended sessions idle for long")
    c.add_argument("--older-than", type=float, default=90, metavar="DAYS")
    c.add_argument("--source")
    c.add_argument("--dry-run", action="store_true")
    c.add_argument("--yes", action="store_true")
    c = sp.add_parser("stats", help="totals, per source, tokens, cost, file size")
    c.add_argument("--json", action="store_true")
    c = sp.add_parser("export", help="JSONL, one session (with messages and lineage) per line")
    c.add_argument("file", help="a path, or - for stdout")
    c.add_argument("--source")
    c.add_argument("--session-id")
    c = sp.add_parser("import", help="import JSONL written by export (idempotent)")
    c.add_argument("file")
    sp.add_parser("optimize", help="optimize the search index and VACUUM")
    c = sp.add_parser(
        "browse", help="pick a session (type to filter) and resume it in `switchboard chat`"
    )
    c.add_argument("--source")
    c.add_argument("--limit", type=int, default=200)
    return p
