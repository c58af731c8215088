"""Adapters keep their place in a platform's stream in the store (gateway.wiring.StoreCursors):
a position written before a restart is read after it, per platform."""

from __future__ import annotations

from pathlib import Path

from gateway.wiring import StoreCursors
from state import open_store


async def test_cursor_survives_reopen_and_is_per_platform(tmp_path: Path) -> None:
    db = await open_store({"backend": "sqlite"}, tmp_path)
    try:
        matrix, email = StoreCursors(db, "matrix"), StoreCursors(db, "email")
        assert await matrix.get("since") is None
        await matrix.set("since", "s72594_4483_1934")
        await email.set("since", "uid:17")
        await matrix.set("since", "s72595_4484_1935")  # a later position replaces the first
    finally:
        await db.close()
    db = await open_store({"backend": "sqlite"}, tmp_path)
    try:
        assert await StoreCursors(db, "matrix").get("since") == "s72595_4484_1935"
        assert await StoreCursors(db, "email").get("since") == "uid:17"
    finally:
        await db.close()
