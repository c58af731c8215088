"""python-telegram-bot's HTTP transport on aiohttp instead of httpx.

PTB's default `HTTPXRequest` costs the daemon more than the rest of a turn together: with
the connection pool the Bot API needs under load (tens of keep-alive connections), httpcore
walks every pooled connection on every request and asks each socket whether it is readable
and who its peer is (a `getpeername` system call per connection per request). Under the
soak at 500 messages/s that was about 30 % of the event loop's time (py-spy). aiohttp's
connector hands out an idle connection from a deque, and aiohttp is already the daemon's
HTTP server. PTB documents `BaseRequest` as the extension point for exactly this; the bodies
are the ones `HTTPXRequest` sends (form fields holding JSON-encoded values, multipart when a
file goes up), so the Bot API sees no difference.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import aiohttp
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

from gateway.adapters.base import send_by_trace

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


class AiohttpRequest(BaseRequest):
    """One aiohttp session with at most `pool_size` connections."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 20.0,
        write_timeout: float = 5.0,
        pool_timeout: float = 1.0,
        pool_size: int = 64,
    ) -> None:
        self._connect = connect_timeout
        self._read = read_timeout
        self._write = write_timeout
        self._pool = pool_timeout
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None
        self._timeout = _timeout(connect_timeout, read_timeout, write_timeout, pool_timeout)

    @property
    def read_timeout(self) -> float | None:
        return self._read

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size),
                headers={"User-Agent": self.USER_AGENT},
                # Telegram's errors come back as JSON with their status: PTB reads both
                raise_for_status=False,
                trace_configs=[send_by_trace()],  # a reply that set out late stops here
            )

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("this AiohttpRequest is not initialized")
        if all(map(_default, (read_timeout, write_timeout, connect_timeout, pool_timeout))):
            timeout = self._timeout
        else:
            timeout = _timeout(
                self._connect if _default(connect_timeout) else connect_timeout,
                self._read if _default(read_timeout) else read_timeout,
                self._write if _default(write_timeout) else write_timeout,
                self._pool if _default(pool_timeout) else pool_timeout,
            )
        data, headers = _body(request_data)
        try:
            async with session.request(
                method, url, data=data, headers=headers, timeout=timeout
            ) as response:
                status, body = response.status, await response.read()
        except TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}: {exc}") from exc
        return status, body


def _default(value: Any) -> bool:
    return isinstance(value, type(BaseRequest.DEFAULT_NONE))


def _sum(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _timeout(
    connect: float | None, read: float | None, write: float | None, pool: float | None
) -> aiohttp.ClientTimeout:
    # aiohttp's `connect` covers the wait for a pooled connection and the TCP connect;
    # a body is written within the read budget (aiohttp has no separate write timeout)
    return aiohttp.ClientTimeout(
        total=None, connect=_sum(pool, connect), sock_connect=connect, sock_read=_sum(read, write)
    )


def _body(request_data: RequestData | None) -> tuple[Any, dict[str, str] | None]:
    """What HTTPXRequest sends, and its content type: the parameters as form fields (each
    value JSON-encoded), or a multipart form with the files beside them. The fields are
    encoded here, as aiohttp would encode them, without its FormData per request."""
    if request_data is None:
        return None, None
    fields = request_data.json_parameters
    if not request_data.contains_files:
        return (urlencode(fields).encode(), FORM) if fields else (None, None)
    form = aiohttp.FormData()
    for name, value in fields.items():
        form.add_field(name, value)
    for name, (filename, content, mimetype) in request_data.multipart_data.items():
        form.add_field(name, content, filename=filename, content_type=mimetype)
    return form, None
