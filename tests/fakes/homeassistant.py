"""A loopback fake of Home Assistant's websocket API (`/api/websocket`): the authentication
phase (auth_required, auth, auth_ok / auth_invalid), numbered commands answered by
`result` (subscribe_events, subscribe_trigger for state triggers, unsubscribe_events,
fire_event, call_service, get_config, ping), ids that must grow within a connection (an id
that does not is answered `id_reuse`, as Home Assistant does), events delivered to the
subscriptions of their type, and a restart that drops every connection.

`outage` (the shared failure-injection switch) fails the commands that send (fire_event,
call_service). A websocket carries no HTTP status, so each injected failure is what Home
Assistant really answers: `success: false` with the error code it gives, a 500 as
`unknown_error`, another 5xx as `home_assistant_error` (an integration's failure), a 429 as
`home_assistant_error` too (Home Assistant has no rate-limit answer and names no wait: a
notify service over its limit fails so), a 403 as `unauthorized`, a 400 as
`invalid_format`; a reset drops the connection with the command unanswered, and a timeout
answers nothing for the seconds given, then `timeout`."""

from __future__ import annotations

import asyncio
import itertools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, wait_for_count

TOKEN = "ha-long-lived-token"
ENV = {"HOMEASSISTANT_TOKEN": TOKEN}
VERSION = "2026.11.3"
ADMIN_USER = "9f0c8a6b2d1e4c7f8a3b5d6e7f809a1b"


SENDS = ("fire_event", "call_service")
# the result's error (code, message) for an injected status
INJECTED = {
    500: ("unknown_error", "Unknown error"),
    429: ("home_assistant_error", "Rate limit exceeded"),
    403: ("unauthorized", "Unauthorized"),
    400: ("invalid_format", "Message incorrectly formatted."),
}
SERVER_FAULT = ("home_assistant_error", "Service unavailable")


@dataclass
class Sub:
    ws: web.WebSocketResponse
    id: int
    kind: str  # "events" or "trigger"
    event_type: str | None = None
    entities: tuple[str, ...] = ()


@dataclass
class FakeHomeAssistant:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    token: str = TOKEN
    admin: bool = True  # False: custom event subscriptions and fire_event are refused
    services: set[str] = field(
        default_factory=lambda: {
            "notify.mobile_app_alice_phone",
            "notify.mobile_app_bob_phone",
            "persistent_notification.create",
        }
    )
    location: str = "Home"
    accept: bool = True  # False: the websocket answers 503 (Home Assistant is restarting)
    commands: list[dict[str, Any]] = field(default_factory=list)  # every command, in order
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # services
    fired: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # fire_event
    failures: list[tuple[str, str, str]] = field(default_factory=list)  # (service, code, msg)
    id_errors: list[int] = field(default_factory=list)
    auths: list[bool] = field(default_factory=list)
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    subs: list[Sub] = field(default_factory=list)
    port: int = 0
    _contexts: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _runner: web.AppRunner | None = None
    _transports: dict[web.WebSocketResponse, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/websocket", self._websocket)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.restart()
        if self._runner is not None:
            await self._runner.cleanup()

    async def restart(self) -> None:
        """Close every connection, as Home Assistant does when it restarts."""
        for ws in list(self.sockets):
            await ws.close()
        self.subs.clear()

    def context(self, user_id: str | None = None) -> dict[str, Any]:
        return {"id": f"ctx{next(self._contexts):04d}", "parent_id": None, "user_id": user_id}

    def open_sockets(self) -> int:
        return len([ws for ws in self.sockets if not ws.closed])

    def subscribed(self, event_type: str) -> list[Sub]:
        return [s for s in self.subs if s.kind == "events" and s.event_type == event_type]

    async def wait_subscribed(
        self, event_type: str = "switchboard_conversation", n: int = 1, timeout: float = 10.0
    ) -> list[Sub]:
        return await wait_for_count(
            lambda: self.subscribed(event_type), n, timeout, f"subscriptions to {event_type}"
        )

    def replies(self) -> list[dict[str, Any]]:
        return [d for t, d in self.fired if t == "switchboard_reply"]

    async def wait_replies(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.replies, n, timeout, "reply events")

    def received(self) -> list[dict[str, Any]]:
        return [d for t, d in self.fired if t == "switchboard_received"]

    async def wait_received(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.received, n, timeout, "received events")

    def notified(self, service: str) -> list[dict[str, Any]]:
        return [d for domain, name, d in self.calls if f"{domain}.{name}" == service]

    # --- pushing events -------------------------------------------------------------------

    async def fire(
        self,
        data: dict[str, Any],
        *,
        event_type: str = "switchboard_conversation",
        context: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An event on the bus (an automation's `event:` action); returns its context."""
        context = context or self.context()
        event = {
            "event_type": event_type,
            "data": data,
            "origin": "LOCAL",
            "time_fired": "2026-12-06T08:00:00.000000+00:00",
            "context": context,
        }
        for sub in self.subscribed(event_type):
            await self._send(sub.ws, {"id": sub.id, "type": "event", "event": event})
        return context

    async def change(self, entity: str, old: str, new: str, name: str | None = None) -> None:
        """A state change of `entity`: the state triggers watching it fire."""
        attributes = {"friendly_name": name} if name else {}
        context = self.context()

        def state(value: str) -> dict[str, Any]:
            return {
                "entity_id": entity,
                "state": value,
                "attributes": attributes,
                "last_changed": "2026-12-06T08:00:00+00:00",
                "context": context,
            }

        trigger = {
            "id": "0",
            "idx": "0",
            "platform": "state",
            "entity_id": entity,
            "from_state": state(old),
            "to_state": state(new),
        }
        for sub in [s for s in self.subs if s.kind == "trigger" and entity in s.entities]:
            event = {"variables": {"trigger": trigger}, "context": context}
            await self._send(sub.ws, {"id": sub.id, "type": "event", "event": event})

    # --- the websocket ----------------------------------------------------------------------

    @staticmethod
    async def _send(ws: web.WebSocketResponse, msg: dict[str, Any]) -> None:
        if not ws.closed:
            await ws.send_str(json.dumps(msg))

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        if not self.accept:
            return web.Response(status=503, text="Home Assistant is starting")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self.sockets.append(ws)
        self._transports[ws] = request.transport
        await self._send(ws, {"type": "auth_required", "ha_version": VERSION})
        first = await ws.receive()
        try:
            auth = json.loads(first.data)
        except (TypeError, ValueError):
            auth = {}
        if auth.get("type") != "auth" or auth.get("access_token") != self.token:
            self.auths.append(False)
            await self._send(ws, {"type": "auth_invalid", "message": "Invalid access token"})
            await ws.close()
            return ws
        self.auths.append(True)
        await self._send(ws, {"type": "auth_ok", "ha_version": VERSION})
        last = 0
        async for frame in ws:
            msg = json.loads(frame.data)
            self.commands.append(msg)
            msg_id = msg.get("id")
            if not isinstance(msg_id, int) or msg_id <= last:
                self.id_errors.append(msg_id)
                await self._result(
                    ws, msg_id, error=("id_reuse", "Identifier values have to increase.")
                )
                continue
            last = msg_id
            await self._command(ws, msg_id, msg)
        self.subs = [s for s in self.subs if s.ws is not ws]
        return ws

    async def _result(
        self,
        ws: web.WebSocketResponse,
        msg_id: Any,
        result: Any = None,
        error: tuple[str, str] | None = None,
    ) -> None:
        if error:
            body = {"code": error[0], "message": error[1]}
            await self._send(ws, {"id": msg_id, "type": "result", "success": False, "error": body})
        else:
            await self._send(
                ws, {"id": msg_id, "type": "result", "success": True, "result": result}
            )

    async def _command(self, ws: web.WebSocketResponse, msg_id: int, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind in SENDS and await self._injected(ws, msg_id):
            return
        if kind == "ping":
            await self._send(ws, {"id": msg_id, "type": "pong"})
        elif kind == "subscribe_events":
            event_type = msg.get("event_type")
            if not self.admin and event_type != "state_changed":
                await self._result(ws, msg_id, error=("unauthorized", "Unauthorized"))
                return
            self.subs.append(Sub(ws, msg_id, "events", event_type))
            await self._result(ws, msg_id)
        elif kind == "subscribe_trigger":
            trigger = msg.get("trigger") or {}
            entities = trigger.get("entity_id") or []
            entities = [entities] if isinstance(entities, str) else entities
            self.subs.append(Sub(ws, msg_id, "trigger", entities=tuple(entities)))
            await self._result(ws, msg_id)
        elif kind == "unsubscribe_events":
            found = [s for s in self.subs if s.ws is ws and s.id == msg.get("subscription")]
            if not found:
                await self._result(ws, msg_id, error=("not_found", "Subscription not found."))
                return
            self.subs.remove(found[0])
            await self._result(ws, msg_id)
        elif kind == "fire_event":
            if not self.admin:
                await self._result(ws, msg_id, error=("unauthorized", "Unauthorized"))
                return
            context = self.context(ADMIN_USER)
            self.fired.append((str(msg.get("event_type")), dict(msg.get("event_data") or {})))
            await self._result(ws, msg_id, {"context": context})
            await self.fire(
                dict(msg.get("event_data") or {}),
                event_type=str(msg.get("event_type")),
                context=context,
            )
        elif kind == "call_service":
            await self._call_service(ws, msg_id, msg)
        elif kind == "auth/current_user":
            user = {"id": ADMIN_USER, "name": "Alice", "is_owner": self.admin}
            await self._result(ws, msg_id, {**user, "is_admin": self.admin})
        elif kind == "get_services":
            found: dict[str, dict[str, Any]] = {}
            for name in self.services:
                domain, _, service = name.partition(".")
                found.setdefault(domain, {})[service] = {"fields": {}}
            await self._result(ws, msg_id, found)
        elif kind == "get_config":
            await self._result(ws, msg_id, {"location_name": self.location, "version": VERSION})
        else:
            await self._result(ws, msg_id, error=("unknown_command", "Unknown command."))

    async def _injected(self, ws: web.WebSocketResponse, msg_id: int) -> bool:
        """Answer this send command with the outage's failure; False when there is none."""
        failure = self.outage.take()
        if failure is None:
            return False
        self.outage.failed += 1
        kind, _, arg = failure.partition(":")
        if kind == "reset":
            transport = self._transports.get(ws)
            if transport is not None:
                transport.abort()  # the connection drops, the command unanswered
            return True
        if kind == "timeout":
            await asyncio.sleep(float(arg or 30))
            await self._result(ws, msg_id, error=("timeout", "Timeout"))
            return True
        await self._result(ws, msg_id, error=INJECTED.get(int(kind), SERVER_FAULT))
        return True

    async def _call_service(
        self, ws: web.WebSocketResponse, msg_id: int, msg: dict[str, Any]
    ) -> None:
        name = f"{msg.get('domain')}.{msg.get('service')}"
        for failure in self.failures:
            if failure[0] == name:
                self.failures.remove(failure)
                await self._result(ws, msg_id, error=(failure[1], failure[2]))
                return
        if name not in self.services:
            error = ("not_found", f"Action {name} not found.")
            await self._result(ws, msg_id, error=error)
            return
        data = dict(msg.get("service_data") or {})
        self.calls.append((str(msg["domain"]), str(msg["service"]), data))
        await asyncio.sleep(0)
        await self._result(ws, msg_id, {"context": self.context(ADMIN_USER), "response": None})


def new_context(user_id: str | None = None) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "parent_id": None, "user_id": user_id}
