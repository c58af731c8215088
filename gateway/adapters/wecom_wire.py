"""WeCom AI bot frames, as pure functions: the long connection's commands and their JSON
shapes, a message callback as an InboundMessage, and an answer's errcode as a typed error.

Every frame is `{"cmd", "headers": {"req_id"}, "body"}`. Ours: `aibot_subscribe` (bot id
and secret), `ping`, `aibot_respond_msg` (a reply, under the req_id of the callback it
answers), `aibot_send_msg` (an active message to a chat). WeCom answers each of ours with
`{"headers": {"req_id"}, "errcode", "errmsg"}` and pushes `aibot_msg_callback` (messages)
and `aibot_event_callback` (events: entering a chat, a newer connection of the same bot
taking over). A single chat has no chatid: its chat is the sender's userid, which is also
what `aibot_send_msg` takes for it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

from gateway.errors import AdapterError, InvalidToken, PlatformRefused, RetryAfter, TransientError
from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.wecom")

PLATFORM = "wecom"
DEFAULT_URL = "wss://openws.work.weixin.qq.com"
SUBSCRIBE = "aibot_subscribe"
PING = "ping"
RESPOND = "aibot_respond_msg"
SEND = "aibot_send_msg"
MESSAGE = "aibot_msg_callback"
EVENT = "aibot_event_callback"
REPLACED = "disconnected_event"  # a newer connection of this bot took over this one

STREAM_BYTES = 20_480  # a stream reply's content, in UTF-8 bytes
MARKDOWN_BYTES = 4_096  # an active markdown message's content, in UTF-8 bytes
SYSTEM_BUSY = {-1}
RATE_LIMITED = {45009, 45033, 45047}  # call frequency, concurrency, message quota
CREDENTIALS = {40001, 40013, 40014, 40056, 40058, 41001, 42001, 93000, 93019}


def new_req_id(cmd: str) -> str:
    return f"{cmd}_{uuid.uuid4().hex}"


def frame(cmd: str, req_id: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"cmd": cmd, "headers": {"req_id": req_id}}
    if body is not None:
        out["body"] = dict(body)
    return out


def subscribe_body(bot_id: str, secret: str) -> dict[str, Any]:
    return {"bot_id": bot_id, "secret": secret}


def stream_reply(stream_id: str, text: str) -> dict[str, Any]:
    """A whole reply as one finished stream message (markdown content)."""
    return {"msgtype": "stream", "stream": {"id": stream_id, "finish": True, "content": text}}


def markdown_message(chat_id: str, text: str) -> dict[str, Any]:
    return {"chatid": chat_id, "msgtype": "markdown", "markdown": {"content": text}}


def req_id_of(data: Mapping[str, Any]) -> str:
    headers = data.get("headers")
    return str(headers.get("req_id") or "") if isinstance(headers, Mapping) else ""


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def answer_error(answer: Mapping[str, Any], what: str) -> AdapterError | None:
    """None for errcode 0; else the error it stands for: a refused credential, a rate
    limit (waited out), a busy server (retried), or a refusal of the chat or the text."""
    try:
        code = int(answer.get("errcode") or 0)
    except (TypeError, ValueError):
        code = -1
    if code == 0:
        return None
    why = f"{answer.get('errmsg') or 'no reason given'} (errcode {code})"
    if code in RATE_LIMITED:
        return RetryAfter(1.0)
    if code in SYSTEM_BUSY:
        return TransientError(f"wecom is busy: {why}")
    if code in CREDENTIALS:
        return InvalidToken(f"wecom refused the bot id or secret: {why}")
    return PlatformRefused(f"wecom refused {what}: {why}")


_MENTION = re.compile(r"^\s*@\S+\s*")


def message_text(body: Mapping[str, Any]) -> str | None:
    """The text of a message callback: text, a voice message's transcript, or the text
    parts of a mixed message; None for what has no text (an image, a file)."""
    kind = body.get("msgtype")
    if kind == "text":
        return str((body.get("text") or {}).get("content") or "")
    if kind == "voice":
        return str((body.get("voice") or {}).get("content") or "")
    if kind == "mixed":
        items = (body.get("mixed") or {}).get("msg_item") or []
        parts = [
            str((item.get("text") or {}).get("content") or "")
            for item in items
            if isinstance(item, Mapping) and item.get("msgtype") == "text"
        ]
        return "\n".join(p for p in parts if p)
    return None


def to_inbound(body: Mapping[str, Any]) -> InboundMessage | None:
    """A message callback's body as an InboundMessage, or None (no text, no ids).

    chattype "single" is a DM keyed by the sender's userid; "group" is keyed by its chatid.
    WeCom hands an AI bot only the group messages that @-mention it, so every group message
    is addressed; the leading @mention is taken off the text (so "/title x" reads as a
    command)."""
    try:
        text = message_text(body)
        msg_id = str(body["msgid"])
        user = str((body.get("from") or {}).get("userid") or "")
        if text is None or not msg_id or not user:
            return None
        group = body.get("chattype") == "group"
        if group:
            text = _MENTION.sub("", text, count=1)
        text = text.strip()
        if not text:
            return None
        if group:
            source = SessionSource(PLATFORM, str(body["chatid"]), ChatType.GROUP, user)
        else:
            source = SessionSource(PLATFORM, user, ChatType.DM, user)
        created = body.get("create_time")
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=msg_id,
            received_at=float(created) if created else 0.0,
            mentioned=True,
            reply_to=msg_id,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed WeCom message callback: %.200r", body)
        return None
