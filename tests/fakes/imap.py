"""A loopback IMAP4rev1 server speaking the subset aioimaplib uses: CAPABILITY, LOGIN,
SELECT (UIDVALIDITY, UIDNEXT), UID SEARCH (UID ranges, ALL, SINCE), UID FETCH (BODY.PEEK[], a
partial BODY.PEEK[]<start.length>, RFC822; as literals), IDLE/DONE with `* N EXISTS` pushes, NOOP and LOGOUT.

One mailbox, held in memory; tests deliver mail with `deliver()`, can switch IDLE off,
change UIDVALIDITY, drop every connection, and read the commands each client sent."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from tests.fakes import wait_for_count

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_ATOM = re.compile(r'"((?:[^"\\]|\\.)*)"|(\S+)')


@dataclass
class Stored:
    uid: int
    raw: bytes
    internal: datetime


@dataclass(eq=False)
class _Conn:
    writer: asyncio.StreamWriter
    selected: bool = False
    idle_tag: str | None = None
    known: int = 0  # EXISTS count this client was told


@dataclass
class FakeImap:
    user: str = "agent@example.com"
    password: str = "s3cret-pw"
    idle: bool = True
    uidvalidity: int = 1000
    mail: list[Stored] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    logins: list[tuple[str, bool]] = field(default_factory=list)
    uidnext: int = 1
    port: int = 0
    tls: ssl.SSLContext | None = None  # implicit TLS (as on port 993)
    _server: asyncio.Server | None = None
    _conns: set[_Conn] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self, port: int = 0) -> None:
        """Listen on `port` (0: any free one; a stopped fake may start again on its old one)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.drop_connections()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._tasks:  # each handler ends on its own once its connection is closed
            await asyncio.wait(set(self._tasks), timeout=5)

    # --- what tests do -------------------------------------------------------------------

    def deliver(self, raw: bytes, internal: datetime | None = None) -> int:
        """Put a message in the mailbox; clients in IDLE hear `* N EXISTS` at once."""
        uid = self.uidnext
        self.uidnext += 1
        self.mail.append(Stored(uid, raw, internal or datetime.now(UTC)))
        for conn in list(self._conns):
            if conn.selected and conn.idle_tag is not None:
                self._exists(conn)
        return uid

    def renumber(self) -> None:
        """A new UIDVALIDITY: every message gets a new UID (as after a mailbox rebuild)."""
        self.uidvalidity += 1
        for i, stored in enumerate(self.mail, start=1):
            stored.uid = i
        self.uidnext = len(self.mail) + 1
        self.drop_connections()

    def drop_connections(self) -> None:
        for conn in list(self._conns):
            conn.writer.close()
        self._conns.clear()

    def sent(self, verb: str) -> list[str]:
        return [c for c in self.commands if c.split(" ", 1)[0] == verb.upper()]

    async def wait_command(self, verb: str, n: int = 1, timeout: float = 5.0) -> list[str]:
        return await wait_for_count(lambda: self.sent(verb), n, timeout, f"{verb} commands")

    # --- the protocol ------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        self._conns.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            writer.write(b"* OK fake IMAP4rev1 server ready\r\n")
            while True:
                line = await reader.readline()
                if not line:
                    return
                text = line.decode("utf-8", "replace").rstrip("\r\n")
                if conn.idle_tag is not None:
                    if text.upper() == "DONE":
                        writer.write(f"{conn.idle_tag} OK IDLE terminated\r\n".encode())
                        conn.idle_tag = None
                    continue
                tag, _, rest = text.partition(" ")
                verb, _, args = rest.partition(" ")
                if verb.upper() == "UID":
                    sub, _, args = args.partition(" ")
                    verb = f"UID {sub.upper()}"
                self.commands.append(f"{verb.upper().replace(' ', '_')} {args}".strip())
                if not await self._command(conn, tag, verb.upper(), args):
                    return
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._conns.discard(conn)
            with contextlib.suppress(Exception):
                writer.close()

    async def _command(self, conn: _Conn, tag: str, verb: str, args: str) -> bool:
        w = conn.writer
        if verb == "CAPABILITY":
            caps = "IMAP4rev1 AUTH=PLAIN" + (" IDLE" if self.idle else "")
            w.write(f"* CAPABILITY {caps}\r\n{tag} OK CAPABILITY completed\r\n".encode())
        elif verb == "LOGIN":
            user, password = (_unquote(a) for a in _atoms(args)[:2])
            ok = (user, password) == (self.user, self.password)
            self.logins.append((user, ok))
            reply = "OK LOGIN completed" if ok else "NO [AUTHENTICATIONFAILED] Invalid credentials"
            w.write(f"{tag} {reply}\r\n".encode())
        elif verb == "SELECT":
            conn.selected, conn.known = True, len(self.mail)
            w.write(
                f"* FLAGS (\\Seen \\Answered)\r\n* {len(self.mail)} EXISTS\r\n* 0 RECENT\r\n"
                f"* OK [UIDVALIDITY {self.uidvalidity}] UIDs valid\r\n"
                f"* OK [UIDNEXT {self.uidnext}] Predicted next UID\r\n"
                f"{tag} OK [READ-WRITE] SELECT completed\r\n".encode()
            )
        elif verb == "UID SEARCH":
            found = self._search(args)
            w.write(f"* SEARCH {' '.join(map(str, found))}\r\n{tag} OK SEARCH done\r\n".encode())
        elif verb == "UID FETCH":
            uid_set, _, parts = args.partition(" ")
            partial = re.search(r"BODY(?:\.PEEK)?\[\]<(\d+)\.(\d+)>", parts)
            for stored in self._in_set(uid_set):
                seq = self.mail.index(stored) + 1
                data, item = stored.raw, "RFC822" if "RFC822" in parts else "BODY[]"
                if partial:  # RFC 3501: BODY[]<start.length> answers BODY[]<start>
                    start, length = int(partial.group(1)), int(partial.group(2))
                    data, item = data[start : start + length], f"BODY[]<{start}>"
                w.write(f"* {seq} FETCH (UID {stored.uid} {item} {{{len(data)}}}\r\n".encode())
                w.write(data + b")\r\n")
            w.write(f"{tag} OK FETCH completed\r\n".encode())
        elif verb == "IDLE" and self.idle:
            conn.idle_tag = tag
            w.write(b"+ idling\r\n")
            if len(self.mail) > conn.known:
                self._exists(conn)
        elif verb == "NOOP":
            if len(self.mail) > conn.known:
                self._exists(conn)
            w.write(f"{tag} OK NOOP completed\r\n".encode())
        elif verb == "LOGOUT":
            w.write(f"* BYE logging out\r\n{tag} OK LOGOUT completed\r\n".encode())
            await w.drain()
            return False
        else:
            w.write(f"{tag} BAD unknown command\r\n".encode())
        return True

    def _exists(self, conn: _Conn) -> None:
        conn.known = len(self.mail)
        conn.writer.write(f"* {conn.known} EXISTS\r\n".encode())

    def _search(self, args: str) -> list[int]:
        words = [_unquote(a) for a in _atoms(args)]
        if words[:1] and words[0].upper() == "CHARSET":
            words = words[2:]
        found = list(self.mail)
        while words:
            word = words.pop(0).upper()
            if word == "UID":
                wanted = {s.uid for s in self._in_set(words.pop(0))}
                found = [s for s in found if s.uid in wanted]
            elif word == "SINCE":
                day = _imap_date(words.pop(0))
                found = [s for s in found if s.internal.date() >= day]
            elif word != "ALL":
                raise ValueError(f"the fake does not search by {word}")
        return [s.uid for s in found]

    def _in_set(self, uid_set: str) -> list[Stored]:
        """RFC 3501 sequence sets over UIDs; `n:*` holds the highest UID even below n."""
        top = max((s.uid for s in self.mail), default=0)
        chosen: set[int] = set()
        for part in uid_set.split(","):
            lo, _, hi = part.partition(":")
            a = top if lo == "*" else int(lo)
            b = a if not hi else top if hi == "*" else int(hi)
            chosen |= {s.uid for s in self.mail if min(a, b) <= s.uid <= max(a, b)}
        return [s for s in self.mail if s.uid in chosen]


def _atoms(text: str) -> list[str]:
    return [m.group(0) for m in _ATOM.finditer(text)]


def _unquote(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] == '"':
        return re.sub(r"\\(.)", r"\1", word[1:-1])
    return word


def _imap_date(text: str) -> date:
    day, month, year = text.split("-")
    return date(int(year), MONTHS.index(month.capitalize()) + 1, int(day))


def self_signed(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A certificate for 127.0.0.1 made with the openssl command (its file, to trust with
    SSL_CERT_FILE) and a server context holding it."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context
