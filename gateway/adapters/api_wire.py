"""The HTTP API's wire: errors in OpenAI's shape, the reasons a request ends without a
reply, and the checks every endpoint makes of a request (a JSON object, the
Idempotency-Key, the callback_url, text a store can hold). The endpoints are in api.py,
api_openai.py, api_messages.py and api_send.py."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.messages import OutboundMessage
from gateway.session_keys import SessionSource
from state import unstorable

MAX_BODY = 2 * 1024 * 1024
IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"  # "true" on an answer given again, not a new turn
MAX_KEY = 255

# the kinds of answer a request can end with, besides a reply: (status, type, code, message)
DROPPED = {
    "duplicate": (
        409,
        "duplicate_message",
        "this message_id was already received for this chat; its reply is in the session's history",
    ),
    "unauthorised": (403, "not_allowed", "this user may not use the gateway"),
    "shutting_down": (503, "shutting_down", "the gateway is shutting down"),
    "not_accepted": (
        503,
        "storage_unavailable",
        "the gateway could not store your message; send it again (with the same Idempotency-Key)",
    ),
    "unstorable": (
        400,
        "unstorable_input",
        "the message holds a value the store can never "
        "keep; nothing was stored, and sending it again cannot help",
    ),
    "in_flight": (
        409,
        "in_flight",
        "this message id is stored and its turn has not answered "
        "yet (it runs, or runs again after a restart); ask again later for its reply",
    ),
    "answered_elsewhere": (
        409,
        "answered_elsewhere",
        "another replica answered this message and its answer (a command's) is not stored",
    ),
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
}


# the seconds a 503 asks its sender to wait before delivering again: the store's
# reconnects are tried every half second, and it answers within a second of returning
RETRY_AFTER_S = "1"


def error(status: int, message: str, code: str | None = None) -> web.Response:
    """An error in OpenAI's shape; the type follows from the status (5xx: server_error)."""
    kind = "server_error" if status >= 500 else ERROR_TYPES.get(status, "invalid_request_error")
    return web.json_response(
        {"error": {"message": message, "type": kind, "code": code}}, status=status
    )


def not_stored(out: OutboundMessage) -> web.Response | None:
    """The error for a reply whose message was not stored (never a 200): 503 when the store
    was away (send it again), 400 when no store can keep it; None for a stored one."""
    if out.error == "storage":
        return error(503, out.text, "storage_unavailable")
    if out.error == "unstorable":
        return error(400, out.text, "unstorable_input")
    return None


def bad(status: int, message: str) -> web.Response:
    return error(status, message, "invalid_request" if status == 400 else None)


def json_type(value: object) -> str:
    """The JSON type of a decoded value, as an error message names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a decimal number"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "a string"


def usage(out: OutboundMessage) -> tuple[dict[str, int], str]:
    """The OpenAI `usage` of an answer and where its figures come from: "agent" (the
    backend's counts), "estimate" (ours, about 4 characters a token: the echo agent, or a
    backend that reports none) or "none" (no agent call answered this request: a command,
    or an answer read back from the store)."""
    u = out.usage
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}, "none"
    counts = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }
    return counts, "estimate" if u.estimated else "agent"


def refused_text(fields: dict[str, str]) -> web.Response | None:
    """A 400 naming the first field whose text no store can hold (state/text.py: NUL, a
    lone surrogate, which JSON's "\\ud800" allows), else None."""
    for name, value in fields.items():
        why = unstorable(value)
        if why is not None:
            return bad(400, f"{name} {why}")
    return None


@dataclass(frozen=True)
class Answer:
    """What a request is answered with: the reply and the notices sent before it."""

    reply: OutboundMessage
    notices: tuple[str, ...]
    duplicate: bool = False  # given again: this request ran no turn of its own


# (source, text, message id or None, callback_url or None) -> the request's answer, or the
# error response it ends with (ApiAdapter.turn)
Turn = Callable[
    [SessionSource, str, "str | None", "str | None"], Awaitable["Answer | web.Response"]
]


def idempotency_key(request: web.Request, fallback: str | None) -> str | None | web.Response:
    """The request's Idempotency-Key (else `fallback`, the body's or X-Request-Id's id);
    a 400 when it is malformed or disagrees with the body's message_id."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return fallback
    if not key.strip() or len(key) > MAX_KEY or not key.isprintable():
        return bad(400, f"{IDEMPOTENCY_HEADER} must be 1 to {MAX_KEY} printable characters")
    return key


async def read_json(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return bad(400, "the body must be JSON")
    if not isinstance(body, dict):
        return bad(400, "the body must be a JSON object")
    return body


def callback_url(body: dict[str, Any]) -> str | None | web.Response:
    """The body's `callback_url`: where follow-ups to this request are POSTed."""
    url = body.get("callback_url")
    if url is None:
        return None
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        return bad(400, "callback_url must be an http:// or https:// URL")
    return url
