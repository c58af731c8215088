"""DingTalk's HTTP side: the access token, the stream connection ticket, and sending a
markdown message through a session webhook or the robot API, with failures typed.

dingtalk-stream makes these calls with blocking `requests` against a fixed endpoint and
swallows their errors, so they are made here with aiohttp against `base_url`: a bad client
secret becomes InvalidToken, a rate limit RetryAfter, a server or network fault TransientError.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.adapters.base import send_by_trace
from gateway.errors import InvalidToken, PlatformRefused, RetryAfter, TransientError

DEFAULT_API = "https://api.dingtalk.com"
TOKEN_PATH = "/v1.0/oauth2/accessToken"
OPEN_PATH = "/v1.0/gateway/connections/open"
GROUP_SEND = "/v1.0/robot/groupMessages/send"
DM_SEND = "/v1.0/robot/oToMessages/batchSend"
WEBHOOK_RATE_LIMITED = {130101, 130102}  # a session webhook sending too fast
TIMEOUT = aiohttp.ClientTimeout(total=15)


def _throttled(status: int, body: Mapping[str, Any]) -> bool:
    code = str(body.get("code") or "")
    return status == 429 or "QpsLimit" in code or "Throttling" in code


def _retry_after(resp: aiohttp.ClientResponse) -> float:
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


class DingTalkApi:
    """One app's credentials and an aiohttp session; the access token is cached until
    five minutes before DingTalk says it expires."""

    def __init__(
        self,
        client_id: str,
        client_secret: str,
        base_url: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client_id, self._secret = client_id, client_secret
        self.base = (base_url or DEFAULT_API).rstrip("/")
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None
        self._token: tuple[str, float] | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _call(
        self, url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, Any], aiohttp.ClientResponse]:
        if self._http is None:
            # one session for the token, the stream ticket and the replies: SEND_BY is set
            # only around a reply's send, so only a reply that set out late stops here
            self._http = aiohttp.ClientSession(timeout=TIMEOUT, trace_configs=[send_by_trace()])
        try:
            async with self._http.post(url, json=body, headers=headers or {}) as resp:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = {}
                if resp.status >= 500:
                    raise TransientError(f"dingtalk answered {resp.status}")
                return resp.status, data if isinstance(data, dict) else {}, resp
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"dingtalk unreachable ({type(exc).__name__})") from exc

    async def access_token(self) -> str:
        if self._token and self._token[1] > self._clock():
            return self._token[0]
        body = {"appKey": self.client_id, "appSecret": self._secret}
        status, data, resp = await self._call(self.base + TOKEN_PATH, body)
        if _throttled(status, data):
            raise RetryAfter(_retry_after(resp))
        if status != 200 or not data.get("accessToken"):
            why = data.get("code") or data.get("message") or f"HTTP {status}"
            raise InvalidToken(f"dingtalk refused the client credentials: {why}")
        expires = self._clock() + int(data.get("expireIn", 7200)) - 300
        self._token = (str(data["accessToken"]), expires)
        return self._token[0]

    async def open_connection(self, topics: list[str]) -> str:
        """The stream's websocket URL with its one-time ticket."""
        body = {
            "clientId": self.client_id,
            "clientSecret": self._secret,
            "ua": "switchboard",
            "localIp": "",
            "subscriptions": [{"type": "CALLBACK", "topic": t} for t in topics],
        }
        status, data, resp = await self._call(self.base + OPEN_PATH, body)
        if _throttled(status, data):
            raise RetryAfter(_retry_after(resp))
        if status in (400, 401, 403):
            why = data.get("code") or data.get("message") or f"HTTP {status}"
            raise InvalidToken(f"dingtalk refused the stream connection: {why}")
        if status != 200 or not data.get("endpoint") or not data.get("ticket"):
            raise TransientError(f"dingtalk gave no stream endpoint (HTTP {status})")
        sep = "&" if "?" in str(data["endpoint"]) else "?"
        from urllib.parse import quote_plus

        return f"{data['endpoint']}{sep}ticket={quote_plus(str(data['ticket']))}"

    async def by_webhook(self, webhook: str, title: str, text: str) -> bool:
        """A reply through the message's session webhook; False when DingTalk refuses it
        (expired early, say), so the caller can use the robot API instead."""
        payload = {"msgtype": "markdown", "markdown": {"title": title, "text": text}}
        status, data, resp = await self._call(webhook, payload)
        if status == 429 or data.get("errcode") in WEBHOOK_RATE_LIMITED:
            raise RetryAfter(_retry_after(resp))
        return status == 200 and data.get("errcode", 0) == 0

    async def by_robot(self, robot_code: str, chat_id: str, title: str, text: str) -> str:
        """A message through the robot API: a group's openConversationId (cid...) or a
        user's staff id. Returns DingTalk's processQueryKey."""
        token = await self.access_token()
        param = json.dumps({"title": title, "text": text}, ensure_ascii=False)
        body: dict[str, Any] = {
            "robotCode": robot_code,
            "msgKey": "sampleMarkdown",
            "msgParam": param,
        }
        if chat_id.startswith("cid"):
            path, body["openConversationId"] = GROUP_SEND, chat_id
        else:
            path, body["userIds"] = DM_SEND, [chat_id]
        status, data, resp = await self._call(
            self.base + path, body, {"x-acs-dingtalk-access-token": token}
        )
        if _throttled(status, data) or chat_id in (data.get("flowControlledStaffIdList") or []):
            raise RetryAfter(_retry_after(resp))
        if status == 401:
            self._token = None  # expired early: the retry fetches another
            raise TransientError("the access token was refused")
        if status != 200 or chat_id in (data.get("invalidStaffIdList") or []):
            why = data.get("code") or data.get("message") or f"HTTP {status}"
            raise PlatformRefused(f"dingtalk refused the message: {why}")
        return str(data.get("processQueryKey") or "")
