"""A loopback fake of the Slack Web API (for slack_sdk / slack-bolt), plus a helper that
signs Events API requests the way Slack does. Posted messages are kept per channel with
their metadata, and read back through conversations.history and conversations.replies.
As Slack does, a Socket Mode envelope not acknowledged is sent again (a new envelope id,
`retry_attempt` counting up) on the next connection, and `EventsDelivery` posts Events API
requests again (`X-Slack-Retry-Num`) until one is answered 2xx."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from slack_sdk.signature import SignatureVerifier

from tests.fakes import Outage, wait_for_count

BOT_USER = "U0BOT"
SECRET = "fake-signing-secret"


@dataclass
class FakeSlack:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    port: int = 0
    _runner: web.AppRunner | None = None
    _ts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    # envelopes sent and not acknowledged yet, oldest first: envelope id -> (payload, attempt)
    unacked: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    # a new connection gets what is unacknowledged before any newer envelope: Slack promises
    # no order between a retry and a new event; this fake keeps the one the users sent in
    _sending: asyncio.Lock = field(default_factory=asyncio.Lock)
    connections_opened: int = 0
    token: str | None = None  # when set, auth.test refuses any other bearer token
    ts_base: int = 1700000000  # the seconds of every posted message's ts
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # channel -> posts
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)

    # --- Socket Mode -----------------------------------------------------------------------

    async def wait_socket(self, count: int = 1, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        # the count-th websocket itself, not only its apps.connections.open call: an event
        # sent in between would reach only the old socket, which the client is leaving
        while (
            len(self.sockets) < count or self.sockets[-1].closed or self.connections_opened < count
        ):
            if time.monotonic() > deadline:
                raise AssertionError("no Socket Mode connection")
            await asyncio.sleep(0.01)

    async def socket_event(
        self, payload: dict[str, Any], envelope_id: str, retry_attempt: int = 0
    ) -> None:
        """An Events API envelope to every open connection (none: it waits for the next);
        until acknowledged it is sent again on each new connection, as Slack does (a new
        envelope id, `retry_attempt` counting up, `retry_reason: timeout`)."""
        async with self._sending:
            self.unacked[envelope_id] = (payload, retry_attempt)
            await self._send_envelope(payload, envelope_id, retry_attempt)

    async def _send_envelope(
        self, payload: dict[str, Any], envelope_id: str, retry_attempt: int
    ) -> None:
        envelope = {
            "envelope_id": envelope_id,
            "type": "events_api",
            "accepts_response_payload": False,
            "retry_attempt": retry_attempt,
            "retry_reason": "timeout" if retry_attempt else "",
            "payload": payload,
        }
        for ws in [s for s in self.sockets if not s.closed]:
            with contextlib.suppress(ConnectionError, RuntimeError):  # a link dying under us
                await ws.send_str(json.dumps(envelope))

    async def socket_disconnect(self) -> None:
        for ws in [s for s in self.sockets if not s.closed]:
            await ws.send_str(json.dumps({"type": "disconnect", "reason": "refresh_requested"}))

    async def _link(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        async with self._sending:
            self.sockets.append(ws)
            await ws.send_str(
                json.dumps(
                    {
                        "type": "hello",
                        "num_connections": 1,
                        "connection_info": {"app_id": "A1"},
                        "debug_info": {"host": "fake"},
                    }
                )
            )
            # what no connection acknowledged goes out again on this one, oldest first
            for old_id, (payload, attempt) in list(self.unacked.items()):
                del self.unacked[old_id]
                new_id = f"{old_id.split('~')[0]}~{attempt + 1}"
                self.unacked[new_id] = (payload, attempt + 1)
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await ws.send_str(
                        json.dumps(
                            {
                                "envelope_id": new_id,
                                "type": "events_api",
                                "accepts_response_payload": False,
                                "retry_attempt": attempt + 1,
                                "retry_reason": "timeout",
                                "payload": payload,
                            }
                        )
                    )
        async for frame in ws:
            try:
                data = json.loads(frame.data)
            except (TypeError, ValueError):
                continue
            if isinstance(data, dict) and data.get("envelope_id"):
                self.acks.append(data["envelope_id"])
                self.unacked.pop(data["envelope_id"], None)
        return ws

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def fail_next(self, method: str, status: int, headers: dict[str, str] | None = None) -> None:
        self.failures.setdefault(method, []).append((status, headers or {}))

    def posted(self) -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == "chat.postMessage"]

    async def wait_posted(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.posted, n, timeout, "posts")

    async def start(self) -> None:
        app = web.Application(
            middlewares=[self.outage.middleware(lambda r: r.path == "/api/chat.postMessage")]
        )
        app.router.add_route("*", "/api/{method}", self._handle)
        app.router.add_get("/link", self._link)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for ws in self.sockets:
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            if request.content_type == "application/json":
                params.update(await request.json())
            else:
                params.update({k: v for k, v in (await request.post()).items()})
        self.calls.append((method, params))
        queued = self.failures.get(method)
        if queued:
            status, headers = queued.pop(0)
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=status, headers=headers
            )
        bearer = request.headers.get("Authorization", "")
        if method == "auth.test" and self.token is not None and bearer != f"Bearer {self.token}":
            body: dict[str, Any] = {"ok": False, "error": "invalid_auth"}
        elif method == "auth.test":
            body = {
                "ok": True,
                "team_id": "T1",
                "user_id": BOT_USER,
                "bot_id": "B1",
                "team": "t",
                "user": "bot",
                "url": "https://t.slack.com/",
            }
        elif method == "apps.connections.open":
            self.connections_opened += 1
            body = {"ok": True, "url": f"ws://127.0.0.1:{self.port}/link"}
        elif method == "chat.postMessage":
            body = self._post_message(params)
        elif method in ("conversations.history", "conversations.replies"):
            body = self._read(method, params)
        else:
            print(f"FakeSlack: unimplemented method {method}", flush=True)
            body = {"ok": False, "error": "unknown_method"}
        response = web.json_response(body)
        if not self.keep_alive:
            response.force_close()
        return response

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        meta = params.get("metadata")
        if meta is not None and not (
            isinstance(meta, dict)
            and isinstance(meta.get("event_type"), str)
            and isinstance(meta.get("event_payload"), dict)
        ):
            return {"ok": False, "error": "invalid_metadata_format"}
        ts = f"{self.ts_base}.{next(self._ts):06d}"
        message: dict[str, Any] = {
            "type": "message",
            "user": BOT_USER,
            "bot_id": "B1",
            "text": params.get("text"),
            "ts": ts,
        }
        if params.get("thread_ts"):
            message["thread_ts"] = str(params["thread_ts"])
        if meta is not None:
            message["metadata"] = meta
        self.history.setdefault(str(params.get("channel")), []).append(message)
        return {
            "ok": True,
            "channel": params.get("channel"),
            "ts": ts,
            "message": {k: v for k, v in message.items() if k != "metadata"},
        }

    def _read(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """conversations.history (top-level messages, newest first) or .replies (one
        thread, oldest first): `oldest` exclusive, `limit`, an offset as the cursor, and
        metadata only with include_all_metadata, as Slack answers."""
        found = self.history.get(str(params.get("channel")), [])
        if method == "conversations.replies":
            thread = str(params.get("ts"))
            found = [m for m in found if m.get("thread_ts") == thread or m["ts"] == thread]
        else:
            found = list(reversed([m for m in found if "thread_ts" not in m]))
        if params.get("oldest"):
            found = [m for m in found if float(m["ts"]) > float(params["oldest"])]
        start, limit = int(params.get("cursor") or 0), int(params.get("limit") or 100)
        page = found[start : start + limit]
        if str(params.get("include_all_metadata")).lower() not in ("1", "true"):
            page = [{k: v for k, v in m.items() if k != "metadata"} for m in page]
        more = start + limit < len(found)
        return {
            "ok": True,
            "messages": page,
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }

    def shown(self, channel: str) -> list[str]:
        """What the bot's messages in a channel (threads included) say, oldest first."""
        return [str(m["text"]) for m in self.history.get(channel, [])]


def signed(
    payload: dict[str, Any], *, secret: str = SECRET, age_s: int = 0
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    ts = str(int(time.time()) - age_s)
    sig = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return body, {
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sig,
        "Content-Type": "application/json",
    }


def message(
    text: str,
    channel: str = "D0DM",
    user: str = "U1",
    ts: str = "1700000001.000100",
    **extra: object,
) -> dict[str, Any]:
    """A `message` event as Slack sends it; a channel id starting with D is a DM."""
    ev: dict[str, Any] = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": "im" if channel.startswith("D") else "channel",
    }
    ev.update(extra)
    return ev


def event(ev: dict[str, Any], event_id: str = "Ev1") -> dict[str, Any]:
    return {
        "type": "event_callback",
        "team_id": "T1",
        "api_app_id": "A1",
        "event_id": event_id,
        "event_time": int(time.time()),
        "event": ev,
        "authorizations": [{"team_id": "T1", "user_id": BOT_USER, "is_bot": True}],
    }


@dataclass
class EventsDelivery:
    """Slack's side of the Events API: events POSTed signed to `url`, one at a time and in
    order; one not answered 2xx (a 5xx, a dropped connection) is posted again, with
    `X-Slack-Retry-Num` counting up and `X-Slack-Retry-Reason`, until it is. (Slack gives up
    after three retries spread over minutes; here the retries come at once and do not stop,
    so a test decides how long a daemon stays down.)"""

    url: str
    secret: str = SECRET
    pending: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[tuple[str, int, int | None]] = field(
        default_factory=list
    )  # (event, retry, status)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def deliver(self, payload: dict[str, Any]) -> None:
        self.pending.append(payload)
        self._wakeup.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="fake-slack.events")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            while True:
                if not self.pending:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                payload = self.pending[0]
                retry, reason = 0, ""
                while True:
                    body, headers = signed(payload, secret=self.secret)
                    if retry:
                        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": reason}
                    status: int | None
                    try:
                        async with http.post(self.url, data=body, headers=headers) as resp:
                            status = resp.status
                    except (aiohttp.ClientError, TimeoutError):
                        status = None
                    self.attempts.append((str(payload.get("event_id")), retry, status))
                    if status is not None and 200 <= status < 300:
                        break
                    retry, reason = retry + 1, "http_error" if status else "http_timeout"
                    await asyncio.sleep(0.05)
                self.pending.pop(0)
