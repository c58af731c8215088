"""Choosing the store: `state.backend` in config, `open_store`, and what only SQLite offers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from state import Maintenance, SessionDB, UnknownBackend, open_store


async def test_open_store_opens_state_db_in_the_home_with_the_writer_settings(
    tmp_path: Path,
) -> None:
    store = await open_store(
        {"backend": "sqlite", "synchronous": "FULL", "queue_size": 50}, tmp_path
    )
    try:
        assert isinstance(store, SessionDB) and store.path == tmp_path / "state.db"
        assert (store.writer.config.synchronous, store.writer.config.queue_size) == ("FULL", 50)
        assert store.backend == "sqlite"
    finally:
        await store.close()


async def test_an_unknown_backend_is_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(UnknownBackend) as err:
        await open_store({"backend": "mongodb"}, tmp_path)
    assert err.value.key == "state.backend" and err.value.exit_code == 78
    assert "state.backend" in str(err.value) and "sqlite, postgres" in str(err.value)
    assert not (tmp_path / "state.db").exists()


def test_the_config_refuses_an_unknown_backend_and_defaults_to_sqlite(tmp_path: Path) -> None:
    assert load_config(None, {}).get("state.backend") == "sqlite"
    path = tmp_path / "config.yaml"
    path.write_text("state:\n  backend: mongodb\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert err.value.key == "state.backend" and err.value.exit_code == 78


def test_check_config_exits_78_naming_state_backend(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: mongodb\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78
    assert "state.backend" in proc.stderr and "Traceback" not in proc.stderr


async def test_the_sqlite_store_offers_maintenance(db: SessionDB) -> None:
    """Checkpoint, VACUUM and the FTS5 checks are the `Maintenance` capability: SQLite has
    it; a backend without it is told apart by the same isinstance check."""
    assert isinstance(db, Maintenance)
    assert not isinstance(object(), Maintenance)
    sid = await db.create_session(source="api")
    await db.append_message(sid, "user", "hello maintenance")
    assert await db.integrity_check() == [] and await db.check_search_index() == []
    await db.optimize_search_index()
    assert await db.rebuild_search_index() >= 0
    busy, frames, copied = await db.checkpoint("TRUNCATE")
    assert busy == 0 and frames == copied == 0
    with pytest.raises(ValueError):
        await db.checkpoint("PASSIVE); DROP TABLE sessions; --")
    assert [h["session_id"] for h in await db.search_messages("maintenance")] == [sid]


async def test_sqlite_tolerates_two_live_sessions_of_one_key_and_names_the_newest(
    db: SessionDB,
) -> None:
    """Another program sharing state.db (Hermes Agent, an import) may leave two live
    sessions under one key; SQLite keeps them and the index takes the newest. (PostgreSQL
    refuses the second by a constraint: tests/state/test_pg_store.py.)"""
    old = await db.create_session(source="telegram", session_key="k1", started_at=10.0)
    new = await db.create_session(source="telegram", session_key="k1", started_at=20.0)
    assert await db.newest_live_session_by_key() == {"k1": new}
    assert [r["id"] for r in await db.live_sessions_by_key()] == [old, new]
    assert (await db.live_session_for_key("k1"))["id"] == new  # type: ignore[index]
