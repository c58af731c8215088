"""Backups of a home: one archive per backup, taken while the daemon runs. The archive holds
a consistent snapshot of state.db (state.sqlite.backup), the index written from that snapshot, the
config file and, when asked, the secrets file, with a manifest of counts and checksums;
restore unpacks one into an empty home. `switchboard backup` / `restore` (gateway/cli/
backup.py) and doctor's backup age use it."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.errors import GatewayError
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
    from gateway.home import version

    return version()


def archive_name(now: float) -> str:
    return PREFIX + datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ") + SUFFIX


def backups_in(directory: Path) -> list[Path]:
    """The archives this command wrote into `directory`, oldest first (names sort by time)."""
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.iterdir()
        if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX) and p.is_file()
    )


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


def take_backup(
    home: Path, target: Path, *, config: Path | None, secrets: bool, now: float | None = None
) -> Written:
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
            raise BackupError(
                f"{home / 'state.db'} fails its checks; no backup written: "
                + "; ".join(summary.problems[:3])
            )
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
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
            "switchboard_version": _version(),
            "home": str(home.absolute()),
            **{k: v for k, v in asdict(summary).items() if k != "problems"},
            "index_entries": entries,
            "files": {
                n: {"size": (stage / n).stat().st_size, "sha256": _sha256(stage / n)} for n in files
            },
        }
        partial = stage / "archive"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # every conversation
        with (
            os.fdopen(fd, "wb") as raw,
            tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar,
        ):
            blob = json.dumps(manifest, indent=2, ensure_ascii=False).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size, info.mtime, info.mode = len(blob), int(now), 0o600
            tar.addfile(info, io.BytesIO(blob))
            for name in files:
                tar.add(
                    stage / name, arcname=name, recursive=False, filter=lambda i: _owned(i, now)
                )
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
    from gateway.home import HomeLock

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
            raise BackupError(
                f"the restored state.db fails its checks: {'; '.join(summary.problems[:3])}"
            )
    finally:
        lock.release()
        (home / "switchboard.lock").unlink(missing_ok=True)
    return summary, names, entries
