"""A loopback fake of WeCom's self-built app side: the REST API (`cgi-bin/gettoken` with the
corp id and the app's secret, `cgi-bin/message/send`), and what WeCom's callbacks look
like: XML whose `Encrypt` is AES-256-CBC with the EncodingAESKey, signed with the Token.
The fake's encryption is written apart from the adapter's decryption (its own padding
through `cryptography`'s PKCS7), so the two only meet in what they put on the wire.

`outage` (the shared failure-injection switch) fails `message/send` as WeCom's REST API
answers: a 5xx as that HTTP status, and otherwise HTTP 200 with an errcode, as WeCom
words its errors: 45009 for a 429 (WeCom names no wait), 60011 (no privilege) for a 403,
40008 (invalid message type) for a 400; a reset drops the connection unanswered."""

from __future__ import annotations

import base64
import hashlib
import itertools
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.fakes import Outage, wait_for_count

CORP_ID = "wwFAKEcorp0001"
AGENT_ID = 1000002
APP_SECRET = "fake-app-secret"
CALLBACK_TOKEN = "fakeCallbackToken"
AES_KEY = base64.b64encode(b"0123456789abcdef0123456789abcdef").decode().rstrip("=")
ENV = {
    "WECOM_SECRET": APP_SECRET,
    "WECOM_CALLBACK_TOKEN": CALLBACK_TOKEN,
    "WECOM_ENCODING_AES_KEY": AES_KEY,
}


def seal(message: str, receiver: str = CORP_ID, encoding_aes_key: str = AES_KEY) -> str:
    key = base64.b64decode(encoding_aes_key + "=")
    body = message.encode()
    plain = os.urandom(16) + struct.pack("!I", len(body)) + body + receiver.encode()
    padder = padding.PKCS7(256).padder()  # 32-byte blocks, as WeCom pads
    padded = padder.update(plain) + padder.finalize()
    box = Cipher(algorithms.AES(key), modes.CBC(key[:16])).encryptor()
    return base64.b64encode(box.update(padded) + box.finalize()).decode()


def sign(*parts: str) -> str:
    return hashlib.sha1("".join(sorted(parts)).encode()).hexdigest()


def callback(
    xml: str, *, token: str = CALLBACK_TOKEN, receiver: str = CORP_ID
) -> tuple[str, bytes]:
    """The query string and body WeCom posts for a decrypted callback `xml`."""
    encrypted = seal(xml, receiver)
    timestamp, nonce = str(int(time.time())), "n" + os.urandom(4).hex()
    query = urlencode(
        {
            "msg_signature": sign(token, timestamp, nonce, encrypted),
            "timestamp": timestamp,
            "nonce": nonce,
        }
    )
    body = (
        f"<xml><ToUserName><![CDATA[{CORP_ID}]]></ToUserName>"
        f"<AgentID><![CDATA[{AGENT_ID}]]></AgentID>"
        f"<Encrypt><![CDATA[{encrypted}]]></Encrypt></xml>"
    )
    return query, body.encode()


def url_check(echo: str, *, token: str = CALLBACK_TOKEN) -> str:
    encrypted = seal(echo)
    timestamp, nonce = str(int(time.time())), "n1"
    return urlencode(
        {
            "msg_signature": sign(token, timestamp, nonce, encrypted),
            "timestamp": timestamp,
            "nonce": nonce,
            "echostr": encrypted,
        }
    )


def text_xml(text: str, *, msg_id: str = "7001", user: str = "alice", kind: str = "text") -> str:
    content = (
        f"<Content><![CDATA[{text}]]></Content>"
        if kind == "text"
        else f"<Recognition><![CDATA[{text}]]></Recognition>"
    )
    return (
        f"<xml><ToUserName><![CDATA[{CORP_ID}]]></ToUserName>"
        f"<FromUserName><![CDATA[{user}]]></FromUserName>"
        f"<CreateTime>{int(time.time())}</CreateTime><MsgType><![CDATA[{kind}]]></MsgType>"
        f"{content}<MsgId>{msg_id}</MsgId><AgentID>{AGENT_ID}</AgentID></xml>"
    )


# the errcode WeCom answers (with HTTP 200) for an injected status
INJECTED = {
    429: (45009, "api freq out of limit"),
    403: (60011, "no privilege to access/modify contact/party/agent"),
    400: (40008, "invalid message type"),
}


async def _error(status: int, _retry_after: float | None, _request: web.Request) -> web.Response:
    if status >= 500:
        return web.json_response({"errcode": -1, "errmsg": "system busy"}, status=status)
    errcode, errmsg = INJECTED.get(status, (-1, "system busy"))
    return web.json_response({"errcode": errcode, "errmsg": errmsg})


@dataclass
class FakeWeComApi:
    outage: Outage = field(default_factory=Outage)  # failures injected into message/send
    secret: str = APP_SECRET
    port: int = 0
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    tokens: list[str] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, kind: str, answer: dict[str, Any]) -> None:
        """The next `kind` call ("token", "send") answers `answer`."""
        self.failures.setdefault(kind, []).append(answer)

    def sent(self) -> list[dict[str, Any]]:
        return [body for kind, body in self.calls if kind == "send" and body.get("ok")]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "WeCom app messages")

    async def start(self) -> None:
        injecting = self.outage.middleware(lambda r: r.path == "/cgi-bin/message/send", _error)
        app = web.Application(middlewares=[injecting])
        app.router.add_get("/cgi-bin/gettoken", self._token)
        app.router.add_post("/cgi-bin/message/send", self._send)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _token(self, request: web.Request) -> web.Response:
        q = request.query
        self.calls.append(("token", dict(q)))
        if self.failures.get("token"):
            return web.json_response(self.failures["token"].pop(0))
        if q.get("corpid") != CORP_ID or q.get("corpsecret") != self.secret:
            return web.json_response({"errcode": 40001, "errmsg": "invalid credential"})
        token = f"tok-{next(self._ids)}"
        self.tokens.append(token)
        return web.json_response(
            {"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": 7200}
        )

    async def _send(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["token"] = request.query.get("access_token")
        self.calls.append(("send", body))
        if self.failures.get("send"):
            return web.json_response(self.failures["send"].pop(0))
        if body["token"] not in self.tokens:
            return web.json_response({"errcode": 40014, "errmsg": "invalid access_token"})
        if body.get("agentid") != AGENT_ID or body.get("msgtype") != "markdown":
            return web.json_response({"errcode": 40056, "errmsg": "invalid agentid"})
        body["ok"] = True
        return web.json_response({"errcode": 0, "errmsg": "ok", "msgid": f"m-{next(self._ids)}"})
