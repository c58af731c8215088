"""A loopback SMTP server on aiosmtpd (a real SMTP implementation), in the test's own
event loop: AUTH PLAIN/LOGIN (in the clear, after a required STARTTLS, or under implicit
TLS), every accepted message kept as a parsed EmailMessage with its envelope, and a
temporary failure on demand."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from tests.fakes import Outage, wait_for_count


@dataclass
class Accepted:
    mail_from: str
    rcpt_tos: list[str]
    message: EmailMessage


@dataclass
class FakeSmtp:
    user: str = "agent@example.com"
    password: str = "s3cret-pw"
    accepted: list[Accepted] = field(default_factory=list)
    auth_attempts: list[tuple[str, bool]] = field(default_factory=list)
    fail_next: int = 0  # answer this many DATA commands with 451
    outage: Outage = field(
        default_factory=Outage
    )  # failures injected into DATA, as SMTP words them
    port: int = 0
    tls: ssl.SSLContext | None = None
    tls_mode: str = "starttls"  # with `tls`: "starttls" (required) or "tls" (implicit)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        from aiosmtpd.smtp import SMTP

        loop = asyncio.get_running_loop()
        starttls = self.tls if self.tls_mode == "starttls" else None
        self._server = await loop.create_server(
            lambda: SMTP(
                self,
                hostname="fake-smtp.local",
                auth_require_tls=starttls is not None,
                tls_context=starttls,
                require_starttls=starttls is not None,
                authenticator=self._authenticate,
                loop=loop,
            ),
            "127.0.0.1",
            0,
            ssl=self.tls if self.tls_mode == "tls" else None,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def _authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> Any:
        from aiosmtpd.smtp import AuthResult

        login = data.login.decode() if hasattr(data, "login") else ""
        ok = (login, data.password.decode() if hasattr(data, "password") else "") == (
            self.user,
            self.password,
        )
        self.auth_attempts.append((login, ok))
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 235 or 535

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        failure = self.outage.take()
        if failure is not None:
            self.outage.failed += 1
            kind = failure.partition(":")[0]
            if kind == "reset":
                server.transport.abort()
                return "421 4.3.2 closing"  # never reaches the client
            if kind == "timeout":
                await asyncio.sleep(float(failure.partition(":")[2] or 30))
            # SMTP has no rate-limit answer with a wait: a 429 is a 451 (try later)
            return {
                "403": "550 5.7.1 message refused",
                "400": "554 5.6.0 message content refused",
            }.get(
                kind,
                "421 4.3.2 service not available"
                if kind.startswith("5")
                else "451 4.7.1 try again later",
            )
        if self.fail_next > 0:
            self.fail_next -= 1
            return "451 4.3.0 try again later"
        parsed = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(parsed, EmailMessage)
        self.accepted.append(Accepted(envelope.mail_from, list(envelope.rcpt_tos), parsed))
        return "250 2.0.0 OK queued"

    async def wait(self, n: int, timeout: float = 10.0) -> list[Accepted]:
        return await wait_for_count(lambda: self.accepted, n, timeout, "mails sent")
