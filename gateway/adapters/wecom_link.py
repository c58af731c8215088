"""One WeCom AI bot long connection, over aiohttp's websocket client: opened and
subscribed with the bot id and secret, kept alive with `ping` frames, read in order
(callbacks handed over one at a time, answers matched to the call that waits for them
by req_id; calls under one req_id, such as two replies to one callback, take turns, each
sent once the one before it is answered, since an answer names only the req_id), closed
when WeCom says a newer connection of the bot took over.

Failures come out typed: a refused bot id or secret is InvalidToken, a connection that
cannot be opened, drops, or leaves a call unanswered is TransientError, an answer with an
errcode is what `wecom_wire.answer_error` makes of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from gateway.adapters.base import check_send_by, send_by_trace
from gateway.adapters.wecom_wire import (
    EVENT,
    MESSAGE,
    PING,
    REPLACED,
    SUBSCRIBE,
    answer_error,
    frame,
    new_req_id,
    req_id_of,
    subscribe_body,
)
from gateway.errors import InvalidToken, TransientError

log = logging.getLogger("gateway.adapters.wecom")

Handler = Callable[[dict[str, Any]], Awaitable[None]]
CONNECT_TIMEOUT_S = 15.0
MISSED_PINGS = 2  # unanswered pings in a row after which the connection is taken for dead


class Link:
    """A connection's life: `open` (connect and subscribe), `serve` (read until it ends),
    `call` (a frame of ours and WeCom's answer), `close`."""

    def __init__(
        self,
        url: str,
        bot_id: str,
        secret: str,
        *,
        heartbeat_s: float = 30.0,
        answer_timeout_s: float = 10.0,
    ) -> None:
        self.url, self._bot_id, self._secret = url, bot_id, secret
        self._heartbeat_s, self._answer_timeout_s = heartbeat_s, answer_timeout_s
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._turns: dict[str, _Turn] = {}  # req_id -> the calls under it, one at a time
        self._missed = 0
        self.replaced = False  # WeCom closed it for a newer connection of the same bot

    @property
    def open_(self) -> bool:
        return self._ws is not None and not self._ws.closed

    async def open(self) -> None:
        """Connect and subscribe; the subscription's answer is read here, before `serve`."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
            trace_configs=[send_by_trace()],
        )
        try:
            self._ws = await asyncio.wait_for(
                self._http.ws_connect(
                    self.url, timeout=aiohttp.ClientWSTimeout(ws_close=5.0), max_msg_size=0
                ),
                CONNECT_TIMEOUT_S,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self.close()
            raise TransientError(f"wecom unreachable ({type(exc).__name__}: {exc})") from exc
        req_id = new_req_id(SUBSCRIBE)
        try:
            await self._ws.send_str(
                json.dumps(frame(SUBSCRIBE, req_id, subscribe_body(self._bot_id, self._secret)))
            )
            answer = await asyncio.wait_for(self._answer_of(req_id), CONNECT_TIMEOUT_S)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self.close()
            raise TransientError(f"wecom did not answer the subscription ({exc!r})") from exc
        error = answer_error(answer, "the subscription")
        if error is not None:
            await self.close()
            if not isinstance(error, TransientError):  # refused, not busy: the credentials
                raise InvalidToken(f"wecom refused the bot id or secret: {answer.get('errmsg')}")
            raise error

    async def _answer_of(self, req_id: str) -> dict[str, Any]:
        """Read frames until the answer to `req_id` (only the subscription is read so)."""
        assert self._ws is not None
        while True:
            msg = await self._ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise TransientError(f"the connection closed while subscribing ({msg.type.name})")
            data = _parsed(msg.data)
            if data is not None and not data.get("cmd") and req_id_of(data) == req_id:
                return data

    async def serve(self, on_message: Handler, on_event: Handler) -> None:
        """Read frames until the connection ends: message callbacks go to `on_message` in
        the order WeCom sent them (each awaited before the next is read), events to
        `on_event`, answers to the calls waiting for them. Pings go out meanwhile."""
        assert self._ws is not None
        beat = asyncio.create_task(self._heartbeat(), name="wecom.heartbeat")
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                data = _parsed(msg.data)
                if data is None:
                    log.info("ignored an unreadable WeCom frame: %.200r", msg.data)
                elif data.get("cmd") == MESSAGE:
                    await on_message(data)
                elif data.get("cmd") == EVENT:
                    if _event_type(data) == REPLACED:
                        self.replaced = True
                        break
                    await on_event(data)
                else:
                    self._answered(data)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
            await self.close()

    def _answered(self, data: dict[str, Any]) -> None:
        req_id = req_id_of(data)
        if req_id.startswith(PING + "_"):
            self._missed = 0
            return
        waiting = self._waiting.pop(req_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(data)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            if self._missed >= MISSED_PINGS:
                log.warning("wecom answered none of %d pings; reconnecting", self._missed)
                if self._ws is not None:
                    await self._ws.close()
                return
            self._missed += 1
            with contextlib.suppress(aiohttp.ClientError, ConnectionError):
                await self._send(frame(PING, new_req_id(PING)))

    async def _send(self, data: Mapping[str, Any]) -> None:
        if self._ws is None or self._ws.closed:
            raise TransientError("the wecom connection is closed")
        text = json.dumps(data, ensure_ascii=False)
        await check_send_by()  # a reply that stood still stops here, unsent (SetOutLate)
        await self._ws.send_str(text)

    async def call(
        self, cmd: str, body: Mapping[str, Any], *, req_id: str | None = None, what: str = ""
    ) -> dict[str, Any]:
        """Send one frame and wait for WeCom's answer to it; an errcode comes out typed.
        A call under a req_id another call is waiting on goes out after that one's answer
        (WeCom's answer carries only the req_id, so two in flight could not be told apart)."""
        req_id = req_id or new_req_id(cmd)
        turn = self._turns.setdefault(req_id, _Turn())
        turn.callers += 1
        try:
            async with turn.lock:
                answer = await self._call(cmd, body, req_id)
        finally:
            turn.callers -= 1
            if not turn.callers and self._turns.get(req_id) is turn:
                del self._turns[req_id]
        error = answer_error(answer, what or cmd)
        if error is not None:
            raise error
        return answer

    async def _call(self, cmd: str, body: Mapping[str, Any], req_id: str) -> dict[str, Any]:
        waiting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[req_id] = waiting
        try:
            try:
                await self._send(frame(cmd, req_id, body))
            except (aiohttp.ClientError, ConnectionError) as exc:
                raise TransientError(f"the wecom connection dropped ({exc!r})") from exc
            try:
                return await asyncio.wait_for(asyncio.shield(waiting), self._answer_timeout_s)
            except TimeoutError as exc:
                raise TransientError(f"wecom did not answer {cmd} in time") from exc
        finally:
            if self._waiting.get(req_id) is waiting:
                del self._waiting[req_id]

    async def close(self) -> None:
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(TransientError("the wecom connection closed"))
        self._waiting.clear()
        ws, self._ws = self._ws, None
        if ws is not None and not ws.closed:
            with contextlib.suppress(Exception):
                await ws.close()
        http, self._http = self._http, None
        if http is not None:
            await http.close()


class _Turn:
    """The calls under one req_id: the lock they take in turn and how many hold or await it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.callers = 0


def _parsed(raw: Any) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _event_type(data: Mapping[str, Any]) -> str:
    body = data.get("body")
    event = body.get("event") if isinstance(body, Mapping) else None
    return str(event.get("eventtype") or "") if isinstance(event, Mapping) else ""
