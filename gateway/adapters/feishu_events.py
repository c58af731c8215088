"""What Feishu / Lark POSTs to the event webhook, checked and translated as pure functions.

`open_request` verifies a request before anything else reads it (the X-Lark-Signature over
timestamp + nonce + encrypt key + body, the timestamp window, AES-256-CBC decryption with
lark-oapi's AESCipher, the verification token) and answers the URL-verification challenge;
`to_inbound` turns an `im.message.receive_v1` event into an InboundMessage. No I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.feishu")
PLATFORM = "feishu"
RECEIVE = "im.message.receive_v1"
STALE_AFTER_S = 300  # a signed request older (or newer) than this is a replay: refused
TIMESTAMP, NONCE, SIGNATURE = "X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature"


class Refused(Exception):
    """A request that must not be processed: `status` is the HTTP answer (400/401/403)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


@dataclass(frozen=True)
class Opened:
    """A verified request: either the URL-verification challenge to echo, or an event."""

    challenge: str | None
    event: Mapping[str, Any]


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    """Feishu's X-Lark-Signature: hex SHA-256 of timestamp + nonce + encrypt key + raw body."""
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def decrypt(encrypted: str, encrypt_key: str) -> str:
    """An `encrypt` field in plain text (AES-256-CBC, key SHA-256(encrypt key), IV first)."""
    from lark_oapi.core.utils import AESCipher

    return str(AESCipher(encrypt_key).decrypt_str(encrypted))


def open_request(
    headers: Mapping[str, str],
    body: bytes,
    *,
    encrypt_key: str,
    verification_token: str,
    now: float,
    stale_after_s: float = STALE_AFTER_S,
) -> Opened:
    """The request's event once every check passed, else `Refused`. Only the one-time
    URL-verification challenge may come unsigned; it must still decrypt and carry the token."""
    sent = headers.get(SIGNATURE)
    if sent is not None:
        ts, nonce = headers.get(TIMESTAMP, ""), headers.get(NONCE, "")
        if not hmac.compare_digest(signature(ts, nonce, encrypt_key, body), sent.strip()):
            raise Refused(401, "bad signature")
        try:
            age = abs(now - int(ts))
        except ValueError:
            raise Refused(401, "bad timestamp") from None
        if age > stale_after_s:
            raise Refused(401, f"stale request ({age:.0f}s old)")
    try:
        outer = json.loads(body)
        if not isinstance(outer, dict):
            raise ValueError("not an object")
        inner = outer
        if "encrypt" in outer:
            inner = json.loads(decrypt(str(outer["encrypt"]), encrypt_key))
        if not isinstance(inner, dict):
            raise ValueError("not an object")
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise Refused(400 if sent is not None else 401, f"unreadable body ({exc})") from None
    header = inner.get("header")
    header = header if isinstance(header, dict) else {}
    token = inner.get("token") if "token" in inner else header.get("token")
    if not isinstance(token, str) or not hmac.compare_digest(token, verification_token):
        raise Refused(403, "wrong verification token")
    if inner.get("type") == "url_verification":
        return Opened(str(inner.get("challenge", "")), inner)
    if sent is None:
        raise Refused(401, "missing signature")
    return Opened(None, inner)


_PLACEHOLDER = re.compile(r"(@_user_\d+)([ \t]*)")  # a mention and the space after it


def _post_text(content: Mapping[str, Any]) -> str:
    """A `post` (rich text) as plain text: paragraphs on lines, links and mentions inline."""
    body: Any = content
    if "content" not in body:  # the locale-keyed form: {"zh_cn": {...}}
        body = next((v for v in content.values() if isinstance(v, dict)), {})
    lines = [str(body["title"])] if body.get("title") else []
    for paragraph in body.get("content") or []:
        words = []
        for el in paragraph if isinstance(paragraph, list) else []:
            tag = el.get("tag")
            if tag in ("text", "a", "code_block", "md"):
                words.append(str(el.get("text", "")))
            elif tag == "at":
                words.append(str(el.get("user_id") or ""))
        lines.append("".join(words))
    return "\n".join(lines)


def message_text(
    message_type: str, content: str, mentions: Sequence[Mapping[str, Any]], bot_open_id: str | None
) -> str | None:
    """The message as plain text: mentions of the bot dropped, others as @Name; None for
    kinds without text (images, files, stickers)."""
    data = json.loads(content)
    if message_type == "text":
        text = str(data.get("text", ""))
    elif message_type == "post":
        text = _post_text(data)
    else:
        return None
    names: dict[str, str | None] = {}  # None: the bot, dropped with the space after it
    for m in mentions:
        is_bot = bot_open_id is not None and (m.get("id") or {}).get("open_id") == bot_open_id
        names[str(m.get("key", ""))] = None if is_bot else f"@{m.get('name', '')}"

    def name(hit: re.Match[str]) -> str:
        if hit.group(1) not in names:
            return hit.group(0)
        found = names[hit.group(1)]
        return "" if found is None else found + hit.group(2)

    return _PLACEHOLDER.sub(name, text).strip()


def to_inbound(
    envelope: Mapping[str, Any],
    bot_open_id: str | None,
    active_threads: set[tuple[str, str]] | None = None,
    require_mention: bool = True,
) -> InboundMessage | None:
    """An `im.message.receive_v1` event as an InboundMessage, or None when it is not a text
    message from a person (other events, bots, images, malformed payloads).

    DMs (p2p) are DM sessions. A group message in a thread (`thread_id`) belongs to the thread
    keyed by its root message, which threads the bot has answered continue without a mention;
    other group messages address the bot only with a mention (or when none is required)."""
    try:
        if (envelope.get("header") or {}).get("event_type") != RECEIVE:
            return None
        event = envelope["event"]
        sender, message = event["sender"], event["message"]
        if sender.get("sender_type") != "user":
            return None
        user = (sender.get("sender_id") or {}).get("open_id")
        chat_id, message_id = str(message["chat_id"]), str(message["message_id"])
        mentions = message.get("mentions") or []
        text = message_text(
            str(message["message_type"]), str(message["content"]), mentions, bot_open_id
        )
        if not text or not user:
            return None
        at_bot = bot_open_id is not None and any(
            (m.get("id") or {}).get("open_id") == bot_open_id for m in mentions
        )
        received = int(message.get("create_time") or 0) / 1000
        if message.get("chat_type") == "p2p":
            source = SessionSource(PLATFORM, chat_id, ChatType.DM, str(user))
            addressed = True
        else:
            root = (message.get("root_id") or message_id) if message.get("thread_id") else None
            known = root is not None and (chat_id, root) in (active_threads or set())
            addressed = at_bot or known or not require_mention
            source = SessionSource(PLATFORM, chat_id, ChatType.GROUP, str(user), thread_id=root)
        return InboundMessage(
            source=source,
            text=text,
            platform_message_id=message_id,
            received_at=received,
            mentioned=addressed,
            reply_to=message_id,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        log.info("ignored a malformed Feishu event: %.200r", envelope)
        return None


def card(markdown: str) -> str:
    """An interactive card holding one markdown element (Feishu renders its markdown there)."""
    return json.dumps(
        {
            "config": {"wide_screen_mode": True},
            "elements": [{"tag": "markdown", "content": markdown}],
        },
        ensure_ascii=False,
    )


def card_size(markdown: str) -> int:
    """Bytes the markdown takes inside a card's JSON (escaped, UTF-8): what Feishu limits."""
    return len(json.dumps(markdown, ensure_ascii=False).encode())
