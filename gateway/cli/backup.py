"""`switchboard backup` and `switchboard restore`: one archive per backup, taken from a
running home. The archive holds a consistent snapshot of state.db (state.sqlite.backup), the index
written from that snapshot, the config file and, when asked, the secrets file, with a
manifest of counts and checksums. A PostgreSQL home is backed up with pg_dump: the command
says how."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, GatewayError
from state import snapshots

FORMAT = "switchboard-backup"
FORMAT_VERSION = 1
PREFIX, SUFFIX = "switchboard-", ".tar.gz"
INDEX = "sessions/sessions.json"
# archive member -> where it lives in a home; nothing else is ever extracted
MEMBERS = ("state.db", INDEX, "config.yaml", "switchboard.env")

PG_RECIPE = """\
this home keeps its sessions in PostgreSQL: back the database up with pg_dump, which takes a
consistent snapshot while the replicas run:
  pg_dump --format=custom --file=switchboard-$(date -u +%Y%m%dT%H%M%SZ).dump "$SWITCHBOARD_PG_DSN"
restore into a new, empty database, then point state.dsn_env at it:
  pg_restore --no-owner --dbname="$NEW_DSN" switchboard-....dump
keep beside the dump: config.yaml and the secrets file (the DSN, the platform tokens).
There is no sessions.json to keep: the routes live in the database."""


class BackupError(GatewayError):
    """A backup or restore that cannot be done; nothing was left half-written."""


@dataclass(frozen=True)
class Written:
    path: Path
    size: int
    summary: snapshots.SnapshotSummary
    files: tuple[str, ...]
    index_entries: int


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _version() -> str:
    from gateway.cli import _version as version

    return version()


def archive_name(now: float) -> str:
    return PREFIX + datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ") + SUFFIX


def backups_in(directory: Path) -> list[Path]:
    """The archives this command wrote into `directory`, oldest first (names sort by time)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir()
                  if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX) and p.is_file())  # fmt: skip


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of the archive at `path`; BackupError when it is not one of ours."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            member = tar.extractfile("manifest.json")
            manifest = json.load(member) if member else None
    except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
        raise BackupError(f"{path} is not a switchboard backup ({exc})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{path} is not a switchboard backup (no manifest)")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise BackupError(f"{path} was written by a newer switchboard; upgrade to restore it")
    return manifest


async def _index_from(db_path: Path, out: Path) -> int:
    """Write the index the daemon would build from the state.db at `db_path`."""
    from gateway.index import SessionIndex
    from state import SessionDB

    db = await SessionDB.open(db_path)
    try:
        index = SessionIndex(out, db)
        await index.rebuild()
        await index.close()
        return len(index)
    finally:
        await db.close()


def take_backup(home: Path, target: Path, *, config: Path | None, secrets: bool,
                now: float | None = None) -> Written:  # fmt: skip
    """Snapshot `home` into a new archive at `target` (written whole, then renamed)."""
    now = time.time() if now is None else now
    if target.exists():
        raise BackupError(f"{target} already exists; name a new file or a directory")
    if not target.parent.is_dir():
        raise BackupError(f"{target.parent} is not a directory")
    with tempfile.TemporaryDirectory(prefix=".switchboard-backup-", dir=target.parent) as tmp:
        stage = Path(tmp)
        db = stage / "state.db"
        snapshots.snapshot(home / "state.db", db)
        summary = snapshots.verify(db)
        if not summary.ok:
            raise BackupError(f"{home / 'state.db'} fails its checks; no backup written: "
                              + "; ".join(summary.problems[:3]))  # fmt: skip
        # the snapshot is a closed file now: the index is built on a copy, so the archived
        # state.db stays byte for byte the image that was verified
        scratch = stage / "scratch"
        scratch.mkdir()
        shutil.copyfile(db, scratch / "state.db")
        (stage / "sessions").mkdir()
        entries = asyncio.run(_index_from(scratch / "state.db", stage / INDEX))
        shutil.rmtree(scratch)
        files = ["state.db", INDEX]
        if config is not None and config.is_file():
            shutil.copyfile(config, stage / "config.yaml")
            files.append("config.yaml")
        if secrets:
            env = home / "switchboard.env"
            if not env.is_file():
                raise BackupError(f"--with-secrets: {env} does not exist")
            shutil.copyfile(env, stage / "switchboard.env")
            files.append("switchboard.env")
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "created_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
            "switchboard_version": _version(), "home": str(home.absolute()),
            **{k: v for k, v in asdict(summary).items() if k != "problems"},
            "index_entries": entries,
            "files": {n: {"size": (stage / n).stat().st_size, "sha256": _sha256(stage / n)}
                      for n in files},
        }  # fmt: skip
        partial = stage / "archive"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # every conversation
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
            blob = json.dumps(manifest, indent=2, ensure_ascii=False).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size, info.mtime, info.mode = len(blob), int(now), 0o600
            tar.addfile(info, io.BytesIO(blob))
            for name in files:
                tar.add(stage / name, arcname=name, recursive=False,
                        filter=lambda i: _owned(i, now))  # fmt: skip
            raw.flush()
            os.fsync(raw.fileno())
        os.link(partial, target)  # fails rather than replace a file that appeared meanwhile
    return Written(target, target.stat().st_size, summary, tuple(files), entries)


def _owned(info: tarfile.TarInfo, now: float) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode, info.mtime = 0o600, int(now)
    return info


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest archives in `directory`; returns what went."""
    old = backups_in(directory)[:-keep] if keep > 0 else []
    for path in old:
        path.unlink(missing_ok=True)
    return old


def restore(archive: Path, home: Path) -> tuple[snapshots.SnapshotSummary, tuple[str, ...], int]:
    """Unpack `archive` into the empty (or missing) `home`, bring state.db to this
    switchboard's schema and write its index. Returns the summary, the files, the entries."""
    from gateway.app import HomeLock

    manifest = read_manifest(archive)
    if home.exists() and (not home.is_dir() or any(home.iterdir())):
        raise BackupError(f"{home} is not empty: restore into a new home (or empty it first)")
    home.mkdir(parents=True, exist_ok=True)
    lock = HomeLock(home)
    lock.acquire()
    try:
        listed: dict[str, dict[str, Any]] = manifest.get("files") or {}
        names = tuple(n for n in MEMBERS if n in listed)
        if "state.db" not in names:
            raise BackupError(f"{archive} holds no state.db")
        with tempfile.TemporaryDirectory(prefix=".restore-", dir=home) as tmp:
            stage = Path(tmp)
            with tarfile.open(archive, "r:gz") as tar:
                for name in names:
                    member = tar.extractfile(name)
                    if member is None:
                        raise BackupError(f"{archive} lists {name} but does not hold it")
                    dest = stage / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with dest.open("wb") as fh:
                        shutil.copyfileobj(member, fh)
                    if _sha256(dest) != listed[name].get("sha256"):
                        raise BackupError(f"{archive}: {name} does not match its checksum")
            for name in names:
                if name == INDEX:
                    continue  # written anew from the restored state.db below
                dest = home / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(stage / name, dest)
                if name == "switchboard.env":
                    dest.chmod(0o600)
        (home / "sessions").mkdir(exist_ok=True)
        entries = asyncio.run(_index_from(home / "state.db", home / INDEX))  # migrates too
        summary = snapshots.verify(home / "state.db")
        if not summary.ok:
            raise BackupError(f"the restored state.db fails its checks: {'; '.join(summary.problems[:3])}")
    finally:
        lock.release()
        (home / "switchboard.lock").unlink(missing_ok=True)
    return summary, names, entries


async def _record(home: Path, written: Written) -> None:
    """The home's last backup, for `switchboard status` (state_meta, as an export records)."""
    from gateway.ops.status import BACKUP_META
    from state import SessionDB

    db = await SessionDB.open(home / "state.db")
    try:
        await db.set_meta(BACKUP_META, json.dumps({
            "at": time.time(), "file": str(written.path.absolute()), "kind": "backup",
            "sessions": written.summary.sessions, "messages": written.summary.messages,
        }))  # fmt: skip
    finally:
        await db.close()


def _describe(summary: snapshots.SnapshotSummary) -> str:
    return (f"schema {summary.schema_version}, {summary.sessions:,} sessions "
            f"({summary.live_sessions:,} live), {summary.messages:,} messages; "
            "integrity ok, search index ok")  # fmt: skip


def cmd_backup(args: argparse.Namespace) -> int:
    from gateway.cli.paths import backend_of, config_path_of, home_of
    from gateway.config import load_config

    home = home_of(args)
    config_file = config_path_of(args, home)
    if backend_of(args, home) == "postgres":
        print(f"switchboard: {PG_RECIPE}", file=sys.stderr)
        return EXIT_FAILURE
    settings = load_config(config_file).backup
    if args.file is None and settings.directory is None:
        print("switchboard: name a FILE or DIRECTORY, or set backup.directory in the config",
              file=sys.stderr)  # fmt: skip
        return EXIT_USAGE
    target = Path(args.file or settings.directory).expanduser()
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
    print(f"  sessions.json: {entries:,} entries, written from state.db"
          + (f"; with {', '.join(rest)}" if rest else ""))  # fmt: skip
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
        sub, "backup", "take a consistent backup of this home while it runs",
        description="Write one archive (.tar.gz, mode 0600) holding a consistent snapshot of "
        "state.db taken while the daemon runs, the session index written from it, and the "
        "config file; verify it (SQLite's integrity check, the search index's own check, "
        "the counts) and print what it holds. A PostgreSQL home prints the pg_dump recipe "
        "instead and exits 1.",
    )  # fmt: skip
    p.add_argument("file", nargs="?", metavar="FILE|DIRECTORY",
                   help="the archive to write, or a directory (one that exists, or a path "
                   "ending in /) to write "
                   f"{PREFIX}<UTC time>{SUFFIX} into (default: backup.directory)")  # fmt: skip
    p.add_argument("--keep", type=_count, metavar="N",
                   help="writing into a directory: keep the N newest archives there and "
                   "delete older ones (default: backup.keep)")  # fmt: skip
    p.add_argument("--with-secrets", action="store_true",
                   help="add the home's switchboard.env (platform tokens) to the archive")  # fmt: skip
    p.set_defaults(func=cmd_backup)
    p = add_command(
        sub, "restore", "restore a backup into a new, empty home",
        description="Unpack an archive written by `switchboard backup` into the --home given "
        "(which must be empty or missing), check every file against the manifest's "
        "checksums, bring state.db to this switchboard's schema, write sessions.json from "
        "it and verify the result. The restored home starts and continues each chat's "
        "live session.",
    )  # fmt: skip
    p.add_argument("file", metavar="FILE", help="an archive written by switchboard backup")
    p.set_defaults(func=cmd_restore)
