"""signal-cli's HTTP daemon on the wire: JSON-RPC 2.0 calls to `POST /api/v1/rpc`, the
server-sent events of `GET /api/v1/events`, and signal-cli's error codes mapped onto the
gateway's errors (a rate limit is a RetryAfter, an I/O or network failure is transient).
It knows nothing of messages or sessions; the Signal adapter builds on it.
"""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gateway.adapters.base import send_by_trace
from gateway.errors import AdapterError, InvalidToken, RetryAfter, TransientError

RPC_PATH = "/api/v1/rpc"
EVENTS_PATH = "/api/v1/events"
# signal-cli's own error codes (SignalJsonRpcCommandHandler), beside JSON-RPC's -326xx
USER_ERROR, IO_ERROR, UNTRUSTED_KEY_ERROR, RATELIMIT_ERROR = -1, -3, -4, -5
METHOD_NOT_FOUND = -32601
RATE_LIMIT_DEFAULT_S = 10.0  # when signal-cli names no wait (its RateLimitException had none)


class SignalCliError(AdapterError):
    """signal-cli answered a call with a JSON-RPC error that retrying will not fix."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"signal-cli error {code}: {message}")
        self.code = code


def rpc_error(error: Mapping[str, Any]) -> AdapterError:
    """The gateway error for a JSON-RPC `error` object from signal-cli. A send's per-
    recipient results come in `data.response.results`: a rate limit names its wait in
    `retryAfterSeconds`, a network failure is worth retrying."""
    code = given if isinstance(given := error.get("code"), int) else 0
    message = str(error.get("message") or "")
    data = found if isinstance(found := error.get("data"), Mapping) else {}
    response = inner if isinstance(inner := data.get("response"), Mapping) else {}
    results = [r for r in response.get("results") or [] if isinstance(r, Mapping)]
    types = {r.get("type") for r in results}
    if code == RATELIMIT_ERROR or (results and types == {"RATE_LIMIT_FAILURE"}):
        waits = [r.get("retryAfterSeconds") for r in results]
        seconds = max((float(w) for w in waits if isinstance(w, (int, float))), default=0.0)
        return RetryAfter(seconds or RATE_LIMIT_DEFAULT_S)
    if code == IO_ERROR or (results and types == {"NETWORK_FAILURE"}):
        return TransientError(f"signal-cli could not reach Signal: {message}")
    return SignalCliError(code, message)


@dataclass
class SseEvent:
    id: str | None
    event: str
    data: str


@dataclass
class SseParser:
    """Server-sent events from the bytes as they arrive (split anywhere, even inside a
    UTF-8 character): `id:`, `event:` and `data:` fields, `:` keep-alive comments, a blank
    line ends an event. signal-cli names its events `receive`, one JSON object per `data:`."""

    _buf: str = ""
    _id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _utf8: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buf += self._utf8.decode(chunk)
        out: list[SseEvent] = []
        while True:
            cut = self._buf.find("\n")
            if cut < 0:
                return out
            line, self._buf = self._buf[:cut].rstrip("\r"), self._buf[cut + 1 :]
            event = self._line(line)
            if event is not None:
                out.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            if not self._data:
                self._event = ""
                return None
            event = SseEvent(self._id, self._event or "message", "\n".join(self._data))
            self._data, self._event = [], ""
            return event
        if line.startswith(":"):
            return None  # a keep-alive
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value  # kept for the events after it, as the spec says
        return None


class SignalRpc:
    """JSON-RPC calls to one signal-cli daemon for one account, over an aiohttp session
    the caller opens and closes. Every call names the account, so a multi-account daemon
    (`signal-cli daemon --http`, no `-a`) serves the right one and a single-account daemon
    ignores it."""

    def __init__(self, url: str, account: str, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.account = account
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._ids = itertools.count(1)
        self.http: Any = None

    async def open(self, timeout_s: float = 30.0) -> None:
        import aiohttp

        if self.http is None:
            self.http = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                trace_configs=[send_by_trace()],  # a reply that set out late stops here
            )

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    def events_url(self) -> str:
        return f"{self.url}{EVENTS_PATH}?account={quote(self.account, safe='')}"

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """The call's `result`; raises TransientError when the daemon cannot be reached
        or fails, RetryAfter when Signal rate limits, SignalCliError otherwise; SetOutLate
        (not caught here) when a send's request would leave past its SEND_BY."""
        import aiohttp

        if self.http is None:
            raise TransientError("the signal-cli client is closed")
        body = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": method,
            "params": {"account": self.account, **(params or {})},
        }
        try:
            async with self.http.post(f"{self.url}{RPC_PATH}", json=body) as resp:
                if resp.status in (401, 403):
                    raise InvalidToken(f"{self.url} refused the request (HTTP {resp.status})")
                if resp.status >= 500:
                    raise TransientError(f"signal-cli answered HTTP {resp.status}")
                if resp.status == 201:  # signal-cli's answer to a notification
                    return None
                if resp.status != 200:
                    raise SignalCliError(resp.status, f"HTTP {resp.status} from {self.url}")
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise TransientError(
                f"signal-cli is not reachable at {self.url} ({type(exc).__name__})"
            ) from exc
        if not isinstance(answer, Mapping):
            raise SignalCliError(0, f"not a JSON-RPC answer: {str(answer)[:200]}")
        if isinstance(answer.get("error"), Mapping):
            raise rpc_error(answer["error"])
        return answer.get("result")
