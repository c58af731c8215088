"""`POST /v1/send` of the HTTP API: one message to a chat of any platform, for
`switchboard send` on this machine while the daemon runs (loopback callers only)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.adapters.api_wire import bad, error, read_json, refused_text

# (platform, chat id or chat_id:thread_id or None for the home channel, text) -> the outbox
# row's outcome: {"id", "platform", "chat_id", "message_ids", "state": sent | pending}
SendOne = Callable[[str, "str | None", str], Awaitable[dict[str, Any]]]


async def send_view(send_one: SendOne, request: web.Request) -> web.Response:
    """One message to a chat, for terminal commands on this machine only: the peer must
    be loopback (whatever the server listens on), and the bearer key applies as for the
    other endpoints. Body: {"platform", "target" (null: the home channel), "text"}."""
    import ipaddress

    from gateway.errors import ConfigError, GatewayError, NoHomeChannel
    from gateway.ops.send import BadTarget

    try:
        local = ipaddress.ip_address((request.remote or "").split("%")[0]).is_loopback
    except ValueError:
        local = False
    # a reverse proxy on this machine connects from loopback too: what it forwards is not
    proxied = any(h in request.headers for h in ("Forwarded", "X-Forwarded-For", "X-Real-IP"))
    if not local or proxied:
        return error(403, "POST /v1/send answers on loopback only", "loopback_only")
    body = await read_json(request)
    if isinstance(body, web.Response):
        return body
    platform, target, text = body.get("platform"), body.get("target"), body.get("text")
    if not isinstance(platform, str) or not platform:
        return bad(400, "platform: required, a platform name")
    if target is not None and not isinstance(target, str):
        return bad(400, "target: a chat id as a string, or null for the home channel")
    if not isinstance(text, str) or not text.strip():
        return bad(400, "text: required, non-empty text")
    refused = refused_text({"text": text, "target": target or ""})
    if refused is not None:
        return refused
    try:
        sent = await send_one(platform, target, text)
    except ConfigError as exc:
        return error(404, str(exc), "not_configured")
    except NoHomeChannel as exc:
        return error(409, str(exc), "no_home_channel")
    except BadTarget as exc:
        return bad(400, str(exc))
    except GatewayError as exc:
        code = {69: "platform_unreachable", 77: "platform_refused"}.get(exc.exit_code)
        return error(504 if code == "platform_unreachable" else 502, str(exc), code)
    queued = sent.get("state") != "sent"  # stored; the daemon tries again later
    return web.json_response({**sent, "sent": not queued}, status=202 if queued else 200)
