"""`switchboard doctor`: is this installation healthy? Each check returns a line; the
command exits 0 only when every check passes. `--fix` rebuilds sessions.json from state.db
(only while no daemon holds the home) and clears parent links to sessions that are gone."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gateway.adapters import adapter_class
from gateway.config import Config
from gateway.errors import AlreadyRunning
from gateway.wiring import replicated, store_settings
from state import ClusterStore, Maintenance, SessionDB, Store, open_store


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # noted, but does not fail the run

    def line(self) -> str:
        mark = "ok  " if self.ok else ("warn" if self.warn else "FAIL")
        return f"[{mark}] {self.name}: {self.detail}"


def _daemon_running(home: Path) -> bool:
    """Whether a daemon holds the home lock, probed without taking it over (the lock file
    keeps the daemon's pid; a probe that gets the lock lets go at once)."""
    try:
        fd = os.open(home / "switchboard.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock the probe got
    return False


async def _index_check(home: Path, db: Store, flush_s: float = 2.0) -> tuple[Check, list[str]]:
    """sessions.json against state.db. A running daemon writes the file at most every
    `flush_s`, so what looks wrong while it runs is looked at again after one flush: only
    what is still wrong then counts. A live session with no entry (from `sessions import`, or
    one the daemon has not written yet) is adopted by the daemon when it starts: a warning."""
    path = home / "sessions" / "sessions.json"
    check, problems, unindexed = await _compare_index(path, db)
    doubtful = problems or unindexed or (check is not None and not check.ok)
    if doubtful and _daemon_running(home):
        await asyncio.sleep(flush_s + 1.0)
        check, problems, unindexed = await _compare_index(path, db)
        if check is not None and check.warn:  # the running daemon should have written it
            check = Check(check.name, False, check.detail.partition(";")[0])
    if check is not None:
        return check, problems or ["missing"]
    if problems:
        detail = f"{len(problems)} problem(s): " + "; ".join(problems[:3])
        return Check("session index", False, detail), problems + unindexed
    if unindexed:
        detail = (
            f"{len(unindexed)} live session(s) with no entry yet ({', '.join(unindexed[:3])}); "
            "the daemon adopts them when it next starts"
        )
        return Check("session index", False, detail, warn=True), unindexed
    return Check("session index", True, f"{_entries(path)} entries agree with state.db"), []


async def _routes_check(db: Store) -> Check:
    """PostgreSQL: session_routes and the replicas. Stale routes heal when their key is next
    leased and dead replicas' leases are taken over, so neither fails the check."""
    assert isinstance(db, ClusterStore)  # replicated(db.backend): the PostgreSQL store
    report = await db.cluster_report()
    detail = (
        f"{report['routes']} routes, {report['live_replicas']} live replica(s)"
        + (
            f"; {report['stale_routes']} route(s) heal at their next message"
            if report["stale_routes"]
            else ""
        )
        + (
            f"; {report['dead_leases']} lease(s) of stopped replicas"
            if report["dead_leases"]
            else ""
        )
        + (
            f"; {report['orphaned_rows']} inbox row(s) wait for a live replica"
            if report["orphaned_rows"]
            else ""
        )
    )
    return Check("session routes", True, detail, warn=bool(report["orphaned_rows"]))


def _entries(path: Path) -> int:
    try:
        return len(json.loads(path.read_bytes()))
    except (OSError, ValueError):
        return 0


async def _compare_index(path: Path, db: Store) -> tuple[Check | None, list[str], list[str]]:
    """(a verdict when the file cannot be compared at all, entries that point at a missing
    or ended session, keys whose live session has no entry). Terminal sessions are never
    in the daemon's index and are left out."""
    live = {
        r["session_key"]: r["id"]
        for r in await db.live_sessions_by_key()
        if not r["session_key"].startswith("agent:main:cli:")
    }
    try:
        data = json.loads(await asyncio.to_thread(path.read_bytes))
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        detail = f"{path} is missing ({len(live)} live sessions in state.db)"
        if not live:
            return Check("session index", True, detail), [], []
        detail += "; the daemon builds it from state.db when it next starts"
        return Check("session index", False, detail, warn=True), [], []
    except (ValueError, UnicodeDecodeError) as exc:
        return Check("session index", False, f"{path} is unreadable ({exc})"), ["unreadable"], []
    problems = []
    states = await db.session_states(
        [str(v.get("session_id")) for v in data.values() if isinstance(v, dict)]
    )
    for key, value in data.items():
        sid = value.get("session_id") if isinstance(value, dict) else None
        if sid not in states:
            problems.append(f"{key} -> missing session {sid}")
        elif states[sid][0] is not None:
            problems.append(f"{key} -> ended session {sid}")
    return None, problems, [k for k in live if k not in data]


async def _reach(config: Config) -> list[Check]:
    """Each enabled platform's token, checked by its adapter through its client library."""
    checks = []
    for name, settings in config.platforms.items():
        if not settings.enabled:
            continue
        cls = adapter_class(name)
        try:
            ok, detail = await cls.check_credentials(settings, config.platform_secrets(name))
        except Exception as exc:  # a third-party adapter's surprise is a failed check, not a crash
            ok, detail = False, f"unreachable ({type(exc).__name__})"
        checks.append(Check(f"{name} reachable", ok, detail))
    return checks


# a standby this far behind (or a primary's standby with this replay lag) is worth a look
REPLICATION_LAG_WARN_S = 30.0


async def _replication_check(db: Store) -> Check:
    """Where PostgreSQL reports it: the round trip, and how far replication is behind."""
    started = time.perf_counter()
    try:
        # PgStore's alone: state.api declares it on no protocol (this check runs on it only)
        status = await db.server_status()  # type: ignore[attr-defined]
    except Exception as exc:  # a server that answered the connect but not this: report it
        return Check("PostgreSQL replication", False, f"not readable ({exc})", warn=True)
    trip = f"PostgreSQL {status['version']}, round trip {(time.perf_counter() - started) * 1000:.1f} ms"
    if status["standby"]:
        behind = status["replay_behind"]
        detail = f"{trip}; a standby (read-only): replay {'unknown' if behind is None else f'{behind:.1f} s'} behind"
        return Check("PostgreSQL replication", False, detail + " — switchboard needs the primary")
    standbys = status["standbys"]
    if not standbys:
        return Check("PostgreSQL replication", True, f"{trip}; primary, no standbys")
    lags = [s["lag"] or 0.0 for s in standbys]
    names = ", ".join(
        f"{s['name'] or '?'} {s['state']} {(s['lag'] or 0.0):.1f} s" for s in standbys
    )
    worst = max(lags)
    return Check(
        "PostgreSQL replication",
        worst < REPLICATION_LAG_WARN_S,
        f"{trip}; primary, standbys: {names}",
        warn=worst >= REPLICATION_LAG_WARN_S,
    )


async def _inbox_check(db: Store) -> Check:
    """Turns and replies a crash left open: the next start runs the turns again and sends
    the 'ready' replies; a 'sending' reply is never sent again (at most once)."""
    counts = await db.inbox_counts()
    unsent = await db.unsent_replies()
    sending = sum(1 for r in unsent if r["reply_state"] == "sending")
    ready = len(unsent) - sending
    stuck = counts.get("received", 0) + counts.get("started", 0)
    parts = [f"{stuck} turn(s) open ({counts.get('started', 0)} started)"] if stuck else []
    if ready:
        parts.append(f"{ready} reply(ies) waiting to be sent")
    if sending:
        parts.append(f"{sending} reply(ies) stopped while sending (not sent again)")
    if not parts:
        return Check("inbox", True, f"nothing open ({sum(counts.values())} rows kept)")
    return Check(
        "inbox",
        True,
        "; ".join(parts) + " (the daemon resolves these when it "
        "starts; open rows while it runs are turns in flight)",
        warn=True,
    )


async def _outbox_check(db: Store, now: float | None = None) -> Check:
    """Platforms whose sends the running daemon's outbox saw failing (it stores them as
    they start and stop failing): their replies are held, not lost, until they expire."""
    try:
        failing = json.loads(await db.get_meta("outbox.failing") or "{}")
    except ValueError:
        failing = {}
    if not failing:
        return Check("outbox", True, "no platform's sends are failing")
    now = time.time() if now is None else now
    named = "; ".join(
        f"{p}: sends failing for {max(0, int(now - float(v.get('since', now))))} s "
        f"({v.get('error') or 'no detail'})"
        for p, v in sorted(failing.items())
    )
    return Check("outbox", False, named + "; replies are held until delivered or expired")


async def run_doctor(
    home: Path,
    config: Config | None,
    config_error: str | None,
    *,
    fix: bool,
    full: bool,
    check_platforms: bool = True,
) -> list[Check]:
    checks = await _state_checks(home, config, config_error, fix=fix, full=full)
    if config is not None and config.backup.directory is not None:
        checks.append(
            await asyncio.to_thread(
                backup_check, config.backup.directory, config.backup.max_age_hours
            )
        )
    if config is not None and check_platforms:
        checks += await _reach(config)
    return checks


async def _state_checks(
    home: Path, config: Config | None, config_error: str | None, *, fix: bool, full: bool
) -> list[Check]:
    checks: list[Check] = []
    checks.append(
        Check(
            "config",
            config is not None,
            config_error or (str(config.path) if config and config.path else "embedded defaults"),
        )
    )
    path = home / "state.db"
    db: Store
    if config is not None and replicated(config.state.backend):
        try:
            settings = {**store_settings(config), "dsn": config.secret("state.dsn_env")}
            db = await open_store(settings, home)
        except Exception as exc:  # an unreachable server is a failed check, not a crash
            checks.append(Check("PostgreSQL", False, str(exc)))
            return checks
        checks.append(Check("PostgreSQL", True, f"connected ({getattr(db, 'where', 'ok')})"))
        checks.append(await _replication_check(db))
    elif not path.exists():
        checks.append(
            Check("state.db", True, f"{path} does not exist yet (created on first run)", warn=True)
        )
        return checks
    else:
        try:
            db = await SessionDB.open(path)
        except Exception as exc:  # the one place a damaged file is reported rather than raised
            checks.append(Check("state.db", False, str(exc)))
            return checks
    try:
        if isinstance(db, Maintenance):  # SQLite's file-level checks
            problems = await db.integrity_check(quick=not full)
            checks.append(
                Check(
                    "state.db integrity",
                    not problems,
                    "ok" if not problems else "; ".join(problems[:3]),
                )
            )
            fts = await db.check_search_index()
            checks.append(Check("search index", not fts, "ok" if not fts else "; ".join(fts)))
        version, latest = await db.schema_version(), db.latest_schema_version()
        checks.append(
            Check("schema", version == latest, f"version {version} (this switchboard: {latest})")
        )
        if isinstance(db, SessionDB):
            wal = (home / "state.db-wal").stat().st_size if (home / "state.db-wal").exists() else 0
            checks.append(
                Check(
                    "WAL size",
                    wal < 256 * 1024 * 1024,
                    f"{wal / 1e6:.1f} MB",
                    warn=wal >= 256 * 1024 * 1024,
                )
            )
        if version >= 12 or not isinstance(db, SessionDB):
            checks.append(await _inbox_check(db))
            checks.append(await _outbox_check(db))
        flush_s = config.sessions.index_flush_seconds if config is not None else 2.0
        index_problems: list[str] = []
        if replicated(db.backend):  # no sessions.json: the routes table, per lease
            index_check = await _routes_check(db)
        else:
            index_check, index_problems = await _index_check(home, db, flush_s)
        if index_problems and fix:
            from gateway.home import HomeLock
            from gateway.index import SessionIndex

            lock = HomeLock(home)
            try:
                lock.acquire()
            except AlreadyRunning as exc:
                index_check = Check(
                    "session index",
                    False,
                    f"{index_check.detail} (not fixed: {exc}; stop it first)",
                )
            else:
                try:
                    index = SessionIndex(home / "sessions" / "sessions.json", db)
                    await index.rebuild()
                    await index.close()
                    index_check = Check(
                        "session index", True, f"rebuilt from state.db ({len(index)} entries)"
                    )
                finally:
                    lock.release()
        checks.append(index_check)
        orphans = await db.count_dangling_parents()
        if orphans and fix:
            fixed = await db.clear_dangling_parents()
            checks.append(
                Check("lineage", True, f"cleared {fixed} parent link(s) to deleted sessions")
            )
        else:
            checks.append(
                Check(
                    "lineage",
                    orphans == 0,
                    "no dangling parent links"
                    if not orphans
                    else f"{orphans} session(s) point at a deleted parent (--fix clears them)",
                )
            )
    finally:
        await db.close()
    return checks


def backup_check(where: str, max_age_hours: float, now: float | None = None) -> Check:
    """The newest archive `switchboard backup` wrote into `where`, by its manifest's time."""
    from datetime import datetime

    from gateway.ops.backups import BackupError, backups_in, read_manifest

    directory = Path(where).expanduser()
    found = backups_in(directory)
    if not found:
        return Check("backup", False, f"none yet in {directory}", warn=True)
    try:
        made = datetime.fromisoformat(read_manifest(found[-1])["created_at"]).timestamp()
    except (BackupError, KeyError, ValueError) as exc:
        return Check("backup", False, f"{found[-1]} is unreadable ({exc})")
    hours = ((time.time() if now is None else now) - made) / 3600
    detail = f"newest {found[-1].name}, {hours:.1f} h old ({len(found)} kept)"
    if hours > max_age_hours:
        return Check(
            "backup", False, f"{detail}: older than backup.max_age_hours ({max_age_hours:g})"
        )
    return Check("backup", True, detail)


def exit_code(checks: list[Check]) -> int:
    return 0 if all(c.ok or c.warn for c in checks) else 1


def as_json(checks: list[Check]) -> str:
    return json.dumps(
        {"ok": exit_code(checks) == 0, "checks": [c.__dict__ for c in checks]}, ensure_ascii=False
    )
