"""QQ Bot's websocket gateway: Hello (op 10) with the heartbeat interval, Identify (op 2)
with "QQBot <access token>" and the intents, or Resume (op 6) with the session id and the
last sequence number taken; heartbeats (op 1) carry that number and expect an ack (op 11);
Reconnect (op 7) and Invalid Session (op 9) are obeyed.

Inbox before ack: dispatches are handled one after another, and the sequence number moves
past a message only once the core took it. The number is what a Resume names, so after a
message the core could not store (NotAccepted), a drop or a restart QQ sends everything
after it again; the core's unique key answers a redelivery once. The session id and the
number are kept in the store's cursors, so a restarted daemon (or the replica that takes the
connection over) resumes where the last one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway.adapters.base import Backoff, Cursors, call_with_retry
from gateway.adapters.qqbot_api import QQApi
from gateway.errors import InvalidToken, NotAccepted, TransientError

log = logging.getLogger("gateway.adapters.qqbot")

GROUP_AND_C2C_EVENT = 1 << 25  # C2C_MESSAGE_CREATE, GROUP_AT_MESSAGE_CREATE
PUBLIC_GUILD_MESSAGES = 1 << 30  # AT_MESSAGE_CREATE: a guild channel's @-messages
HELLO_TIMEOUT_S = 30.0
SESSION_CURSOR, SEQ_CURSOR = "session_id", "seq"
AUTH_FAILED = 4004  # the token in Identify / Resume was refused
CANNOT_RESUME = frozenset({4006, 4007, 4009})  # session gone, bad seq, session timed out
FATAL = {4914: "the bot is offline (sandbox only)", 4915: "the bot is banned"}
RATE_LIMITED = 4008

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]


class Drop(Exception):
    """This connection ends; the loop connects again (resuming when it can)."""


class QQGateway:
    """One bot's gateway connection, run by `run` until cancelled: it connects again after
    every drop, resuming the session while QQ allows it."""

    def __init__(
        self,
        api: QQApi,
        on_event: OnEvent,
        *,
        intents: int = GROUP_AND_C2C_EVENT,
        backoff: Backoff,
        cursors: Cursors | None = None,
    ) -> None:
        self.api, self._on_event, self.intents = api, on_event, intents
        self._backoff, self._cursors = backoff, cursors
        self.session_id: str | None = None
        self.seq: int | None = None  # the last dispatch taken: what heartbeats and Resume name
        self.bot_name: str | None = None
        self.connections = self.resumes = 0
        self.connected = False
        self.last_error: str | None = None
        self._acked = True  # the last heartbeat's ack came
        self._ready = False  # the session is ready (or resumed) on this connection
        self._kept_session: str | None = None  # the session id last written to the store
        self._ws: aiohttp.ClientWebSocketResponse | None = None

    async def load(self) -> None:
        """Take up the session the last receiver left in the store, to resume it."""
        if self._cursors is None:
            return
        session, seq = await self._cursors.get(SESSION_CURSOR), await self._cursors.get(SEQ_CURSOR)
        if session and seq and seq.isdigit():
            self.session_id, self.seq = session, int(seq)
            self._kept_session = session

    async def _keep(self) -> None:
        """The session id (when it changed) and the sequence number, into the store."""
        if self._cursors is None:
            return
        if self.session_id != self._kept_session:
            await self._cursors.set(SESSION_CURSOR, self.session_id or "")
            self._kept_session = self.session_id
        await self._cursors.set(SEQ_CURSOR, "" if self.seq is None else str(self.seq))

    def _forget_session(self) -> None:
        self.session_id, self.seq = None, None

    async def run(self) -> None:
        """Connect, follow the connection until it drops, connect again with backoff. A
        refused AppSecret (or a banned bot) ends it: raised as InvalidToken."""
        attempt = 0
        while True:
            try:
                url = await call_with_retry(self.api.gateway_url, backoff=self._backoff, log=log)
                async with self.api.http.ws_connect(url, autoping=True, heartbeat=None) as ws:
                    self._ws = ws
                    if await self._follow(ws):
                        attempt = 0
                    self._closed(ws.close_code)
            except InvalidToken as exc:
                self.last_error = str(exc)
                raise
            except (Drop, TransientError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("qq gateway connection lost (%s); connecting again", self.last_error)
            except Exception as exc:  # e.g. the store refused the cursor: connect again
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("qq gateway connection failed; connecting again")
            finally:
                self._ws, self.connected = None, False
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1

    def _closed(self, code: int | None) -> None:
        """What QQ's close code says about the next connection."""
        if code is None or code < 4000:
            return
        self.last_error = f"closed by qq with code {code}"
        if code in FATAL:
            raise InvalidToken(f"qq closed the gateway: {FATAL[code]} (code {code})")
        if code == AUTH_FAILED:
            self.api.forget_token()
            self._forget_session()
        elif code in CANNOT_RESUME:
            self._forget_session()
        log.warning("qq closed the gateway connection with code %s", code)

    async def _follow(self, ws: aiohttp.ClientWebSocketResponse) -> bool:
        """One connection: hello, identify or resume, then dispatches until it closes.
        True once the session was ready (or resumed) on it."""
        hello = await self._read(ws, within_s=HELLO_TIMEOUT_S)
        if hello is None or hello.get("op") != 10:
            raise Drop(f"no hello from the gateway ({hello!r:.100})")
        interval = float((hello.get("d") or {}).get("heartbeat_interval") or 41250) / 1000
        token = f"QQBot {await self.api.access_token()}"
        if self.session_id and self.seq is not None:
            resume = {"token": token, "session_id": self.session_id, "seq": self.seq}
            await ws.send_json({"op": 6, "d": resume})
        else:
            identify = {
                "token": token,
                "intents": self.intents,
                "shard": [0, 1],
                "properties": {"$os": "linux", "$browser": "switchboard", "$device": "switchboard"},
            }
            await ws.send_json({"op": 2, "d": identify})
        self.connections += 1
        self._acked, self._ready = True, False
        dispatches: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        beats = asyncio.create_task(self._heartbeats(ws, interval), name="qqbot.heartbeat")
        taking = asyncio.create_task(self._take(ws, dispatches), name="qqbot.dispatches")
        try:
            while (payload := await self._read(ws)) is not None:
                if payload.get("op") == 0:
                    dispatches.put_nowait(payload)  # taken in order, beside the reading
                else:
                    await self._control(ws, payload)
            dispatches.put_nowait(None)
            await taking  # what came before the close is still taken, in order
        finally:
            for task in (beats, taking):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self._ready

    async def _take(
        self, ws: aiohttp.ClientWebSocketResponse, dispatches: asyncio.Queue[dict[str, Any] | None]
    ) -> None:
        """Dispatches one after another; after one the core could not take, none more on
        this connection (it is closed: the resume names the number before it)."""
        while (payload := await dispatches.get()) is not None:
            if not await self._dispatch(ws, payload):
                return

    async def _read(
        self, ws: aiohttp.ClientWebSocketResponse, within_s: float | None = None
    ) -> dict[str, Any] | None:
        """The next payload; None when the connection closed."""
        while True:
            msg = await ws.receive(timeout=within_s)
            if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                try:
                    payload = json.loads(msg.data)
                except ValueError:
                    log.info("ignored an unreadable gateway payload: %.200r", msg.data)
                    continue
                if isinstance(payload, dict):
                    return payload
                continue
            if msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSING,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                return None

    async def _control(self, ws: aiohttp.ClientWebSocketResponse, payload: dict[str, Any]) -> None:
        """A payload other than a dispatch, answered while dispatches are being taken."""
        op = payload.get("op")
        if op == 11:
            self._acked = True
        elif op == 7:  # QQ asks for a new connection: resume on it
            await ws.close()
        elif op == 9:  # the session cannot be resumed (or the identify was wrong)
            log.warning("qq invalidated the gateway session; identifying again")
            self._forget_session()
            await ws.close()
        elif op == 1:  # QQ asks for a heartbeat now
            await ws.send_json({"op": 1, "d": self.seq})

    async def _dispatch(self, ws: aiohttp.ClientWebSocketResponse, payload: dict[str, Any]) -> bool:
        """One dispatch, its sequence number kept once it was taken; False when the core
        could not take it (the connection is closed before it)."""
        kind, data, seq = str(payload.get("t") or ""), payload.get("d"), payload.get("s")
        data = data if isinstance(data, dict) else {}
        if kind == "READY":
            self.session_id = str(data.get("session_id") or "") or None
            self.bot_name = str((data.get("user") or {}).get("username") or "") or None
        elif kind == "RESUMED":
            self.resumes += 1
        else:
            try:
                await self._on_event(kind, data)
            except NotAccepted as exc:  # not taken: QQ sends it again after the resume
                self.last_error = f"a message was not accepted: {exc}"
                log.warning("the gateway could not take a message; resuming before it")
                await ws.close()
                return False
        if kind in ("READY", "RESUMED"):
            self._ready = self.connected = True
            self.last_error = None
        if isinstance(seq, int) and (self.seq is None or seq > self.seq or kind == "READY"):
            self.seq = seq
        if self.session_id:
            await self._keep()
        return True

    async def _heartbeats(self, ws: aiohttp.ClientWebSocketResponse, interval: float) -> None:
        """op 1 with the last sequence number taken, every `interval`; a beat whose ack did
        not come by the next one means the connection is dead: it is closed."""
        while not ws.closed:
            await asyncio.sleep(interval)
            if not self._acked:
                self.last_error = "no heartbeat ack"
                log.warning("qq gateway: no heartbeat ack; connecting again")
                await ws.close()
                return
            self._acked = False
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json({"op": 1, "d": self.seq})
