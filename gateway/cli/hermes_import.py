"""`switchboard import --from-hermes [HERMES_HOME]`: bring a Hermes Agent home over.

From its state.db: sessions, messages, titles, lineage, token counts, per-model usage
(state/hermes/hermes_import.py). From its gateway: the routing index (`sessions/sessions.json`,
and the `gateway_routing` table Hermes 0.19 keeps beside it) whose keys are rebuilt with
switchboard's key builder from each session's origin, threads included, and the home
channels `/sethome` wrote into its `.env`.

Works whether the daemon runs or not. state.db is the only thing written while it runs:
the store waits out the daemon's write lock, and the daemon adopts a key's imported live
session on the key's next message (or when it starts). When no daemon runs, the import
takes the home lock and updates sessions.json itself. Running it twice changes nothing;
`--dry-run` reports the same counts and writes nothing.

Into a home whose store is on PostgreSQL the same import runs through a scratch state.db
that stands in for the database where the import's decisions look at it, then moves over
as `sessions import` moves an export (`_through_scratch`): one implementation of Hermes's
rows and keys for both stores. There the replicas adopt each key's session on its next
message (no sessions.json), and per-model usage rows stay behind.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway import adapters
from gateway.config import Config
from gateway.errors import EXIT_FAILURE, EXIT_OK, AlreadyRunning
from gateway.handoff import HOME_KEY, configured_home
from gateway.session_keys import KeySettings, SessionSource, build_key
from gateway.vocab import ChatType
from state import HermesImport, ImportReport, SessionDB, Store, open_store
from state import HermesRouting as Routing
from state import read_hermes_routing as read_routing

DEFAULT_HERMES_HOME = "~/.hermes"
_CHAT_TYPES = {
    "dm": ChatType.DM,
    "group": ChatType.GROUP,
    "channel": ChatType.CHANNEL,
    "thread": ChatType.THREAD,
    "forum": ChatType.GROUP,
    "supergroup": ChatType.GROUP,
    "private": ChatType.DM,
}


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_command: Callable[..., argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = add_command(
        sub,
        "import",
        "bring sessions over from another program",
        description="Copy a Hermes Agent home's sessions, messages, titles, lineage, "
        "token counts, gateway session keys and home channels into this home; "
        "running it twice changes nothing.",
    )
    p.add_argument(
        "--from-hermes",
        dest="from_hermes",
        nargs="?",
        const=DEFAULT_HERMES_HOME,
        required=True,
        metavar="HERMES_HOME",
        help=f"a Hermes Agent home (default {DEFAULT_HERMES_HOME}); its files are read, "
        "never written",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would change; write nothing")
    return p


def hermes_db_file(arg: str) -> Path | None:
    """The state.db of a Hermes home (or the file itself), None when there is none."""
    source = Path(arg).expanduser()
    db_file = source / "state.db" if source.is_dir() else source
    return db_file if db_file.is_file() else None


# --- Hermes's routing index -> switchboard keys -------------------------------------------


def routing_entries(hermes_home: Path, table: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Hermes's routing index {Hermes key: entry}: its state.db table first (Hermes reads it
    first too), sessions.json for the keys the table lacks. Unreadable parts are skipped."""
    out: dict[str, dict[str, Any]] = {}
    try:
        data = json.loads((hermes_home / "sessions" / "sessions.json").read_text("utf-8"))
    except (OSError, ValueError):
        data = {}
    if isinstance(data, dict):
        for key, entry in data.items():
            if not key.startswith("_") and isinstance(entry, dict) and entry.get("session_id"):
                out[key] = entry
    for key, text in table.items():
        try:
            entry = json.loads(text)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("session_id"):
            out[key] = entry
    return out


def _text(value: Any) -> str | None:
    return None if value is None or str(value) == "" else str(value)


def hermes_source(
    hermes_key: str, origin: Mapping[str, Any], row: Mapping[str, Any]
) -> SessionSource | None:
    """Where a Hermes session's messages come from, as switchboard's adapters describe it:
    the origin Hermes recorded, else the row's routing columns. A group key without a user
    part was a shared session in Hermes, so it stays shared (no user)."""
    parts = hermes_key.split(":")
    platform = _text(origin.get("platform")) or _text(row.get("source"))
    if platform is None and len(parts) > 2:
        platform = parts[2]
    raw_type = _text(origin.get("chat_type")) or _text(row.get("chat_type"))
    if raw_type is None and len(parts) > 3:
        raw_type = parts[3]
    chat_type = _CHAT_TYPES.get(raw_type or "", ChatType.GROUP)
    chat_id = _text(origin.get("chat_id")) or _text(row.get("chat_id"))
    if chat_id is None and len(parts) > 4:
        chat_id = parts[4]
    if not platform or not chat_id:
        return None
    thread_id = _text(origin.get("thread_id")) or _text(row.get("thread_id"))
    user_id = (
        _text(origin.get("user_id_alt"))
        or _text(origin.get("user_id"))
        or _text(row.get("user_id"))
    )
    if chat_type != "dm" and user_id is not None:
        stem = ":".join(parts[:4] + [chat_id] + ([thread_id] if thread_id else []))
        if hermes_key == stem:
            user_id = None  # Hermes kept this room (or thread) as one shared session
    return SessionSource(
        platform=platform,
        chat_id=chat_id,
        chat_type=chat_type,
        user_id=user_id,
        user_name=_text(origin.get("user_name")),
        chat_name=_text(origin.get("chat_name")),
        thread_id=thread_id,
    )


def plan_routing(
    rows: list[dict[str, Any]], entries: Mapping[str, Mapping[str, Any]], settings: KeySettings
) -> tuple[Routing, list[str]]:
    """Each keyed Hermes session's switchboard key, and which session stays live on each
    key (the one Hermes's index routed to). Also the Hermes keys that could not be mapped."""
    routed = {str(e["session_id"]): (k, e) for k, e in entries.items()}
    keys: dict[str, tuple[str, dict[str, Any]]] = {}
    live: dict[str, str] = {}
    unmapped: list[str] = []
    for row in rows:
        sid = str(row["id"])
        if sid not in routed and not row.get("session_key"):
            continue  # a terminal or cron session: never routed by a key
        hermes_key, entry = routed.get(sid, (str(row["session_key"]), {}))
        origin = entry.get("origin") if isinstance(entry.get("origin"), dict) else None
        if origin is None:
            try:
                origin = json.loads(row.get("origin_json") or "{}")
            except ValueError:
                origin = {}
        source = hermes_source(hermes_key, origin if isinstance(origin, dict) else {}, row)
        if source is None:
            unmapped.append(hermes_key)
            continue
        key = build_key(source, settings).format()
        keys[sid] = (key, source.as_dict())
        if sid in routed and row.get("ended_at") is None:
            # several Hermes keys can land on one switchboard key: the latest routed wins
            current = live.get(key)
            if current is None or _updated(routed, sid) >= _updated(routed, current):
                live[key] = sid
    return Routing(keys=keys, live=live), unmapped


def _updated(routed: Mapping[str, tuple[str, Mapping[str, Any]]], sid: str) -> str:
    return str(routed[sid][1].get("updated_at") or "")


# --- home channels -------------------------------------------------------------------------


def _env_file(path: Path) -> dict[str, str]:
    """KEY=value lines of a dotenv file (`export` prefix, quotes and comments allowed)."""
    out: dict[str, str] = {}
    try:
        lines = path.read_text("utf-8-sig", errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        try:
            words = shlex.split(value, comments=True)
        except ValueError:
            words = [value.strip()]
        out[name.strip()] = words[0] if words else ""
    return out


def hermes_homes(hermes_home: Path, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{platform: home} from the `<PLATFORM>_HOME_CHANNEL[_THREAD_ID]` lines `/sethome` writes
    to Hermes's .env, in the shape switchboard's /sethome stores. The chat's type comes from
    a Hermes session in that chat when there is one."""
    env = _env_file(hermes_home / ".env")
    out: dict[str, dict[str, Any]] = {}
    for platform in adapters.names():
        name = f"{platform.upper()}_HOME_CHANNEL"
        chat_id = (env.get(name) or "").strip()
        if not chat_id:
            continue
        thread = (env.get(f"{name}_THREAD_ID") or "").strip()
        home = configured_home(platform, f"{chat_id}:{thread}" if thread else chat_id)
        if home is None:
            continue
        for row in rows:
            if row.get("source") == platform and str(row.get("chat_id")) == chat_id:
                home["chat_type"] = _CHAT_TYPES.get(str(row.get("chat_type")), home["chat_type"])
        home.update(set_by=None, at=time.time(), imported_from="hermes")
        out[platform] = home
    return out


# --- the command ---------------------------------------------------------------------------


async def run(
    args: argparse.Namespace,
    home: Path,
    db_file: Path | None,
    config: Config,
    state: dict[str, Any] | None = None,
) -> int:
    """The import into the home's state.db, or into the store `state` names (open_store's
    settings: PostgreSQL) through a scratch state.db (`_through_scratch`)."""
    if db_file is None:
        print(f"switchboard: no Hermes state.db at {args.from_hermes}")
        return EXIT_FAILURE
    hermes_home = db_file.parent
    settings = KeySettings(
        group_sessions_per_user=config.sessions.group_sessions_per_user,
        thread_sessions_per_user=config.sessions.thread_sessions_per_user,
    )
    rows, table = read_routing(db_file)
    routing, unmapped = plan_routing(rows, routing_entries(hermes_home, table), settings)
    homes = hermes_homes(hermes_home, rows)
    moved: ImportReport | None = None
    if state is None:
        db = await SessionDB.open(home / "state.db")
        try:
            r = await db.import_hermes(db_file, dry_run=args.dry_run, routing=routing)
            homes_set, homes_kept = await _set_homes(db, homes, args.dry_run)
            index_note = "" if args.dry_run or not r.keys_bound else await _update_index(home, db)
        finally:
            await db.close()
    else:
        target = await open_store(state, home)
        try:
            r, moved = await _through_scratch(target, db_file, rows, routing, args.dry_run)
            homes_set, homes_kept = await _set_homes(target, homes, args.dry_run)
        finally:
            await target.close()
        index_note = (
            ""
            if args.dry_run or not r.keys_bound
            else ("session_routes: the replica a key's next message reaches adopts its session")
        )
    verb = "would import" if args.dry_run else "imported"
    print(
        f"{verb} {r.sessions} sessions, {r.messages} messages, {r.titles} titles, "
        f"{r.usage_rows} usage rows from {db_file}; {r.skipped} already present"
    )
    print(
        f"session keys: {r.keys_mapped} mapped, {len(r.keys_bound)} live sessions bound, "
        f"{len(r.keys_kept)} kept by a live switchboard session, {r.superseded} superseded "
        f"Hermes sessions ended, {r.keys_unmapped} unmapped"
    )
    for key, sid in r.keys_bound:
        print(f"  {key} -> {sid}")
    for key in r.keys_kept:
        print(f"  {key}: left with its switchboard session")
    for key in unmapped:
        print(f"  not mapped (no platform or chat in it): {key}")
    print(f"home channels: {len(homes_set)} set, {len(homes_kept)} already set here")
    for platform in homes_set:
        h = homes[platform]
        where = f"{h['chat_id']}" + (f" thread {h['thread_id']}" if h.get("thread_id") else "")
        print(f"  {platform}: {where}")
    if index_note:
        print(index_note)
    for conflict in r.title_conflicts:
        print(f"  title kept off (already used here): {conflict}")
    for title, free in moved.renamed_titles if moved else ():
        print(f"  title renamed (already used here): {title} -> {free}")
    for error in moved.errors if moved else ():
        print(f"  not imported: {error}")
    return EXIT_OK


async def _through_scratch(
    target: Store, db_file: Path, rows: list[dict[str, Any]], routing: Routing, dry_run: bool
) -> tuple[HermesImport, ImportReport | None]:
    """The import into a store that is not a state.db (PostgreSQL), and the report of the
    move into it (None for a dry run: nothing moves). The SQLite import runs into a scratch
    state.db made to look like `target` where its decisions depend on it: the Hermes sessions `target` already has are there (so they
    are skipped), and so are the sessions live on `target`'s keys (so each such key keeps
    its switchboard session and the Hermes rows for it end). What it imported then moves to
    `target` as `sessions import` moves an export: sessions, messages, titles (a title
    `target` already uses is renamed, as that import does), lineage, tokens and keys; each
    key's live session is adopted by the replica its next message reaches. Per-model usage
    rows stay behind (the sessions' own token and cost totals come over)."""
    present = await target.session_states([str(r["id"]) for r in rows if r.get("id")])
    live = await target.newest_live_session_by_key()
    holding = set(live.values())
    with tempfile.TemporaryDirectory(prefix="switchboard-import-") as tmp:
        scratch = await SessionDB.open(Path(tmp) / "state.db")
        try:
            for key, sid in live.items():
                await scratch.create_session(sid, "api", session_key=key)
            for sid, (ended_at, _reason) in present.items():
                if sid not in holding:
                    await scratch.create_session(sid, "api")
                    await scratch.end_session(sid, "imported", now=ended_at)
            report = await scratch.import_hermes(db_file, routing=routing)
            records = [rec async for rec in scratch.export_all(session_ids=report.imported_ids)]
        finally:
            await scratch.close()
    report.usage_rows, report.dry_run = 0, dry_run
    if dry_run:
        return report, None
    moved = await target.import_records(records)
    report.sessions, report.messages = moved.imported, moved.messages
    return report, moved


async def _set_homes(
    db: Store, homes: Mapping[str, dict[str, Any]], dry_run: bool
) -> tuple[list[str], list[str]]:
    """A home set here with /sethome (or an earlier import) is kept."""
    done, kept = [], []
    for platform, home in homes.items():
        if await db.get_meta(HOME_KEY.format(platform)):
            kept.append(platform)
            continue
        if not dry_run:
            await db.set_meta(HOME_KEY.format(platform), json.dumps(home))
        done.append(platform)
    return done, kept


async def _update_index(home: Path, db: SessionDB) -> str:
    """Write the imported live sessions into sessions.json, under the daemon's home lock so
    no daemon can start meanwhile. A running daemon owns the file (it rewrites it from
    memory), so then it is left alone: the daemon adopts each key's session on the key's
    next message, or at start-up."""
    from gateway.home import HomeLock
    from gateway.index import SessionIndex

    lock = HomeLock(home)
    try:
        lock.acquire()
    except AlreadyRunning:
        return "sessions.json: the running daemon adopts these sessions on their next message"
    try:
        index = SessionIndex(home / "sessions" / "sessions.json", db)
        await index.load()
        await index.close()
    finally:
        lock.release()
    return "sessions.json: updated"
