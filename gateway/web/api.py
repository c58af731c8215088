"""The dashboard's JSON API under /api (described by /api/openapi.json, gateway/web/
openapi.py): sessions, one session, search, insights, health, and the operations."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from gateway.web import actions, queries
from gateway.web.context import dashboard_of
from gateway.web.openapi import document
from state import QueryError, SessionNotFound, StateError, TitleError

ApiHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _errors(fn: ApiHandler) -> ApiHandler:
    """Typed errors -> JSON with a status, in one place."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await fn(request)
        except queries.BadParam as exc:
            return _error(400, str(exc))
        except SessionNotFound as exc:
            return _error(404, str(exc))
        except (TitleError, QueryError) as exc:
            return _error(400, str(exc))
        except actions.Refused as exc:
            return _error(409, str(exc))
        except StateError as exc:
            return _error(503, str(exc))

    return wrapped


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise queries.BadParam("the body must be JSON") from None
    if not isinstance(body, dict):
        raise queries.BadParam("the body must be a JSON object")
    return body


async def list_sessions(request: web.Request) -> web.Response:
    return web.json_response(await queries.session_page(dashboard_of(request), request.query))


async def get_session(request: web.Request) -> web.Response:
    after = request.query.get("after")
    at = request.query.get("at")
    try:
        detail = await actions.session_detail(
            dashboard_of(request),
            request.match_info["id"],
            after_id=int(after) if after else None,
            at=int(at) if at else None,
        )
    except ValueError:
        raise queries.BadParam("after and at must be message ids (whole numbers)") from None
    return web.json_response(detail)


async def rename_session(request: web.Request) -> web.Response:
    body = await _json_body(request)
    title = body.get("title")
    if not isinstance(title, str):
        raise queries.BadParam("title must be a string (empty clears it)")
    new = await actions.rename(dashboard_of(request), request.match_info["id"], title)
    return web.json_response({"id": request.match_info["id"], "title": new})


async def delete_session(request: web.Request) -> web.Response:
    await actions.delete(dashboard_of(request), request.match_info["id"])
    return web.json_response({"deleted": request.match_info["id"]})


async def export_session(request: web.Request) -> web.StreamResponse:
    return await _export(request, [request.match_info["id"]])


async def export_all(request: web.Request) -> web.StreamResponse:
    platform = request.query.get("platform") or None
    if platform is not None and platform not in queries.PLATFORMS:
        raise queries.BadParam(f"platform must be one of {', '.join(queries.PLATFORMS)}")
    return await _export(request, None, platform)


async def _export(
    request: web.Request, ids: list[str] | None, source: str | None = None
) -> web.StreamResponse:
    d = dashboard_of(request)
    if ids is not None and await d.db.get_session(ids[0]) is None:
        raise SessionNotFound(ids[0])
    name = f"{ids[0]}.jsonl" if ids else "switchboard-export.jsonl"
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/x-ndjson; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{name}"',
        }
    )
    from gateway.web.auth import add_security_headers

    add_security_headers(response)  # headers go out with prepare(), before the guard sees it
    await response.prepare(request)
    async for rec in d.db.export_all(source, session_ids=ids):
        await response.write((json.dumps(rec, ensure_ascii=False) + "\n").encode())
    await response.write_eof()
    return response


async def _body_chunks(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_chunked(64 * 1024):
        yield chunk


async def import_sessions(request: web.Request) -> web.Response:
    report = await queries.import_stream(dashboard_of(request), _body_chunks(request))
    return web.json_response(report)


async def prune(request: web.Request) -> web.Response:
    body = await _json_body(request)
    days = body.get("older_than_days")
    if not isinstance(days, (int, float)) or isinstance(days, bool) or days < 1:
        raise queries.BadParam("older_than_days must be a number of at least 1")
    platform = body.get("platform")
    if platform is not None and platform not in queries.PLATFORMS:
        raise queries.BadParam(f"platform must be one of {', '.join(queries.PLATFORMS)}")
    return web.json_response(
        await actions.prune(
            dashboard_of(request), float(days), platform, body.get("dry_run") is True
        )
    )


async def delete_empty(request: web.Request) -> web.Response:
    body = await _json_body(request)
    return web.json_response(
        await actions.delete_empty(dashboard_of(request), body.get("dry_run") is True)
    )


async def search(request: web.Request) -> web.Response:
    return web.json_response(await queries.search(dashboard_of(request), request.query))


async def insights(request: web.Request) -> web.Response:
    return web.json_response(await queries.insights(dashboard_of(request), request.query))


async def health(request: web.Request) -> web.Response:
    d = dashboard_of(request)
    return web.json_response(d.health() if d.health else {"status": "ok"})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


ROUTES: list[tuple[str, str, ApiHandler]] = [
    ("GET", "/sessions", list_sessions),
    ("GET", "/sessions/{id}", get_session),
    ("DELETE", "/sessions/{id}", delete_session),
    ("POST", "/sessions/{id}/title", rename_session),
    ("GET", "/sessions/{id}/export", export_session),
    ("GET", "/export", export_all),
    ("POST", "/import", import_sessions),
    ("POST", "/prune", prune),
    ("POST", "/empty-sessions", delete_empty),
    ("GET", "/search", search),
    ("GET", "/insights", insights),
    ("GET", "/health", health),
    ("GET", "/openapi.json", openapi),
]


def register(router: web.UrlDispatcher) -> None:
    for method, path, handler in ROUTES:
        router.add_route(method, path, _errors(handler))
