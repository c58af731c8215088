"""The generic signed webhook's wire format, as pure functions: the signature header
(`X-Switchboard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`), its
check with a time tolerance, the endpoints' config shape, and a request body as an
InboundMessage. The adapter (webhook.py) does the I/O."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType
from state import unstorable

HEADER = "X-Switchboard-Signature"
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MODES = ("sync", "async")
ENDPOINT_KEYS = ("secret_env", "mode", "callback_url", "reply_timeout_seconds")
MAX_FIELD = 200  # characters in an id, user, chat or thread
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL = re.compile(r"https?://[^\s<>]+")


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The header value for `body` sent at `timestamp` (what the caller and our callbacks send)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


@dataclass(frozen=True)
class Refusal:
    status: int  # 401: missing, malformed or stale; 403: a signature that does not match
    reason: str


def verify(
    secret: str, header: str | None, body: bytes, now: float, tolerance_s: float
) -> Refusal | None:
    """None when `header` signs `body` with `secret` at a time within `tolerance_s` of `now`;
    else why not. Every `v1=` is tried (a caller rotating its secret may send two)."""
    if not header:
        return Refusal(401, f"missing {HEADER} header")
    parts = [p.strip().partition("=") for p in header.split(",")]
    stamps = [v for k, _, v in parts if k == "t"]
    macs = [v.lower() for k, _, v in parts if k == "v1" and v]
    if len(stamps) != 1 or not stamps[0].isdigit() or not macs:
        return Refusal(401, f"malformed {HEADER} header (want t=<unix seconds>,v1=<hex>)")
    timestamp = int(stamps[0])
    if abs(now - timestamp) > tolerance_s:
        return Refusal(
            401, f"timestamp outside the {tolerance_s:g} s tolerance (stale or replayed)"
        )
    expected = sign(secret, timestamp, body).rpartition("v1=")[2]
    if not secret or not any(hmac.compare_digest(expected, m) for m in macs):
        return Refusal(403, "signature does not match")
    return None


def endpoints_problem(value: Any) -> str | None:
    """The config check of `platforms.webhook.endpoints`: every problem, each naming its key."""
    if not isinstance(value, Mapping):
        return "must be a mapping of endpoint names to their settings"
    found = []
    for name, spec in value.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            found.append(
                f"{name!r}: endpoint names are 1-64 of a-z, 0-9, _ and - (they are URL paths)"
            )
            continue
        if not isinstance(spec, Mapping):
            found.append(f"{name}: must be a mapping (secret_env, mode, callback_url ...)")
            continue
        for key in spec:
            if key not in ENDPOINT_KEYS:
                found.append(f"{name}.{key}: unknown key (known here: {', '.join(ENDPOINT_KEYS)})")
        secret_env, mode = spec.get("secret_env"), spec.get("mode", "sync")
        url, wait = spec.get("callback_url"), spec.get("reply_timeout_seconds", 25)
        if not isinstance(secret_env, str) or not _ENV.fullmatch(secret_env):
            found.append(f"{name}.secret_env: is required (the env var holding its signing secret)")
        if mode not in MODES:
            found.append(f"{name}.mode: must be sync or async (got {mode!r})")
        if url is not None and (not isinstance(url, str) or not _URL.fullmatch(url)):
            found.append(f"{name}.callback_url: must be an http(s) URL (got {url!r})")
        elif mode == "async" and url is None:
            found.append(
                f"{name}.callback_url: is required in async mode (replies are POSTed there)"
            )
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 1 <= wait <= 300:
            found.append(f"{name}.reply_timeout_seconds: must be between 1 and 300 (got {wait!r})")
    return "; ".join(found) or None


def split_chat(chat_id: str) -> tuple[str, str]:
    """`<endpoint>:<chat or user>` -> (endpoint, the rest)."""
    name, _, rest = chat_id.partition(":")
    return name, rest


def _field(body: Mapping[str, Any], key: str, required: bool) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
        raise ValueError(f"{key} must be a non-empty string" + ("" if required else " when given"))
    text = str(value)
    if len(text) > MAX_FIELD and key != "text":
        raise ValueError(f"{key} must be at most {MAX_FIELD} characters")
    why = unstorable(text)  # NUL, a lone surrogate: refused, as the HTTP API does
    if why is not None:
        raise ValueError(f"{key} {why}")
    return text


def to_inbound(endpoint: str, body: Any, received_at: float = 0.0) -> InboundMessage:
    """A request body `{id, user, text, chat?, thread?, user_name?}` as an InboundMessage in
    the endpoint's key space; ValueError (its text is the 400's) for anything else."""
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - {"id", "user", "text", "chat", "thread", "user_name"})
    if unknown:
        raise ValueError(
            f"unknown field {unknown[0]!r} (known: id, user, text, chat, thread, user_name)"
        )
    mid, user = _field(body, "id", True), _field(body, "user", True)
    text = _field(body, "text", True)
    chat, thread = _field(body, "chat", False), _field(body, "thread", False)
    name = _field(body, "user_name", False)
    if thread is not None and chat is None:
        raise ValueError("thread needs chat (a thread lives in a chat)")
    source = SessionSource(
        "webhook",
        f"{endpoint}:{chat or user}",
        ChatType.GROUP if chat else ChatType.DM,
        user,
        name,
        thread_id=thread,
    )
    return InboundMessage(
        source, str(text), platform_message_id=mid, received_at=received_at, reply_to=mid
    )
