"""Weixin's iLink Bot API over aiohttp: the `getupdates` long poll, `sendmessage`,
`getconfig` (the credential check and the typing ticket), `sendtyping` and the two QR login
calls, with failures typed.

Every business call is a JSON POST under `<base_url>/ilink/bot/` carrying the bot token
(`AuthorizationType: ilink_bot_token`, `Authorization: Bearer <token>`), a random
`X-WECHAT-UIN` (a random unsigned 32-bit number, in decimal, base64-encoded) and
`base_info.channel_version` in the body. An answer's `ret` / `errcode` is 0 on success; -14
means the session behind the token expired (a new QR login is needed: InvalidToken), -2 is
iLink's frequency limit (RetryAfter). No maintained Python SDK exists, so this is aiohttp.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from gateway.adapters.base import send_by_trace
from gateway.errors import AdapterError, InvalidToken, RetryAfter, TransientError

DEFAULT_BASE_URL = "https://ilinkai.weixin.qq.com"
GET_UPDATES = "ilink/bot/getupdates"
SEND_MESSAGE = "ilink/bot/sendmessage"
GET_CONFIG = "ilink/bot/getconfig"
SEND_TYPING = "ilink/bot/sendtyping"
GET_BOT_QRCODE = "ilink/bot/get_bot_qrcode"
GET_QRCODE_STATUS = "ilink/bot/get_qrcode_status"
APP_ID = "bot"  # the iLink-App-Id of a bot client
CHANNEL_VERSION = "2.2.0"  # base_info.channel_version: the bot channel protocol's version
CLIENT_VERSION = str((2 << 16) | (2 << 8))  # iLink-App-ClientVersion: 2.2.0 packed
SESSION_EXPIRED = -14
FREQUENCY_LIMIT = -2
FREQUENCY_WAIT_S = 2.0  # iLink's frequency limit names no wait
TYPING, TYPING_STOPPED = 1, 2  # sendtyping's status
ITEM_TEXT, ITEM_VOICE = 1, 3  # item_list entry types; 2 image, 4 file, 5 video
BOT_MESSAGE = 2  # message_type: 1 a user's, 2 a bot's
FINISHED = 2  # message_state of a complete (not streaming) message
CALL_TIMEOUT_S = 15.0


def wechat_uin() -> str:
    """X-WECHAT-UIN: a fresh random uint32, as decimal text, base64-encoded."""
    number = int.from_bytes(secrets.token_bytes(4), "big")
    return base64.b64encode(str(number).encode()).decode()


def _code(data: Mapping[str, Any]) -> int:
    """The answer's error code (`ret`, else `errcode`); 0 when it succeeded."""
    for key in ("ret", "errcode"):
        value = data.get(key)
        if isinstance(value, int) and value != 0:
            return value
    return 0


def _why(data: Mapping[str, Any]) -> str:
    msg = data.get("errmsg") or data.get("msg") or ""
    return f"{_code(data)}{f' {msg}' if msg else ''}"


@dataclass(frozen=True)
class Updates:
    """One getupdates answer: its messages, the cursor that follows them, and the long
    poll's length iLink asks for next (None when it says nothing)."""

    msgs: list[dict[str, Any]]
    cursor: str
    next_timeout_s: float | None


class WeixinApi:
    """One bot token against one iLink base URL, over one aiohttp session (a second one
    for the long poll, so a reply never waits behind it)."""

    def __init__(self, token: str, base_url: str | None = None) -> None:
        self.token = token
        self.base = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._http: aiohttp.ClientSession | None = None
        self._poll: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        for session in (self._http, self._poll):
            if session is not None:
                await session.close()
        self._http = self._poll = None

    def _session(self, polling: bool) -> aiohttp.ClientSession:
        if polling:
            if self._poll is None:
                self._poll = aiohttp.ClientSession()
            return self._poll
        if self._http is None:
            # SEND_BY is set only around a reply's send: only a reply that set out late stops
            self._http = aiohttp.ClientSession(trace_configs=[send_by_trace()])
        return self._http

    def headers(self, body: bytes) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "AuthorizationType": "ilink_bot_token",
            "Authorization": f"Bearer {self.token}",
            "X-WECHAT-UIN": wechat_uin(),
            "iLink-App-Id": APP_ID,
            "iLink-App-ClientVersion": CLIENT_VERSION,
            "Content-Length": str(len(body)),
        }

    async def post(
        self, path: str, payload: Mapping[str, Any], timeout_s: float = CALL_TIMEOUT_S
    ) -> dict[str, Any]:
        """A business call: its JSON answer, or a typed error (-14 and 401/403 are
        InvalidToken, 429 and -2 RetryAfter, 5xx and network trouble TransientError)."""
        body = json.dumps(
            {**payload, "base_info": {"channel_version": CHANNEL_VERSION}},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        polling = path == GET_UPDATES
        http = self._session(polling)
        # a long poll: connecting gets the usual time, the held answer `timeout_s`
        timeout = (
            aiohttp.ClientTimeout(total=None, sock_connect=CALL_TIMEOUT_S, sock_read=timeout_s)
            if polling
            else aiohttp.ClientTimeout(total=timeout_s)
        )
        try:
            async with http.post(
                f"{self.base}/{path}", data=body, headers=self.headers(body), timeout=timeout
            ) as resp:
                status, text = resp.status, await resp.text()
                retry_after = resp.headers.get("Retry-After")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"weixin unreachable ({type(exc).__name__})") from exc
        return _answer(path, status, text, retry_after)

    async def get_updates(self, cursor: str, timeout_s: float) -> Updates:
        """One long poll from `cursor` ("" at first). An answer held past `timeout_s` is
        an empty one: the same cursor is asked again (a connection that cannot be made in
        time is TransientError, as any other)."""
        try:
            data = await self.post(GET_UPDATES, {"get_updates_buf": cursor}, timeout_s)
        except TransientError as exc:
            if isinstance(exc.__cause__, aiohttp.SocketTimeoutError):
                return Updates([], cursor, None)
            raise
        msgs = data.get("msgs") or []
        hint = data.get("longpolling_timeout_ms")
        return Updates(
            [m for m in msgs if isinstance(m, dict)] if isinstance(msgs, list) else [],
            str(data.get("get_updates_buf") or cursor),
            hint / 1000 if isinstance(hint, int) and hint > 0 else None,
        )

    async def check_token(self) -> dict[str, Any]:
        """A call with no side effect that iLink answers -14 for an expired or unknown
        token: getconfig (whose typing ticket is not used)."""
        return await self.post(GET_CONFIG, {"ilink_user_id": ""})

    async def typing_ticket(self, user: str, context_token: str) -> str | None:
        """The ticket sendtyping takes for `user` (getconfig's typing_ticket)."""
        data = await self.post(GET_CONFIG, {"ilink_user_id": user, "context_token": context_token})
        ticket = data.get("typing_ticket")
        return str(ticket) if ticket and not _code(data) else None

    async def send_typing(self, user: str, ticket: str, on: bool) -> None:
        status = TYPING if on else TYPING_STOPPED
        await self.post(
            SEND_TYPING, {"ilink_user_id": user, "typing_ticket": ticket, "status": status}
        )

    async def send_text(self, to: str, text: str, context_token: str) -> str:
        """One text message to `to`, echoing the peer's context_token; our client_id back
        (iLink answers no message id of its own)."""
        client_id = f"switchboard-{uuid.uuid4().hex}"
        msg = {
            "from_user_id": "",
            "to_user_id": to,
            "client_id": client_id,
            "message_type": BOT_MESSAGE,
            "message_state": FINISHED,
            "context_token": context_token,
            "item_list": [{"type": ITEM_TEXT, "text_item": {"text": text}}],
        }
        data = await self.post(SEND_MESSAGE, {"msg": msg})
        if _code(data):
            raise AdapterError(f"weixin refused the message to {to}: {_why(data)}")
        return client_id


def _answer(path: str, status: int, text: str, retry_after: str | None) -> dict[str, Any]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        data = None
    if status == 429:
        raise RetryAfter(_seconds(retry_after))
    if status >= 500:
        raise TransientError(f"weixin answered HTTP {status} to {path}")
    if status in (401, 403):
        raise InvalidToken(f"weixin refused the bot token (HTTP {status})")
    if status != 200 or not isinstance(data, dict):
        raise AdapterError(f"weixin answered HTTP {status} to {path}: {text[:200]!r}")
    code = _code(data)
    if code == SESSION_EXPIRED:
        raise InvalidToken(
            f"weixin refused the bot token: the session expired ({_why(data)}); "
            "log in again with `switchboard login weixin`"
        )
    if code == FREQUENCY_LIMIT:
        raise RetryAfter(FREQUENCY_WAIT_S)
    return data


def _seconds(value: str | None) -> float:
    try:
        return max(0.0, float(value or "1"))
    except ValueError:
        return 1.0


# --- the QR login: no token yet, plain GETs ------------------------------------------------


async def login_get(http: aiohttp.ClientSession, base: str, path: str, timeout_s: float) -> Any:
    """A login call (GET, no token): its JSON answer; network trouble is TransientError."""
    headers = {"iLink-App-Id": APP_ID, "iLink-App-ClientVersion": CLIENT_VERSION}
    try:
        async with http.get(
            f"{base.rstrip('/')}/{path}",
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            status, text = resp.status, await resp.text()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise TransientError(f"weixin unreachable at {base} ({type(exc).__name__})") from exc
    if status != 200:
        raise TransientError(f"weixin answered HTTP {status} to {path.partition('?')[0]}")
    try:
        return json.loads(text)
    except ValueError:
        raise TransientError(f"weixin answered {path.partition('?')[0]} with no JSON") from None


def qrcode_path(bot_type: str) -> str:
    return f"{GET_BOT_QRCODE}?bot_type={quote(bot_type)}"


def status_path(qrcode: str) -> str:
    return f"{GET_QRCODE_STATUS}?qrcode={quote(qrcode)}"
