"""`switchboard backup` and `switchboard restore`: thin shells over gateway/ops/backups.py.
A PostgreSQL home is backed up with pg_dump: `backup` says how."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from gateway.ops.backups import (
    INDEX,
    PG_RECIPE,
    PREFIX,
    SUFFIX,
    BackupError,
    Written,
    archive_name,
    prune,
    restore,
    take_backup,
)
from state import snapshots


async def _record(home: Path, written: Written) -> None:
    """The home's last backup, for `switchboard status` (state_meta, as an export records)."""
    from gateway.ops.status import BACKUP_META
    from state import SessionDB

    db = await SessionDB.open(home / "state.db")
    try:
        await db.set_meta(
            BACKUP_META,
            json.dumps(
                {
                    "at": time.time(),
                    "file": str(written.path.absolute()),
                    "kind": "backup",
                    "sessions": written.summary.sessions,
                    "messages": written.summary.messages,
                }
            ),
        )
    finally:
        await db.close()


def _describe(summary: snapshots.SnapshotSummary) -> str:
    return (
        f"schema {summary.schema_version}, {summary.sessions:,} sessions "
        f"({summary.live_sessions:,} live), {summary.messages:,} messages; "
        "integrity ok, search index ok"
    )


def cmd_backup(args: argparse.Namespace) -> int:
    from gateway.cli.paths import backend_of, config_path_of, home_of
    from gateway.config import load_config

    home = home_of(args)
    config_file = config_path_of(args, home)
    if backend_of(args, home) == "postgres":
        print(f"switchboard: {PG_RECIPE}", file=sys.stderr)
        return EXIT_FAILURE
    settings = load_config(config_file).backup
    chosen: str | None = args.file or settings.directory
    if chosen is None:
        print(
            "switchboard: name a FILE or DIRECTORY, or set backup.directory in the config",
            file=sys.stderr,
        )
        return EXIT_USAGE
    target = Path(chosen).expanduser()
    keep = settings.keep if args.keep is None else args.keep
    as_dir = args.file is None or args.file.endswith(os.sep) or target.is_dir()
    directory = target if as_dir else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        target = directory / archive_name(now)
        while target.exists():  # two backups in one second
            now += 1
            target = directory / archive_name(now)
    if not (home / "state.db").is_file():
        raise BackupError(f"{home / 'state.db'} does not exist: nothing to back up")
    written = take_backup(home, target, config=config_file, secrets=args.with_secrets)
    asyncio.run(_record(home, written))
    print(f"backup: {written.path} ({written.size / 1e6:,.1f} MB)")
    print(f"  state.db: {_describe(written.summary)}")
    extras = [f"sessions.json ({written.index_entries:,} entries)"]
    extras += [n for n in written.files if n not in ("state.db", INDEX)]
    print(f"  with: {', '.join(extras)}")
    if directory is not None:
        for gone in prune(directory, keep):
            print(f"  removed older backup {gone.name} (keeping {keep})")
    return EXIT_OK


def cmd_restore(args: argparse.Namespace) -> int:
    from gateway.cli.paths import home_of

    home = home_of(args)
    archive = Path(args.file).expanduser()
    summary, names, entries = restore(archive, home)
    print(f"restored {archive} into {home}")
    print(f"  state.db: {_describe(summary)}")
    rest = [n for n in names if n not in ("state.db", INDEX)]
    print(
        f"  sessions.json: {entries:,} entries, written from state.db"
        + (f"; with {', '.join(rest)}" if rest else "")
    )
    return EXIT_OK


def _count(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (got {value!r})") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (got {n})")
    return n


def add_parsers(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "backup",
        "take a consistent backup of this home while it runs",
        description="Write one archive (.tar.gz, mode 0600) holding a consistent snapshot of "
        "state.db taken while the daemon runs, the session index written from it, and the "
        "config file; verify it (SQLite's integrity check, the search index's own check, "
        "the counts) and print what it holds. A PostgreSQL home prints the pg_dump recipe "
        "instead and exits 1.",
    )
    p.add_argument(
        "file",
        nargs="?",
        metavar="FILE|DIRECTORY",
        help="the archive to write, or a directory (one that exists, or a path "
        "ending in /) to write "
        f"{PREFIX}<UTC time>{SUFFIX} into (default: backup.directory)",
    )
    p.add_argument(
        "--keep",
        type=_count,
        metavar="N",
        help="writing into a directory: keep the N newest archives there and "
        "delete older ones (default: backup.keep)",
    )
    p.add_argument(
        "--with-secrets",
        action="store_true",
        help="add the home's switchboard.env (platform tokens) to the archive",
    )
    p.set_defaults(func=cmd_backup)
    p = add_command(
        sub,
        "restore",
        "restore a backup into a new, empty home",
        description="Unpack an archive written by `switchboard backup` into the --home given "
        "(which must be empty or missing), check every file against the manifest's "
        "checksums, bring state.db to this switchboard's schema, write sessions.json from "
        "it and verify the result. The restored home starts and continues each chat's "
        "live session.",
    )
    p.add_argument("file", metavar="FILE", help="an archive written by switchboard backup")
    p.set_defaults(func=cmd_restore)
