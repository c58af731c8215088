"""The web dashboard: HTML pages under /ui and a JSON API under /api, served by the api
adapter's aiohttp server. Everything it shows comes from the `Store` (state.api); it
writes through the same store methods the CLI uses."""

from __future__ import annotations

from gateway.web.app import Dashboard, DashboardSettings

__all__ = ["Dashboard", "DashboardSettings"]
