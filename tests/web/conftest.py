from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.adapters.api import ApiAdapter
from gateway.web import Dashboard, DashboardSettings
from state import SessionDB, Store
from tests.web_seed import Seeded, seed

KEY = "s3cret-dashboard-key"


@dataclass
class Site:
    db: Store
    seeded: Seeded
    base: str
    dashboard: Dashboard
    live: set[str]


async def start_site(
    tmp_path: Path,
    key: str | None = KEY,
    live: set[str] | None = None,
    *,
    store: Store | None = None,
    **settings: object,
) -> tuple[Site, TestServer]:
    """The dashboard on the real api adapter over a seeded store (a SQLite file under
    `tmp_path` unless `store` is given)."""
    db = store or await SessionDB.open(tmp_path / "state.db")
    seeded = await seed(db, time.time())
    live_ids = live if live is not None else set()
    dash = Dashboard(
        db,
        DashboardSettings(key=key, prices={"gpt-4o-mini": (0.15, 0.6)}, **settings),  # type: ignore[arg-type]
        health=lambda: {
            "status": "ok",
            "adapters": {"api": {"state": "running"}},
            "writer_queue_depth": 0,
            "sessions": 1,
            "turns_in_flight": 0,
            "last_error": None,
            "uptime_seconds": 1.0,
        },
        live_ids=lambda: set(live_ids),
    )
    # the real api adapter's app, so mounting and its own bearer check are exercised too
    adapter = ApiAdapter(key=key, subapps=dash.subapps())
    server = TestServer(adapter.app(), host="127.0.0.1")
    await server.start_server()
    return Site(db, seeded, f"http://127.0.0.1:{server.port}", dash, live_ids), server


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    s, server = await start_site(tmp_path)
    try:
        yield s
    finally:
        await server.close()
        await s.db.close()


async def sign_in(http: aiohttp.ClientSession, base: str, key: str = KEY) -> str:
    """Sign in through the form; returns the CSRF token from the next page."""
    async with http.post(
        f"{base}/ui/login", data={"key": key, "next": "/ui/ops"}, headers={"Origin": base}
    ) as resp:
        assert resp.status == 200, await resp.text()
        page = await resp.text()
    marker = 'name="csrf" value="'
    start = page.index(marker) + len(marker)
    return page[start : page.index('"', start)]
