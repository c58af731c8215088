"""The route index (session key -> the live session) and its one-process form, sessions.json
held in memory (`SessionIndex`, also named `JsonRouteIndex`).

`RouteIndex` is what the router, sessions, commands and the Resetter use; several replicas
on PostgreSQL use gateway/topology/routes.py's `PgRouteIndex` instead. In sessions.json,
lookups never touch the disk. Changes mark the index dirty and a debounced flush writes the
whole file atomically (temp file, fsync, rename) at most once per interval, off the event
loop, so a burst of messages costs one write and the cost never depends on message count.
state.db is the source of truth: a missing or corrupt file is rebuilt from it.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from state import Store

log = logging.getLogger("gateway.index")


def iso(ts: float) -> str:
    return _iso_second(int(ts))


@functools.lru_cache(maxsize=4096)
def _iso_second(second: int) -> str:
    # memoised: flushes format thousands of timestamps that fall in the same few seconds
    return datetime.fromtimestamp(second, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@functools.lru_cache(maxsize=65536)
def from_iso(text: str) -> float:
    # memoised: an index holds many entries stamped in the same second
    return datetime.fromisoformat(text).timestamp()  # 3.11 parses the trailing "Z"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    session_id: str
    created_at: float
    updated_at: float  # last user/agent activity: the reset policies' clock
    origin: dict[str, Any]
    display_name: str | None
    platform: str
    chat_type: str

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "origin": {k: v for k, v in self.origin.items() if v is not None},
            "display_name": self.display_name,
            "platform": self.platform,
            "chat_type": self.chat_type,
        }

    def static_part(self) -> tuple[Any, ...]:
        """Everything but updated_at (the one field a turn changes). `origin` is never
        changed in place: a different origin is a different entry."""
        return (
            self.session_id,
            self.created_at,
            self.origin,
            self.display_name,
            self.platform,
            self.chat_type,
        )

    def encode_around_updated_at(self) -> tuple[bytes, bytes]:
        """This entry's JSON object (to_json, compact), split around the updated_at string.
        A quote inside a value is escaped, so the first `"updated_at":"` is the key."""
        text = json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":"))
        marker = '"updated_at":"'
        start = text.index(marker) + len(marker)
        end = text.index('"', start)
        return text[:start].encode(), text[end:].encode()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> IndexEntry:
        return cls(
            session_id=str(d["session_id"]),
            created_at=from_iso(d["created_at"]),
            updated_at=from_iso(d["updated_at"]),
            origin=dict(d.get("origin") or {}),
            display_name=d.get("display_name"),
            platform=str(d.get("platform") or ""),
            chat_type=str(d.get("chat_type") or "dm"),
        )


def _sid(entry: IndexEntry | dict[str, Any]) -> str:
    return entry.session_id if isinstance(entry, IndexEntry) else str(entry["session_id"])


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


class RouteIndex(Protocol):
    """Session key -> its live session's entry. `get` is synchronous (the hot path reads
    memory); changes are the caller's under the key's session lock."""

    async def load(self) -> str: ...

    async def sync_all(self) -> None:
        """Bring every entry up to date before a sweep over `items()` (for an index other
        processes change too; sessions.json is always current)."""
        ...

    def get(self, key: str) -> IndexEntry | None: ...

    def items(self) -> list[tuple[str, IndexEntry]]: ...

    def __len__(self) -> int: ...

    def keys_for_session(self, session_id: str) -> list[str]: ...

    def put(self, key: str, entry: IndexEntry) -> None: ...

    def touch(self, key: str, now: float | None = None) -> None: ...

    def remove(self, key: str) -> IndexEntry | None: ...

    async def close(self) -> None: ...


class SessionIndex:
    """sessions.json (`JsonRouteIndex`): the RouteIndex of one daemon."""

    def __init__(
        self,
        path: Path,
        db: Store,
        flush_interval: float = 2.0,
        activity_interval: float = 30.0,
        *,
        settle_on_close: bool = False,
    ) -> None:
        self.path = path
        self.db = db
        self.settle_on_close = settle_on_close  # the daemon's: see close()
        self.flush_interval = flush_interval
        # Activity (updated_at) alone is persisted at most this often: state.db already has
        # each session's last_active, committed with every message.
        self.activity_interval = max(activity_interval, flush_interval)
        self._touched: set[str] = set()
        self._activity_task: asyncio.Task[None] | None = None
        # Entries read from disk stay as their decoded JSON dicts until first used, so a
        # 100,000-entry index starts in the time it takes to decode the file.
        self._entries: dict[str, IndexEntry | dict[str, Any]] = {}
        self._dirty_keys: set[str] | None = set()
        self._fragments: dict[str, bytes] = {}  # key -> its encoded `"key":{...}` piece
        # key -> (static part, the piece's bytes before and after updated_at): a turn only
        # moves updated_at, so re-encoding a touched entry is a join, not a json.dumps
        self._templates: dict[str, tuple[tuple[Any, ...], bytes, bytes]] = {}
        self._unencoded = False  # fragments must be rebuilt from all entries at the next flush
        self._flush_task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.writes = 0
        self.bytes_written = 0

    # --- loading ----------------------------------------------------------------------

    async def load(self) -> str:
        """Read the file (or rebuild from state.db), then heal entries. Returns how."""
        # The live sessions are read on a reader thread while the file is read and decoded.
        live_query = asyncio.ensure_future(self.db.newest_live_session_by_key())
        try:
            how = await self._read_file()
        except BaseException:
            live_query.cancel()
            await asyncio.gather(live_query, return_exceptions=True)
            raise
        newest = await live_query
        await self._agree(newest, reconcile=how == "loaded", stopping=False)
        return how

    async def _agree(self, newest: dict[str, str], *, reconcile: bool, stopping: bool) -> None:
        """Bring the entries in line with state.db's newest live session of each key.
        One pass: nearly every entry points at its key's newest live session. The rest are
        healed (their session ended or vanished) or superseded (`reconcile`: the file is
        behind). `stopping`: a clean stop settles what other processes changed, which is
        expected then, so it is said at INFO, never as a warning."""
        entries = self._entries
        mismatched = [
            (k, sid)
            for k, v in entries.items()
            if newest.get(k) != (sid := v["session_id"] if type(v) is dict else _sid(v))
        ]
        if mismatched:
            live = set(newest.values())
            await self._heal([(k, sid) for k, sid in mismatched if sid not in live], stopping)
        if reconcile:
            unseen = newest.keys() - entries.keys()
            await self._reconcile(
                newest, [k for k, _ in mismatched if k in newest] + list(unseen), stopping
            )

    async def _read_file(self) -> str:
        how = "loaded"
        try:
            raw = await asyncio.to_thread(self.path.read_bytes)
            # Building 100,000 entries would trigger many cyclic-GC passes over objects
            # that cannot form cycles; pausing it halves start-up on a large index.
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                data = json.loads(raw)
                if not isinstance(data, dict):
                    raise ValueError("top level is not an object")
                try:
                    sids = [value["session_id"] for value in data.values()]
                except (TypeError, KeyError):
                    raise ValueError("an entry has no session_id") from None
                if not all(type(sid) is str for sid in sids):
                    raise ValueError("an entry's session_id is not a string")
                self._entries = data
                self._fragments.clear()
                self._unencoded = True  # the file is current; the cache is not
            finally:
                if gc_was_enabled:
                    gc.enable()
        except FileNotFoundError:
            how = "rebuilt (sessions.json was missing)"
            await self.rebuild()
        except (ValueError, KeyError, TypeError) as exc:
            how = f"rebuilt (sessions.json was unreadable: {exc})"
            await self.rebuild()
        if how != "loaded":
            # a fresh home has neither file nor sessions: nothing to warn about
            level = logging.WARNING if self._entries or "unreadable" in how else logging.DEBUG
            log.log(level, "session index %s from state.db: %d entries", how, len(self._entries))
        return how

    async def rebuild(self) -> None:
        entries: dict[str, IndexEntry | dict[str, Any]] = {}
        for row in await self.db.live_sessions_by_key():
            origin = json.loads(row["origin_json"]) if row["origin_json"] else {}
            entries[row["session_key"]] = IndexEntry(
                session_id=row["id"],
                created_at=row["started_at"],
                updated_at=row["last_active"] or row["started_at"],
                origin=origin,
                display_name=origin.get("chat_name") or origin.get("user_name"),
                platform=row["source"],
                chat_type=row["chat_type"] or "dm",
            )
        self._entries = entries
        self._fragments.clear()
        self._changed_all()

    async def _reconcile(
        self, newest: dict[str, str], candidates: list[str], stopping: bool = False
    ) -> None:
        """The file is written at most every few seconds, so after a crash it can miss a
        session created just before: adopt, per key, the newest live session state.db has.
        (Terminal sessions are not routed by the daemon and are left out.) `candidates`
        are the keys whose entry differed from `newest` before healing."""
        entries = self._entries
        behind = {
            key
            for key in candidates
            if ((v := entries.get(key)) is None or _sid(v) != newest[key])
            and not key.startswith("agent:main:cli:")
        }
        if not behind:
            return  # the common case: a clean stop left the file current
        adopted = 0
        for row in await self.db.live_sessions_by_key():
            key = row["session_key"]
            if key not in behind or row["id"] != newest[key]:
                continue
            origin = json.loads(row["origin_json"]) if row["origin_json"] else {}
            self._entries[key] = IndexEntry(
                session_id=row["id"],
                created_at=row["started_at"],
                updated_at=row["last_active"] or row["started_at"],
                origin=origin,
                display_name=origin.get("chat_name") or origin.get("user_name"),
                platform=row["source"],
                chat_type=row["chat_type"] or "dm",
            )
            self._changed(key)
            adopted += 1
        if adopted and stopping:
            log.info(
                "session index: %d key(s) adopt a newer live session another process started",
                adopted,
            )
        elif adopted:
            log.warning(
                "session index was behind state.db (an unclean stop?): %d entr%s updated",
                adopted,
                "y" if adopted == 1 else "ies",
            )

    async def _heal(self, suspects: list[tuple[str, str]], stopping: bool = False) -> None:
        """Entries whose session is missing are dropped; entries whose session ended follow
        a compression to its live tip, or are dropped. `suspects` are the (key, session)
        entries whose session is not the live session of any key; the rest need no lookup."""
        if not suspects:
            return
        states = await self.db.session_states(list({sid for _, sid in suspects}))
        for key, sid in suspects:
            state = states.get(sid)
            if state is not None and state[0] is None:
                continue  # live, but without a key of its own: kept as it is
            self._changed(key)
            if state is None:
                log.log(
                    logging.INFO if stopping else logging.WARNING,
                    "index entry %s points at a missing session %s%s; dropped",
                    key,
                    sid,
                    " (deleted by another process)" if stopping else "",
                )
                del self._entries[key]
                continue
            tip = await self.db.get_compression_tip(sid)
            tip_state = (await self.db.session_states([tip])).get(tip)
            entry = self._materialise(key)
            if entry is not None and tip != sid and tip_state and tip_state[0] is None:
                self._entries[key] = replace(entry, session_id=tip)
                log.info("index entry %s healed to its compression tip %s", key, tip)
            else:
                self._entries.pop(key, None)
                log.info("index entry %s pointed at ended session %s; dropped", key, sid)

    # --- lookups and changes -------------------------------------------------------------

    def _materialise(self, key: str) -> IndexEntry | None:
        value = self._entries.get(key)
        if value is None or isinstance(value, IndexEntry):
            return value
        try:
            entry = IndexEntry.from_json(value)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("index entry %s is malformed (%s); dropped", key, exc)
            del self._entries[key]
            self._changed(key)
            return None
        self._entries[key] = entry
        return entry

    def get(self, key: str) -> IndexEntry | None:
        return self._materialise(key)

    async def sync_all(self) -> None:
        return None  # one daemon writes this index: memory is current

    def items(self) -> list[tuple[str, IndexEntry]]:
        out = []
        for key in list(self._entries):
            entry = self._materialise(key)
            if entry is not None:
                out.append((key, entry))
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def keys_for_session(self, session_id: str) -> list[str]:
        return [k for k, e in self._entries.items() if _sid(e) == session_id]

    def put(self, key: str, entry: IndexEntry) -> None:
        self._entries[key] = entry
        self._changed(key)

    def touch(self, key: str, now: float | None = None) -> None:
        entry = self._materialise(key)
        if entry is not None:
            # the constructor, not dataclasses.replace: this runs twice per turn
            self._entries[key] = IndexEntry(
                entry.session_id,
                entry.created_at,
                time.time() if now is None else now,
                entry.origin,
                entry.display_name,
                entry.platform,
                entry.chat_type,
            )
            self._touched.add(key)
            if self._activity_task is None or self._activity_task.done():
                try:
                    self._activity_task = asyncio.get_running_loop().create_task(
                        self._activity_flush(), name="gateway.index.activity"
                    )
                except RuntimeError:  # no running loop: the next flush or close() writes it
                    pass

    def remove(self, key: str) -> IndexEntry | None:
        entry = self._materialise(key)
        self._entries.pop(key, None)
        if entry is not None:
            self._changed(key)
        return entry

    # --- persistence -------------------------------------------------------------------

    def _changed(self, key: str) -> None:
        if self._dirty_keys is not None:
            self._dirty_keys.add(key)
        self._schedule_flush()

    def _changed_all(self) -> None:
        self._dirty_keys = None  # re-encode everything at the next flush
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_task is None or self._flush_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._flush_task = loop.create_task(self._debounced_flush(), name="gateway.index.flush")

    async def _activity_flush(self) -> None:
        await asyncio.sleep(self.activity_interval)
        self._promote_touched()
        await self.flush()

    def _promote_touched(self) -> None:
        if self._touched and self._dirty_keys is not None:
            self._dirty_keys |= self._touched
        self._touched = set()

    async def _debounced_flush(self) -> None:
        await asyncio.sleep(self.flush_interval)
        await self.flush()

    @property
    def dirty(self) -> bool:
        return self._dirty_keys is None or bool(self._dirty_keys)

    async def flush(self) -> None:
        """Write the file now if anything changed (one flush at a time).

        Each entry's JSON is cached; only entries that changed since the last flush are
        encoded again, then the cached pieces are joined and written atomically. A burst of
        changes to a 100,000-entry index encodes the changed entries, not all of them."""
        async with self._write_lock:
            if not self.dirty:
                return
            if self._dirty_keys is None or self._unencoded:
                changed: dict[str, IndexEntry | dict[str, Any] | None] = dict(self._entries)
                full = True
                self._unencoded = False
            else:
                changed = {k: self._entries.get(k) for k in self._dirty_keys}
                full = False
            self._dirty_keys = set()
            fragments, templates = self._fragments, self._templates

            def _encode_and_write() -> int:
                if full:
                    fragments.clear()
                    templates.clear()
                for n, (key, value) in enumerate(changed.items(), 1):
                    if n % 500 == 0:
                        time.sleep(0)  # a full re-encode lets the event loop run in between
                    if value is None:
                        fragments.pop(key, None)
                        templates.pop(key, None)
                        continue
                    if not isinstance(value, IndexEntry):  # as read from the file
                        fragments[key] = (
                            json.dumps(key, ensure_ascii=False)
                            + ":"
                            + json.dumps(value, ensure_ascii=False, separators=(",", ":"))
                        ).encode()
                        continue
                    static = value.static_part()
                    template = templates.get(key)
                    if template is None or template[0] != static:
                        head, tail = value.encode_around_updated_at()
                        head = json.dumps(key, ensure_ascii=False).encode() + b":" + head
                        template = templates[key] = (static, head, tail)
                    fragments[key] = template[1] + iso(value.updated_at).encode() + template[2]
                payload = b"{" + b",".join(fragments.values()) + b"}"
                write_atomic(self.path, payload)
                return len(payload)

            try:
                size = await asyncio.to_thread(_encode_and_write)
            except OSError as exc:
                self._dirty_keys = None  # the cache may be ahead of the file: redo it all
                log.error("could not write %s: %s (will retry)", self.path, exc)
                self._schedule_flush()
                return
            self.writes += 1
            self.bytes_written += size

    async def close(self) -> None:
        """The last write. With `settle_on_close`, the entries are first brought in line
        with state.db: while the daemon ran, another process may have deleted a session an
        entry points at (`sessions delete --force`) or started a newer live session for a
        key (`sessions import`). The file a clean stop leaves is then current, and the next
        start has nothing to heal or adopt: its warnings mean an unclean stop."""
        if self._activity_task is not None and not self._activity_task.done():
            self._activity_task.cancel()
            await asyncio.gather(self._activity_task, return_exceptions=True)
        self._promote_touched()
        if self._flush_task is not None and not self._flush_task.done():
            self._flush_task.cancel()
            await asyncio.gather(self._flush_task, return_exceptions=True)
        if self.settle_on_close:
            try:
                newest = await self.db.newest_live_session_by_key()
                await self._agree(newest, reconcile=True, stopping=True)
            except Exception as exc:  # the store is failing: the next start heals instead
                log.error("could not check the session index against state.db: %s", exc)
        await self.flush()


JsonRouteIndex = SessionIndex
