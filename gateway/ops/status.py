"""`switchboard status`: one report on a home, from what the running daemon says on
`/health` and what the store holds, shaped as a stable JSON object (`collect`) and as one
plain-text screen (`render`). It works with the daemon down: the store and the config
still answer, and the report says the daemon is not running."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BACKUP_META = "backup:last"  # written by a whole-store `sessions export`: {at, sessions, file}
HEALTH_TIMEOUT_S = 3.0
SHAPE_VERSION = 1
EXIT_NOT_RUNNING = 3  # as `systemctl status` says of a unit that is not active


def health_url(data: Mapping[str, Any]) -> str | None:
    """Where the daemon's HTTP API answers on this machine, from the config's values (None
    when the API is off)."""
    api = data["platforms"]["api"]
    if not api["enabled"]:
        return None
    host = api["host"]
    if host in ("0.0.0.0", "", "::"):  # listening everywhere: loopback reaches it
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{api['port']}"


async def fetch_health(url: str) -> tuple[dict[str, Any] | None, str | None]:
    """The daemon's /health body, or why it could not be had."""
    import aiohttp

    try:
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            async with http.get(f"{url}/health") as resp:
                body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return None, f"{url}/health did not answer ({type(exc).__name__})"
    if not isinstance(body, dict):
        return None, f"{url}/health answered something else than a JSON object"
    return body, None


def _midnight_utc(now: float) -> float:
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day.timestamp()


async def _store_part(
    home: Path, data: Mapping[str, Any], secrets: Mapping[str, str], now: float
) -> tuple[dict[str, Any], dict[str, Any], dict[str, int] | None]:
    """(store, sessions, inbox counts) read from the store the config names."""
    from dataclasses import asdict

    from gateway.config import StateSettings
    from gateway.sections import build
    from gateway.wiring import replicated
    from state import SessionDB, Store, open_store

    backend = data["state"]["backend"]
    store: dict[str, Any] = {
        "backend": backend,
        "path": None,
        "bytes": None,
        "last_backup": None,
        "error": None,
    }
    sessions: dict[str, Any] = {"live": None, "messages_today": None}
    if not replicated(backend):
        path = home / "state.db"
        store["path"] = str(path)
        if not path.exists():
            store["error"] = "no state.db yet (the daemon creates it at its first start)"
            return store, sessions, None
    db: Store
    try:
        if not replicated(backend):
            db = await SessionDB.open(home / "state.db")
        else:
            settings = {
                **asdict(build(StateSettings, data["state"])),
                "dsn": secrets.get("state.dsn_env"),
            }
            db = await open_store(settings, home)
    except Exception as exc:  # an unreachable server, a damaged file: reported, not raised
        store["error"] = f"cannot open the store ({type(exc).__name__}: {exc})"
        return store, sessions, None
    try:
        stats = await db.stats()
        store["bytes"] = int(stats["db_bytes"]) + int(stats["wal_bytes"])
        sessions["live"] = int(stats["live_sessions"] or 0)
        sessions["messages_today"] = int(
            (await db.insights(_midnight_utc(now), now + 1))["messages"]
        )
        raw = await db.get_meta(BACKUP_META)
        if raw:
            store["last_backup"] = json.loads(raw)
        inbox = await db.inbox_counts()
        sessions["outbox_pending"] = await db.sends_pending()
    finally:
        await db.close()
    return store, sessions, inbox


async def collect(
    home: Path, data: Mapping[str, Any], secrets: Mapping[str, str], problems: list[str]
) -> dict[str, Any]:
    """The report (the shape docs/operator-commands.md documents as `status --json`);
    `home` is absolute."""
    from gateway.home import version
    from gateway.ops.daemon import running_pid

    now = time.time()
    pid = running_pid(home)
    url = health_url(data)
    health, why = (None, None)
    if pid is not None and url is not None:
        health, why = await fetch_health(url)
    elif pid is not None:
        why = "the HTTP API is off (platforms.api.enabled: false): nothing to ask"
    replica = (health or {}).get("replica")
    daemon = {
        "running": pid is not None,
        "pid": pid,
        "health": (health or {}).get("status") if health else None,
        "url": url,
        "version": (health or {}).get("version"),
        "uptime_seconds": (health or {}).get("uptime_seconds"),
        "replica": replica.get("name") if isinstance(replica, dict) else None,
        "leader": replica.get("leader") if isinstance(replica, dict) else None,
        "live_replicas": replica.get("live_replicas") if isinstance(replica, dict) else None,
        "error": why,
        "last_error": (health or {}).get("last_error"),
    }
    adapters: dict[str, dict[str, Any]] = {}
    enabled = [name for name, p in data["platforms"].items() if p.get("enabled")]
    reported = (health or {}).get("adapters") or {}
    for name in sorted(set(enabled) | set(reported)):
        h = reported.get(name) if isinstance(reported.get(name), dict) else None
        adapters[name] = {
            "enabled": name in enabled,
            "state": str(h.get("state")) if h else ("stopped" if pid is None else "unknown"),
            "last_error": (h or {}).get("last_error"),
        }
    store, sessions, inbox = await _store_part(home, data, secrets, now)
    if health is not None and health.get("sessions") is not None:
        sessions["in_index"] = health.get("sessions")
    outbox = sessions.pop("outbox_pending", None)  # one-off sends waiting (state/sqlite/sends.py)
    reset = data["session_reset"]
    return {
        "shape": SHAPE_VERSION,
        "home": str(home),
        "cli_version": version(),
        "checked_at": now,
        "daemon": daemon,
        "adapters": adapters,
        "queues": {
            "writer": (health or {}).get("writer_queue_depth"),
            "turns_in_flight": (health or {}).get("turns_in_flight"),
            "unsent_replies": (health or {}).get("unsent_replies"),
            # rows other programs wrote into the store that search does not see yet
            "indexing": (health or {}).get("indexing_backlog"),
            # replies and sends the daemon's outbox holds for a platform that is not taking them
            "held": _held((health or {}).get("outbox")),
            "inbox": inbox,
            "outbox": outbox,
        },
        "sessions": sessions,
        "store": store,
        "reset": {
            "mode": reset["mode"],
            "sweep_seconds": reset["sweep_seconds"],
            "next_sweep": (health or {}).get("next_reset_sweep"),
        },
        "config_problems": problems,
    }


def exit_code(report: Mapping[str, Any]) -> int:
    """0: the daemon runs and says ok; 1: it runs degraded or cannot be asked; 3: it is not
    running."""
    daemon = report["daemon"]
    if not daemon["running"]:
        return EXIT_NOT_RUNNING
    return 0 if daemon["health"] == "ok" else 1


def _clean(value: object) -> str:
    """Data from the daemon or the store, on one terminal line: control characters shown
    as escapes, never interpreted."""
    text = str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _duration(seconds: float) -> str:
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {s}s" if minutes else f"{s}s"


def _at(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ts else "-"


def render(report: Mapping[str, Any]) -> str:
    """The report as one plain-text screen."""
    d = report["daemon"]
    lines = [f"switchboard {_clean(report['cli_version'])}   home {_clean(report['home'])}", ""]
    if not d["running"]:
        lines.append("daemon     not running")
    else:
        line = f"daemon     running, pid {d['pid']}"
        if d["health"]:
            line += f", {_clean(d['health'])}"
        if d["uptime_seconds"] is not None:
            line += f", up {_duration(float(d['uptime_seconds']))}"
        if d["version"]:
            line += f", version {_clean(d['version'])}"
        lines.append(line)
        if d["replica"]:
            role = "leader" if d["leader"] else "follower"
            lines.append(f"replica    {_clean(d['replica'])} ({role}; {d['live_replicas']} live)")
        if d["error"]:
            lines.append(f"           {_clean(d['error'])}")
        if d["last_error"]:
            lines.append(f"last error {_clean(d['last_error'])}")
    lines.append("")
    if report["adapters"]:
        lines.append("adapters")
        for name, a in report["adapters"].items():
            state = _clean(a["state"]) + ("" if a["enabled"] else " (not enabled in config)")
            lines.append(f"  {_clean(name):<12} {state}")
            if a["last_error"]:
                lines.append(f"  {'':<12} last error: {_clean(a['last_error'])}")
    else:
        lines.append("adapters   none enabled")
    q = report["queues"]
    inbox = q["inbox"] or {}
    waiting = sum(n for state, n in inbox.items() if state in ("received", "started"))
    lines += [
        "",
        "queues     "
        + ", ".join(
            [
                f"writer {q['writer'] if q['writer'] is not None else '-'}",
                f"turns in flight {q['turns_in_flight'] if q['turns_in_flight'] is not None else '-'}",
                f"inbox open {waiting}",
                f"unsent replies {q['unsent_replies'] if q['unsent_replies'] is not None else '-'}",
                f"outbox {q['outbox'] if q['outbox'] is not None else '-'}",
                f"held {q['held'] if q.get('held') is not None else '-'}",
            ]
            + ([f"indexing {q['indexing']}"] if q.get("indexing") else [])
        ),
    ]
    s = report["sessions"]
    live = "-" if s["live"] is None else s["live"]
    today = "-" if s["messages_today"] is None else s["messages_today"]
    lines.append(f"sessions   {live} live, {today} messages today (UTC)")
    st = report["store"]
    where = f" {_clean(st['path'])}" if st["path"] else ""
    lines.append(f"store      {st['backend']}{where}, {_size(st['bytes'])}")
    if st["error"]:
        lines.append(f"           {_clean(st['error'])}")
    backup = st["last_backup"]
    if isinstance(backup, dict):
        lines.append(
            f"backup     {_at(backup.get('at'))}, {backup.get('sessions')} sessions "
            f"to {_clean(backup.get('file'))}"
        )
    else:
        lines.append("backup     none recorded (switchboard sessions export FILE)")
    r = report["reset"]
    nxt = _at(r["next_sweep"]) if r["next_sweep"] else "- (the daemon is not running)"
    lines.append(f"reset      {_clean(r['mode'])}, sweep every {r['sweep_seconds']}s, next {nxt}")
    for problem in report["config_problems"]:
        lines.append(f"config     {_clean(problem)}")
    return "\n".join(lines)


def _held(outbox: Any) -> int | None:
    """The outbox's held items, all platforms (None: no daemon answered)."""
    if not isinstance(outbox, dict) or not isinstance(outbox.get("pending"), dict):
        return None
    return sum(int(n) for n in outbox["pending"].values())
