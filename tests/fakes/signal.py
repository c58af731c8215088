"""A loopback fake of signal-cli's HTTP daemon (`signal-cli daemon --http`): JSON-RPC 2.0
at POST /api/v1/rpc (single or batch; `version`, `listAccounts`, `send`, `sendTyping`,
`sendReceipt`), server-sent `receive` events at GET /api/v1/events with ids and a replay
buffer for `Last-Event-ID` (as signal-cli keeps after 0.14.6), and GET /api/v1/check. Errors
have signal-cli's shapes: -5 with per-recipient `retryAfterSeconds`, -32601, HTTP 415/421."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, wait_for_count

BOT = "+15550000001"
BOT_UUID = "00000000-0000-4000-8000-0000000000b0"
ALICE, ALICE_UUID = "+15550000002", "11111111-1111-4111-8111-111111111111"
BOB, BOB_UUID = "+15550000003", "22222222-2222-4222-8222-222222222222"
GROUP = "Pmpi+EfPWmsxiomLe9Nx2XF9HOE483p6iKiFj65iMwI="
VERSION = "0.14.7"
_ts = itertools.count(1_700_000_000_000)


def envelope(
    text: str | None,
    *,
    number: str | None = ALICE,
    uuid: str | None = ALICE_UUID,
    name: str = "Alice",
    group: str | None = None,
    ts: int | None = None,
    account: str = BOT,
    **data: Any,
) -> dict[str, Any]:
    """A `receive` event's payload as signal-cli writes it (JsonMessageEnvelope)."""
    ts = ts if ts is not None else next(_ts)
    msg: dict[str, Any] = {
        "timestamp": ts,
        "message": text,
        "expiresInSeconds": 0,
        "viewOnce": False,
    }
    if group:
        msg["groupInfo"] = {"groupId": group, "groupName": "Team", "revision": 3, "type": "DELIVER"}
    msg.update(data)
    env = {
        "source": number or uuid,
        "sourceNumber": number,
        "sourceUuid": uuid,
        "sourceName": name,
        "sourceDevice": 1,
        "timestamp": ts,
        "serverReceivedTimestamp": ts + 5,
        "serverDeliveredTimestamp": ts + 9,
        "dataMessage": msg,
    }
    return {"envelope": env, "account": account}


def mention(start: int, number: str = BOT, uuid: str = BOT_UUID) -> dict[str, Any]:
    return {"name": number, "number": number, "uuid": uuid, "start": start, "length": 1}


def attachment(content_type: str = "image/jpeg") -> dict[str, Any]:
    return {
        "contentType": content_type,
        "filename": "photo.jpg",
        "id": "aBc123.jpg",
        "size": 4096,
        "width": 640,
        "height": 480,
        "caption": None,
        "uploadTimestamp": None,
    }


async def _is_send(request: web.Request) -> bool:
    """A JSON-RPC `send` call (the body is read again by the handler: aiohttp keeps it)."""
    if request.path != "/api/v1/rpc":
        return False
    try:
        return bool((await request.json()).get("method") == "send")
    except ValueError:
        return False


@dataclass
class FakeSignal:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    accounts: list[str] = field(default_factory=lambda: [BOT])
    multi_account: bool = True  # False: a `-a NUMBER` daemon, which has no listAccounts
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)  # (id, data), the replay buffer
    last_event_ids: list[str | None] = field(default_factory=list)  # per connection
    port: int = 0
    keepalive_s: float = 15.0
    keep_alive: bool = True  # False: each RPC answer closes its connection (the next connects)
    _streams: list[web.StreamResponse] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _prefix: str = field(default_factory=lambda: f"{int(time.time() * 1000)}-")
    _runner: web.AppRunner | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- driving it from a test ----------------------------------------------------------

    async def push(self, payload: dict[str, Any]) -> str:
        """A message arrives: kept for replay and written to every open stream."""
        event_id = f"{self._prefix}{next(self._seq)}"
        data = json.dumps(payload)
        self.events.append((event_id, data))
        for stream in list(self._streams):
            await self._write(stream, event_id, data)
        return event_id

    async def drop_streams(self) -> None:
        """The daemon closes every event stream (a restart, a network cut)."""
        for stream in list(self._streams):
            self._streams.remove(stream)
            with _quiet():
                await stream.write_eof()
        self._closing.set()
        self._closing = asyncio.Event()

    def fail_next(self, method: str, kind: str, value: float = 0) -> None:
        """kind: "rate_limit" (value: retryAfterSeconds), "network", "http" (value: status)."""
        self.failures.setdefault(method, []).append((kind, value))

    def sent(self, method: str = "send") -> list[dict[str, Any]]:
        return [p for m, p in self.calls if m == method]

    async def wait_sent(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(lambda: self.delivered(), n, timeout, "messages sent")

    def delivered(self) -> list[dict[str, Any]]:
        """Sends that signal-cli answered with success."""
        return [p for m, p in self.calls if m == "send" and not p.get("_failed")]

    async def wait_connected(self, n: int = 1, timeout: float = 10.0) -> None:
        await wait_for_count(lambda: self.last_event_ids, n, timeout, "event stream connections")
        await wait_for_count(lambda: self._streams, 1, timeout, "an open event stream")

    # --- the server ------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(middlewares=[self.outage.middleware(_is_send, _error_answer)])
        app.router.add_post("/api/v1/rpc", self._rpc)
        app.router.add_get("/api/v1/events", self._events)
        app.router.add_get("/api/v1/check", self._check)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.drop_streams()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _check(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self._host_ok(request) else 421)

    @staticmethod
    def _host_ok(request: web.Request) -> bool:
        # signal-cli answers 421 to a Host header that is not the address it listens on
        return request.host.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")

    async def _rpc(self, request: web.Request) -> web.Response:
        response = await self._rpc_answer(request)
        if not self.keep_alive:
            response.force_close()
        return response

    async def _rpc_answer(self, request: web.Request) -> web.Response:
        if not self._host_ok(request):
            return web.Response(status=421)
        if not request.content_type.startswith("application/json"):
            return web.Response(status=415)
        try:
            body = await request.json()
        except ValueError:
            return web.json_response(_error(None, -32700, "Parse error"))
        if isinstance(body, list):
            answers = [a for a in [self._answer(r) for r in body] if a is not None]
            return web.json_response(answers) if answers else web.Response(status=201)
        answer = self._answer(body)
        if isinstance(answer, int):
            return web.Response(status=answer)
        return web.json_response(answer) if answer is not None else web.Response(status=201)

    def _answer(self, req: Any) -> Any:
        if not isinstance(req, dict) or not isinstance(req.get("method"), str):
            return _error(None, -32600, "method field must be set")
        method, rid = req["method"], req.get("id")
        params = dict(req.get("params") or {})
        self.calls.append((method, params))
        queued = self.failures.get(method)
        if queued:
            kind, value = queued.pop(0)
            params["_failed"] = kind
            return _failure(rid, kind, value, params)
        if method == "version":
            result: Any = {"version": VERSION}
        elif method == "listAccounts":
            if not self.multi_account:
                return _error(rid, -32601, "Method not implemented")
            result = [{"number": n} for n in self.accounts]
        elif params.get("account") not in self.accounts:
            return _error(rid, -32602, "Specified account does not exist")
        elif method == "send":
            to = params.get("recipient") or []
            if not params.get("message") or (not to and not params.get("groupId")):
                return _error(rid, -1, "No recipients given")
            ts = next(_ts)
            results = [
                {"recipientAddress": {"uuid": None, "number": n}, "type": "SUCCESS"}
                for n in (to if isinstance(to, list) else [to])
            ]
            result = {"timestamp": ts, "results": results}
        elif method in ("sendTyping", "sendReceipt"):
            result = {"timestamp": next(_ts), "results": []}
        else:
            return _error(rid, -32601, "Method not implemented")
        return None if rid is None else {"jsonrpc": "2.0", "result": result, "id": rid}

    async def _events(self, request: web.Request) -> web.StreamResponse:
        if not self._host_ok(request):
            return web.Response(status=421)
        account = request.query.get("account")
        if account and account not in self.accounts:
            return web.Response(status=400)
        last = request.headers.get("Last-Event-ID")
        self.last_event_ids.append(last)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        if last is not None:  # replay what came after it (all kept events if unknown)
            ids = [i for i, _ in self.events]
            start = ids.index(last) + 1 if last in ids else 0
            for event_id, data in self.events[start:]:
                await self._write(stream, event_id, data)
        self._streams.append(stream)
        closing = self._closing
        while stream in self._streams:
            try:
                await asyncio.wait_for(closing.wait(), self.keepalive_s)
            except TimeoutError:
                with _quiet():
                    await stream.write(b":\n")
        return stream

    async def _write(self, stream: web.StreamResponse, event_id: str, data: str) -> None:
        try:
            await stream.write(f"id:{event_id}\nevent:receive\ndata:{data}\n\n".encode())
        except (ConnectionError, RuntimeError):
            if stream in self._streams:
                self._streams.remove(stream)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ConnectionError, RuntimeError))  # type: ignore[arg-type]


def _error(rid: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message, "data": data}, "id": rid}


async def _error_answer(
    status: int, retry_after: float | None, request: web.Request
) -> web.StreamResponse:
    """An injected failure as signal-cli words it: Signal's rate limit and a recipient
    Signal refuses (not registered) are JSON-RPC errors of the send; a 5xx is the HTTP
    server's own."""
    if status not in (429, 403):
        return web.Response(status=status)
    req = await request.json()
    params = dict(req.get("params") or {})
    if status == 429:
        return web.json_response(_failure(req.get("id"), "rate_limit", retry_after or 1, params))
    to = params.get("recipient") or [params.get("groupId")]
    results = [
        {"recipientAddress": {"uuid": None, "number": n}, "type": "UNREGISTERED_FAILURE"}
        for n in to
    ]
    return web.json_response(
        _error(
            req.get("id"),
            -1,
            "Failed to send message: the recipient is not registered",
            {"response": {"timestamp": next(_ts), "results": results}},
        )
    )


def _failure(rid: Any, kind: str, value: float, params: dict[str, Any]) -> Any:
    if kind == "http":
        return int(value)
    to = params.get("recipient") or [params.get("groupId")]
    if kind == "rate_limit":
        results = [
            {
                "recipientAddress": {"uuid": None, "number": n},
                "type": "RATE_LIMIT_FAILURE",
                "retryAfterSeconds": int(value),
            }
            for n in to
        ]
        return _error(
            rid,
            -5,
            "Failed to send message due to rate limiting",
            {"response": {"timestamp": next(_ts), "results": results}},
        )
    results = [
        {"recipientAddress": {"uuid": None, "number": n}, "type": "NETWORK_FAILURE"} for n in to
    ]
    return _error(
        rid,
        -1,
        "Failed to send message",
        {"response": {"timestamp": next(_ts), "results": results}},
    )
