"""Email, on aioimaplib (IMAP IDLE, or polling) and aiosmtplib (SMTP), one session per sender.

A fresh mail goes to its sender's session (chat_id = the lower-case address), and so does
every reply in its chain; a chain rooted in a mail this adapter opened with create_thread
(a handoff) is that thread's own session. Replies quote the original and keep the thread
headers; auto-replies, bounces and lists are never answered (see docs in the README).
Every IMAP connection sees every new mail, so among replicas one watches the folder
(gateway.shards.Receiver), from the UID the last watcher stored; the others only send.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from email.utils import formataddr
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Cursors,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    UsesCursors,
    UsesShards,
    call_with_retry,
    check_send_by,
    failed,
    stop_task,
)
from gateway.adapters.email_imap import ImapAccount, Watcher
from gateway.adapters.email_inbound import THREAD_MARK, Mail, parse_mail, received_at
from gateway.adapters.email_outbound import Original, compose
from gateway.errors import AdapterError, ConfigError, InvalidToken, PlatformRefused, TransientError
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, env_name, in_range, one_of, setting
from gateway.session_keys import SessionSource
from gateway.shards import Receiver, ShardLedger
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.email")
REMEMBERED = 2_000  # originals kept in memory for quoting and threading replies
LOOPBACK = ("127.0.0.1", "::1", "localhost")
IMAP_PORTS = {"tls": 993, "plain": 143}
SMTP_PORTS = {"tls": 465, "starttls": 587, "plain": 25}
FRESH_SUBJECT = "A message from your agent"


def _address(v: Any) -> str | None:
    return None if "@" in str(v) and " " not in str(v) else f"must be an email address (got {v!r})"


@dataclass(frozen=True)
class EmailSettings(PlatformSettings):
    require_mention: bool = setting(False)  # true: answer only mail naming `address` in To/Cc
    address: str | None = setting(None, _address, "our From address")
    imap_host: str | None = setting(None)
    imap_port: int | None = setting(None, in_range(1, 65535))
    imap_tls: str = setting("tls", one_of("tls", "plain"))
    imap_user: str | None = setting(None)
    smtp_host: str | None = setting(None)
    smtp_port: int | None = setting(None, in_range(1, 65535))
    smtp_tls: str = setting("starttls", one_of("tls", "starttls", "plain"))
    smtp_user: str | None = setting(None)
    smtp_password_env: str | None = setting(None, env_name, "SMTP password env var")
    folder: str = setting("INBOX")
    poll_seconds: float = setting(60.0, in_range(1, 3600))


@dataclass(frozen=True)
class SmtpAccount:
    host: str
    port: int
    tls: str
    user: str
    password: str
    timeout_s: float = 30.0


def to_inbound(
    mail: Mail,
    our_address: str,
    *,
    fallback_id: str,
    require_mention: bool = False,
    spelling: Mapping[str, str] | None = None,
    now: float = 0.0,
) -> InboundMessage | None:
    """A parsed mail as an InboundMessage, or None when it gets no answer. `spelling` maps
    a lower-case address to how allowed_users/admins write it (the core compares ids
    exactly; addresses are case-insensitive)."""
    if mail.skip:
        log.info("email from %s not answered: %s", mail.sender or "?", mail.skip)
        return None
    text = mail.text or mail.subject
    if not text.strip():
        return None
    ours = our_address.lower()
    root = mail.root
    thread = root if root and is_our_thread(root, ours) else None
    source = SessionSource(
        platform="email",
        chat_id=mail.sender,
        chat_type=ChatType.THREAD if thread else ChatType.DM,
        user_id=(spelling or {}).get(mail.sender, mail.sender),
        user_name=mail.sender_name,
        thread_id=thread,
    )
    return InboundMessage(
        source=source,
        text=text,
        platform_message_id=mail.message_id or fallback_id,
        received_at=received_at(mail, now),
        reply_to=mail.message_id or fallback_id,
        mentioned=not require_mention or ours in mail.to or ours in mail.cc,
    )


def is_our_thread(message_id: str, our_address: str) -> bool:
    """A Message-ID create_thread made: `<switchboard-thread.<hex>@<our domain>>`."""
    local, _, domain = message_id.strip("<>").partition("@")
    return (
        local.startswith(THREAD_MARK) and domain.lower() == our_address.rpartition("@")[2].lower()
    )


class EmailAdapter(UsesCursors, UsesShards, Outbound, SetupSteps):
    platform: ClassVar[str] = "email"
    settings: ClassVar[type[EmailSettings]] = EmailSettings
    drain_per_second: ClassVar[float] = (
        2.0  # the outbox's backlog pace (email: cautious, mail servers throttle bursts)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("aioimaplib", "aiosmtplib")

    # --- the platform, as the core sees it -------------------------------------------

    @classmethod
    def secrets_needed(cls, settings: EmailSettings) -> list[SecretNeed]:
        needs = [SecretNeed("token_env", "EMAIL_PASSWORD", "the mailbox password")]
        if settings.smtp_password_env:
            needs.append(
                SecretNeed("smtp_password_env", "EMAIL_SMTP_PASSWORD", "the SMTP password")
            )
        return needs

    @classmethod
    def problems(cls, settings: EmailSettings, api_enabled: bool) -> list[ConfigError]:
        out, key = [], "platforms.email."
        for lib in ("aioimaplib", "aiosmtplib"):
            if importlib.util.find_spec(lib) is None:
                out.append(
                    ConfigError(
                        "platforms.email",
                        f"needs the {lib} package: pip install 'switchboard[email]'",
                    )
                )
        for name in ("address", "imap_host", "smtp_host"):
            if not getattr(settings, name):
                out.append(ConfigError(key + name, "is required when email is enabled"))
        for name, host in (("imap_tls", settings.imap_host), ("smtp_tls", settings.smtp_host)):
            if getattr(settings, name) == "plain" and host and host not in LOOPBACK:
                out.append(
                    ConfigError(
                        key + name,
                        f"plain (no TLS) is allowed only for a loopback host, not {host}",
                    )
                )
        if settings.base_url is not None:
            out.append(
                ConfigError(key + "base_url", "is not used by email (set imap_host and smtp_host)")
            )
        for name in ("allowed_users", "admins"):
            for entry in getattr(settings, name):
                if _address(entry) or "*" in str(entry):
                    out.append(
                        ConfigError(key + name, f"must list whole email addresses (got {entry!r})")
                    )
        return out

    @classmethod
    def from_config(cls, settings: EmailSettings, secrets: Mapping[str, str]) -> EmailAdapter:
        imap, smtp = _accounts(settings, secrets)
        allowed = None if settings.allow_all_users else (*settings.allowed_users, *settings.admins)
        return cls(
            str(settings.address),
            imap,
            smtp,
            poll_s=settings.poll_seconds,
            require_mention=settings.require_mention,
            allowed=allowed,
        )

    @classmethod
    def setup_steps(cls, settings: EmailSettings) -> list[str]:
        """What to do on email's side (`switchboard setup` prints it)."""
        return [
            "a mailbox for the agent with IMAP and SMTP access; many providers want an app "
            "password (EMAIL_PASSWORD) rather than the account password",
            "have the mail server check SPF, DKIM and DMARC: whoever controls a From header "
            "can write as an allowed sender",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {}

    @classmethod
    async def check_credentials(
        cls, settings: EmailSettings, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        from gateway.adapters.email_imap import Connection

        imap, smtp = _accounts(settings, secrets)
        imap, smtp = replace(imap, timeout_s=10.0), replace(smtp, timeout_s=10.0)
        conn = Connection(imap)
        try:
            await conn.open()
        except (InvalidToken, TransientError) as exc:
            return False, str(exc)
        finally:
            await conn.close()
        try:
            await _smtp_login(smtp)
        except (InvalidToken, TransientError, AdapterError) as exc:
            return False, str(exc)
        return True, f"{settings.address} (IMAP {imap.host}, SMTP {smtp.host})"

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        """A home is a person's address: their one-to-one session."""
        return "dm"

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        """A thread is the Message-ID of the mail create_thread sent to an address."""
        return SessionSource(
            cls.platform,
            thread.chat_id,
            ChatType.THREAD,
            user_id=thread.chat_id,
            thread_id=thread.thread_id,
        )

    # --- one running mailbox ---------------------------------------------------------

    def __init__(
        self,
        address: str,
        imap: ImapAccount,
        smtp: SmtpAccount,
        *,
        poll_s: float = 60.0,
        require_mention: bool = False,
        allowed: tuple[str | int, ...] | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self.address = address.strip()
        self.smtp = smtp
        self._require_mention = require_mention
        # who may write (None: anyone); lower-case address -> the config's own spelling
        self._spelling = None if allowed is None else {str(a).lower(): str(a) for a in allowed}
        self._backoff = backoff
        self.watcher = Watcher(imap, self._on_mail, poll_s=poll_s, backoff=backoff)
        self._task: asyncio.Task[None] | None = None
        self._emit: Emit | None = None
        self._originals: OrderedDict[str, Original] = OrderedDict()
        self._last: OrderedDict[tuple[str, str | None], str] = OrderedDict()
        self._subjects: dict[str, str] = {}  # thread root -> subject, for threads we opened
        self._notices: dict[str, list[str]] = {}  # reply_to -> notices held for the reply
        self._receiver = Receiver(self.platform, self._watch, self._unwatch)
        self.state: str = AdapterState.STOPPED

    def use_cursors(self, cursors: Cursors) -> None:
        self.watcher.cursors = cursors

    def use_shards(self, ledger: ShardLedger) -> None:
        """Among replicas: watch the folder only while this replica owns the watch."""
        self._receiver.use(ledger)

    async def open_outbound(self) -> None:
        """Ready to send, receiving nothing (`switchboard send` without a daemon): the
        SMTP login, no IMAP watch."""
        await _smtp_login(self.smtp)

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        await self._receiver.start()
        try:
            await _smtp_login(self.smtp)
        except InvalidToken as exc:
            await self.stop()
            self._refused(str(exc))
            raise
        except (TransientError, AdapterError) as exc:
            log.warning("email: SMTP not reachable yet (%s); replies will retry", exc)
        self.state = AdapterState.RUNNING
        log.info(
            "email as %s (%s)",
            self.address,
            self.watcher.mode if self._receiver.receiving else "sending only",
        )

    async def _watch(self) -> None:
        """Connect and follow the folder from the stored place: after a takeover, the UID
        the last watching replica handled (InvalidToken on a refused login)."""
        await self._unwatch()
        self.watcher.place = None
        try:
            await self.watcher.connect()
        except InvalidToken as exc:
            self._refused(str(exc))
            raise
        except TransientError as exc:  # the loop below keeps trying
            self.watcher.last_error = str(exc)
            log.warning("email: %s; will retry", exc)
        self._task = asyncio.create_task(self._run(), name="email.imap")

    async def _unwatch(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        await self.watcher.close()

    def _refused(self, why: str) -> None:
        self.state = failed(why)
        log.error("email adapter stopped: %s", why)

    async def _run(self) -> None:
        await self.watcher.run()
        if self.watcher.failed:
            self.state = failed(self.watcher.failed)

    async def stop(self) -> None:
        await self._receiver.stop()
        await self._unwatch()
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "address": self.address,
            "imap": self.watcher.mode,
            "last_error": self.watcher.last_error,
            **self._receiver.health(),
        }

    # --- inbound ------------------------------------------------------------------------

    async def _on_mail(self, uid: int, raw: bytes) -> None:
        try:
            mail = parse_mail(raw, self.address)
        except Exception as exc:  # a mail we cannot read must not hold up the folder
            log.warning("email: UID %d could not be read (%s); skipped", uid, type(exc).__name__)
            return
        if self._spelling is not None and mail.sender not in self._spelling and not mail.skip:
            # never answered: a refusal would go to an address anyone can forge
            log.info("email from %s ignored: not in allowed_users", mail.sender)
            return
        fallback = f"<uid.{self.watcher.conn.uidvalidity if self.watcher.conn else 0}.{uid}@imap>"
        msg = to_inbound(
            mail,
            self.address,
            fallback_id=fallback,
            spelling=self._spelling,
            require_mention=self._require_mention,
            now=time.time(),
        )
        if msg is None or self._emit is None:
            return
        sender = formataddr((mail.sender_name, mail.sender)) if mail.sender_name else mail.sender
        self._remember(
            str(msg.reply_to),
            Original(
                str(msg.reply_to), mail.subject, mail.date, sender, mail.text, mail.references
            ),
        )
        self._last[(msg.source.chat_id, msg.source.thread_id)] = str(msg.reply_to)
        await self._emit(msg)  # NotAccepted propagates: the watcher keeps its place

    def _remember(self, message_id: str, original: Original) -> None:
        self._originals[message_id] = original
        for table in (self._originals, self._last):
            while len(table) > REMEMBERED:
                table.popitem(last=False)

    # --- outbound -----------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        if msg.notice and msg.reply_to:  # said in the answer's mail, not a mail of its own
            self._notices.setdefault(msg.reply_to, []).append(msg.text)
            while len(self._notices) > REMEMBERED:  # a notice whose answer never came
                self._notices.pop(next(iter(self._notices)))
            return SentRef(self.platform, msg.chat_id, ())
        text = "\n\n".join([*self._notices.pop(msg.reply_to or "", []), msg.text])
        original = self._originals.get(msg.reply_to or "") or self._originals.get(
            self._last.get((msg.chat_id, msg.thread_id), "")
        )
        root = msg.thread_id if original is None else None
        subject = f"Re: {self._subjects[root]}" if root in self._subjects else FRESH_SUBJECT
        mail = compose(
            sender=self.address,
            to=msg.chat_id,
            text=text,
            subject=subject,
            original=original,
            thread_root=root,
        )
        await self._deliver(mail, msg.chat_id)
        return SentRef(self.platform, msg.chat_id, (str(mail["Message-ID"]),))

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        """A new mail with `name` as its subject; its Message-ID is the thread."""
        domain = self.address.rpartition("@")[2]
        root = f"<{THREAD_MARK}{uuid.uuid4().hex}@{domain}>"
        subject = " ".join(name.split())[:200] or "A conversation"
        mail = compose(
            sender=self.address,
            to=chat_id,
            subject=subject,
            message_id=root,
            text=f"{subject}\n\nReply to this mail to continue the conversation here.",
        )
        await self._deliver(mail, chat_id)
        self._subjects[root] = subject
        return ThreadRef(self.platform, chat_id, root, subject)

    async def _deliver(self, mail: Any, to: str) -> None:
        try:
            await call_with_retry(
                lambda: _smtp_send(self.smtp, mail, self.address, to),
                backoff=self._backoff,
                log=log,
            )
        except InvalidToken as exc:
            self._refused(str(exc))
            if self._task is not None:
                self._task.cancel()
            raise


def _accounts(
    settings: EmailSettings, secrets: Mapping[str, str]
) -> tuple[ImapAccount, SmtpAccount]:
    address = str(settings.address or "")
    password = secrets.get("token_env", "")
    imap_user = settings.imap_user or address
    imap = ImapAccount(
        str(settings.imap_host),
        settings.imap_port or IMAP_PORTS[settings.imap_tls],
        settings.imap_tls,
        imap_user,
        password,
        settings.folder,
    )
    smtp = SmtpAccount(
        str(settings.smtp_host),
        settings.smtp_port or SMTP_PORTS[settings.smtp_tls],
        settings.smtp_tls,
        settings.smtp_user or imap_user,
        secrets.get("smtp_password_env") or password,
    )
    return imap, smtp


def _smtp_client(a: SmtpAccount) -> Any:
    import aiosmtplib

    return aiosmtplib.SMTP(
        hostname=a.host,
        port=a.port,
        use_tls=a.tls == "tls",
        start_tls=a.tls == "starttls",
        timeout=a.timeout_s,
    )


async def _smtp_login(a: SmtpAccount) -> None:
    client = _smtp_client(a)
    await _smtp_call(lambda: client.connect(username=a.user, password=a.password), a)
    with contextlib.suppress(Exception):
        await client.quit()


async def _smtp_send(a: SmtpAccount, mail: Any, sender: str, to: str) -> None:
    client = _smtp_client(a)
    await _smtp_call(lambda: client.connect(username=a.user, password=a.password), a)
    try:
        # connected and logged in: the last await before the mail goes out, where a reply
        # that set out late (the process stood still) stops unsent (SetOutLate)
        await check_send_by()
        await _smtp_call(lambda: client.send_message(mail, sender=sender, recipients=[to]), a)
    finally:
        with contextlib.suppress(Exception):
            await client.quit()


async def _smtp_call(call: Any, a: SmtpAccount) -> Any:
    """aiosmtplib's errors in the gateway's terms: a refused login stops the adapter, 4xx
    and network trouble are retried, 5xx is a refused message."""
    import aiosmtplib

    try:
        return await call()
    except aiosmtplib.SMTPAuthenticationError as exc:
        raise InvalidToken(f"SMTP login refused for {a.user}: {exc.code} {exc.message}") from exc
    except aiosmtplib.SMTPResponseException as exc:
        if 400 <= exc.code < 500:
            raise TransientError(f"SMTP answered {exc.code} {exc.message}") from exc
        raise PlatformRefused(f"SMTP refused the mail: {exc.code} {exc.message}") from exc
    except aiosmtplib.SMTPRecipientsRefused as exc:
        codes = [e.code for e in exc.recipients]
        if codes and all(400 <= c < 500 for c in codes):
            raise TransientError(f"SMTP deferred the recipient ({codes})") from exc
        raise PlatformRefused(f"SMTP refused the recipient ({codes})") from exc
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise TransientError(
            f"SMTP {a.host}:{a.port} unreachable ({type(exc).__name__}: {exc})"
        ) from exc
