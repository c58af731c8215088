"""Home Assistant's websocket API (`/api/websocket`) on aiohttp: the authentication phase,
numbered commands and their results, and subscriptions that survive reconnects.

The server greets with `auth_required`; the client answers `auth` with its long-lived
access token and gets `auth_ok` or `auth_invalid` (a refused token: InvalidToken, no
retry). In the command phase every message carries an `id` that grows with each command
of the connection; the server's `result` (or `pong`) names it, and the events of a
subscription carry the id of the command that made it. A dropped connection (Home
Assistant restarting, the network) is opened again with backoff, authenticated again, and
every wanted subscription is made again under new ids. A command sent while the connection
is down waits for it a while, then fails as TransientError.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.adapters.base import Backoff, check_send_by
from gateway.errors import AdapterError, InvalidToken, TransientError

log = logging.getLogger("gateway.adapters.homeassistant")
HEARTBEAT_S = 30.0
# error codes of a command that trying again may cure; any other is a refusal
TRANSIENT_CODES = frozenset({"home_assistant_error", "unknown_error", "timeout"})


class CommandFailed(AdapterError):
    """Home Assistant answered a command with `success: false`."""

    def __init__(self, command: str, code: str, message: str) -> None:
        super().__init__(f"home assistant refused {command}: {message or code} ({code})")
        self.code, self.message = code, message


@dataclass(frozen=True)
class Subscription:
    """What to subscribe to: `subscribe_events` of one event type, or `subscribe_trigger`
    of one trigger. `kind` names it to the event handler."""

    kind: str
    command: Mapping[str, Any]


OnEvent = Callable[[str, Mapping[str, Any]], None]


def websocket_url(url: str) -> str:
    base = url.rstrip("/")
    base = base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return base + "/api/websocket"


class HaSocket:
    """One authenticated websocket to Home Assistant, kept open until `close`."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        on_event: OnEvent,
        backoff: Backoff,
        on_refused: Callable[[str], None],
        connect_timeout_s: float = 15.0,
        command_timeout_s: float = 30.0,
    ) -> None:
        self.url = websocket_url(url)
        self._token = token
        self._on_event, self._on_refused = on_event, on_refused
        self._backoff = backoff
        self._connect_timeout, self._command_timeout = connect_timeout_s, command_timeout_s
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids: itertools.count[int] = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._wanted: list[Subscription] = []
        self._active: dict[int, Subscription] = {}  # subscription id -> what it is
        self._ready = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self.ha_version: str | None = None
        self.connections = 0
        self.refused: str | None = None
        self.last_error: str | None = None

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    async def open(self) -> None:
        """Connect and authenticate once (InvalidToken when refused, TransientError when
        unreachable); then keep the connection in a task of its own."""
        if self._http is None:
            self._http = aiohttp.ClientSession()
        reader = self._attach(await self._connect())
        self._loop = asyncio.create_task(self._run(reader), name="homeassistant.websocket")

    async def close(self) -> None:
        for task in (self._loop, self._reader):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._loop = self._reader = None
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        self._lost()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # --- connecting -----------------------------------------------------------------------

    async def _connect(self) -> aiohttp.ClientWebSocketResponse:
        assert self._http is not None
        try:
            async with asyncio.timeout(self._connect_timeout):
                ws = await self._http.ws_connect(self.url, heartbeat=HEARTBEAT_S)
                try:
                    await self._authenticate(ws)
                except BaseException:
                    await ws.close()
                    raise
        except aiohttp.WSServerHandshakeError as exc:
            raise TransientError(f"home assistant websocket refused: HTTP {exc.status}") from exc
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise TransientError(f"home assistant unreachable ({type(exc).__name__})") from exc
        self._ws = ws
        self.connections += 1
        return ws

    async def _authenticate(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        hello = await self._receive(ws)
        if hello.get("type") != "auth_required":
            raise TransientError(f"not a Home Assistant websocket (first message {hello!r:.80})")
        await ws.send_str(json.dumps({"type": "auth", "access_token": self._token}))
        answer = await self._receive(ws)
        if answer.get("type") == "auth_invalid":
            why = str(answer.get("message") or "invalid access token")
            raise InvalidToken(f"home assistant refused the access token: {why}")
        if answer.get("type") != "auth_ok":
            raise TransientError(f"unexpected answer to auth: {answer!r:.80}")
        self.ha_version = str(answer.get("ha_version") or hello.get("ha_version") or "") or None

    @staticmethod
    async def _receive(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
        frame = await ws.receive()
        if frame.type != aiohttp.WSMsgType.TEXT:
            raise TransientError(f"the websocket closed during authentication ({frame.type!r})")
        try:
            found = json.loads(frame.data)
        except ValueError as exc:
            raise TransientError(
                "not a Home Assistant websocket (a frame that is not JSON)"
            ) from exc
        return found if isinstance(found, dict) else {}

    def _attach(self, ws: aiohttp.ClientWebSocketResponse) -> asyncio.Task[None]:
        """Start reading an authenticated connection: commands may go out from now on."""
        self._reader = asyncio.create_task(self._read(ws), name="homeassistant.read")
        self._ready.set()
        return self._reader

    async def _run(self, reader: asyncio.Task[None] | None) -> None:
        """Wait for the connection to drop, then open another with backoff and make every
        wanted subscription again; ends when the token is refused."""
        attempt = 0
        while True:
            if reader is not None:
                await asyncio.gather(reader, return_exceptions=True)
                self._lost()
                log.warning("home assistant websocket closed; reconnecting")
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1
            try:
                ws = await self._connect()
            except InvalidToken as exc:
                self.refused = str(exc)
                self._on_refused(str(exc))
                return
            except TransientError as exc:
                self.last_error, reader = str(exc), None
                log.info("home assistant: %s", exc)
                continue
            reader = self._attach(ws)
            try:
                for sub in list(self._wanted):
                    await self._subscribe_now(sub)
                attempt = 0  # back in business: the next drop starts the backoff afresh
            except (TransientError, CommandFailed) as exc:
                self.last_error = str(exc)
                log.warning("home assistant: could not subscribe again: %s", exc)
                await ws.close()

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        async for frame in ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                msg = json.loads(frame.data)
            except ValueError:
                log.info("ignored a frame that is not JSON: %.200r", frame.data)
                continue
            for one in msg if isinstance(msg, list) else [msg]:  # coalesced messages
                if isinstance(one, dict):
                    self._dispatch(one)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind, msg_id = msg.get("type"), msg.get("id")
        if kind == "event" and isinstance(msg.get("event"), dict):
            sub = self._active.get(msg_id) if isinstance(msg_id, int) else None
            if sub is not None:
                self._on_event(sub.kind, msg["event"])
            return
        if kind in ("result", "pong") and isinstance(msg_id, int):
            waiter = self._pending.pop(msg_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(msg)

    def _lost(self) -> None:
        self._ready.clear()
        self._active.clear()
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(TransientError("the home assistant websocket closed"))
        self._pending.clear()

    # --- commands ---------------------------------------------------------------------------

    async def command(self, payload: Mapping[str, Any]) -> Any:
        """Send one command and return its result's `result`; CommandFailed when Home
        Assistant answered `success: false`, TransientError when the connection is down."""
        what = str(payload.get("type"))
        try:
            async with asyncio.timeout(self._command_timeout):
                await self._ready.wait()
                ws = self._ws
                if ws is None or ws.closed:
                    raise TransientError("the home assistant websocket is closed")
                msg_id = next(self._ids)
                waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._pending[msg_id] = waiter
                try:
                    await check_send_by()  # a reply that set out too late goes no further
                    await ws.send_str(json.dumps({**payload, "id": msg_id}))
                    answer = await waiter
                finally:
                    self._pending.pop(msg_id, None)
        except TimeoutError as exc:
            raise TransientError(f"home assistant did not answer {what} in time") from exc
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise TransientError(f"home assistant websocket failed ({type(exc).__name__})") from exc
        if answer.get("type") == "pong":
            return None
        if not answer.get("success"):
            error = answer.get("error") or {}
            code = str(error.get("code") or "unknown_error")
            raise CommandFailed(what, code, str(error.get("message") or ""))
        return answer.get("result")

    async def subscribe(self, sub: Subscription) -> None:
        """Subscribe now (when connected) and after every reconnect."""
        self._wanted.append(sub)
        if self.connected:
            try:
                await self._subscribe_now(sub)
            except BaseException:
                self._wanted.remove(sub)
                raise

    async def unsubscribe_all(self, timeout_s: float = 5.0) -> None:
        """No more subscriptions: those active are ended on the connection (when it is up;
        a dropped connection ended them already), none is made again."""
        self._wanted.clear()
        active, self._active = dict(self._active), {}
        if not self.connected:
            return
        with contextlib.suppress(AdapterError, TimeoutError):
            async with asyncio.timeout(timeout_s):
                for sub_id in active:
                    await self.command({"type": "unsubscribe_events", "subscription": sub_id})

    async def _subscribe_now(self, sub: Subscription) -> None:
        """The command's id becomes the subscription's: registered before it is sent, so
        an event that follows the result at once is not missed."""
        ws = self._ws
        if ws is None or ws.closed:
            raise TransientError("the home assistant websocket is closed")
        msg_id = next(self._ids)
        self._active[msg_id] = sub
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = waiter
        try:
            await ws.send_str(json.dumps({**sub.command, "id": msg_id}))
            async with asyncio.timeout(self._command_timeout):
                answer = await waiter
        except TimeoutError as exc:
            raise TransientError("home assistant did not answer a subscription") from exc
        except BaseException:
            self._active.pop(msg_id, None)
            raise
        finally:
            self._pending.pop(msg_id, None)
        if not answer.get("success"):
            self._active.pop(msg_id, None)
            error = answer.get("error") or {}
            raise CommandFailed(
                str(sub.command.get("type")),
                str(error.get("code") or "unknown_error"),
                str(error.get("message") or ""),
            )
