"""QQ Bot's HTTP side (API v2), on aiohttp: the app access token, the gateway's websocket
URL, the bot's own profile and the two send calls (a user's C2C chat, a group), with QQ's
answers typed: a refused AppSecret becomes InvalidToken, a rate limit RetryAfter, a server
or network fault TransientError, a refusal of the chat or the text PlatformRefused.

QQ answers an error with a JSON body `{"code", "message", "err_code", "trace_id"}` beside
the HTTP status; the codes that mean "too fast" are waited out, the rest are QQ's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.adapters.base import send_by_trace
from gateway.errors import (
    AdapterError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)

DEFAULT_API = "https://api.sgroup.qq.com"
DEFAULT_TOKEN_BASE = "https://bots.qq.com"
TOKEN_PATH = "/app/getAppAccessToken"
TOKEN_MARGIN_S = 50.0  # QQ hands out a new token in the last 60 s of the old one's life
# "msg limit exceed", a channel's write limit, "message rate-limited", the guild limit
RATE_LIMITED = frozenset({22009, 20028, 1100100, 1100308})
RATE_LIMIT_WAIT_S = 2.0  # QQ names no wait: this long, then again
TOKEN_EXPIRED = frozenset({11244})
DUPLICATE_SEQ = 40054005  # "消息被去重": this msg_id + msg_seq was sent already
# the replied-to message is unknown or too old for a passive reply
REPLY_GONE = frozenset({304026, 304027, 40034024, 40034025})
# markdown the bot may not send: invalid or not allowed content, no markdown permission
MARKDOWN_REFUSED = frozenset({50055, 50056, 304036})
TIMEOUT = aiohttp.ClientTimeout(total=20)
GROUP_PREFIX = "group-"  # a group chat's id is this before its group_openid
CHANNEL_PREFIX = "channel-"  # a guild text channel's id is this before its channel_id


class QQError(AdapterError):
    """An answer QQ gave to a send, with its code (0 when it gave none)."""

    def __init__(self, status: int, code: int, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.message or 'HTTP ' + str(self.status)} (code {self.code})"


class DuplicateSeq(QQError):
    """QQ has a message under this msg_id and msg_seq already."""


class ReplyGone(QQError):
    """The message a passive reply names is unknown to QQ or past its reply window."""


class MarkdownRefused(QQError):
    """QQ does not take markdown from this bot (no permission, or content it refuses)."""


def _code(body: Mapping[str, Any]) -> int:
    for key in ("code", "err_code"):
        try:
            return int(body.get(key) or 0)
        except (TypeError, ValueError):
            continue
    return 0


def is_group(chat_id: str) -> bool:
    return chat_id.startswith(GROUP_PREFIX)


def is_channel(chat_id: str) -> bool:
    return chat_id.startswith(CHANNEL_PREFIX)


def send_path(chat_id: str) -> str:
    """The send call's path for a chat id: `group-<group_openid>`, `channel-<channel_id>`
    (a guild text channel) or a user's openid."""
    if is_group(chat_id):
        return f"/v2/groups/{chat_id[len(GROUP_PREFIX) :]}/messages"
    if is_channel(chat_id):
        return f"/channels/{chat_id[len(CHANNEL_PREFIX) :]}/messages"
    return f"/v2/users/{chat_id}/messages"


class QQApi:
    """One bot's credentials and an aiohttp session. The access token is kept until
    TOKEN_MARGIN_S before the `expires_in` QQ gave with it."""

    def __init__(
        self,
        app_id: str,
        secret: str,
        api_base: str | None = None,
        token_base: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app_id, self._secret = app_id, secret
        self.api_base = (api_base or DEFAULT_API).rstrip("/")
        self.token_base = (token_base or DEFAULT_TOKEN_BASE).rstrip("/")
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None
        self._token: tuple[str, float] | None = None
        self.tokens_fetched = 0

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # SEND_BY is set only around a reply's send: only a late reply stops here
            self._http = aiohttp.ClientSession(timeout=TIMEOUT, trace_configs=[send_by_trace()])
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def forget_token(self) -> None:
        self._token = None

    async def _call(
        self, method: str, url: str, body: Mapping[str, Any] | None, auth: bool
    ) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
        headers = {"X-Union-Appid": self.app_id}
        if auth:
            headers["Authorization"] = f"QQBot {await self.access_token()}"
        try:
            async with self.http.request(method, url, json=body, headers=headers) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = {}
                if resp.status >= 500:
                    raise TransientError(f"qq answered {resp.status}")
                return resp.status, data if isinstance(data, dict) else {}, resp
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"qq unreachable ({type(exc).__name__})") from exc

    async def access_token(self) -> str:
        """The app access token, fetched again TOKEN_MARGIN_S before it expires."""
        if self._token and self._token[1] > self._clock():
            return self._token[0]
        body = {"appId": self.app_id, "clientSecret": self._secret}
        status, data, _resp = await self._call("POST", self.token_base + TOKEN_PATH, body, False)
        if status == 429 or _code(data) in RATE_LIMITED:
            raise RetryAfter(RATE_LIMIT_WAIT_S)
        if not data.get("access_token"):
            why = data.get("message") or f"HTTP {status}"
            raise InvalidToken(f"qq refused the app credentials: {why} (code {_code(data)})")
        try:
            lifetime = float(data.get("expires_in") or 7200)  # QQ sends it as a string
        except (TypeError, ValueError):
            lifetime = 7200.0
        self._token = (str(data["access_token"]), self._clock() + lifetime - TOKEN_MARGIN_S)
        self.tokens_fetched += 1
        return self._token[0]

    async def _get(self, path: str) -> dict[str, Any]:
        status, data, _resp = await self._call("GET", self.api_base + path, None, True)
        if status == 401 or _code(data) in TOKEN_EXPIRED:
            self.forget_token()  # expired early: the retry fetches another
            raise TransientError(f"qq refused the access token: {data.get('message') or status}")
        if status == 429 or _code(data) in RATE_LIMITED:
            raise RetryAfter(RATE_LIMIT_WAIT_S)
        if status != 200:
            raise TransientError(f"qq answered {status} to {path}: {data.get('message')}")
        return data

    async def gateway_url(self) -> str:
        """Where the websocket gateway is (GET /gateway)."""
        data = await self._get("/gateway")
        if not data.get("url"):
            raise TransientError("qq gave no gateway url")
        return str(data["url"])

    async def whoami(self) -> str:
        """The bot's name (GET /users/@me): what `doctor` shows."""
        data = await self._get("/users/@me")
        return str(data.get("username") or data.get("id") or self.app_id)

    async def send(self, chat_id: str, body: Mapping[str, Any]) -> str:
        """POST a message to a user's chat or a group; QQ's id of the message."""
        status, data, _resp = await self._call(
            "POST", self.api_base + send_path(chat_id), body, True
        )
        if status in (200, 201, 202) and data.get("id"):
            return str(data["id"])
        code = _code(data)
        if status == 429 or code in RATE_LIMITED:
            raise RetryAfter(RATE_LIMIT_WAIT_S)
        if status == 401 or code in TOKEN_EXPIRED:
            self.forget_token()  # expired early: the retry fetches another
            raise TransientError("qq refused the access token")
        message = str(data.get("message") or "")
        if code == DUPLICATE_SEQ:
            raise DuplicateSeq(status, code, message)
        if code in REPLY_GONE:
            raise ReplyGone(status, code, message)
        if code in MARKDOWN_REFUSED and "markdown" in body:
            raise MarkdownRefused(status, code, message)
        if 200 <= status < 300:
            return str(data.get("id") or "")  # accepted (held for review): no id yet
        raise PlatformRefused(
            f"qq refused the message to {chat_id}: {QQError(status, code, message)}"
        )
