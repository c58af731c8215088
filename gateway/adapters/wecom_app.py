"""WeCom's callback mode, for a self-built app (自建应用): WeCom POSTs each message as
encrypted XML to the api server's `/wecom/callback` (and checks the URL once with a GET
carrying an encrypted `echostr`); replies go out through the app's REST API
(`cgi-bin/gettoken` with the corp id and the app's secret, `cgi-bin/message/send` with the
agent id), so any replica can take a callback and send. An app's chats are single chats.

The request is checked (msg_signature, then decryption addressed to our corp id) before
anything is stored, and 200 is answered only once the message is committed; a message that
could not be stored answers 503, and WeCom posts it again (it retries an unanswered
callback), which the store then answers once by its MsgId.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.adapters.base import send_by_trace
from gateway.adapters.wecom_crypto import Refused, check_signature, decrypt, xml_fields
from gateway.adapters.wecom_wire import PLATFORM, answer_error
from gateway.errors import InvalidToken, PlatformRefused, TransientError
from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.wecom")
DEFAULT_API = "https://qyapi.weixin.qq.com"
CALLBACK_PATH = "/wecom/callback"
APP_MARKDOWN_BYTES = 2_048  # an app's markdown message, in UTF-8 bytes
TOKEN_GONE = {40014, 42001}  # the access token is bad or expired: fetch another
TIMEOUT = aiohttp.ClientTimeout(total=15)


def verify_url(
    query: Mapping[str, str], token: str, key: bytes, corp_id: str
) -> str:  # GET: WeCom checks the URL when it is saved
    echo = query.get("echostr", "")
    check_signature(
        token,
        query.get("timestamp", ""),
        query.get("nonce", ""),
        echo,
        query.get("msg_signature", ""),
    )
    return decrypt(key, echo, corp_id)


def open_callback(
    query: Mapping[str, str], body: bytes, token: str, key: bytes, corp_id: str
) -> dict[str, str]:
    """The fields of a callback's decrypted XML, after its signature is checked."""
    outer = xml_fields(body)
    encrypted = outer.get("Encrypt", "")
    check_signature(
        token,
        query.get("timestamp", ""),
        query.get("nonce", ""),
        encrypted,
        query.get("msg_signature", ""),
    )
    return xml_fields(decrypt(key, encrypted, corp_id))


def app_inbound(fields: Mapping[str, str]) -> InboundMessage | None:
    """A text or voice message of an app's single chat; None for events and the rest."""
    kind = fields.get("MsgType")
    text = fields.get("Content") if kind == "text" else fields.get("Recognition")
    user, msg_id = fields.get("FromUserName", ""), fields.get("MsgId", "")
    if kind not in ("text", "voice") or not (text or "").strip() or not user or not msg_id:
        return None
    try:
        created = float(fields.get("CreateTime") or 0)
    except ValueError:
        created = 0.0
    return InboundMessage(
        source=SessionSource(PLATFORM, user, ChatType.DM, user),
        text=str(text).strip(),
        platform_message_id=msg_id,
        received_at=created,
        mentioned=True,
    )


class AppApi:
    """The app's REST calls with its access token, cached until five minutes before
    WeCom says it expires."""

    def __init__(
        self,
        corp_id: str,
        secret: str,
        agent_id: int,
        base_url: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.corp_id, self._secret, self.agent_id = corp_id, secret, agent_id
        self.base = (base_url or DEFAULT_API).rstrip("/")
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None
        self._token: tuple[str, float] | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=TIMEOUT, trace_configs=[send_by_trace()])
        try:
            async with self._http.request(method, self.base + path, **kw) as resp:
                if resp.status >= 500:
                    raise TransientError(f"wecom answered {resp.status}")
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"wecom unreachable ({type(exc).__name__})") from exc
        if not isinstance(data, dict):
            raise TransientError(f"wecom answered {resp.status} without JSON")
        return data

    async def access_token(self) -> str:
        if self._token and self._token[1] > self._clock():
            return self._token[0]
        data = await self._call(
            "GET", "/cgi-bin/gettoken", params={"corpid": self.corp_id, "corpsecret": self._secret}
        )
        error = answer_error(data, "the access token")
        if error is not None:
            if isinstance(error, TransientError):
                raise error
            raise InvalidToken(f"wecom refused the corp id or app secret: {data.get('errmsg')}")
        expires = self._clock() + int(data.get("expires_in") or 7200) - 300
        self._token = (str(data["access_token"]), expires)
        return self._token[0]

    async def send_markdown(self, user: str, text: str) -> str:
        """One markdown message to a user of the app; returns WeCom's msgid."""
        token = await self.access_token()
        body = {
            "touser": user,
            "msgtype": "markdown",
            "agentid": self.agent_id,
            "markdown": {"content": text},
        }
        data = await self._call(
            "POST", "/cgi-bin/message/send", params={"access_token": token}, json=body
        )
        if data.get("errcode") in TOKEN_GONE:
            self._token = None  # the retry fetches another
            raise TransientError("the access token was refused")
        error = answer_error(data, "the message")
        if error is not None:
            raise error
        if data.get("invaliduser"):
            raise PlatformRefused(f"wecom refused the message: no such user {data['invaliduser']}")
        return str(data.get("msgid") or "")


__all__ = ["CALLBACK_PATH", "AppApi", "Refused", "app_inbound", "open_callback", "verify_url"]
