"""The IMAP side of the email adapter, on aioimaplib: log in, select the folder, hand each
new message (by UID) to the adapter, then wait with IDLE (or poll when the server has no
IDLE), reconnecting with backoff after a network failure.

The place in the folder is UIDVALIDITY plus the last UID handled, kept through the
gateway's cursors and advanced only after the adapter's handler returned for that UID, so
a restart neither answers a mail twice nor skips one that arrived while it was down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.adapters.base import DEFAULT_BACKOFF, Backoff, Cursors
from gateway.errors import InvalidToken, TransientError

log = logging.getLogger("gateway.adapters.email")
MAX_FETCH_BYTES = 4 * 1024 * 1024  # what is read of one mail (its attachments are not used)
IDLE_REFRESH_S = 25 * 60.0  # RFC 2177: re-issue IDLE before 29 minutes
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_FETCH_UID = re.compile(rb"FETCH \(.*UID (\d+)")
Handler = Callable[[int, bytes], Awaitable[None]]


@dataclass(frozen=True)
class ImapAccount:
    host: str
    port: int
    tls: str  # "tls" (implicit) or "plain" (loopback only)
    user: str
    password: str
    folder: str = "INBOX"
    timeout_s: float = 30.0


class Connection:
    """One logged-in IMAP connection with the folder selected."""

    def __init__(self, account: ImapAccount) -> None:
        self.account = account
        self.client: Any = None
        self.lost = asyncio.Event()
        self.uidvalidity = 0
        self.uidnext = 0

    async def open(self) -> None:
        """Connect, log in and select; InvalidToken when the server refuses the login,
        TransientError for anything a retry may cure."""
        import aioimaplib

        a = self.account
        context = ssl.create_default_context() if a.tls == "tls" else None
        try:
            self.client = aioimaplib.IMAP4(
                host=a.host,
                port=a.port,
                timeout=a.timeout_s,
                ssl_context=context,
                conn_lost_cb=lambda _exc: self.lost.set(),
            )
            await self.client.wait_hello_from_server()
            login = await self.client.login(a.user, a.password)
        except (OSError, TimeoutError, aioimaplib.AioImapException) as exc:
            await self.close()
            raise TransientError(f"IMAP {a.host}:{a.port} unreachable ({_why(exc)})") from exc
        if login.result != "OK":
            await self.close()
            raise InvalidToken(f"IMAP login refused for {a.user}: {_text(login.lines)}")
        try:
            selected = await self._ok(self.client.select(_quote(a.folder)), "SELECT")
        except TransientError:
            await self.close()
            raise
        for line in selected.lines:
            found = re.search(rb"\[(UIDVALIDITY|UIDNEXT) (\d+)\]", bytes(line))
            if found and found.group(1) == b"UIDVALIDITY":
                self.uidvalidity = int(found.group(2))
            elif found:
                self.uidnext = int(found.group(2))

    @property
    def has_idle(self) -> bool:
        return bool(self.client is not None and self.client.has_capability("IDLE"))

    async def _ok(self, call: Awaitable[Any], what: str) -> Any:
        import aioimaplib

        try:
            response = await call
        except (OSError, TimeoutError, aioimaplib.AioImapException) as exc:
            raise TransientError(f"IMAP {what} failed ({_why(exc)})") from exc
        if response.result != "OK":
            raise TransientError(f"IMAP {what} answered {response.result}: {_text(response.lines)}")
        return response

    async def search(self, *criteria: str) -> list[int]:
        response = await self._ok(self.client.uid_search(*criteria, charset=None), "UID SEARCH")
        uids: list[int] = []
        for line in response.lines[:-1]:  # aioimaplib strips "* SEARCH"; the last is the status
            uids += [int(w) for w in bytes(line).split() if w.isdigit()]
        return sorted(set(uids))

    async def fetch(self, uid: int) -> bytes | None:
        """The message's first MAX_FETCH_BYTES (BODY.PEEK[]: its \\Seen flag is left as it
        was). The text comes first in a mail; a huge attachment is cut, never a timeout."""
        items = f"(UID BODY.PEEK[]<0.{MAX_FETCH_BYTES}>)"
        response = await self._ok(self.client.uid("fetch", str(uid), items), "UID FETCH")
        lines = response.lines
        for i, line in enumerate(lines[:-1]):
            head = bytes(line)
            found = _FETCH_UID.search(head)
            if found and int(found.group(1)) == uid and head.rstrip().endswith(b"}"):
                return bytes(lines[i + 1])
        return None

    async def wait(self, poll_s: float) -> None:
        """Until the server says something changed (IDLE) or `poll_s` passed (no IDLE)."""
        if not self.has_idle:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lost.wait(), poll_s)
            if self.lost.is_set():
                raise TransientError("IMAP connection lost")
            await self._ok(self.client.noop(), "NOOP")
            return
        import aioimaplib

        try:
            idle = await self.client.idle_start(timeout=IDLE_REFRESH_S)
            push = asyncio.ensure_future(self.client.wait_server_push(IDLE_REFRESH_S + 30))
            lost = asyncio.ensure_future(self.lost.wait())
            try:
                await asyncio.wait({push, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                push.cancel()
                lost.cancel()
            if self.lost.is_set():
                raise TransientError("IMAP connection lost during IDLE")
            self.client.idle_done()
            await asyncio.wait_for(idle, self.account.timeout_s)
        except (OSError, TimeoutError, aioimaplib.AioImapException) as exc:
            raise TransientError(f"IMAP IDLE failed ({_why(exc)})") from exc

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        with contextlib.suppress(Exception):
            if not self.lost.is_set() and client.get_state() in ("AUTH", "SELECTED"):
                if client.has_pending_idle():
                    client.idle_done()
                await asyncio.wait_for(client.logout(), 5)
        with contextlib.suppress(Exception):
            if client.protocol.transport is not None:
                client.protocol.transport.close()


@dataclass
class Place:
    """Where we are in the folder: its UIDVALIDITY, the last UID handled, and the UTC day
    of the last advance (the fallback search after a UIDVALIDITY change starts there)."""

    uidvalidity: int
    uid: int
    day: str

    def dumps(self) -> str:
        return json.dumps({"uidvalidity": self.uidvalidity, "uid": self.uid, "day": self.day})

    @classmethod
    def loads(cls, text: str | None) -> Place | None:
        try:
            data = json.loads(text or "")
            return cls(int(data["uidvalidity"]), int(data["uid"]), str(data["day"]))
        except (ValueError, KeyError, TypeError):
            return None


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


class Watcher:
    """Keeps one connection open and hands every new UID to `handle`, in order."""

    def __init__(
        self,
        account: ImapAccount,
        handle: Handler,
        *,
        poll_s: float,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.account = account
        self.handle = handle
        self.poll_s = poll_s
        self.backoff = backoff
        self.cursors: Cursors | None = None
        self.place: Place | None = None
        self.conn: Connection | None = None
        self.mode = "connecting"  # "idle" or "polling" once connected
        self.last_error: str | None = None
        self.failed: str | None = None

    @property
    def cursor_name(self) -> str:
        return f"imap:{self.account.user}@{self.account.host}/{self.account.folder}"

    async def connect(self) -> None:
        """Open a connection and settle where to start (InvalidToken on a refused login)."""
        conn = Connection(self.account)
        await conn.open()
        self.conn = conn
        self.mode = "idle" if conn.has_idle else "polling"
        if self.place is None and self.cursors is not None:
            self.place = Place.loads(await self.cursors.get(self.cursor_name))
        if self.place is None:  # first start: the folder's mail so far is history
            top = conn.uidnext - 1 if conn.uidnext else max(await conn.search("ALL"), default=0)
            self.place = Place(conn.uidvalidity, top, _today())
            await self._save()
            log.info("email: starting at UID %d of %s", top, self.account.folder)

    async def run(self) -> None:
        attempt = 0
        while True:
            try:
                if self.conn is None:
                    await self.connect()
                    attempt = 0
                assert self.conn is not None
                await self.catch_up(self.conn)
                await self.conn.wait(self.poll_s)
            except InvalidToken as exc:
                self.failed = str(exc)
                log.error("email adapter stopped: %s", exc)
                await self.close()
                return
            # a network failure, NotAccepted, or a surprise: our place is kept, and retried
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                await self.close()
                delay = self.backoff.delay(attempt)
                attempt += 1
                if isinstance(exc, TransientError):
                    log.warning("email: %s; retrying in %.1fs", exc, delay)
                else:
                    log.exception("email: unexpected failure; retrying in %.1fs", delay)
                await asyncio.sleep(delay)

    async def catch_up(self, conn: Connection) -> None:
        """Hand over every message after our place; search again until nothing is new
        (a server may report new mail in ways aioimaplib does not pass on)."""
        assert self.place is not None
        if self.place.uidvalidity != conn.uidvalidity:
            since = datetime.fromisoformat(self.place.day) - timedelta(days=1)
            log.warning(
                "email: UIDVALIDITY of %s changed (%d -> %d); re-reading mail since %s, "
                "answered mail is recognised by Message-ID",
                self.account.folder,
                self.place.uidvalidity,
                conn.uidvalidity,
                since.date(),
            )
            imap_day = f"{since.day}-{MONTHS[since.month - 1]}-{since.year}"
            again = await conn.search("SINCE", imap_day)
            for uid in again:
                await self._one(conn, uid)
            self.place = Place(conn.uidvalidity, max([conn.uidnext - 1, 0, *again]), _today())
            await self._save()
        while True:
            fresh = [
                u for u in await conn.search("UID", f"{self.place.uid + 1}:*") if u > self.place.uid
            ]
            if not fresh:
                return
            for uid in fresh:
                await self._one(conn, uid)

    async def _one(self, conn: Connection, uid: int) -> None:
        raw = await conn.fetch(uid)
        if raw is not None:
            await self.handle(uid, raw)  # NotAccepted (a TransientError) keeps our place
        assert self.place is not None
        if self.place.uidvalidity == conn.uidvalidity and uid > self.place.uid:
            self.place = Place(conn.uidvalidity, uid, _today())
            await self._save()

    async def _save(self) -> None:
        if self.cursors is not None and self.place is not None:
            await self.cursors.set(self.cursor_name, self.place.dumps())

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        self.mode = "connecting"
        if conn is not None:
            await conn.close()


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _text(lines: list[Any]) -> str:
    return " ".join(bytes(line).decode("utf-8", "replace") for line in lines)[:200]


def _quote(folder: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_./-]+", folder):
        return folder
    return '"' + folder.replace("\\", "\\\\").replace('"', '\\"') + '"'
