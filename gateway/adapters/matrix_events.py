"""Matrix events to and from the gateway's messages, as pure functions over the JSON of the
client-server API: `to_inbound` reads one `m.room.message` from a /sync timeline (threads,
replies, mentions, what to ignore), `message_content` builds the content of a reply (plain
`body` + HTML `formatted_body`, thread and reply relations).

The adapter (gateway.adapters.matrix) supplies what an event alone does not say: whether
the room is a DM, its members' names, and which events are the bot's own.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.adapters.matrix_html import has_markup, to_html
from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.matrix")
# An event is at most 65,536 bytes as the server stores it; body + formatted_body of one
# part stay within this many bytes of JSON, leaving the rest for relations and envelope.
PART_BYTES = 60_000
TEXT_MSGTYPES = frozenset({"m.text"})  # m.notice (bots), m.emote and media are not read
HTML_FORMAT = "org.matrix.custom.html"


@dataclass(frozen=True)
class Me:
    """The bot as mention detection sees it."""

    user_id: str
    display_name: str | None = None
    require_mention: bool = True


@dataclass(frozen=True)
class RoomView:
    """What the adapter knows about a room when an event arrives from it."""

    room_id: str
    is_dm: bool
    name: str | None = None
    members: Mapping[str, str] = field(default_factory=dict)  # user id -> display name


@dataclass(frozen=True)
class Relations:
    thread_root: str | None  # m.thread: the thread's root event
    reply_to: str | None  # a genuine reply (not a thread's fallback)
    edit: bool  # m.replace: an edit of an earlier message


def relations(content: Mapping[str, Any]) -> Relations:
    rel = content.get("m.relates_to")
    if not isinstance(rel, Mapping):
        return Relations(None, None, False)
    in_reply = rel.get("m.in_reply_to")
    reply_to = in_reply.get("event_id") if isinstance(in_reply, Mapping) else None
    thread = rel.get("event_id") if rel.get("rel_type") == "m.thread" else None
    if thread and rel.get("is_falling_back"):
        reply_to = None  # only there for clients without threads
    return Relations(
        str(thread) if isinstance(thread, str) and thread else None,
        str(reply_to) if isinstance(reply_to, str) and reply_to else None,
        rel.get("rel_type") == "m.replace",
    )


def strip_reply_fallback(body: str) -> str:
    """The quoted `> <@user> ...` lines older clients put before a reply's own text."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> "):
        return body
    i = 0
    while i < len(lines) and lines[i].startswith(">"):
        i += 1
    rest = lines[i:]
    if rest and not rest[0].strip():
        rest = rest[1:]
    return "\n".join(rest) if rest else body


def mentions(content: Mapping[str, Any], body: str, me: Me) -> bool:
    """The bot is named: in `m.mentions.user_ids`, as a matrix.to pill in the HTML, or by
    user id or display name (a whole word, any case) in the text."""
    intent = content.get("m.mentions")
    if isinstance(intent, Mapping):
        ids = intent.get("user_ids")
        if isinstance(ids, list) and me.user_id in ids:
            return True
    formatted = content.get("formatted_body")
    if isinstance(formatted, str) and (
        f"matrix.to/#/{me.user_id}" in formatted or f"matrix.to/#/%40{me.user_id[1:]}" in formatted
    ):
        return True
    if me.user_id.lower() in body.lower():
        return True
    name = me.display_name
    return bool(name and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", body, re.I))


def strip_mention(body: str, me: Me) -> str:
    """The text without a leading "Bot:" / "@bot:server," address."""
    for name in (me.user_id, me.display_name):
        if not name:
            continue
        m = re.match(rf"\s*{re.escape(name)}(?!\w)\s*[:,]?\s*", body, re.I)
        if m and body[m.end() :].strip():
            return body[m.end() :]
    return body


def to_inbound(
    event: Mapping[str, Any], room: RoomView, me: Me, bot_events: Container[str] = frozenset()
) -> InboundMessage | None:
    """A timeline event as an InboundMessage, or None for anything that is not a new text
    message from a person (the bot's own, notices, media, edits, state, malformed).
    `bot_events` holds ids of the bot's messages and of threads it takes part in: a reply
    to one, or a message in such a thread, addresses the bot without a mention."""
    try:
        if event.get("type") != "m.room.message" or "state_key" in event:
            return None
        sender, event_id = event["sender"], event["event_id"]
        content = event["content"]
        if not isinstance(sender, str) or not isinstance(event_id, str) or sender == me.user_id:
            return None
        if not isinstance(content, Mapping) or content.get("msgtype") not in TEXT_MSGTYPES:
            return None
        body = content.get("body")
        rel = relations(content)
        if not isinstance(body, str) or rel.edit:
            return None
        if rel.reply_to:
            body = strip_reply_fallback(body)
        if not body.strip():
            return None
        if rel.thread_root:
            chat_type = ChatType.THREAD  # a thread is its own shared session, in DMs too
        else:
            chat_type = ChatType.DM if room.is_dm else ChatType.GROUP
        addressed = room.is_dm or not me.require_mention or mentions(content, body, me)
        addressed = addressed or any(
            target in bot_events for target in (rel.thread_root, rel.reply_to) if target
        )
        source = SessionSource(
            platform="matrix",
            chat_id=room.room_id,
            chat_type=chat_type,
            user_id=sender,
            user_name=room.members.get(sender) or None,
            chat_name=None if room.is_dm else room.name,
            thread_id=rel.thread_root,
        )
        ts = event.get("origin_server_ts")
        return InboundMessage(
            source=source,
            text=strip_mention(body, me).strip(),
            platform_message_id=event_id,
            mentioned=addressed,
            reply_to=event_id,
            received_at=ts / 1000 if isinstance(ts, (int, float)) else 0.0,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed Matrix event: %.200r", event)
        return None


def message_content(
    text: str,
    *,
    thread_id: str | None = None,
    reply_to: str | None = None,
    reply_sender: str | None = None,
    notice: bool = False,
) -> dict[str, Any]:
    """An `m.room.message` content for a reply: the markdown as `body`, its HTML as
    `formatted_body` (when it has markup), in a thread (with the reply fallback pointing
    at `reply_to`) or as a reply to `reply_to`."""
    content: dict[str, Any] = {"msgtype": "m.notice" if notice else "m.text", "body": text}
    rendered = to_html(text)
    if has_markup(text, rendered):
        content["format"] = HTML_FORMAT
        content["formatted_body"] = rendered
    if thread_id:
        content["m.relates_to"] = {
            "rel_type": "m.thread",
            "event_id": thread_id,
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": reply_to or thread_id},
        }
    elif reply_to:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
    # intentional mentions: ping only the person answered, never the room
    content["m.mentions"] = {"user_ids": [reply_sender]} if reply_sender else {}
    return content


def part_size(text: str) -> int:
    """Bytes of one part's `body` and `formatted_body` as JSON (PART_BYTES at most)."""
    content = message_content(text)
    return _json_bytes(content["body"]) + _json_bytes(content.get("formatted_body", ""))


def _json_bytes(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode())


def direct_rooms(content: Mapping[str, Any]) -> set[str]:
    """The room ids of an `m.direct` account-data event (user id -> [room ids])."""
    rooms: set[str] = set()
    for ids in content.values() if isinstance(content, Mapping) else ():
        if isinstance(ids, list):
            rooms.update(r for r in ids if isinstance(r, str))
    return rooms


def inviter(invite_state: Mapping[str, Any], me: str) -> str | None:
    """Who invited `me`, from an invited room's stripped state."""
    events = invite_state.get("events") if isinstance(invite_state, Mapping) else None
    for ev in events if isinstance(events, list) else ():
        if (
            isinstance(ev, Mapping)
            and ev.get("type") == "m.room.member"
            and ev.get("state_key") == me
            and isinstance(ev.get("content"), Mapping)
            and ev["content"].get("membership") == "invite"
            and isinstance(ev.get("sender"), str)
        ):
            return str(ev["sender"])
    return None
