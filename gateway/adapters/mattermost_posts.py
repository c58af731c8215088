"""Mattermost posts as InboundMessages: pure functions of a websocket `posted` event (whose
`data.post` is the post as a JSON string) or of a post fetched while catching up, so recorded
payloads test them without a network. DMs (`D`) are dms; channels (`O`, `P`) and group DMs
(`G`) are groups, where the bot answers a mention, or anything in a thread it takes part in.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection, Mapping
from typing import Any

from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.mattermost")


def decode_posted(event: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(post, data) of a websocket `posted` event, whose `data.post` is a JSON string and
    `data.mentions` (when present) a JSON list of user ids."""
    try:
        if event.get("event") != "posted":
            return None
        data = dict(event["data"])
        post = json.loads(data["post"])
        mentions = data.get("mentions")
        data["mentions"] = json.loads(mentions) if isinstance(mentions, str) else (mentions or [])
        return (post, data) if isinstance(post, dict) else None
    except (KeyError, TypeError, ValueError):
        log.info("ignored a malformed Mattermost event: %.200r", event)
        return None


def _mentions_name(text: str, username: str | None) -> bool:
    if not username:
        return False
    # a username may hold . - _; a trailing full stop ends the sentence, not the name
    pattern = rf"(?<![\w.@-])@{re.escape(username)}(?![\w-]|\.[\w-])"
    return re.search(pattern, text, re.IGNORECASE) is not None


def _strip_mention(text: str, username: str | None) -> str:
    if not username:
        return text.strip()
    pattern = rf"(?<![\w.@-])@{re.escape(username)}(?![\w-]|\.[\w-])[,:]?"
    return re.sub(pattern, "", text, flags=re.IGNORECASE).strip()


def to_inbound(
    post: Mapping[str, Any],
    channel_type: str,
    *,
    bot_id: str,
    bot_username: str | None,
    mentions: Collection[str] = (),
    sender_name: str | None = None,
    channel_name: str | None = None,
    require_mention: bool = True,
    active_threads: Collection[tuple[str, str]] = (),
) -> InboundMessage | None:
    """A post as an InboundMessage, or None when it is not a person's new text post:
    system posts (a `type`), the bot's own, other bots' and webhooks', deleted ones."""
    try:
        if post.get("type") or post.get("delete_at"):
            return None
        props = post.get("props") or {}
        if str(props.get("from_bot")) == "true" or str(props.get("from_webhook")) == "true":
            return None
        user, channel, post_id = str(post["user_id"]), str(post["channel_id"]), str(post["id"])
        text = post.get("message")
        if not user or user == bot_id or not isinstance(text, str) or not text.strip():
            return None
        root = str(post.get("root_id") or "") or None
        name = sender_name.lstrip("@") if sender_name else None
        if channel_type == "D":
            source = SessionSource(
                "mattermost", channel, ChatType.DM, user, name, channel_name, root
            )
            addressed = True
        elif channel_type in ("O", "P", "G"):
            mentioned = bot_id in mentions or _mentions_name(text, bot_username)
            in_thread = root is not None and (channel, root) in active_threads
            addressed = mentioned or in_thread or not require_mention
            # a top-level post addressed to the bot is answered in a thread rooted at it
            thread = root or (post_id if addressed else None)
            source = SessionSource(
                "mattermost", channel, ChatType.GROUP, user, name, channel_name, thread
            )
        else:
            return None
        clean = _strip_mention(text, bot_username)
        return InboundMessage(
            source=source,
            text=clean or text.strip(),
            platform_message_id=post_id,
            received_at=float(post.get("create_at") or time.time() * 1000) / 1000,
            mentioned=addressed,
            reply_to=post_id,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed Mattermost post: %.200r", post)
        return None


def from_event(
    event: Mapping[str, Any],
    *,
    bot_id: str,
    bot_username: str | None,
    require_mention: bool = True,
    active_threads: Collection[tuple[str, str]] = (),
) -> InboundMessage | None:
    """A websocket `posted` event as an InboundMessage (None for anything else)."""
    decoded = decode_posted(event)
    if decoded is None:
        return None
    post, data = decoded
    return to_inbound(
        post,
        str(data.get("channel_type") or ""),
        bot_id=bot_id,
        bot_username=bot_username,
        mentions=data["mentions"],
        sender_name=data.get("sender_name"),
        channel_name=data.get("channel_display_name"),
        require_mention=require_mention,
        active_threads=active_threads,
    )
