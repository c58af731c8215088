"""The simple webhook of the HTTP API: `POST /v1/messages`, one message of any chat type
in, its reply out, as plain JSON (no OpenAI shapes). The turn itself is ApiAdapter.turn's."""

from __future__ import annotations

from aiohttp import web

from gateway.adapters.api_wire import (
    IDEMPOTENCY_HEADER,
    REPLAYED_HEADER,
    Turn,
    bad,
    callback_url,
    idempotency_key,
    json_type,
    not_stored,
    read_json,
    refused_text,
)
from gateway.session_keys import CHAT_TYPES, SessionSource
from gateway.vocab import ChatType


async def messages(turn: Turn, request: web.Request) -> web.Response:
    """POST /v1/messages: {"chat_id", "text", ...} in, {"reply", "notices", ...} out."""
    body = await read_json(request)
    if isinstance(body, web.Response):
        return body
    text = body.get("text")
    chat_id = body.get("chat_id")
    if not isinstance(text, str) or not text.strip():
        return bad(400, "text must be a non-empty string")
    if chat_id is None:
        return bad(400, "chat_id is required")
    if not isinstance(chat_id, (str, int)) or isinstance(chat_id, bool):
        return bad(400, f"chat_id must be a string or an integer, not {json_type(chat_id)}")
    if not str(chat_id).strip():
        return bad(400, "chat_id must not be empty")
    chat_type = body.get("chat_type", ChatType.DM)
    if chat_type not in CHAT_TYPES:
        return bad(400, f"chat_type must be one of {', '.join(CHAT_TYPES)}")
    opt = {}
    for name in ("user_id", "user_name", "chat_name", "thread_id", "message_id"):
        v = body.get(name)
        if v is not None and (not isinstance(v, (str, int)) or isinstance(v, bool)):
            return bad(400, f"{name} must be a string, not {json_type(v)}")
        opt[name] = None if v is None else str(v)
    strings = {"text": text, "chat_id": str(chat_id)} | {k: v for k, v in opt.items() if v}
    refused = refused_text(strings)
    if refused is not None:
        return refused
    source = SessionSource(
        platform="api",
        chat_id=str(chat_id),
        chat_type=chat_type,
        user_id=opt["user_id"] or (str(chat_id) if chat_type == ChatType.DM else None),
        user_name=opt["user_name"],
        chat_name=opt["chat_name"],
        thread_id=opt["thread_id"],
    )
    key = idempotency_key(request, opt["message_id"])
    if isinstance(key, web.Response):
        return key
    if opt["message_id"] is not None and key != opt["message_id"]:
        return bad(400, f"message_id and the {IDEMPOTENCY_HEADER} header differ")
    callback = callback_url(body)
    if isinstance(callback, web.Response):
        return callback
    answer = await turn(source, text, key, callback)
    if isinstance(answer, web.Response):
        return answer
    out = answer.reply
    if (refusal := not_stored(out)) is not None:
        return refusal
    replayed = {REPLAYED_HEADER: "true"} if answer.duplicate else {}
    return web.json_response(
        headers=replayed,
        data={
            "reply": out.text,
            "notices": list(answer.notices),
            "session_id": out.session_id,
            "session_key": out.session_key,
            "error": out.error,
            "duplicate": answer.duplicate,
        },
    )
