"""The mautrix HTTP client the Matrix adapter uses, and the one place its errors become the
gateway's: M_LIMIT_EXCEEDED -> RetryAfter (with the server's `retry_after_ms`, which mautrix
itself drops), M_UNKNOWN_TOKEN / 401 -> InvalidToken, network trouble and 5xx ->
TransientError. Also the raw JSON requests the adapter makes beside ClientAPI's typed ones.
Imported only when the adapter starts or checks a token.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp
from mautrix.api import HTTPAPI, Method, Path
from mautrix.errors import MatrixConnectionError, MatrixRequestError, make_request_error

from gateway.adapters.base import send_by_trace
from gateway.errors import AdapterError, InvalidToken, RetryAfter, TransientError

T = TypeVar("T")
DEFAULT_RETRY_AFTER_S = 5.0  # a 429 that names no wait
TOKEN_ERRORS = frozenset({"M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"})


class RateAwareHTTPAPI(HTTPAPI):
    """mautrix's HTTPAPI, but an error keeps how long the server asked us to wait
    (`retry_after_ms` in the body, or a Retry-After header) as `retry_after_s`."""

    async def _send(
        self, method: Any, url: Any, content: Any, query_params: Any, headers: Any
    ) -> tuple[Any, aiohttp.ClientResponse]:
        async with self.session.request(
            str(method), url, data=content, params=query_params, headers=headers
        ) as response:
            if 200 <= response.status < 300:
                return await response.json(content_type=None), response
            text = await response.text()
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            data = data if isinstance(data, dict) else {}
            errcode, message = data.get("errcode"), data.get("error")
            exc = make_request_error(
                http_status=response.status,
                text=text,
                errcode=errcode if isinstance(errcode, str) else None,
                message=message if isinstance(message, str) else None,
            )
            # our own attribute on mautrix's error (its class declares none): mapped() reads it
            exc.retry_after_s = _retry_after(data, response.headers)  # type: ignore[attr-defined]
            raise exc


def _retry_after(data: dict[str, Any], headers: Any) -> float | None:
    ms = data.get("retry_after_ms")
    if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
        return ms / 1000
    header = headers.get("Retry-After")
    try:
        return float(header) if header is not None else None
    except ValueError:
        return None


def new_api(base_url: str, token: str, read_timeout_s: float) -> RateAwareHTTPAPI:
    """An HTTPAPI on its own aiohttp session; close it with `api.session.close()`."""
    timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=read_timeout_s)
    # every request checks SEND_BY when it has its connection: a reply that set out late
    # (the process stood still) stops there unsent (SetOutLate, passed through untouched);
    # sync and typing run in their own tasks, where SEND_BY is not set
    session = aiohttp.ClientSession(
        timeout=timeout, headers={"User-Agent": "switchboard"}, trace_configs=[send_by_trace()]
    )
    return RateAwareHTTPAPI(base_url, token, client_session=session, default_retry_count=0)


def errcode(exc: BaseException) -> str | None:
    code = getattr(exc, "errcode", None)
    return code if isinstance(code, str) else None


def as_gateway_error(exc: BaseException) -> BaseException:
    """The gateway's error for a failed mautrix call (the exception itself when it is a
    refusal that retrying cannot fix, such as M_FORBIDDEN)."""
    if isinstance(exc, MatrixRequestError):
        status = getattr(exc, "http_status", 0)
        code = errcode(exc)
        if code == "M_LIMIT_EXCEEDED" or status == 429:
            wait = getattr(exc, "retry_after_s", None)
            return RetryAfter(DEFAULT_RETRY_AFTER_S if wait is None else wait)
        if code in TOKEN_ERRORS or status == 401:
            return InvalidToken(
                f"{code or 'HTTP 401'}: {getattr(exc, 'message', '') or ''}".strip()
            )
        if status >= 500 or status == 0:
            return TransientError(f"homeserver answered {status}")
        return exc
    if isinstance(exc, (MatrixConnectionError, aiohttp.ClientError, OSError, asyncio.TimeoutError)):
        return TransientError(f"{type(exc).__name__}: {exc}")
    return exc


async def mapped(call: Callable[[], Awaitable[T]]) -> T:
    """Run a mautrix call, raising the gateway's errors."""
    try:
        return await call()
    except (
        TimeoutError,
        MatrixRequestError,
        MatrixConnectionError,
        aiohttp.ClientError,
        OSError,
    ) as exc:
        converted = as_gateway_error(exc)
        if converted is exc:
            raise
        raise converted from exc


GAP_PAGES, GAP_PAGE_SIZE = 50, 100  # at most 5,000 missed events a room are paged back


async def joined_members(client: Any, room_id: str) -> Mapping[str, Any]:
    """GET /rooms/{id}/joined_members as JSON; M_FORBIDDEN and such as AdapterError."""
    try:
        body = await mapped(
            lambda: client.api.request(Method.GET, Path.v3.rooms[room_id].joined_members)
        )
    except MatrixRequestError as exc:
        raise AdapterError(errcode(exc) or f"HTTP {getattr(exc, 'http_status', '?')}") from exc
    return body if isinstance(body, Mapping) else {}


async def event_sender(client: Any, room_id: str, event_id: str) -> str | None:
    """Who sent an event; None when it cannot be seen (not found, not allowed)."""
    try:
        ev = await mapped(
            lambda: client.api.request(Method.GET, Path.v3.rooms[room_id].event[event_id])
        )
    except MatrixRequestError:
        return None
    sender = ev.get("sender") if isinstance(ev, Mapping) else None
    return sender if isinstance(sender, str) else None


async def events_between(
    client: Any, room_id: str, start: str, stop: str
) -> tuple[list[Any], bool]:
    """The room's events from `stop` up to `start` (backwards pagination with /messages),
    oldest first, and whether all of them fit in GAP_PAGES pages."""
    found: list[Any] = []
    token = start
    for _page in range(GAP_PAGES):
        query = {"dir": "b", "from": token, "to": stop, "limit": str(GAP_PAGE_SIZE)}
        page = await mapped(
            functools.partial(
                client.api.request, Method.GET, Path.v3.rooms[room_id].messages, query_params=query
            )
        )
        chunk = page.get("chunk") if isinstance(page, Mapping) else None
        chunk = chunk if isinstance(chunk, list) else []
        found.extend(chunk)
        end = page.get("end") if isinstance(page, Mapping) else None
        if not chunk or not isinstance(end, str) or end == token:
            return found[::-1], True
        token = end
    return found[::-1], False
