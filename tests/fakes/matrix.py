"""A loopback fake of a Matrix homeserver's client-server API, the subset mautrix's
ClientAPI calls for the adapter: whoami, /sync (long poll, `since`/`next_batch` over one
ordered event log, so a token replays nothing and skips nothing), send, typing, join,
joined_members, profile display names, account data and single events.

Like a real homeserver it echoes the bot's own sends back through /sync, dedupes a send
retried with the same transaction id, and answers a wrong token 401 M_UNKNOWN_TOKEN.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import Outage, wait_for_count

BOT = "@switchboard:fake.test"
BOT_NAME = "switchboard"
TOKEN = "syt_fake_token"
PREFIX = "/_matrix/client/v3"


@dataclass
class Room:
    members: dict[str, str]  # joined user id -> display name
    name: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # the room's timeline


@dataclass
class FakeMatrix:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    token: str = TOKEN
    port: int = 0
    rooms: dict[str, Room] = field(default_factory=dict)
    # the sync log: ("timeline", room, event) | ("invite", room, state) | ("account", type, content)
    log: list[tuple[str, str, Any]] = field(default_factory=list)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    failures: dict[str, list[tuple[int, dict[str, Any], dict[str, str]]]] = field(
        default_factory=dict
    )
    account_data: dict[str, Any] = field(default_factory=dict)
    invites: dict[str, dict[str, Any]] = field(default_factory=dict)
    txns: dict[str, str] = field(default_factory=dict)
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _grew: asyncio.Condition | None = None
    _runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- the test's side: rooms, people, messages -------------------------------------

    def add_room(self, room_id: str, people: dict[str, str], name: str | None = None) -> None:
        """A room the bot has joined, with these other people in it."""
        self.rooms[room_id] = Room({BOT: BOT_NAME, **people}, name)

    def event(
        self, room_id: str, sender: str, etype: str, content: dict[str, Any], **extra: Any
    ) -> dict[str, Any]:
        ev = {
            "type": etype,
            "sender": sender,
            "content": content,
            "event_id": f"$ev{next(self._ids)}",
            "origin_server_ts": int(time.time() * 1000),
            "unsigned": {"age": 1},
            **extra,
        }
        self.rooms[room_id].events.append(ev)
        self._append(("timeline", room_id, ev))
        return ev

    def message(self, room_id: str, sender: str, body: str, **content: Any) -> dict[str, Any]:
        return self.event(
            room_id, sender, "m.room.message", {"msgtype": "m.text", "body": body, **content}
        )

    def redeliver(self, room_id: str, ev: dict[str, Any]) -> None:
        """The same event again in a later batch (a server replay)."""
        self._append(("timeline", room_id, dict(ev)))

    def invite(self, room_id: str, inviter: str, people: dict[str, str] | None = None) -> None:
        self.rooms[room_id] = Room(dict(people or {inviter: inviter[1:].split(":")[0]}))
        state = {
            "events": [
                {
                    "type": "m.room.member",
                    "state_key": BOT,
                    "sender": inviter,
                    "content": {"membership": "invite", "is_direct": False},
                },
            ]
        }
        self.invites[room_id] = state
        self._append(("invite", room_id, state))

    def set_direct(self, rooms: dict[str, list[str]]) -> None:
        self.account_data["m.direct"] = rooms
        self._append(("account", "m.direct", rooms))

    def fail_next(
        self,
        kind: str,
        status: int,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """The next request of `kind` (send, sync, typing, join, whoami, ...) fails."""
        self.failures.setdefault(kind, []).append((status, body or {}, headers or {}))

    def sends(self, room_id: str | None = None) -> list[dict[str, Any]]:
        """Every accepted send (content + room id + event id), first to last."""
        return [
            {**ev["content"], "room_id": r, "event_id": ev["event_id"]}
            for kind, r, ev in self.log
            if kind == "timeline"
            and ev["sender"] == BOT
            and ev["type"] == "m.room.message"
            and (room_id is None or r == room_id)
        ]

    async def wait_sends(
        self, n: int, room_id: str | None = None, timeout: float = 10.0
    ) -> list[dict[str, Any]]:
        return await wait_for_count(lambda: self.sends(room_id), n, timeout, "sends")

    def requests(self, kind: str) -> list[Any]:
        return [body for k, _path, body in self.calls if k == kind]

    def _append(self, entry: tuple[str, str, Any]) -> None:
        self.log.append(entry)
        if self._grew is not None:
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        assert self._grew is not None
        async with self._grew:
            self._grew.notify_all()

    # --- the server -------------------------------------------------------------------

    async def start(self) -> None:
        self._grew = asyncio.Condition()
        app = web.Application(
            middlewares=[
                self.outage.middleware(lambda r: r.method == "PUT" and "/send/" in r.path),
                self._guard,
            ]
        )
        r = app.router
        r.add_get(f"{PREFIX}/account/whoami", self._whoami)
        r.add_get(f"{PREFIX}/sync", self._sync)
        r.add_put(f"{PREFIX}/rooms/{{room}}/send/{{etype}}/{{txn}}", self._send)
        r.add_put(f"{PREFIX}/rooms/{{room}}/typing/{{user}}", self._typing)
        r.add_post(f"{PREFIX}/rooms/{{room}}/join", self._join)
        r.add_get(f"{PREFIX}/rooms/{{room}}/joined_members", self._joined_members)
        r.add_get(f"{PREFIX}/rooms/{{room}}/event/{{event}}", self._get_event)
        r.add_get(f"{PREFIX}/rooms/{{room}}/messages", self._messages)
        r.add_get(f"{PREFIX}/profile/{{user}}/displayname", self._displayname)
        r.add_get(f"{PREFIX}/user/{{user}}/account_data/{{type}}", self._account_data)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response = await self._answer(request, handler)
        if not self.keep_alive:
            response.force_close()
        return response

    async def _answer(self, request: web.Request, handler: Any) -> web.StreamResponse:
        kind = _kind(request.path)
        body = await request.json() if request.can_read_body else None
        self.calls.append((kind, request.path_qs, body))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(
                {
                    "errcode": "M_UNKNOWN_TOKEN",
                    "error": "Invalid access token passed.",
                    "soft_logout": False,
                },
                status=401,
            )
        queued = self.failures.get(kind)
        if queued:
            status, payload, headers = queued.pop(0)
            return web.json_response(payload, status=status, headers=headers)
        return await handler(request)

    async def _whoami(self, request: web.Request) -> web.Response:
        return web.json_response({"user_id": BOT, "device_id": "FAKEDEVICE", "is_guest": False})

    async def _sync(self, request: web.Request) -> web.Response:
        since = request.query.get("since")
        timeout_s = int(request.query.get("timeout", "0")) / 1000
        if since is None:
            return web.json_response(self._initial())
        start = int(since.removeprefix("s"))
        if len(self.log) <= start and timeout_s > 0:
            assert self._grew is not None
            async with self._grew:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._grew.wait_for(lambda: len(self.log) > start), timeout_s
                    )
        return web.json_response(self._since(start, _timeline_limit(request.query.get("filter"))))

    def _initial(self) -> dict[str, Any]:
        join = {}
        for room_id, room in self.rooms.items():
            if BOT not in room.members:
                continue
            state = [_member(uid, name) for uid, name in room.members.items()]
            if room.name:
                state.append(
                    {
                        "type": "m.room.name",
                        "state_key": "",
                        "sender": BOT,
                        "content": {"name": room.name},
                        "event_id": f"$name{room_id}",
                    }
                )
            join[room_id] = {
                "state": {"events": state},
                "timeline": {"events": room.events[-10:], "limited": True, "prev_batch": "p0"},
            }
        return {
            "next_batch": f"s{len(self.log)}",
            "rooms": {
                "join": join,
                "invite": {r: {"invite_state": s} for r, s in self.invites.items()},
            },
            "account_data": {
                "events": [{"type": t, "content": c} for t, c in self.account_data.items()]
            },
        }

    def _since(self, start: int, limit: int) -> dict[str, Any]:
        """Everything after `start`; a room with more than `limit` new events gets only the
        last ones, `limited`, with a `prev_batch` token to page back with /messages."""
        join: dict[str, Any] = {}
        invite: dict[str, Any] = {}
        account: list[dict[str, Any]] = []
        for pos, (kind, key, value) in enumerate(self.log[start:], start):
            if kind == "timeline":
                room = join.setdefault(
                    key,
                    {
                        "timeline": {"events": [], "limited": False},
                        "state": {"events": []},
                        "_pos": [],
                    },
                )
                room["timeline"]["events"].append(value)
                room["_pos"].append(pos)
            elif kind == "invite" and key in self.invites:
                invite[key] = {"invite_state": value}
            elif kind == "account":
                account.append({"type": key, "content": value})
        for room in join.values():
            positions = room.pop("_pos")
            if len(positions) > limit:
                room["timeline"]["events"] = room["timeline"]["events"][-limit:]
                room["timeline"]["limited"] = True
                room["timeline"]["prev_batch"] = f"s{positions[-limit]}"
        return {
            "next_batch": f"s{len(self.log)}",
            "rooms": {"join": join, "invite": invite},
            "account_data": {"events": account},
        }

    async def _messages(self, request: web.Request) -> web.Response:
        """Backwards pagination: the room's events before `from` and from `to` on."""
        room_id, q = request.match_info["room"], request.query
        assert q.get("dir") == "b", "the adapter only pages backwards"
        start, stop = int(q["from"].removeprefix("s")), int(q.get("to", "s0").removeprefix("s"))
        limit = int(q.get("limit", "10"))
        found = [
            (pos, ev)
            for pos, (kind, key, ev) in enumerate(self.log)
            if kind == "timeline" and key == room_id and stop <= pos < start
        ]
        page = list(reversed(found))[:limit]
        body: dict[str, Any] = {"chunk": [ev for _pos, ev in page], "start": q["from"]}
        if len(found) > len(page):
            body["end"] = f"s{page[-1][0]}"
        return web.json_response(body)

    async def _send(self, request: web.Request) -> web.Response:
        room_id, txn = request.match_info["room"], request.match_info["txn"]
        if room_id not in self.rooms or BOT not in self.rooms[room_id].members:
            return web.json_response({"errcode": "M_FORBIDDEN", "error": "not in room"}, status=403)
        if txn in self.txns:  # a retried transaction: the same event, sent once
            return web.json_response({"event_id": self.txns[txn]})
        ev = self.event(room_id, BOT, request.match_info["etype"], await request.json())
        self.txns[txn] = ev["event_id"]
        return web.json_response({"event_id": ev["event_id"]})

    async def _typing(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _join(self, request: web.Request) -> web.Response:
        room_id = request.match_info["room"]
        if room_id not in self.invites:
            return web.json_response({"errcode": "M_FORBIDDEN", "error": "not invited"}, status=403)
        del self.invites[room_id]
        self.rooms[room_id].members[BOT] = BOT_NAME
        self.event(
            room_id,
            BOT,
            "m.room.member",
            {"membership": "join", "displayname": BOT_NAME},
            state_key=BOT,
        )
        return web.json_response({"room_id": room_id})

    async def _joined_members(self, request: web.Request) -> web.Response:
        room = self.rooms.get(request.match_info["room"])
        if room is None:
            return web.json_response({"errcode": "M_FORBIDDEN", "error": "not in room"}, status=403)
        return web.json_response(
            {
                "joined": {
                    u: {"display_name": n, "avatar_url": None} for u, n in room.members.items()
                }
            }
        )

    async def _get_event(self, request: web.Request) -> web.Response:
        room = self.rooms.get(request.match_info["room"])
        for ev in room.events if room else []:
            if ev["event_id"] == request.match_info["event"]:
                return web.json_response({**ev, "room_id": request.match_info["room"]})
        return web.json_response(
            {"errcode": "M_NOT_FOUND", "error": "Event not found."}, status=404
        )

    async def _displayname(self, request: web.Request) -> web.Response:
        if request.match_info["user"] == BOT:
            return web.json_response({"displayname": BOT_NAME})
        return web.json_response(
            {"errcode": "M_NOT_FOUND", "error": "Profile not found"}, status=404
        )

    async def _account_data(self, request: web.Request) -> web.Response:
        data = self.account_data.get(request.match_info["type"])
        if data is None:
            return web.json_response(
                {"errcode": "M_NOT_FOUND", "error": "Account data not found"}, status=404
            )
        return web.json_response(data)


def _timeline_limit(filter_param: str | None) -> int:
    """A filter given inline as JSON may raise the timeline limit (Synapse's default: 10)."""
    if filter_param and filter_param.startswith("{"):
        limit = json.loads(filter_param).get("room", {}).get("timeline", {}).get("limit")
        if isinstance(limit, int) and limit > 0:
            return limit
    return 10


def _member(user_id: str, name: str) -> dict[str, Any]:
    return {
        "type": "m.room.member",
        "state_key": user_id,
        "sender": user_id,
        "content": {"membership": "join", "displayname": name},
        "event_id": f"$m{user_id}",
    }


def _kind(path: str) -> str:
    rest = path.removeprefix(PREFIX)
    for kind in (
        "whoami",
        "sync",
        "send",
        "typing",
        "joined_members",
        "join",
        "messages",
        "event",
        "displayname",
        "account_data",
    ):
        if f"/{kind}" in rest:
            return kind
    return rest
