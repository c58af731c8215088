"""Sign-in, cookie sessions, CSRF and security headers for the dashboard.

Browsers sign in once with the configured key and then carry an HttpOnly, SameSite=Strict
cookie naming a server-side session; every mutating request from a cookie session must
also carry that session's CSRF token and come from our own origin. API clients may instead
send `Authorization: Bearer <key>` (browsers never add that header on their own, so no CSRF
token is needed then). Without a key (loopback only) the Host header must name loopback,
which stops a DNS-rebinding page from reaching the dashboard.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

COOKIE = "switchboard_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class WebSession:
    id: str
    csrf: str
    expires: float


class Sessions:
    """Signed-in browsers, in memory (a restart signs everyone out)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._by_id: dict[str, WebSession] = {}

    def create(self) -> WebSession:
        now = self._clock()
        for sid in [k for k, v in self._by_id.items() if v.expires <= now]:
            del self._by_id[sid]
        s = WebSession(secrets.token_urlsafe(32), secrets.token_urlsafe(32), now + self.ttl_s)
        self._by_id[s.id] = s
        return s

    def get(self, sid: str | None) -> WebSession | None:
        s = self._by_id.get(sid or "")
        if s is None or s.expires <= self._clock():
            return None
        return s

    def drop(self, sid: str | None) -> None:
        self._by_id.pop(sid or "", None)


# request storage for the signed-in browser session (RequestKey where aiohttp has it)
WEB_SESSION: Any = (
    web.RequestKey("web_session", WebSession) if hasattr(web, "RequestKey") else "web_session"
)


def session_of(request: web.Request) -> WebSession | None:
    value = request.get(WEB_SESSION)
    return value if isinstance(value, WebSession) else None


def key_matches(given: str, key: str | None) -> bool:
    return key is not None and hmac.compare_digest(given.encode(), key.encode())


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else ""


def same_origin(request: web.Request) -> bool:
    """Origin (or, lacking it, Referer) names the host this request was sent to."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if not origin or origin == "null":
        return False
    return urlsplit(origin).netloc.lower() == request.host.lower()


def host_is_loopback(request: web.Request) -> bool:
    host = request.host.lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name in LOOPBACK_HOSTS


def set_cookie(response: web.StreamResponse, s: WebSession, secure: bool) -> None:
    response.set_cookie(
        COOKIE, s.id, max_age=None, path="/", httponly=True, samesite="Strict", secure=secure
    )


def add_security_headers(response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
