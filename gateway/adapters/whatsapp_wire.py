"""The WhatsApp Cloud API's wire format, as pure functions: the messages and statuses in a
webhook delivery, a message as an InboundMessage, Meta's body signature, Graph API errors
as gateway errors, and markdown in WhatsApp's formatting. The adapter (whatsapp.py) does
the I/O."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Mapping
from typing import Any

from gateway.errors import AdapterError, InvalidToken, PlatformRefused, RetryAfter, TransientError
from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.whatsapp")
WINDOW_CLOSED = 131047  # "Re-engagement message": over 24 h since the user last wrote
RATE_LIMITED = {130429: 6.0, 131056: 6.0, 80007: 60.0}  # code -> wait when no Retry-After
BAD_TOKEN = 190
NOTE = "({kind}: only text messages are read here)"


def messages_of(payload: Mapping[str, Any]) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every inbound message in a webhook delivery, with the sender names it carries
    (wa_id -> profile name). Status callbacks are not messages and are left out."""
    found: list[tuple[dict[str, Any], dict[str, str]]] = []
    if not isinstance(payload, Mapping) or payload.get("object") != "whatsapp_business_account":
        return found
    for entry in payload.get("entry") or []:
        for change in (entry or {}).get("changes") or []:
            value = (change or {}).get("value") or {}
            if not isinstance(value, dict):
                continue
            names = {
                str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "")
                for c in value.get("contacts") or []
                if isinstance(c, dict)
            }
            found += [(m, names) for m in value.get("messages") or [] if isinstance(m, dict)]
    return found


def statuses_of(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The delivery status callbacks in a webhook delivery (sent, delivered, read, failed)."""
    out: list[dict[str, Any]] = []
    for entry in payload.get("entry") or [] if isinstance(payload, Mapping) else []:
        for change in (entry or {}).get("changes") or []:
            value = (change or {}).get("value") or {}
            out += [s for s in value.get("statuses") or [] if isinstance(s, dict)]
    return out


def to_inbound(message: Mapping[str, Any], names: Mapping[str, str]) -> InboundMessage | None:
    """One Cloud API message as an InboundMessage; None for what is not a message to
    answer (reactions, system notices, malformed entries). Non-text messages become a
    short note, so the agent knows something arrived that it cannot read."""
    try:
        sender, mid, kind = str(message["from"]), str(message["id"]), message["type"]
        sent_at = float(message["timestamp"])
    except (KeyError, TypeError, ValueError):
        log.info("ignored a malformed WhatsApp message: %.200r", message)
        return None
    if kind == "text":
        text = (message.get("text") or {}).get("body")
    elif kind == "button":
        text = (message.get("button") or {}).get("text")
    elif kind == "interactive":
        reply = message.get("interactive") or {}
        text = (reply.get("button_reply") or reply.get("list_reply") or {}).get("title")
    elif kind in ("reaction", "system", "request_welcome"):
        return None
    else:
        caption = (
            (message.get(kind) or {}).get("caption")
            if isinstance(message.get(kind), dict)
            else None
        )
        text = NOTE.format(kind=str(kind).replace("_", " ")) + (f" {caption}" if caption else "")
    if not isinstance(text, str) or not text.strip() or not sender or not mid:
        return None
    context = message.get("context") or {}
    source = SessionSource("whatsapp", sender, ChatType.DM, sender, names.get(sender) or None)
    return InboundMessage(
        source,
        text,
        platform_message_id=mid,
        received_at=sent_at,
        reply_to=str(context["id"]) if context.get("id") else None,
    )


def signature_ok(secret: str, body: bytes, header: str | None) -> bool:
    """Meta's `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`."""
    if not secret or not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header[len("sha256=") :].strip().lower())


def graph_error(status: int, body: Any, retry_after: str | None = None) -> Exception:
    """The gateway error for a failed Graph API call (errors come as `{"error": {code}}`)."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code: Any = error.get("code")  # an int from Graph; whatever the JSON held otherwise
    text = str(error.get("message") or f"HTTP {status}")
    if code == WINDOW_CLOSED:
        return WindowClosed(text)
    if status == 429 or code in RATE_LIMITED:
        try:
            wait = float(retry_after) if retry_after else RATE_LIMITED.get(code, 6.0)
        except ValueError:
            wait = RATE_LIMITED.get(code, 6.0)
        return RetryAfter(wait)
    if status == 401 or code == BAD_TOKEN:
        return InvalidToken(f"whatsapp refused the access token ({code or status}): {text}")
    if status >= 500:
        return TransientError(f"whatsapp answered {status}")
    return PlatformRefused(f"whatsapp refused the call ({code or status}): {text}")


class WindowClosed(AdapterError):
    """Over 24 hours since the user last wrote: only a template message may be sent, so
    retrying a free-form reply cannot help."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            "whatsapp: the 24-hour customer-service window is closed (131047); a free-form "
            f"reply cannot be sent until the user writes again ({detail})"
        )


_BOLD = re.compile(r"\*\*(.+?)\*\*")
_LINK = re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)")


def to_whatsapp(text: str) -> str:
    """Markdown bold and links in WhatsApp's formatting; code fences are the same."""
    out = []
    for i, chunk in enumerate(text.split("```")):
        out.append(chunk if i % 2 else _LINK.sub(r"\1 (\2)", _BOLD.sub(r"*\1*", chunk)))
    return "```".join(out)
