"""Signal's text on both sides: a `receive` envelope from signal-cli read into what the
adapter needs (sender, chat, mentions of the bot, quotes, attachments), and the agent's
Markdown turned into plain readable text, since Signal renders no Markdown. Pure
functions over recorded payloads; the adapter does the I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

PLATFORM = "signal"
MENTION_MARK = "\ufffc"  # Signal's placeholder for a mention in the message body
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)


def is_direct(chat_id: str) -> bool:
    """A DM's chat id is the person (a +number or a UUID); a group's is its base64 id."""
    return chat_id.startswith("+") or bool(_UUID.match(chat_id))


@dataclass(frozen=True)
class Me:
    """The bot's own identities: its account number, its UUID once seen, its name."""

    number: str
    uuid: str | None = None
    name: str | None = None

    def is_me(self, number: object, uuid: object) -> bool:
        return bool((number and number == self.number) or (uuid and uuid == self.uuid))


@dataclass(frozen=True)
class Incoming:
    """One data message from a person, read from its envelope."""

    source: SessionSource
    text: str  # mentions resolved; the bot's own mention removed
    message_id: str  # "<author>:<timestamp>": unique per sender, and what a quote needs
    sent_at: float
    mentioned: bool  # a DM, a mention of the bot, a quote of the bot, or no mention needed
    attachments: int


def sender_id(number: str | None, uuid: str | None, listed: Collection[str] = ()) -> str | None:
    """Who a person is to the gateway: their UUID when the allowlist names that UUID,
    else their number, else (number hidden) their UUID."""
    if uuid and uuid in listed:
        return uuid
    return number or uuid


def parse_envelope(
    payload: Mapping[str, Any],
    me: Me,
    *,
    listed: Collection[str] = (),
    require_mention: bool = True,
) -> Incoming | None:
    """A `receive` event's params ({"envelope": ..., "account": ...}) as an Incoming, or
    None for anything that is not a new message from a person: receipts, typing, sync
    copies of our own sends, edits, reactions, deletes, group updates, malformed data."""
    try:
        env = payload["envelope"]
        data = env.get("dataMessage")
        if not isinstance(data, Mapping):
            return None
        number, uuid = env.get("sourceNumber") or None, env.get("sourceUuid") or None
        if number is None and uuid is None and isinstance(env.get("source"), str):
            number = env["source"] if env["source"].startswith("+") else None
            uuid = None if number else env["source"]
        if me.is_me(number, uuid) or (number is None and uuid is None):
            return None
        if data.get("reaction") or data.get("remoteDelete"):
            return None
        group = data.get("groupInfo")
        if isinstance(group, Mapping) and group.get("type") == "UPDATE":
            return None
        body = data.get("message")
        attachments = len(data.get("attachments") or [])
        if body is not None and not isinstance(body, str):
            return None
        if not (body or "").strip() and not attachments:
            return None
        ts = int(data.get("timestamp") or env["timestamp"])
        who = sender_id(number, uuid, listed)
        text, named = resolve_mentions(body or "", data.get("mentions") or [], me)
        quoted = data.get("quote")
        to_me = isinstance(quoted, Mapping) and me.is_me(
            quoted.get("authorNumber") or quoted.get("author"), quoted.get("authorUuid")
        )
        name = env.get("sourceName") or None
        if isinstance(group, Mapping):
            group_id = group["groupId"]
            group_id = group_id[0] if isinstance(group_id, list) else group_id
            if not isinstance(group_id, str) or not group_id:
                return None
            source = SessionSource(
                PLATFORM, group_id, ChatType.GROUP, who, name, group.get("groupName") or None
            )
            mentioned = named or to_me or not require_mention
        else:
            source = SessionSource(PLATFORM, str(who), ChatType.DM, who, name)
            mentioned = True
        return Incoming(
            source, text.strip(), f"{uuid or number}:{ts}", ts / 1000.0, mentioned, attachments
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def resolve_mentions(body: str, mentions: list[Any], me: Me) -> tuple[str, bool]:
    """The body with each mention placeholder replaced (`@name` for people, nothing for
    the bot), and whether the bot was named: by a mention, or by `@<bot name>` in the
    text. Mention offsets count UTF-16 code units, as Signal's body ranges do."""
    units = body.encode("utf-16-le")
    named = False
    spans = []
    for m in mentions:
        if not isinstance(m, Mapping):
            continue
        start, length = int(m.get("start", -1)), int(m.get("length", 0))
        if start < 0 or length <= 0 or (start + length) * 2 > len(units):
            continue
        ours = me.is_me(m.get("number"), m.get("uuid"))
        named = named or ours
        spans.append(
            (start, length, "" if ours else f"@{m.get('name') or m.get('number') or m.get('uuid')}")
        )
    for start, length, label in sorted(spans, reverse=True):
        units = units[: start * 2] + label.encode("utf-16-le") + units[(start + length) * 2 :]
    text = units.decode("utf-16-le", errors="replace")
    if me.name:
        tag = re.compile(rf"(?<!\w)@{re.escape(me.name)}(?!\w)", re.I)
        if tag.search(text):
            named, text = True, tag.sub("", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip(), named


_FENCE = re.compile(r"^```[^\n]*\n?(.*?)\n?```[ \t]*$", re.S | re.M)
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"!\[([^\]]*)\]\((\S+?)\)"), r"\1 (\2)"),  # image: its text and address
    (re.compile(r"\[([^\]]+)\]\((\S+?)\)"), r"\1 (\2)"),  # link: its text and address
    (re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M), r"\1"),  # heading
    (re.compile(r"^[ \t]*>[ \t]?", re.M), ""),  # block quote marker
    (re.compile(r"^[ \t]*([-*_])([ \t]*\1){2,}[ \t]*$", re.M), "―――"),  # rule
    (re.compile(r"^([ \t]*)[*+-][ \t]+", re.M), "\\1• "),  # bullet
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # bold
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # italic *
    (re.compile(r"(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"), r"\1"),  # italic _
    (re.compile(r"~~(?=\S)(.+?)(?<=\S)~~"), r"\1"),  # strike-through
)
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def to_plain(text: str) -> str:
    """Markdown as plain readable text: markers dropped, links as `text (address)`,
    bullets as •. Code (fenced or inline) keeps its content exactly, markers and all."""
    kept: list[str] = []
    text = text.replace("\0", "")  # NUL marks kept code below (and means nothing in a chat)

    def keep(content: str) -> str:
        kept.append(content)
        return f"\0{len(kept) - 1}\0"

    text = _FENCE.sub(lambda m: keep(m.group(1)), text)
    text = _CODE_SPAN.sub(lambda m: keep(m.group(1)), text)
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return re.sub(r"\0(\d+)\0", lambda m: kept[int(m.group(1))], text)
