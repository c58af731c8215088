"""A loopback fake of a Mattermost server: the REST API v4 subset the adapter uses (users/me,
client config, the bot's channels, posts since, threads, create post, typing) and the
websocket at /api/v4/websocket (authentication_challenge, `hello`, `posted` events whose
`data.post` is the post as a JSON string, `user_typing` actions). Driven by the real
mattermostautodriver and aiohttp; every call is recorded, failures can be scripted."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes import Outage, wait_for_count

TEAM = "team0000000000000000000001"
BOT_ID = "bot00000000000000000000001"
BOT_NAME = "switchboard"
ANN, BOB = "ann00000000000000000000001", "bob00000000000000000000001"
DM = "dm000000000000000000000001"  # the bot's direct messages with ann
TOWN = "town0000000000000000000001"  # an open channel
SECRET_ROOM = "priv0000000000000000000001"  # a private channel
TRIO = "grp00000000000000000000001"  # a group DM: ann, bob and the bot
USERS = {
    BOT_ID: {"id": BOT_ID, "username": BOT_NAME, "is_bot": True},
    ANN: {"id": ANN, "username": "ann", "is_bot": False},
    BOB: {"id": BOB, "username": "bob", "is_bot": False},
}
CHANNELS = {
    DM: ("D", f"{ANN}__{BOT_ID}", "ann"),
    TOWN: ("O", "town-square", "Town Square"),
    SECRET_ROOM: ("P", "backroom", "Backroom"),
    TRIO: ("G", "trio", "ann, bob, switchboard"),
}


def _json(body: Any, status: int = 200) -> web.Response:
    # mattermostautodriver parses a GET's body only for exactly "application/json"
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )


def _error(status: int, error_id: str, message: str) -> web.Response:
    return _json(
        {
            "id": error_id,
            "message": message,
            "detailed_error": "",
            "request_id": "req1",
            "status_code": status,
        },
        status,
    )


@dataclass
class FakeMattermost:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    token: str = "mm-good-token"
    max_post_size: int | None = 16_383  # None: the client config does not expose it
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    posts: dict[str, dict[str, Any]] = field(default_factory=dict)
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    actions: list[dict[str, Any]] = field(default_factory=list)
    accept_sockets: bool = True
    keep_alive: bool = (
        True  # False: every REST answer closes its connection (the next call connects)
    )
    hellos: int = 0
    port: int = 0
    _sockets: dict[web.WebSocketResponse, itertools.count[int]] = field(default_factory=dict)
    _pending: dict[str, str] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _last_ms: int = 0
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        for cid, (ctype, name, display) in CHANNELS.items():
            self.channels[cid] = {
                "id": cid,
                "type": ctype,
                "name": name,
                "display_name": display,
                "team_id": "" if ctype in "DG" else TEAM,
                "last_post_at": 0,
                "create_at": 1,
                "update_at": 1,
                "delete_at": 0,
            }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # --- driving -----------------------------------------------------------------------

    def fail_next(self, route: str, status: int, headers: dict[str, str] | None = None) -> None:
        """The next request to `route` ("POST /posts") answers `status` with `headers`."""
        self.failures.setdefault(route, []).append((status, headers or {}))

    async def say(
        self,
        text: str,
        channel: str = DM,
        *,
        user: str = ANN,
        root_id: str = "",
        mentions: list[str] | None = None,
        post_type: str = "",
        props: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A person posts: stored, and broadcast as `posted` to every connected socket (a
        post made while none is connected is only stored: the adapter has to catch up)."""
        post = self._create(channel, user, text, root_id, post_type, props or {})
        await self._broadcast(post, mentions)
        return post

    async def redeliver(self, post: dict[str, Any]) -> None:
        """The server sends a `posted` event for the same post again."""
        await self._broadcast(post, None)

    def bot_posts(self) -> list[dict[str, Any]]:
        return [p for p in self.posts.values() if p["user_id"] == BOT_ID]

    async def wait_bot_posts(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.bot_posts, n, timeout, "bot posts")

    def since_reads(self) -> list[tuple[str, int]]:
        """(channel, since) of every GET /channels/{id}/posts?since= the adapter made."""
        return [
            (path.split("/")[2], int(q["since"]))
            for verb, path, q in self.calls
            if verb == "GET" and path.endswith("/posts") and "since" in (q or {})
        ]

    def typing(self) -> list[dict[str, Any]]:
        return [a["data"] for a in self.actions if a.get("action") == "user_typing"]

    async def wait_connected(self, hellos: int = 1, timeout: float = 10.0) -> None:
        await wait_for_count(
            lambda: list(range(self.hellos)) if self._sockets else [],
            hellos,
            timeout,
            "websocket hellos",
        )

    def sockets(self) -> int:
        """How many authenticated websockets are open now."""
        return sum(1 for ws in self._sockets if not ws.closed)

    async def drop_sockets(self, *, refuse: bool = False) -> None:
        """Close every websocket; with `refuse`, new ones are turned away (503) until
        `accept_sockets` is set again."""
        self.accept_sockets = not refuse
        for ws in list(self._sockets):
            await ws.close(code=1001)
        self._sockets.clear()

    # --- server ------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(lambda r: r.method == "POST" and r.path.endswith("/posts"))
            ]
        )
        app.router.add_get("/api/v4/websocket", self._websocket)
        app.router.add_route("*", "/api/v4/{tail:.*}", self._rest)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.drop_sockets()
        if self._runner is not None:
            await self._runner.cleanup()

    def _create(
        self,
        channel: str,
        user: str,
        text: str,
        root_id: str,
        post_type: str,
        props: dict[str, Any],
    ) -> dict[str, Any]:
        now = max(int(time.time() * 1000), self._last_ms + 1)
        self._last_ms = now
        pid = f"post{next(self._ids):022d}"
        post = {
            "id": pid,
            "create_at": now,
            "update_at": now,
            "edit_at": 0,
            "delete_at": 0,
            "is_pinned": False,
            "user_id": user,
            "channel_id": channel,
            "root_id": root_id,
            "original_id": "",
            "message": text,
            "type": post_type,
            "props": props,
            "hashtags": "",
            "pending_post_id": "",
            "reply_count": 0,
            "metadata": {},
        }
        self.posts[pid] = post
        self.channels[channel]["last_post_at"] = now
        return post

    async def _broadcast(self, post: dict[str, Any], mentions: list[str] | None) -> None:
        ch = self.channels[post["channel_id"]]
        data = {
            "channel_display_name": ch["display_name"],
            "channel_name": ch["name"],
            "channel_type": ch["type"],
            "post": json.dumps(post),
            "sender_name": "@" + USERS[post["user_id"]]["username"],
            "set_online": True,
            "team_id": ch["team_id"],
        }
        if mentions:
            data["mentions"] = json.dumps(mentions)
        for ws, seq in list(self._sockets.items()):
            if not ws.closed:
                await ws.send_str(
                    json.dumps(
                        {
                            "event": "posted",
                            "data": data,
                            "seq": next(seq),
                            "broadcast": {
                                "omit_users": None,
                                "user_id": "",
                                "channel_id": ch["id"],
                                "team_id": "",
                            },
                        }
                    )
                )

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(("WS", "/websocket", None))
        if not self.accept_sockets:
            return web.Response(status=503, text="unavailable")
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        authed = False
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                continue
            msg = json.loads(frame.data)
            seq = msg.get("seq")
            if msg.get("action") == "authentication_challenge" and not authed:
                if (msg.get("data") or {}).get("token") != self.token:
                    await ws.send_str(
                        json.dumps(
                            {
                                "status": "FAIL",
                                "seq_reply": seq,
                                "error": {
                                    "id": "api.web_socket_router.not_authenticated.app_error",
                                    "message": "Invalid or expired session, please login again.",
                                },
                            }
                        )
                    )
                    await ws.close()
                    break
                authed = True
                await ws.send_str(json.dumps({"status": "OK", "seq_reply": seq}))
                await ws.send_str(
                    json.dumps(
                        {
                            "event": "hello",
                            "seq": 0,
                            "data": {
                                "connection_id": f"conn{self.hellos}",
                                "server_version": "10.11.0.fake",
                            },
                            "broadcast": {
                                "omit_users": None,
                                "user_id": BOT_ID,
                                "channel_id": "",
                                "team_id": "",
                            },
                        }
                    )
                )
                self._sockets[ws] = itertools.count(1)
                self.hellos += 1
            elif authed:
                self.actions.append(msg)
                await ws.send_str(json.dumps({"status": "OK", "seq_reply": seq}))
        self._sockets.pop(ws, None)
        return ws

    async def _rest(self, request: web.Request) -> web.Response:
        response = await self._rest_answer(request)
        if not self.keep_alive:
            response.force_close()
        return response

    async def _rest_answer(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body: Any = dict(request.query)
        if request.can_read_body:
            body = await request.json()
        self.calls.append((request.method, path, body))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(
                401,
                "api.context.session_expired.app_error",
                "Invalid or expired session, please login again.",
            )
        parts = path.strip("/").split("/")
        route = f"{request.method} /" + "/".join(
            p
            if p in ("users", "channels", "posts", "config", "client", "thread", "typing", "me")
            else "{id}"
            for p in parts
        )
        queued = self.failures.get(route)
        if queued:
            status, headers = queued.pop(0)
            return web.Response(
                status=status, text="limit exceeded" if status == 429 else "error", headers=headers
            )
        return await self._answer(route, parts, request, body)

    async def _answer(
        self, route: str, parts: list[str], request: web.Request, body: Any
    ) -> web.Response:
        if route == "GET /users/me":
            return _json(USERS[BOT_ID])
        if route == "GET /users/{id}" and parts[1] in USERS:
            return _json(USERS[parts[1]])
        if route == "GET /config/client":
            if request.query.get("format") != "old":
                return _error(
                    501, "api.config.client.old_format.app_error", "format=old is required"
                )
            config = {"Version": "10.11.0", "SiteName": "Fake"}
            if self.max_post_size is not None:
                config["MaxPostSize"] = str(self.max_post_size)
            return _json(config)
        if route == "GET /users/{id}/channels" and parts[1] in (BOT_ID, "me"):
            return _json(list(self.channels.values()))
        if route == "GET /channels/{id}" and parts[1] in self.channels:
            return _json(self.channels[parts[1]])
        if route == "GET /channels/{id}/posts" and parts[1] in self.channels:
            since = int(request.query.get("since") or 0)
            found = [
                p
                for p in self.posts.values()
                if p["channel_id"] == parts[1] and p["update_at"] > since
            ]
            return _json(self._post_list(found))
        if route == "GET /posts/{id}/thread" and parts[1] in self.posts:
            root = parts[1]
            return _json(
                self._post_list([p for p in self.posts.values() if root in (p["id"], p["root_id"])])
            )
        if route == "GET /posts/{id}" and parts[1] in self.posts:
            return _json(self.posts[parts[1]])
        if route == "POST /users/{id}/typing":
            self.actions.append({"action": "rest_typing", "data": body})
            return _json({"status": "OK"})
        if route == "POST /posts":
            return await self._create_post(body)
        print(f"FakeMattermost: unimplemented {route}", flush=True)
        return _error(404, "api.context.404.app_error", "Sorry, we could not find the page.")

    async def _create_post(self, body: dict[str, Any]) -> web.Response:
        channel, text = body.get("channel_id"), body.get("message") or ""
        if channel not in self.channels:
            return _error(
                403,
                "api.context.permissions.app_error",
                "You do not have the appropriate permissions.",
            )
        if len(text) > (self.max_post_size or 16_383):
            return _error(400, "model.post.is_valid.msg.app_error", "Invalid message.")
        pending = body.get("pending_post_id") or ""
        if pending and pending in self._pending:  # the server's duplicate guard on retries
            return _json(self.posts[self._pending[pending]], 201)
        post = self._create(
            channel, BOT_ID, text, body.get("root_id") or "", "", body.get("props") or {}
        )
        if pending:
            self._pending[pending] = post["id"]
        await self._broadcast(post, None)  # the bot's own post comes back, as on a real server
        return _json(post, 201)

    @staticmethod
    def _post_list(posts: list[dict[str, Any]]) -> dict[str, Any]:
        newest_first = sorted(posts, key=lambda p: p["create_at"], reverse=True)
        return {
            "order": [p["id"] for p in newest_first],
            "posts": {p["id"]: p for p in posts},
            "next_post_id": "",
            "prev_post_id": "",
            "has_next": False,
        }
