"""Discord's messages as the core sees them: a discord.py message read into plain fields,
the fields turned into an InboundMessage (pure: tests call it with recorded fields), and the
nonce that keeps a reply sent again from showing twice."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.discord")


def fields_of(message: Any, bot_id: int | None) -> dict[str, Any]:
    import discord

    channel = message.channel
    kind = (
        "dm"
        if isinstance(channel, discord.DMChannel)
        else "thread"
        if isinstance(channel, discord.Thread)
        else "text"
    )
    if kind == "text" and not isinstance(channel, discord.TextChannel):
        kind = "other"
    return {
        "id": message.id,
        "content": message.content,
        "author_id": message.author.id,
        "author_name": getattr(message.author, "display_name", None),
        "author_bot": message.author.bot,
        "kind": kind,
        "channel_id": channel.id,
        "channel_name": getattr(getattr(channel, "parent", None) or channel, "name", None),
        "guild_name": getattr(message.guild, "name", None),
        "parent_id": getattr(channel, "parent_id", None),
        "mentions_bot": bot_id is not None and any(u.id == bot_id for u in message.mentions),
        "thread_owner_is_bot": kind == "thread" and getattr(channel, "owner_id", None) == bot_id,
    }


def to_inbound(
    fields: Mapping[str, Any],
    *,
    require_mention: bool = True,
    free_channels: frozenset[str] = frozenset(),
    active_threads: set[str] | None = None,
) -> InboundMessage | None:
    """fields: id, content, author_id, author_name, author_bot, kind ('dm' | 'text' |
    'thread'), channel_id, channel_name, guild_name, parent_id, mentions_bot."""
    try:
        if fields.get("author_bot"):
            return None
        text = fields.get("content")
        if not isinstance(text, str) or not text.strip():
            return None
        kind, channel = fields["kind"], str(fields["channel_id"])
        user = str(fields["author_id"])
        name = fields.get("author_name")
        if kind == "dm":
            source = SessionSource("discord", channel, ChatType.DM, user, name)
            addressed = True
        elif kind == "thread":
            source = SessionSource(
                "discord",
                channel,
                ChatType.THREAD,
                user,
                name,
                f"{fields.get('guild_name')} / #{fields.get('channel_name')}",
                channel,
            )
            addressed = (
                bool(fields.get("mentions_bot"))
                or channel in (active_threads or set())
                or not require_mention
                or str(fields.get("parent_id")) in free_channels
            )
        elif kind == "text":
            source = SessionSource(
                "discord",
                channel,
                ChatType.GROUP,
                user,
                name,
                f"{fields.get('guild_name')} / #{fields.get('channel_name')}",
            )
            addressed = (
                bool(fields.get("mentions_bot")) or not require_mention or channel in free_channels
            )
        else:
            return None
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=str(fields["id"]),
            received_at=time.time(),
            mentioned=addressed,
            reply_to=str(fields["id"]),
        )
    except (KeyError, TypeError, ValueError):
        log.info("ignored a malformed Discord message: %.200r", dict(fields))
        return None


def reply_nonce(dedupe_key: str, channel_id: str, part: int) -> str:
    """The nonce of one part of a reply: the same for every send of that part, distinct
    across keys, channels and parts, and within Discord's 25 characters (24 hex digits)."""
    seed = f"{dedupe_key}\x00{channel_id}\x00{part}".encode()
    return hashlib.blake2b(seed, digest_size=12).hexdigest()
