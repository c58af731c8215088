"""Discord has no acknowledgement: what arrives while the bot is down (or between a dropped
connection and a fresh IDENTIFY) is never replayed by the gateway. This module keeps the last
handled message id per channel in the adapter's cursors, written after `emit` returned, and
after a (re)start fetches each such channel's newer messages through discord.py's REST
history, bounded by a count per channel and an age, for the adapter to hand over in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from gateway.adapters.base import Cursors

log = logging.getLogger("gateway.adapters.discord")
DISCORD_EPOCH_MS = 1_420_070_400_000
INDEX = "channels"  # the cursor naming every channel that has a position
MAX_CHANNELS = 500  # the most recently active channels are caught up; older ones drop out


def snowflake_at(ms: int) -> int:
    """The smallest id made at `ms`: every message after it has a larger id."""
    return max(0, ms - DISCORD_EPOCH_MS) << 22


class Positions:
    """The last handled message id of each channel the bot answered in, kept under
    `last:<channel>` plus an index cursor listing the channels: the MAX_CHANNELS with the
    newest positions (a channel quiet for longer than the catch-up window still gets the
    window's messages, so age alone does not drop it)."""

    def __init__(self, cursors: Cursors | None) -> None:
        self._cursors = cursors
        self._last: dict[str, int] = {}
        self._index_lock = asyncio.Lock()

    async def load(self) -> dict[str, int]:
        if self._cursors is None:
            return {}
        raw = await self._cursors.get(INDEX) or ""
        for channel in filter(None, raw.split(",")):
            value = await self._cursors.get(f"last:{channel}")
            if value and value.isdigit():
                self._last[channel] = max(self._last.get(channel, 0), int(value))
        return dict(self._last)

    def get(self, channel: str) -> int | None:
        return self._last.get(channel)

    async def advance(self, channel: str, message_id: int) -> None:
        """Record `message_id` as handled in `channel` (never moving a position back)."""
        known = self._last.get(channel)
        if known is not None and message_id <= known:
            return
        self._last[channel] = message_id
        if self._cursors is None:
            return
        await self._cursors.set(f"last:{channel}", str(message_id))
        if known is None:
            await self._write_index()

    async def _write_index(self) -> None:
        assert self._cursors is not None
        async with self._index_lock:  # one writer, so a smaller list never lands last
            if len(self._last) > MAX_CHANNELS:
                newest = sorted(self._last, key=self._last.__getitem__)[-MAX_CHANNELS:]
                self._last = {c: self._last[c] for c in newest}
            await self._cursors.set(INDEX, ",".join(sorted(self._last)))


async def missed(
    client: Any, channel_id: str, after_id: int, *, limit: int, horizon_s: float
) -> AsyncIterator[Any]:
    """The newest `limit` messages of a channel after `after_id` and younger than
    `horizon_s`, oldest first. A channel the bot can no longer see yields nothing."""
    import discord

    floor = snowflake_at(int((time.time() - horizon_s) * 1000))
    after = discord.Object(id=max(after_id, floor))
    try:
        channel = client.get_channel(int(channel_id)) or await client.fetch_channel(int(channel_id))
        # newest first from the present back to `after`, then turned around
        found = [m async for m in channel.history(limit=limit, after=after, oldest_first=False)]
    except (discord.NotFound, discord.Forbidden) as exc:
        log.info("discord: no catch-up in channel %s (%s)", channel_id, exc.status)
        return
    for message in reversed(found):
        yield message
