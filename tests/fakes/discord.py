"""A loopback fake of Discord's REST API and gateway websocket, driven by the real
discord.py (pointed here through `Route.BASE` and `DiscordWebSocket.DEFAULT_GATEWAY`).
Ids are real snowflakes (they carry their creation time), and every message is kept per
channel so REST history (`GET /channels/{id}/messages`) can be read back after a restart.
A send with `enforce_nonce` repeating a nonce seen within `nonce_window_s` is answered with
the first message, as Discord does, and recorded as "POST-DEDUPED" (not in `posted`).
IDENTIFY's `shard` is honoured: a connection gets the guilds of its shard
((guild_id >> 22) % count) and their events, and DMs only on shard 0."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import WSMsgType, web

from tests.fakes import Outage, connection_closer, wait_for_count


def restore_discord_globals(monkeypatch: Any) -> None:
    """The adapter points discord.py at the fake through two class attributes
    (`Route.BASE`, `DiscordWebSocket.DEFAULT_GATEWAY`); have pytest put them back afterwards."""
    import discord

    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    monkeypatch.setattr(
        discord.gateway.DiscordWebSocket,
        "DEFAULT_GATEWAY",
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY,
    )


GUILD = "100000000000000001"
GENERAL = "200000000000000010"
THREAD = "200000000000000020"
# a second guild (only when `guilds` names it), on shard 1 of 2 where GUILD is on shard 0
GUILD2 = str(int(GUILD) + (1 << 22))
DM = "600000000000000001"  # a direct-message channel (no guild): shard 0
GENERAL2 = "200000000000000030"
BOT_ID = "300000000000000001"
BOT = {
    "id": BOT_ID,
    "username": "switchboard",
    "discriminator": "0",
    "avatar": None,
    "bot": True,
    "global_name": None,
}


def _user(uid: str, name: str) -> dict[str, Any]:
    return {"id": uid, "username": name, "discriminator": "0", "avatar": None, "global_name": name}


@dataclass
class FakeDiscord:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    port: int = 0
    refuse_threads: bool = False
    rate_limit_next_post: bool = False
    token: str = "fake-token"
    _runner: web.AppRunner | None = None
    _sockets: list[web.WebSocketResponse] = field(default_factory=list)
    guilds: tuple[str, ...] = (GUILD,)  # the guilds the bot is in (GUILD, GUILD2)
    shard_of: dict[web.WebSocketResponse, tuple[int, int]] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _last_id: int = 0
    history: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # channel -> messages
    dm_users: dict[str, dict[str, Any]] = field(default_factory=dict)  # DM channel -> recipient
    identifies: int = 0
    # (shard, count) of each IDENTIFY made while another open connection had that shard
    identified_twice: list[tuple[int, int]] = field(default_factory=list)
    resumes: int = 0
    nonce_window_s: float = 300.0  # how long an enforced nonce answers with its message
    _nonces: dict[str, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    # False: every REST answer closes its connection, so the next call connects (the
    # gateway websocket is left alone)
    keep_alive: bool = True

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v10"

    @property
    def gateway(self) -> str:
        return f"ws://127.0.0.1:{self.port}/gateway"

    def deduped(self) -> list[dict[str, Any]]:
        """Sends answered with an earlier message because their nonce was enforced."""
        return [b for verb, _path, b in self.calls if verb == "POST-DEDUPED"]

    def shown(self, channel: str) -> list[str]:
        """What the bot's messages in a channel say, as a user scrolling it sees them."""
        return [
            m["content"]
            for m in sorted(self.history.get(channel, []), key=lambda m: int(m["id"]))
            if m["author"]["id"] == BOT_ID
        ]

    def posted(self, channel: str | None = None) -> list[dict[str, Any]]:
        return [
            b
            for verb, path, b in self.calls
            if verb == "POST"
            and path.endswith("/messages")
            and (channel is None or f"/{channel}/" in path)
        ]

    async def wait_posted(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.posted, n, timeout, "messages")

    async def wait_connected(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._sockets:
            if time.monotonic() > deadline:
                raise AssertionError("no gateway connection")
            await asyncio.sleep(0.01)

    def connected_shards(self) -> list[tuple[int, int]]:
        """(shard, count) of every open connection that identified, sorted."""
        return sorted(s for ws, s in self.shard_of.items() if not ws.closed and ws in self._sockets)

    @staticmethod
    def shard_for(data: dict[str, Any], count: int) -> int:
        """Where Discord sends an event: its guild's shard, shard 0 without a guild."""
        guild = data.get("guild_id")
        return 0 if guild is None else (int(guild) >> 22) % count

    def next_id(self, at: float | None = None) -> int:
        """A snowflake made at `at` (Unix seconds, now by default), larger than any before."""
        ms = int((time.time() if at is None else at) * 1000) - 1_420_070_400_000
        self._last_id = max(self._last_id + 1, ms << 22)
        return self._last_id

    @property
    def _ids(self) -> Any:  # the id source the payload builders below draw from
        return iter(self.next_id, None)

    def post_while_away(self, data: dict[str, Any]) -> None:
        """A message that reached Discord while no bot was connected: history only."""
        self._remember(data)

    def _remember(self, data: dict[str, Any]) -> None:
        channel = str(data["channel_id"])
        if "guild_id" not in data and not data["author"].get("bot"):
            self.dm_users.setdefault(channel, data["author"])
        self.history.setdefault(channel, []).append(data)

    def history_requests(self, channel: str) -> list[dict[str, Any]]:
        return [
            b
            for verb, path, b in self.calls
            if verb == "GET" and path == f"/channels/{channel}/messages"
        ]

    # --- events ------------------------------------------------------------------------

    def message(
        self,
        content: str,
        channel: str,
        *,
        user: str = "500000000000000001",
        name: str = "ann",
        guild: bool = True,
        mention: bool = False,
        at: float | None = None,
        guild_id: str = GUILD,
    ) -> dict[str, Any]:
        sent = time.time() if at is None else at
        data: dict[str, Any] = {
            "id": str(self.next_id(sent)),
            "type": 0,
            "content": content,
            "channel_id": channel,
            "author": _user(user, name),
            "timestamp": datetime.fromtimestamp(sent, UTC).isoformat(),
            "mentions": [BOT] if mention else [],
            "mention_roles": [],
            "attachments": [],
            "embeds": [],
            "pinned": False,
            "mention_everyone": False,
            "tts": False,
        }
        if guild:
            data["guild_id"] = guild_id
            data["member"] = {
                "roles": [],
                "flags": 0,
                "joined_at": "2026-01-01T00:00:00+00:00",
                "deaf": False,
                "mute": False,
            }
        return data

    async def dispatch(self, event: str, data: dict[str, Any]) -> None:
        if event == "MESSAGE_CREATE" and not any(
            m["id"] == data["id"] for m in self.history.get(str(data["channel_id"]), [])
        ):
            self._remember(data)
        payload = json.dumps({"op": 0, "s": next(self._seq), "t": event, "d": data})
        for ws in list(self._sockets):
            shard, count = self.shard_of.get(ws, (0, 1))
            if not ws.closed and self.shard_for(data, count) == shard:
                await ws.send_str(payload)

    async def drop_connections(self, code: int = 4000) -> None:
        for ws in list(self._sockets):
            await ws.close(code=code)
        self._sockets.clear()
        self.shard_of.clear()

    # --- server ------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/gateway", self._ws)
        rest = web.Application(
            middlewares=[
                self.outage.middleware(
                    lambda r: r.method == "POST" and r.path.endswith("/messages")
                ),
                connection_closer(self),
            ]
        )
        rest.router.add_route("*", "/{tail:.*}", self._rest)
        app.add_subapp("/api/v10", rest)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self.drop_connections(1000)
        if self._runner is not None:
            await self._runner.cleanup()

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        # discord.py parses JSON only for exactly "application/json" (no charset)
        return web.Response(
            status=status, body=json.dumps(body).encode(), content_type="application/json"
        )

    def _guild(self, guild: str = GUILD) -> dict[str, Any]:
        if guild == GUILD2:
            return {
                "id": GUILD2,
                "name": "Second Guild",
                "owner_id": BOT_ID,
                "unavailable": False,
                "member_count": 2,
                "roles": [
                    {
                        "id": GUILD2,
                        "name": "@everyone",
                        "permissions": "0",
                        "position": 0,
                        "color": 0,
                        "hoist": False,
                        "managed": False,
                        "mentionable": False,
                        "flags": 0,
                    }
                ],
                "channels": [
                    {
                        "id": GENERAL2,
                        "type": 0,
                        "name": "lobby",
                        "position": 0,
                        "permission_overwrites": [],
                    }
                ],
                "threads": [],
                "members": [
                    {
                        "user": BOT,
                        "roles": [],
                        "flags": 0,
                        "joined_at": "2026-01-01T00:00:00+00:00",
                        "deaf": False,
                        "mute": False,
                    }
                ],
                "emojis": [],
                "stickers": [],
                "features": [],
                "voice_states": [],
                "presences": [],
            }
        return {
            "id": GUILD,
            "name": "Fake Guild",
            "owner_id": BOT_ID,
            "unavailable": False,
            "member_count": 2,
            "roles": [
                {
                    "id": GUILD,
                    "name": "@everyone",
                    "permissions": "0",
                    "position": 0,
                    "color": 0,
                    "hoist": False,
                    "managed": False,
                    "mentionable": False,
                    "flags": 0,
                }
            ],
            "channels": [
                {
                    "id": GENERAL,
                    "type": 0,
                    "name": "general",
                    "position": 0,
                    "permission_overwrites": [],
                }
            ],
            "threads": [
                {
                    "id": THREAD,
                    "type": 11,
                    "parent_id": GENERAL,
                    "owner_id": BOT_ID,
                    "name": "ticket",
                    "message_count": 0,
                    "member_count": 1,
                    "guild_id": GUILD,
                    "thread_metadata": {
                        "archived": False,
                        "auto_archive_duration": 1440,
                        "archive_timestamp": "2026-11-29T00:00:00+00:00",
                        "locked": False,
                    },
                }
            ],
            "members": [
                {
                    "user": BOT,
                    "roles": [],
                    "flags": 0,
                    "joined_at": "2026-01-01T00:00:00+00:00",
                    "deaf": False,
                    "mute": False,
                }
            ],
            "emojis": [],
            "stickers": [],
            "features": [],
            "voice_states": [],
            "presences": [],
        }

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        self._sockets.append(ws)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 41250}}))
        async for frame in ws:
            if frame.type != WSMsgType.TEXT:
                continue
            msg = json.loads(frame.data)
            op = msg.get("op")
            if op == 1:
                await ws.send_str(json.dumps({"op": 11}))
            elif op == 2:
                self.identifies += 1
                shard, count = (msg.get("d") or {}).get("shard") or (0, 1)
                if (int(shard), int(count)) in self.connected_shards():
                    self.identified_twice.append((int(shard), int(count)))
                self.shard_of[ws] = (int(shard), int(count))
                mine = [g for g in self.guilds if self.shard_for({"guild_id": g}, count) == shard]
                ready = {
                    "v": 10,
                    "user": BOT,
                    "session_id": "fake-session",
                    "resume_gateway_url": self.gateway,
                    "application": {"id": BOT_ID, "flags": 0},
                    "guilds": [{"id": g, "unavailable": True} for g in mine],
                    "shard": [shard, count],
                }
                await ws.send_str(
                    json.dumps({"op": 0, "s": next(self._seq), "t": "READY", "d": ready})
                )
                for guild in mine:
                    await ws.send_str(
                        json.dumps(
                            {
                                "op": 0,
                                "s": next(self._seq),
                                "t": "GUILD_CREATE",
                                "d": self._guild(guild),
                            }
                        )
                    )
            elif op == 6:
                self.resumes += 1
                await ws.send_str(
                    json.dumps({"op": 0, "s": next(self._seq), "t": "RESUMED", "d": {}})
                )
        if ws in self._sockets:
            self._sockets.remove(ws)
        self.shard_of.pop(ws, None)
        return ws

    async def _rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except (ValueError, json.JSONDecodeError):
                body = await request.text()
        self.calls.append((request.method, path, body))
        if request.headers.get("Authorization") != f"Bot {self.token}":
            return self._json({"message": "401: Unauthorized", "code": 0}, status=401)
        if path == "/users/@me":
            return self._json(BOT)
        if path == "/oauth2/applications/@me":
            return self._json(
                {
                    "id": BOT_ID,
                    "name": "switchboard",
                    "description": "",
                    "icon": None,
                    "bot_public": True,
                    "bot_require_code_grant": False,
                    "verify_key": "k",
                    "owner": BOT,
                    "flags": 0,
                }
            )
        if path == "/gateway/bot":
            return self._json(
                {
                    "url": self.gateway,
                    "shards": 1,
                    "session_start_limit": {
                        "total": 1000,
                        "remaining": 1000,
                        "reset_after": 0,
                        "max_concurrency": 1,
                    },
                }
            )
        if request.method == "GET" and path.startswith("/channels/"):
            return self._channel_get(path, request.query)
        if path.endswith("/typing"):
            return web.Response(status=204)
        if path.endswith("/threads") and request.method == "POST":
            if self.refuse_threads:
                return self._json({"message": "Missing Permissions", "code": 50013}, status=403)
            parent = path.split("/")[2]
            guild = GUILD2 if parent == GENERAL2 else GUILD
            thread = {
                "id": str(next(self._ids)),
                "type": 11,
                "parent_id": parent,
                "owner_id": BOT_ID,
                "guild_id": guild,
                "name": (body or {}).get("name", ""),
                "message_count": 0,
                "member_count": 1,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": (body or {}).get("auto_archive_duration", 1440),
                    "archive_timestamp": "2026-11-29T00:00:00+00:00",
                    "locked": False,
                },
            }
            await self.dispatch(
                "THREAD_CREATE", {**thread, "newly_created": True}
            )  # as Discord tells the bot
            return self._json(thread, status=201)
        if path.endswith("/messages") and request.method == "POST" and self.rate_limit_next_post:
            self.rate_limit_next_post = False
            self.calls[-1] = ("POST-429", path, body)  # a refused attempt, not a delivered message
            return web.Response(
                status=429,
                body=json.dumps(
                    {"message": "You are being rate limited.", "retry_after": 0.3, "global": False}
                ).encode(),
                content_type="application/json",
                # discord.py reads a 429 without Via as a Cloudflare ban; Discord's own carry it
                headers={"Retry-After": "0.3", "X-RateLimit-Scope": "user", "Via": "1.1 google"},
            )
        if path.endswith("/messages") and request.method == "POST":
            channel = path.split("/")[2]
            nonce = (body or {}).get("nonce")
            if nonce is not None and len(str(nonce)) > 25:
                return self._json(
                    {
                        "message": "Invalid Form Body",
                        "code": 50035,
                        "errors": {"nonce": {"_errors": [{"code": "BASE_TYPE_MAX_LENGTH"}]}},
                    },
                    status=400,
                )
            earlier = self._nonces.get(str(nonce)) if (body or {}).get("enforce_nonce") else None
            if earlier is not None and time.monotonic() - earlier[0] < self.nonce_window_s:
                # Discord: the same author and nonce within a few minutes answers with the
                # message made the first time, and makes no new one
                self.calls[-1] = ("POST-DEDUPED", path, body)
                return self._json(earlier[1])
            sent = {
                "id": str(next(self._ids)),
                "type": 0,
                "content": (body or {}).get("content", ""),
                "channel_id": channel,
                "author": BOT,
                "timestamp": datetime.now(UTC).isoformat(),
                "mentions": [],
                "mention_roles": [],
                "attachments": [],
                "embeds": [],
                "pinned": False,
                "mention_everyone": False,
                "tts": False,
            }
            if nonce is not None:
                sent["nonce"] = nonce
                self._nonces[str(nonce)] = (time.monotonic(), sent)
            self._remember(sent)
            return self._json(sent)
        print(f"FakeDiscord: unimplemented {request.method} {path}", flush=True)
        return self._json({"message": "Unknown", "code": 0}, status=404)

    def _channel_get(self, path: str, query: Any) -> web.Response:
        """GET /channels/{id} and GET /channels/{id}/messages (before/after/limit, newest
        first as Discord answers a `before` or plain page, oldest first for `after`)."""
        parts = path.strip("/").split("/")
        channel = parts[1]
        if len(parts) == 2:
            if channel == THREAD:
                return self._json(self._guild()["threads"][0])
            if channel == GENERAL:
                return self._json({**self._guild()["channels"][0], "guild_id": GUILD})
            if channel == GENERAL2 and GUILD2 in self.guilds:
                return self._json({**self._guild(GUILD2)["channels"][0], "guild_id": GUILD2})
            if channel in self.dm_users:
                return self._json(
                    {
                        "id": channel,
                        "type": 1,
                        "recipients": [self.dm_users[channel]],
                        "last_message_id": None,
                    }
                )
            return self._json({"message": "Unknown Channel", "code": 10003}, status=404)
        if parts[2:] != ["messages"]:
            return self._json({"message": "Unknown", "code": 0}, status=404)
        self.calls[-1] = ("GET", path, dict(query))
        found = sorted(self.history.get(channel, []), key=lambda m: int(m["id"]))
        limit = int(query.get("limit", 50))
        if "before" in query:
            found = [m for m in found if int(m["id"]) < int(query["before"])]
        if "after" in query:
            found = [m for m in found if int(m["id"]) > int(query["after"])]
            return self._json(list(reversed(found[:limit])))
        return self._json(list(reversed(found))[:limit])
