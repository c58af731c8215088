"""A loopback fake of the Feishu Open API subset lark-oapi calls (tenant token, bot info,
message create and reply: a uuid repeated within `uuid_window_s` is answered with the
message it made, as Feishu does for an hour), plus helpers that build `im.message.receive_v1` events and
encrypt and sign them the way Feishu does before it POSTs them to a webhook."""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, wait_for_count

APP_ID = "cli_fake_app"
APP_SECRET = "fake-app-secret"
ENCRYPT_KEY = "fake-encrypt-key"
VERIFICATION_TOKEN = "fake-verification-token"
BOT_OPEN_ID = "ou_bot"
ENV = {
    "FEISHU_APP_ID": APP_ID,
    "FEISHU_APP_SECRET": APP_SECRET,
    "FEISHU_ENCRYPT_KEY": ENCRYPT_KEY,
    "FEISHU_VERIFICATION_TOKEN": VERIFICATION_TOKEN,
}


@dataclass
class FakeFeishu:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    app_secret: str = APP_SECRET
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: list[tuple[int, int, dict[str, str]]] = field(default_factory=list)
    tokens_issued: list[str] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    uuid_window_s: float = 3600.0  # Feishu: one message per uuid within an hour
    _by_uuid: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    _messages: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int, code: int, headers: dict[str, str] | None = None) -> None:
        """The next message create/reply answers `status` with Feishu error `code`."""
        self.failures.append((status, code, headers or {}))

    def sent(self) -> list[dict[str, Any]]:
        """Every message created or replied (not refused), in order, with its card's markdown."""
        return [p for m, p in self.calls if m in ("create", "reply") and "message_id" in p]

    def deduped(self) -> list[dict[str, Any]]:
        """Sends answered with an earlier message because their uuid was seen within the hour."""
        return [p for m, p in self.calls if m in ("create", "reply") and p.get("deduped")]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.sent, n, timeout, "Feishu messages")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(
                    lambda r: r.method == "POST" and r.path.startswith("/open-apis/im/v1/messages")
                )
            ]
        )
        app.router.add_post("/open-apis/auth/v3/tenant_access_token/internal", self._token)
        app.router.add_get("/open-apis/bot/v3/info", self._bot)
        app.router.add_post("/open-apis/im/v1/messages", self._create)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._reply)
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _unknown(self, request: web.Request) -> web.Response:
        print(f"FakeFeishu: unimplemented {request.method} {request.path}", flush=True)
        return web.json_response({"code": 404, "msg": "not found"}, status=404)

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("token", body))
        if (body.get("app_id"), body.get("app_secret")) != (APP_ID, self.app_secret):
            return web.json_response({"code": 10014, "msg": "app secret invalid"})
        token = f"t-fake-{len(self.tokens_issued) + 1}"
        self.tokens_issued.append(token)
        return web.json_response(
            {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": 7200}
        )

    def _authorised(self, request: web.Request) -> bool:
        bearer = request.headers.get("Authorization", "")
        return bearer.removeprefix("Bearer ") in self.tokens_issued

    async def _bot(self, request: web.Request) -> web.Response:
        self.calls.append(("bot", {}))
        if not self._authorised(request):
            return web.json_response({"code": 99991663, "msg": "Invalid access token"}, status=400)
        return web.json_response(
            {
                "code": 0,
                "msg": "ok",
                "bot": {
                    "activate_status": 2,
                    "app_name": "switchboard",
                    "avatar_url": "",
                    "ip_white_list": [],
                    "open_id": BOT_OPEN_ID,
                },
            }
        )

    def _refusal(self, request: web.Request) -> web.Response | None:
        if not self._authorised(request):
            return web.json_response({"code": 99991663, "msg": "Invalid access token"}, status=400)
        if self.failures:
            status, code, headers = self.failures.pop(0)
            return web.json_response(
                {"code": code, "msg": "refused"}, status=status, headers=headers
            )
        return None

    def _store(self, record: dict[str, Any]) -> web.Response:
        """The message as Feishu answers it; a uuid seen before answers the first message."""
        key = record.get("uuid")
        if key and len(key) > 50:
            return web.json_response(
                {"code": 99992402, "msg": "field validation failed: uuid exceeds 50 characters"},
                status=400,
            )
        earlier = self._by_uuid.get(key) if key else None
        if earlier is not None and time.monotonic() - earlier[0] < self.uuid_window_s:
            record["deduped"] = True
            return web.json_response({"code": 0, "msg": "success", "data": earlier[1]})
        message_id = f"om_sent_{next(self._ids)}"
        data = {
            "message_id": message_id,
            "chat_id": record["chat_id"],
            "msg_type": record["msg_type"],
            "root_id": record.get("root_id"),
            "parent_id": record.get("parent_id"),
            "thread_id": record.get("thread_id"),
            "create_time": str(int(time.time() * 1000)),
            "body": {"content": record["content"]},
        }
        record["message_id"] = message_id
        record["markdown"] = json.loads(record["content"])["elements"][0]["content"]
        self._messages[message_id] = data
        if key:
            self._by_uuid[key] = (time.monotonic(), data)
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        record = {
            **body,
            "receive_id_type": request.query.get("receive_id_type"),
            "chat_id": body.get("receive_id"),
        }
        self.calls.append(("create", record))
        return self._refusal(request) or self._store(record)

    async def _reply(self, request: web.Request) -> web.Response:
        body = await request.json()
        parent = request.match_info["message_id"]
        known = self._messages.get(parent, {})
        root = known.get("root_id") or parent
        record = {
            **body,
            "parent_id": parent,
            "root_id": root,
            "chat_id": known.get("chat_id") or "oc_unknown",
            "thread_id": f"omt_{root}" if body.get("reply_in_thread") else None,
        }
        self.calls.append(("reply", record))
        return self._refusal(request) or self._store(record)


# --- what Feishu POSTs to the webhook --------------------------------------------------


def message_event(
    text: str,
    *,
    chat_id: str = "oc_dm",
    chat_type: str = "p2p",
    user: str = "ou_alice",
    message_id: str = "om_1",
    event_id: str = "ev_1",
    mentions: list[dict[str, Any]] | None = None,
    root_id: str | None = None,
    thread_id: str | None = None,
    message_type: str = "text",
    content: dict[str, Any] | None = None,
    sender_type: str = "user",
) -> dict[str, Any]:
    """An `im.message.receive_v1` event (schema 2.0) as Feishu sends it, before encryption."""
    message = {
        "message_id": message_id,
        "root_id": root_id,
        "parent_id": root_id,
        "create_time": str(int(time.time() * 1000)),
        "chat_id": chat_id,
        "thread_id": thread_id,
        "chat_type": chat_type,
        "message_type": message_type,
        "content": json.dumps(content if content is not None else {"text": text}),
        "mentions": mentions or [],
    }
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id,
            "event_type": "im.message.receive_v1",
            "create_time": message["create_time"],
            "token": VERIFICATION_TOKEN,
            "app_id": APP_ID,
            "tenant_key": "tenant-1",
        },
        "event": {
            "sender": {
                "sender_id": {"open_id": user, "union_id": f"on_{user}", "user_id": user},
                "sender_type": sender_type,
                "tenant_key": "tenant-1",
            },
            "message": message,
        },
    }


def mention(key: str, open_id: str = BOT_OPEN_ID, name: str = "switchboard") -> dict[str, Any]:
    return {
        "key": key,
        "id": {"open_id": open_id, "union_id": f"on_{open_id}", "user_id": None},
        "name": name,
        "tenant_key": "tenant-1",
    }


def encrypt(plain: str, key: str = ENCRYPT_KEY) -> str:
    """AES-256-CBC with key SHA-256(encrypt key), a random IV in front, PKCS#7, base64."""
    from Crypto.Cipher import AES

    data = plain.encode()
    pad = 16 - len(data) % 16
    iv = os.urandom(16)
    cipher = AES.new(hashlib.sha256(key.encode()).digest(), AES.MODE_CBC, iv)
    return base64.b64encode(iv + cipher.encrypt(data + bytes([pad]) * pad)).decode()


def signed(
    payload: dict[str, Any],
    *,
    key: str = ENCRYPT_KEY,
    sign_key: str | None = None,
    age_s: int = 0,
    signature: bool = True,
) -> tuple[bytes, dict[str, str]]:
    """The request Feishu makes: the payload encrypted with `key`, signed with `sign_key`
    (default `key`) at a timestamp `age_s` seconds ago."""
    body = json.dumps({"encrypt": encrypt(json.dumps(payload), key)}).encode()
    headers = {"Content-Type": "application/json"}
    if signature:
        ts, nonce = str(int(time.time()) - age_s), os.urandom(8).hex()
        digest = hashlib.sha256((ts + nonce + (sign_key or key)).encode() + body).hexdigest()
        headers.update(
            {
                "X-Lark-Request-Timestamp": ts,
                "X-Lark-Request-Nonce": nonce,
                "X-Lark-Signature": digest,
            }
        )
    return body, headers
