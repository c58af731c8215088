"""Export -> import round trip, idempotence, lineage and title conflicts; the compat API."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from state import Store
from state.hermes.compat import SessionDB as SyncSessionDB
from tests.state.conftest import OpenStore


async def _populate(db: Store) -> tuple[str, str, str]:
    root = await db.create_session(source="telegram", title="trip", user_id="u1", chat_id="c1")
    await db.append_messages(
        root,
        [
            {"role": "user", "content": "plan a trip to 京都 🎌"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "t1", "function": {"name": "web_search"}}],
            },
            {"role": "tool", "content": "results", "tool_call_id": "t1", "tool_name": "web_search"},
            {
                "role": "assistant",
                "content": "Here is a plan",
                "reasoning": "thought",
                "reasoning_details": [{"type": "summary", "text": "s"}],
            },
        ],
    )
    await db.update_token_counts(root, input_tokens=42, output_tokens=7)
    child = await db.fork_session(
        root,
        "compression",
        seed_messages=[{"role": "system", "content": "sum"}],
        end_reason="compression",
    )
    other = await db.create_session(source="cli")
    await db.append_message(other, "user", "unrelated")
    return root, child, other


async def test_export_import_round_trip_is_lossless_and_idempotent(
    open_test_store: OpenStore,
) -> None:
    src = await open_test_store("a")
    root, child, other = await _populate(src)
    buf = io.StringIO()
    assert await src.write_jsonl(buf) == 3
    originals = {r["session"]["id"]: r async for r in src.export_all()}
    await src.close()

    lines = [json.loads(line) for line in buf.getvalue().splitlines()]
    dst = await open_test_store("b")
    try:
        # children first: lineage must still be restored
        report = await dst.import_records(list(reversed(lines)))
        assert (report.imported, report.skipped_existing, report.messages) == (3, 0, 6)
        again = await dst.import_records(lines)
        assert (again.imported, again.skipped_existing) == (0, 3)
        for sid, orig in originals.items():
            got = await dst.export_session(sid)
            assert got["session"] == orig["session"]
            strip = lambda ms: [{k: v for k, v in m.items() if k != "id"} for m in ms]  # noqa: E731
            assert strip(got["messages"]) == strip(orig["messages"])
        assert await dst.get_compression_tip(root) == child
        assert await dst.resolve_session_by_title("trip") == child
        assert [h["session_id"] for h in await dst.search_messages("京都")] == [root]
    finally:
        await dst.close()


async def test_import_renames_a_title_already_used_by_another_session(
    open_test_store: OpenStore,
) -> None:
    src = await open_test_store("a")
    sid = await src.create_session(source="api", title="shared name")
    rec = await src.export_session(sid)
    await src.close()
    dst = await open_test_store("b")
    try:
        await dst.create_session(source="api", title="Shared Name")
        report = await dst.import_records([rec])
        assert report.renamed_titles == [("shared name", "shared name (imported)")]
        assert await dst.get_session_title(sid) == "shared name (imported)"
    finally:
        await dst.close()


async def test_import_of_a_child_without_its_parent_orphans_it(open_test_store: OpenStore) -> None:
    src = await open_test_store("a")
    root = await src.create_session(source="api")
    child = await src.fork_session(root, "branch")
    rec = await src.export_session(child)
    await src.close()
    dst = await open_test_store("b")
    try:
        await dst.import_records([rec, {"nonsense": True}])
        assert (await dst.require_session(child))["parent_session_id"] is None
    finally:
        await dst.close()


def test_compat_sync_api_matches_the_documented_names(tmp_path: Path) -> None:
    db = SyncSessionDB(tmp_path / "state.db")
    try:
        sid = db.create_session("20250101_000000_abcdef12", "telegram", model="m")
        assert db.get_session(sid)["model"] == "m"
        assert db.resolve_session_id("20250101_000000_abc") == sid
        assert db.resolve_session_id("nope") is None
        mid = db.append_message(sid, "user", "hello compat world")
        assert mid > 0
        assert db.set_session_title(sid, "compat") is True
        assert db.get_session_title(sid) == "compat"
        assert db.get_next_title_in_lineage("compat") == "compat #2"
        assert db.resolve_session_by_title("compat") == sid
        assert db.sanitize_title("  a\u200b b ") == "a b"
        assert [h["id"] for h in db.search_messages("compat")] == [mid]
        assert db.list_sessions_rich()[0]["id"] == sid
        later = db.create_session("20250101_000001_abcdef13", "cli", parent_session_id=sid)
        assert [s["id"] for s in db.search_sessions()] == [later, sid]  # children too
        assert [s["id"] for s in db.search_sessions("telegram")] == [sid]
        assert [s["id"] for s in db.search_sessions(limit=1, offset=1)] == [sid]
        assert db.search_sessions()[1]["model"] == "m"  # whole rows
        db.delete_session(later)
        assert db.session_count() == 1 and db.message_count() == 1
        assert db.export_session(sid)["messages"][0]["content"] == "hello compat world"
        assert len(db.export_all()) == 1
        db.set_meta("k", "v")
        assert db.get_meta("k") == "v"
        db.update_token_counts(sid, input_tokens=5)
        db.end_session(sid, "user_exit")
        assert db.get_session(sid)["end_reason"] == "user_exit"
        db.reopen_session(sid)
        assert db.get_compression_tip(sid) == sid
        other = db.create_session("20250101_000000_abcdef13", "telegram")
        try:
            db.set_session_title(other, "COMPAT")
            raise AssertionError("a duplicate title must raise")
        except ValueError as exc:
            assert "already in use" in str(exc)
        (turn,) = db.get_messages_as_conversation(sid)
        assert turn == {
            "role": "user",
            "content": "hello compat world",
            "timestamp": turn["timestamp"],
        }
        assert isinstance(turn["timestamp"], float)
        db.clear_messages(sid)
        assert db.delete_session(sid) is True and db.delete_session(sid) is False
        assert db.prune_sessions(1) == 0
        db.vacuum()
    finally:
        db.close()


def test_compat_open_errors_are_sqlite3_errors(tmp_path: Path) -> None:
    import sqlite3

    bad = tmp_path / "state.db"
    bad.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(sqlite3.Error, match="state.db"):
        SyncSessionDB(bad)
    assert bad.read_bytes() == b"this is not a database at all" * 100
