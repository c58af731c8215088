"""The dashboard's shared state as its handlers see it (`DashboardState`), and how a
handler finds it from its request. The pages, the JSON API and the guard that serves
them are built on it in gateway.web.app; this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gateway.web import auth
from gateway.web.ratelimit import FailureLimiter
from state import Store


@dataclass(frozen=True)
class DashboardSettings:
    """`key` None: no sign-in (allowed on loopback only). Prices: USD per million tokens
    (input, output) by model name."""

    key: str | None = None
    session_hours: float = 12.0
    secure_cookie: bool = False
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)


class DashboardState:
    """Shared state of the dashboard's sub-apps: the store, settings, browser sessions."""

    def __init__(
        self,
        db: Store,
        settings: DashboardSettings,
        *,
        health: Callable[[], dict[str, Any]] | None = None,
        live_ids: Callable[[], set[str]] = set,
        is_live: Callable[[str], bool] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.health = health
        self.live_ids = live_ids  # sessions bound to a chat in the index: never deleted
        self.is_live = is_live or (lambda sid: sid in live_ids())
        self.sessions = auth.Sessions(settings.session_hours * 3600)
        self.sign_in_limiter = FailureLimiter()  # 10 wrong keys per 5 minutes per address


DASHBOARD = web.AppKey("dashboard", DashboardState)


def dashboard_of(request: web.Request) -> DashboardState:
    return request.app[DASHBOARD]
