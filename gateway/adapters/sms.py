"""SMS through Twilio: inbound messages arrive as form-encoded webhooks on the daemon's HTTP
server, replies go out through the Messages REST API with the twilio library's async client.

Every webhook's `X-Twilio-Signature` is checked (the library's RequestValidator, against the
configured public URL) before anything else is used. Twilio signs no timestamp, so a replay
is caught by the core's dedupe on the MessageSid. STOP/HELP/START are Twilio's and the
carriers' to answer, never the agent's. Replies are plain text: markdown is stripped.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.adapters.base import (
    DEFAULT_BACKOFF,
    Backoff,
    Emit,
    Outbound,
    Route,
    SetupSteps,
    call_with_retry,
    send_by_trace,
)
from gateway.adapters.kit.chats import AsksWhoami, DirectOnly
from gateway.adapters.kit.lifecycle import start_whoami
from gateway.adapters.kit.split import split_message
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.sections import PlatformSettings, SecretNeed, setting
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType

log = logging.getLogger("gateway.adapters.sms")
REPLIES = WebhookReplies()  # text/plain refusals
WEBHOOK_PATH = "/sms/webhook"
LIMIT = 1_600  # Twilio's limit per message; carriers see segments of 153 (GSM-7) or 67 (UCS-2)
RATE_LIMIT_WAIT_S = 1.0  # Twilio sends no Retry-After; a long code sends about 1 message/s
EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response></Response>'
# Twilio's default opt-out, opt-in and help keywords: Twilio (or the carrier) answers them
KEYWORDS = frozenset(
    "STOP STOPALL UNSUBSCRIBE CANCEL END QUIT OPTOUT REVOKE START YES UNSTOP HELP INFO".split()
)


def _account_sid(v: Any) -> str | None:
    return (
        None
        if re.fullmatch(r"AC[0-9a-fA-F]{32}", str(v))
        else f"must be an AC… account SID (got {v!r})"
    )


def _e164(v: Any) -> str | None:
    return (
        None
        if re.fullmatch(r"\+[1-9]\d{6,14}", str(v))
        else f"must be an E.164 number like +15551234567 (got {v!r})"
    )


def _url(v: Any) -> str | None:
    return None if re.fullmatch(r"https?://\S+", str(v)) else f"must be an http(s) URL (got {v!r})"


@dataclass(frozen=True)
class SmsSettings(PlatformSettings):
    account_sid: str | None = setting(None, _account_sid, "the Twilio account SID")
    from_number: str | None = setting(None, _e164, "the Twilio number replies come from")
    webhook_url: str | None = setting(None, _url, "the public URL Twilio calls")


# --- translation (pure) ---------------------------------------------------------------


def to_inbound(params: Mapping[str, str], now: float = 0.0) -> InboundMessage | None:
    """A Twilio messaging webhook's form as an InboundMessage (None when it is not an
    inbound message). Media (MMS) becomes a short note beside the text."""
    sid, sender = params.get("MessageSid") or params.get("SmsSid"), params.get("From")
    if not sid or not sender:
        return None
    text = (params.get("Body") or "").strip()
    try:
        media = int(params.get("NumMedia") or 0)
    except ValueError:
        media = 0
    if media:
        note = f"(MMS with {media} attachment{'s' if media > 1 else ''}: only text is read here)"
        text = f"{note} {text}".strip()
    if not text:
        return None
    source = SessionSource("sms", sender, ChatType.DM, sender)
    return InboundMessage(source, text, platform_message_id=sid, received_at=now)


def keyword(text: str) -> str | None:
    """The carrier keyword a message is (STOP, HELP, START ...), else None."""
    word = text.strip().upper().rstrip(".!")
    return word if word in KEYWORDS else None


def twilio_error(status: int, code: int | None, text: str) -> Exception:
    """The gateway error for a failed Twilio REST call."""
    if status == 429 or code == 20429:
        return RetryAfter(RATE_LIMIT_WAIT_S)
    if status == 401 or code == 20003:
        return InvalidToken(f"twilio refused the credentials ({code or status}): {text}")
    if status >= 500:
        return TransientError(f"twilio answered {status}")
    if code == 21610:
        return PlatformRefused(f"sms: the recipient has opted out with STOP (21610): {text}")
    return PlatformRefused(f"twilio refused the message ({code or status}): {text}")


_FENCE = re.compile(r"^\s*```[^\n]*$", re.M)
_IMAGE_OR_LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
_STRONG = re.compile(r"(\*\*|__)(.+?)\1")
_EM = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?!\w)|(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)")
_CODE = re.compile(r"`([^`]+)`")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+", re.M)
_QUOTE = re.compile(r"^\s{0,3}>\s?", re.M)
_BULLET = re.compile(r"^(\s*)[*+]\s+", re.M)


def plain_text(markdown: str) -> str:
    """Markdown as plain text for a phone: fences, emphasis, headings and quote marks go,
    links keep their address in brackets, bullets become dashes."""
    text = _FENCE.sub("", markdown)
    text = _IMAGE_OR_LINK.sub(lambda m: f"{m[1]} ({m[2]})" if m[1] else m[2], text)
    text = _STRONG.sub(r"\2", text)
    text = _EM.sub(lambda m: m[1] or m[2], text)
    text = _CODE.sub(r"\1", text)
    text = _HEADING.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub(r"\1- ", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


# --- the adapter ------------------------------------------------------------------------


class SmsAdapter(DirectOnly, AsksWhoami, Outbound, SetupSteps):
    """An SMS conversation is always with one phone number, and has no threads: a handoff
    lands in the home number's conversation."""

    platform: ClassVar[str] = "sms"
    settings: ClassVar[type[SmsSettings]] = SmsSettings
    drain_per_second: ClassVar[float] = (
        1.0  # the outbox's backlog pace (a Twilio long code: 1 a second)
    )
    library_loggers: ClassVar[tuple[str, ...]] = ("twilio",)

    @classmethod
    def secrets_needed(cls, settings: SmsSettings) -> list[SecretNeed]:
        return [SecretNeed("token_env", "TWILIO_AUTH_TOKEN", "the Twilio auth token")]

    @classmethod
    def problems(cls, settings: SmsSettings, api_enabled: bool) -> list[ConfigError]:
        out = api_server_off(cls.platform, api_enabled)
        for key, hint in (
            ("account_sid", "Twilio console: Account Info"),
            ("from_number", "your Twilio phone number"),
            ("webhook_url", "the public URL of /sms/webhook; signatures cover it"),
        ):
            if not getattr(settings, key):
                out.append(ConfigError(f"platforms.sms.{key}", f"is required ({hint})"))
        if importlib.util.find_spec("twilio") is None:  # looked up, not imported
            out.append(
                ConfigError(
                    "platforms.sms", "needs the twilio package: pip install 'switchboard[sms]'"
                )
            )
        return out

    @classmethod
    def from_config(cls, settings: SmsSettings, secrets: Mapping[str, str]) -> SmsAdapter:
        return cls(
            str(settings.account_sid),
            secrets.get("token_env", ""),
            str(settings.from_number),
            str(settings.webhook_url),
            base_url=settings.base_url,
        )

    @classmethod
    def setup_steps(cls, settings: SmsSettings) -> list[str]:
        """What to do on sms's side (`switchboard setup` prints it)."""
        return [
            "Twilio console: copy the Account SID (account_sid) and Auth Token "
            "(TWILIO_AUTH_TOKEN); the number's E.164 form is from_number",
            "Phone Numbers > Active numbers > the number > Messaging: 'A message comes in' "
            "-> Webhook, HTTP POST, the URL below (US numbers need A2P 10DLC registration)",
        ]

    def routes(self) -> Mapping[str, Route]:
        return {WEBHOOK_PATH: self.handle_webhook}

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        from_number: str,
        webhook_url: str,
        *,
        base_url: str | None = None,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._sid = account_sid
        self._token = auth_token
        self._from = from_number
        self._webhook_url = webhook_url
        self._base_url = base_url
        self._backoff = backoff
        self._client: Any = None  # twilio.rest.Client on its async HTTP client, made on use
        self._emit: Emit | None = None
        self.account_name: str | None = None
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None
        self.keywords_dropped = 0

    # --- lifecycle ------------------------------------------------------------------

    def _twilio(self) -> Any:
        if self._client is None:
            from twilio.http.async_http_client import AsyncTwilioHttpClient
            from twilio.rest import Client

            # where to connect comes from the config, not from TWILIO_EDGE/TWILIO_REGION; a
            # reply that set out late stops where its request gets its connection (SEND_BY)
            http = AsyncTwilioHttpClient(trace_configs=[send_by_trace()])
            self._client = Client(
                self._sid, self._token, http_client=http, environment={"TWILIO_EDGE": ""}
            )
            if self._base_url:
                self._client.api.base_url = self._base_url.rstrip("/")
        return self._client

    async def _rest(self, call: Any) -> Any:
        import aiohttp
        from twilio.base.exceptions import TwilioException

        try:
            return await call(self._twilio())
        except TwilioException as exc:
            status, code = getattr(exc, "status", 0) or 0, getattr(exc, "code", None)
            raise twilio_error(int(status), code, str(getattr(exc, "msg", "") or exc)) from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"twilio unreachable ({type(exc).__name__})") from exc

    async def _whoami(self) -> str:
        """Who the credentials belong to: the Twilio account's name."""
        account = await self._rest(lambda c: c.api.v2010.accounts(self._sid).fetch_async())
        return str(account.friendly_name or self._sid)

    async def start(self, emit: Emit) -> None:
        self._emit = emit
        self.account_name = await start_whoami(
            self,
            self._whoami,
            by="twilio",
            credential="account SID or auth token",
            refused_as="invalid token",
            unreachable="could not look up the Twilio account",
            log=log,
        )
        log.info("sms webhook at %s for %s", WEBHOOK_PATH, self._from)

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.http_client.close()
            self._client = None
        self.state = AdapterState.STOPPED

    def health(self) -> dict[str, object]:
        return {
            "state": self.state,
            "account": self.account_name,
            "last_error": self.last_error,
            "keywords_dropped": self.keywords_dropped,
        }

    # --- webhook --------------------------------------------------------------------

    async def handle_webhook(self, request: Any) -> Any:
        """POST /sms/webhook: the signature first (over the configured public URL and the
        form); the message is acknowledged with empty TwiML once the core has it."""
        from aiohttp import web
        from twilio.request_validator import RequestValidator

        form = await request.post()
        signature = request.headers.get("X-Twilio-Signature")
        if not signature:
            return web.Response(status=401, text="missing signature")
        if not self._token or not RequestValidator(self._token).validate(
            self._webhook_url, form, signature
        ):
            log.warning("refused a webhook POST with a bad signature")
            return web.Response(status=403, text="bad signature")
        if (emit := taking(self._emit, self.state)) is None:
            return REPLIES.stopped()
        if form.get("AccountSid") != self._sid:
            log.warning("ignored a webhook for another account (%s)", form.get("AccountSid"))
            return web.Response(text=EMPTY_TWIML, content_type="text/xml")
        msg = to_inbound({k: str(v) for k, v in form.items()}, time.time())
        if msg is not None and (word := keyword(msg.text)):
            self.keywords_dropped += 1
            log.info(
                "dropped %s from %s: Twilio and the carrier answer it", word, msg.source.chat_id
            )
        elif not await committed(emit, [msg]):
            return REPLIES.again()
        return web.Response(text=EMPTY_TWIML, content_type="text/xml")

    # --- outbound -------------------------------------------------------------------

    async def send(self, msg: OutboundMessage) -> SentRef:
        ids: list[str] = []
        for part in split_message(plain_text(msg.text), LIMIT):
            try:
                sent = await call_with_retry(
                    functools.partial(
                        self._rest,
                        lambda c, part=part: c.messages.create_async(
                            to=msg.chat_id, from_=self._from, body=part
                        ),
                    ),
                    backoff=self._backoff,
                    log=log,
                )
            except InvalidToken as exc:
                self.last_error = "invalid credentials"
                log.error("twilio refused the auth token; replies fail until it is fixed (%s)", exc)
                raise
            except AdapterError as exc:
                self.last_error = str(exc)
                raise
            ids.append(str(sent.sid))
        return SentRef(self.platform, msg.chat_id, tuple(ids))
