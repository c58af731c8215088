"""The store queries behind the dashboard: keyset paging with ties, the lineage
tree of rows written by other programs, empty sessions, insights period edges. The tests
taking `store` run on both backends; those taking `db` check SQLite's tallies and plans."""

from __future__ import annotations

import sqlite3

from state import SessionDB, Store
from state.sqlite.keyset import PageQuery


async def test_keyset_pages_visit_tied_rows_once(store: Store) -> None:
    db = store
    for i in range(7):
        await db.create_session(f"20250101_000000_0000000{i}", "telegram", started_at=1000.0)
    for sort in ("active", "started"):
        for descending in (True, False):
            seen: list[str] = []
            cursor = None
            while True:
                rows, cursor = await db.session_page(
                    PageQuery(sort=sort, descending=descending, limit=2, after=cursor)
                )
                seen += [r["id"] for r in rows]
                if cursor is None:
                    break
            assert sorted(seen) == [f"20250101_000000_0000000{i}" for i in range(7)]
            assert len(set(seen)) == 7
            assert seen == sorted(seen, reverse=descending)


async def test_lineage_tree_reads_foreign_children_by_their_parents_end_reason(
    store: Store,
) -> None:
    db = store
    root = await db.create_session("r", "cli", started_at=1.0)
    await db.end_session(root, "compression", now=2.0)
    await db.create_session("c", "cli", parent_session_id=root, started_at=3.0)  # no child_kind
    await db.create_session(
        "x", "cli", parent_session_id="c", child_kind="delegate", started_at=4.0
    )
    tree = await db.lineage_tree("x")
    assert tree is not None and tree["id"] == "r"
    child = tree["children"][0]
    assert (child["id"], child["child_kind"]) == ("c", "compression")
    assert [(n["id"], n["child_kind"]) for n in child["children"]] == [("x", "delegate")]
    assert await db.lineage_tree("missing") is None


async def test_empty_sessions_are_ended_ones_without_messages_and_spare_protected(
    store: Store,
) -> None:
    db = store
    for sid in ("a", "b", "live"):
        await db.create_session(sid, "cli", started_at=1.0)
    await db.append_message("b", "user", "hi")
    for sid in ("a", "b"):
        await db.end_session(sid, "idle")
    await db.create_session("kept", "cli", started_at=1.0)
    await db.end_session("kept", "idle")
    assert await db.count_empty_sessions() == 2
    assert await db.delete_empty_sessions(protected={"kept"}) == 1
    assert [await db.get_session(s) is None for s in ("a", "b", "live", "kept")] == [
        True,
        False,
        False,
        False,
    ]


async def test_insights_period_edges(db: SessionDB, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sid = await db.create_session("s", "slack", started_at=50.0)
    await db.append_message(sid, "user", "before", timestamp=99.0)
    await db.append_message(sid, "user", "inside", timestamp=100.0)
    await db.append_message(sid, "user", "at the end", timestamp=200.0)
    out = await db.insights(100.0, 200.0)
    assert out["messages"] == 1
    # last_active trails the newest message by up to a second: still found
    await db.close()
    conn = sqlite3.connect(tmp_path / "state.db")
    conn.execute("UPDATE sessions SET last_active = 199.5")
    conn.commit()
    conn.close()
    again = await SessionDB.open(tmp_path / "state.db")
    try:
        assert (await again.insights(200.0, 300.0))["messages"] == 1
        assert (await again.insights(0.0, 300.0, "telegram"))["messages"] == 0
    finally:
        await again.close()


async def test_insights_count_only_the_periods_messages_whatever_their_order(
    store: Store,
) -> None:
    db = store
    old = await db.create_session("old", "cli", started_at=50.0)
    await db.append_message(old, "user", "a", timestamp=60.0)
    new = await db.create_session("new", "api", started_at=120.0)
    await db.append_message(new, "user", "b", timestamp=90.0)  # stamped before its session
    await db.append_message(old, "user", "c", timestamp=150.0)
    await db.append_message(new, "tool", "d", tool_name="t", timestamp=130.0)
    await db.append_message(new, "user", "e", timestamp=250.0)
    out = await db.insights(100.0, 200.0)
    assert out["messages"] == 2
    assert out["top_tools"] == [{"tool": "t", "calls": 1}]
    assert (await db.insights(100.0, 200.0, "cli"))["messages"] == 1
    assert (await db.insights(0.0, 100.0, "cli"))["messages"] == 1


async def test_chat_type_filter_walks_an_index_in_either_sort(db: SessionDB, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from state.sqlite import keyset

    await db.create_session("g", "telegram", chat_id="1", chat_type="group", started_at=5.0)
    for i in range(20):
        await db.create_session(f"d{i}", "telegram", chat_id="2", chat_type="dm", started_at=i)
    conn = sqlite3.connect(tmp_path / "state.db")
    try:
        for sort in ("active", "started"):
            seen: list[str] = []
            conn.set_trace_callback(seen.append)
            rows, _ = keyset.page(conn, PageQuery(chat_type="group", sort=sort))
            conn.set_trace_callback(None)
            assert [r["id"] for r in rows] == ["g"]
            sql = next(q for q in seen if "FROM sessions" in q)
            plan = " ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql))
            assert f"idx_sessions_chat_type_{sort}" in plan, plan
    finally:
        conn.close()
