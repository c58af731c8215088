"""The OpenAI-compatible endpoints of the HTTP API: `POST /v1/chat/completions` (plain
JSON, or server-sent chunks with `stream`) and `GET /v1/models`. They read and answer the
OpenAI shapes; the turn itself is ApiAdapter.turn's."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from aiohttp import web

from gateway.adapters.api_wire import (
    REPLAYED_HEADER,
    Turn,
    bad,
    callback_url,
    error,
    idempotency_key,
    not_stored,
    read_json,
    refused_text,
    usage,
)
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType


async def models_list(models: tuple[str, ...], created: int, request: web.Request) -> web.Response:
    """GET /v1/models: the configured model names (the first answers by default)."""
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "switchboard"}
                for m in models
            ],
        }
    )


async def chat_completions(
    turn: Turn, models: tuple[str, ...], request: web.Request
) -> web.StreamResponse:
    """POST /v1/chat/completions: the last user message's text is the turn's; the reply
    comes as a chat.completion, or as its chunks when `stream` is true."""
    body = await read_json(request)
    if isinstance(body, web.Response):
        return body
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return bad(400, "messages must be a non-empty list")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return bad(400, "the last message must have role 'user'")
    at = f"messages[{len(messages) - 1}].content"
    content = last.get("content")
    fields: dict[str, str] = {}
    if isinstance(content, list):  # content parts: keep the text ones
        fields = {
            f"{at}[{k}].text": p["text"]
            for k, p in enumerate(content)
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        }
        content = "\n".join(fields.values())
    elif isinstance(content, str):
        fields = {at: content}
    if not isinstance(content, str) or not content.strip():
        return bad(400, "the last user message has no text")
    refused = refused_text(fields)
    if refused is not None:
        return refused
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        return bad(400, "stream must be true or false")
    who = request.headers.get("X-Switchboard-Session") or body.get("user") or "default"
    if not isinstance(who, str) or not who.strip() or len(who) > 200:
        return bad(
            400,
            "user / X-Switchboard-Session must be a non-empty string of at most 200 characters",
        )
    refused = refused_text({"user": who})
    if refused is not None:
        return refused
    model = body.get("model") if isinstance(body.get("model"), str) else None
    model = model or (models[0] if models else "switchboard")
    source = SessionSource(
        platform="api", chat_id=who, chat_type=ChatType.DM, user_id=who, user_name=who
    )
    key = idempotency_key(request, request.headers.get("X-Request-Id"))
    if isinstance(key, web.Response):
        return key
    callback = callback_url(body)
    if isinstance(callback, web.Response):
        return callback
    answer = await turn(source, content, key, callback)
    if isinstance(answer, web.Response):
        return answer
    out = answer.reply
    if (refusal := not_stored(out)) is not None:
        return refusal
    if out.error == "agent":  # the chat platforms get an apology; an API client an error
        return error(502, "the agent failed to answer; the message was stored", "agent_error")
    ident, created = f"chatcmpl-{os.urandom(12).hex()}", int(time.time())
    counts, counted_by = usage(out)
    extra = {
        "session_id": out.session_id,
        "session_key": out.session_key,
        "notices": list(answer.notices),
        "duplicate": answer.duplicate,
        "usage_source": counted_by,
    }
    replayed = {REPLAYED_HEADER: "true"} if answer.duplicate else {}
    if stream:
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        return await stream_chunks(
            request,
            ident,
            created,
            model,
            out.text,
            extra,
            replayed,
            counts if with_usage else None,
        )
    return web.json_response(
        headers=replayed,
        data={
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": out.text},
                    "finish_reason": "stop",
                }
            ],
            "usage": counts,
            "switchboard": extra,
        },
    )


async def stream_chunks(
    request: web.Request,
    ident: str,
    created: int,
    model: str,
    text: str,
    extra: dict[str, Any],
    headers: dict[str, str],
    usage: dict[str, int] | None = None,
) -> web.StreamResponse:
    """The finished reply as OpenAI chat.completion.chunk events: the role, the content
    (in pieces of a few hundred characters), the stop, with `usage` (asked for with
    `stream_options.include_usage`) a chunk without choices carrying it, then [DONE]."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)

    async def event(delta: dict[str, str], finish: str | None, **more: Any) -> None:
        chunk = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            **more,
        }
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

    await event({"role": "assistant", "content": ""}, None)
    for i in range(0, len(text), 400):
        await event({"content": text[i : i + 400]}, None)
    await event({}, "stop", switchboard=extra)
    if usage is not None:
        chunk = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage,
        }
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
