"""The Mattermost websocket event stream, and catching up on what it missed.

`EventStream` opens `/api/v4/websocket` (aiohttp), answers the server's authentication
challenge, reconnects with backoff, and hands `posted` events one at a time to the adapter.
After every `hello` (a first connect, a reconnect, a restart) it first fetches, per channel
with recent activity, the posts created since the last one seen there (kept through the
adapter's Cursors) and hands those over in order; a post id is handed over once per run.
A channel's position moves only after the adapter accepted the post (inbox before ack).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.adapters.base import Backoff, Cursors
from gateway.adapters.mattermost_posts import decode_posted
from gateway.errors import NotAccepted

log = logging.getLogger("gateway.adapters.mattermost")
OnPost = Callable[[dict[str, Any], Mapping[str, Any]], Awaitable[None]]
Position = tuple[int, tuple[str, ...]]  # create_at (ms) of the last post, ids at that ms
CATCH_UP = "catch-up"  # a queue marker: fetch what was missed before the next live event
CATCH_UP_CHANNELS = 50
SEEN_POSTS = 10_000
HEARTBEAT_S = 30.0


def parse_position(value: str | None) -> Position | None:
    if not value:
        return None
    ms, _, ids = value.partition(":")
    try:
        return int(ms), tuple(i for i in ids.split(",") if i)
    except ValueError:
        return None


def format_position(pos: Position) -> str:
    return f"{pos[0]}:{','.join(pos[1])}"


@dataclass(frozen=True)
class ServerCalls:
    """The two REST reads a catch-up needs, made through the adapter's retrying call."""

    call: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]]
    driver: Any
    bot_id: str

    async def channels(self) -> list[dict[str, Any]]:
        found = await self.call(lambda: self.driver.channels.get_channels_for_user(self.bot_id))
        return [c for c in found or [] if isinstance(c, dict) and c.get("id")]

    async def posts_since(self, channel_id: str, since_ms: int) -> list[dict[str, Any]]:
        found = await self.call(
            lambda: self.driver.posts.get_posts_for_channel(channel_id, since=since_ms)
        )
        return [p for p in ((found or {}).get("posts") or {}).values() if isinstance(p, dict)]


class EventStream:
    def __init__(
        self,
        url: str,
        token: str,
        server: ServerCalls,
        *,
        on_post: OnPost,
        cursors: Cursors | None,
        backoff: Backoff,
        catch_up_hours: float,
        on_refused: Callable[[], None],
        connect_timeout_s: float = 15.0,
    ) -> None:
        self._ws_url = url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        self._ws_url += "/api/v4/websocket"
        self._token = token
        self._server = server
        self._on_post = on_post
        self._cursors = cursors
        self._backoff = backoff
        self._horizon_ms = int(catch_up_hours * 3_600_000)
        self._on_refused = on_refused
        self._connect_timeout = connect_timeout_s
        self._session: Any = None
        self._ws: Any = None
        self._seq: itertools.count[int] = itertools.count(1)
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._retry: asyncio.Task[None] | None = None
        self._hello = asyncio.Event()
        self._positions: dict[str, Position | None] = {}
        self._watermark: int | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._stalled: set[str] = set()
        self._pending: int | None = None  # a failed catch-up's starting point, until one succeeds
        self._marks_loaded = False
        self._retry_attempt = 0
        self.connected = False
        self.refused = False
        self.reconnects = 0
        self.catch_ups = 0

    async def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()
        self._tasks = [
            asyncio.create_task(self._read(), name="mattermost.websocket"),
            asyncio.create_task(self._consume(), name="mattermost.events"),
        ]
        # the first hello, or a refusal; past the timeout the reader keeps trying alone
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._connect_timeout):
                await self._hello.wait()

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._retry] if self._retry else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks, self._retry = [], None
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.connected = False

    async def typing(self, channel_id: str, parent_id: str | None) -> None:
        """The websocket's `user_typing` action (no REST call, no rate limit)."""
        ws = self._ws
        if ws is None or ws.closed:
            return
        with contextlib.suppress(Exception):
            await ws.send_json(
                {
                    "action": "user_typing",
                    "seq": next(self._seq),
                    "data": {"channel_id": channel_id, "parent_id": parent_id or ""},
                }
            )

    # --- the websocket ------------------------------------------------------------------

    async def _read(self) -> None:
        import aiohttp

        attempt = 0
        while True:
            try:
                async with self._session.ws_connect(self._ws_url, heartbeat=HEARTBEAT_S) as ws:
                    self._seq = itertools.count(1)
                    await ws.send_json(
                        {
                            "seq": next(self._seq),
                            "action": "authentication_challenge",
                            "data": {"token": self._token},
                        }
                    )
                    async for frame in ws:
                        if frame.type != aiohttp.WSMsgType.TEXT:
                            continue
                        if not await self._frame(ws, frame.data):
                            return  # the token was refused
                        if self.connected:
                            attempt = 0
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 401:
                    self._refuse()
                    return
                self._note(exc)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                self._note(exc)
            finally:
                self._ws, self.connected = None, False
            self.reconnects += 1
            delay = self._backoff.delay(attempt)
            attempt += 1
            log.warning("mattermost websocket closed; reconnecting in %.1fs", delay)
            await asyncio.sleep(delay)

    def _note(self, exc: BaseException) -> None:
        log.info("mattermost websocket error: %s: %s", type(exc).__name__, exc)

    async def _frame(self, ws: Any, raw: str) -> bool:
        try:
            event = json.loads(raw)
        except ValueError:
            log.info("ignored a websocket frame that is not JSON: %.200r", raw)
            return True
        if not isinstance(event, dict):
            return True
        if event.get("seq_reply") == 1 and event.get("status") == "FAIL":
            self._refuse()
            return False
        if event.get("event") == "hello":
            self._ws, self.connected = ws, True
            self._hello.set()
            await self._queue.put(CATCH_UP)
        elif event.get("event") == "posted":
            await self._queue.put(event)
        return True

    def _refuse(self) -> None:
        self.refused = True
        self._hello.set()
        self._on_refused()

    # --- handing posts over, in order -----------------------------------------------------

    async def _consume(self) -> None:
        while True:
            item = await self._queue.get()
            if item == CATCH_UP:
                if await self._catch_up():
                    self._retry_attempt = 0
                else:  # live posts are not held back meanwhile; the next try covers them too
                    self._retry_later()
                continue
            decoded = decode_posted(item)
            if decoded is not None:
                await self._deliver(*decoded, live=True)

    async def _deliver(self, post: dict[str, Any], data: Mapping[str, Any], *, live: bool) -> bool:
        """Hand one post over; False when the gateway could not take it (then its channel
        waits for a catch-up, so nothing after it moves the channel's position)."""
        pid, channel = str(post.get("id") or ""), str(post.get("channel_id") or "")
        if not pid or not channel or pid in self._seen:
            return True
        if live and channel in self._stalled:
            return True  # the pending catch-up brings it, in order
        try:
            await self._on_post(post, data)
        except NotAccepted:
            log.warning("post %s in %s not accepted; catching up on it later", pid, channel)
            self._stalled.add(channel)
            ms = int(post.get("create_at") or 0)
            pos = await self._position(channel)
            if pos is None or pos[0] >= ms:  # the catch-up starts just before this post
                await self._store_position(channel, (ms - 1, ()))
            self._retry_later()
            return False
        except Exception:  # one bad post must not stop the stream
            log.exception("post %s in %s could not be handled", pid, channel)
        self._seen[pid] = None
        if len(self._seen) > SEEN_POSTS:
            self._seen.popitem(last=False)
        await self._advance(channel, int(post.get("create_at") or 0), pid)
        return True

    def _retry_later(self) -> None:
        if self._retry is None or self._retry.done():
            self._retry = asyncio.create_task(self._retry_catch_up(), name="mattermost.retry")

    async def _retry_catch_up(self) -> None:
        self._retry_attempt += 1
        await asyncio.sleep(self._backoff.delay(self._retry_attempt))
        await self._queue.put(CATCH_UP)

    # --- positions ------------------------------------------------------------------------

    async def _position(self, channel: str) -> Position | None:
        if channel not in self._positions:
            raw = await self._cursors.get(f"channel:{channel}") if self._cursors else None
            self._positions[channel] = parse_position(raw)
        return self._positions[channel]

    async def _advance(self, channel: str, ms: int, pid: str) -> None:
        pos = await self._position(channel)
        if pos is not None and ms < pos[0]:
            return
        ids = (*pos[1], pid)[-20:] if pos is not None and ms == pos[0] else (pid,)
        await self._store_position(channel, (ms, ids))
        if self._watermark is None or ms > self._watermark:
            await self._set_watermark(ms)

    async def _store_position(self, channel: str, pos: Position) -> None:
        self._positions[channel] = pos
        if self._cursors is not None:
            await self._cursors.set(f"channel:{channel}", format_position(pos))

    async def _set_watermark(self, ms: int) -> None:
        self._watermark = ms
        if self._cursors is not None:
            await self._cursors.set("watermark", str(ms))

    async def _load_marks(self) -> None:
        if self._marks_loaded or self._cursors is None:
            return
        self._marks_loaded = True
        watermark, pending = (
            await self._cursors.get("watermark"),
            await self._cursors.get("pending"),
        )
        if self._watermark is None and watermark and watermark.isdigit():
            self._watermark = int(watermark)
        if self._pending is None and pending and pending.isdigit():
            self._pending = int(pending)

    async def _set_pending(self, ms: int | None) -> None:
        if ms != self._pending:
            self._pending = ms
            if self._cursors is not None:
                await self._cursors.set("pending", "" if ms is None else str(ms))

    async def _catch_up(self) -> bool:
        """Fetch and hand over what was missed; False to be tried again later. Until a
        catch-up succeeds its starting point is kept (`pending`), so the live posts that
        flow meanwhile do not move the next try past what is still missing."""
        await self._load_marks()
        base = self._pending if self._pending is not None else self._watermark
        try:
            channels = await self._server.channels()
        except Exception as exc:  # AdapterError, or the library's own refusal
            log.warning("mattermost catch-up could not list channels: %s", exc)
            await self._set_pending(base)
            return False
        if not base:  # a first start: history is not answered
            latest = max((int(c.get("last_post_at") or 0) for c in channels), default=0)
            await self._set_watermark(latest or int(time.time() * 1000))
            return True
        now = int(time.time() * 1000)
        oldest = now - self._horizon_ms if self._horizon_ms > 0 else None

        def last(c: dict[str, Any]) -> int:
            return int(c.get("last_post_at") or 0)

        # stalled channels first (a post there was refused), then the most recently active
        wanted = [c for c in channels if c["id"] in self._stalled or (oldest and last(c) > oldest)]
        wanted.sort(key=lambda c: (c["id"] in self._stalled, last(c)), reverse=True)
        missed: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for ch in wanted[:CATCH_UP_CHANNELS]:
            cid = str(ch["id"])
            pos = await self._position(cid) or (base, ())
            if self._pending is not None and pos[0] > self._pending:
                pos = (self._pending, ())
            if last(ch) <= pos[0] and cid not in self._stalled:
                continue
            try:
                posts = await self._server.posts_since(cid, max(pos[0], oldest or 0) - 1)
            except Exception as exc:
                log.warning("mattermost catch-up could not read channel %s: %s", cid, exc)
                await self._set_pending(base)
                return False
            data = {"channel_type": ch.get("type"), "channel_display_name": ch.get("display_name")}
            for p in posts:
                ms, pid = int(p.get("create_at") or 0), str(p.get("id"))
                fresh = ms > pos[0] or (ms == pos[0] and pid not in pos[1])
                if (
                    fresh
                    and pid not in self._seen
                    and ms >= (oldest or 0)
                    and p.get("channel_id") == cid
                ):
                    missed.append((p, data))
        missed.sort(key=lambda pd: (int(pd[0].get("create_at") or 0), str(pd[0].get("id"))))
        blocked: set[str] = set()
        for post, data in missed:
            channel = str(post.get("channel_id"))
            if channel not in blocked and not await self._deliver(post, data, live=False):
                blocked.add(channel)
        self.catch_ups += 1
        if missed:
            log.info("mattermost caught up on %d missed posts", len(missed))
        self._stalled &= blocked
        if not blocked:
            await self._set_pending(None)
        return not blocked
