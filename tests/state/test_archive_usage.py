"""Archive, bulk delete, per-model usage and workspace in the async store (shared with the
Hermes facade)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from state import SessionDB, SessionNotFound
from state.hermes.compat import SessionDB as SyncSessionDB


async def test_archive_covers_the_compression_chain_and_hides_it_from_listings(
    db: SessionDB,
) -> None:
    root = await db.create_session("root", "telegram")
    await db.end_session(root, "compression")
    tip = await db.create_session("tip", "telegram", parent_session_id=root)
    other = await db.create_session("other", "telegram")
    assert await db.set_session_archived(tip) is True
    for sid in (root, tip):
        assert (await db.require_session(sid))["archived"] == 1
    assert (await db.require_session(other))["archived"] == 0
    assert {r["id"] for r in await db.list_sessions()} == {other}
    assert await db.set_session_archived(tip, False) is True
    assert await db.set_session_archived("missing") is False


async def test_bulk_delete_takes_delegates_along_and_orphans_other_children(
    db: SessionDB,
) -> None:
    parent = await db.create_session("p", "cli")
    await db.create_session("sub", "cli", model_config={"_delegate_from": parent})
    await db.create_session("kid", "cli", parent_session_id=parent)
    await db.append_message(parent, "user", "hello")
    deleted = await db.delete_sessions([parent, parent, "", "missing"])
    assert sorted(deleted) == ["p", "sub"]
    kid = await db.require_session("kid")
    assert kid["parent_session_id"] is None
    ended = await db.create_session("empty", "cli")
    await db.end_session(ended, "idle")
    assert await db.delete_empty_sessions() == 1
    assert await db.get_session("kid") is not None  # live, so not "empty"


async def test_per_model_usage_and_workspace(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    sync = SyncSessionDB(path)
    sync.create_session("s", "cli", model="small")
    sync.update_token_counts(
        "s", input_tokens=10, output_tokens=5, billing_provider="p1", api_call_count=1
    )
    sync.update_session_model("s", "big")
    sync.update_token_counts(
        "s",
        input_tokens=100,
        output_tokens=50,
        model="big",
        billing_provider="p1",
        api_call_count=1,
    )
    sync.close()
    db = await SessionDB.open(path)
    try:
        rows = await db.model_usage("s")
        assert [(r["model"], r["input_tokens"], r["api_call_count"]) for r in rows] == [
            ("big", 100, 1),
            ("small", 10, 1),
        ]
        session = await db.require_session("s")
        assert (session["input_tokens"], session["api_call_count"]) == (110, 2)
        await db.update_session_cwd("s", "/work/repo", git_branch="main", git_repo_root=" ")
        await db.update_session_cwd("s", "/work/repo/sub", git_branch="")
        row = await db.require_session("s")
        assert (row["cwd"], row["git_branch"], row["git_repo_root"]) == (
            "/work/repo/sub",
            "main",
            None,
        )
        assert json.loads(json.dumps(rows))  # plain values
    finally:
        await db.close()


async def test_the_async_store_records_per_model_usage_like_the_facade(tmp_path: Path) -> None:
    """update_token_counts and a turn's token counts (append_messages) on the async store
    fill session_model_usage by the same rules as the facade: route, first accounted
    fallback, absolute updates adding no row, unknown sessions refused."""
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        sid = await db.create_session("telegram", model="small")
        await db.update_token_counts(
            sid, input_tokens=10, output_tokens=5, billing_provider="p1", api_call_count=1
        )
        await db.update_token_counts(
            sid,
            input_tokens=100,
            model="big",
            billing_provider="p2",
            api_call_count=2,
            estimated_cost_usd=0.25,
        )
        await db.update_token_counts(sid, input_tokens=7, absolute=True)  # totals only
        await db.append_messages(
            sid, [{"role": "assistant", "content": "hi"}], input_tokens=3, output_tokens=4
        )
        rows = {(r["model"], r["billing_provider"]): r for r in await db.model_usage(sid)}
        assert set(rows) == {("small", "p1"), ("big", "p2")}
        assert (rows["small", "p1"]["input_tokens"], rows["small", "p1"]["output_tokens"]) == (
            13,
            9,
        )
        assert rows["big", "p2"]["api_call_count"] == 2
        assert rows["big", "p2"]["estimated_cost_usd"] == 0.25
        session = await db.require_session(sid)
        assert (session["input_tokens"], session["output_tokens"]) == (10, 4)
        assert (session["model"], session["billing_provider"]) == ("small", "p1")
        try:
            await db.update_token_counts("no-such-session", input_tokens=1)
        except SessionNotFound:
            pass
        else:
            raise AssertionError("an unknown session must be refused")
        assert await db.model_usage("no-such-session") == []
    finally:
        await db.close()


async def test_batched_turn_tokens_account_like_one_call_at_a_time(tmp_path: Path) -> None:
    """Appends that reach the writer together (the batched path) leave the same session
    totals and usage rows as the same appends made one at a time."""
    results = []
    for mode in ("one", "batched"):
        db = await SessionDB.open(tmp_path / f"{mode}.db")
        try:
            plain = await db.create_session("plain", "telegram")
            routed = await db.create_session("routed", "telegram", model="m1")
            await db.update_token_counts(
                routed, input_tokens=1, billing_provider="p", api_call_count=1
            )
            calls = [
                (sid, [{"role": "assistant", "content": f"r{i}"}], i + 1, 2 * i)
                for i, sid in enumerate([plain, routed, plain, routed, plain])
            ]
            if mode == "one":
                for sid, batch, tin, tout in calls:
                    await db.append_messages(sid, batch, input_tokens=tin, output_tokens=tout)
            else:
                await asyncio.gather(
                    *(
                        db.append_messages(sid, batch, input_tokens=tin, output_tokens=tout)
                        for sid, batch, tin, tout in calls
                    )
                )
                assert db.write_stats().batches < len(calls) + 3  # they did share commits
            state = []
            for sid in (plain, routed):
                row = await db.require_session(sid)
                usage = sorted(
                    (r["model"], r["billing_provider"], r["input_tokens"], r["output_tokens"])
                    for r in await db.model_usage(sid)
                )
                state.append(
                    (
                        row["input_tokens"],
                        row["output_tokens"],
                        row["api_call_count"],
                        row["estimated_cost_usd"],
                        usage,
                    )
                )
            results.append(state)
        finally:
            await db.close()
    assert results[0] == results[1]
    assert results[0][0][4] == [("unknown", "", 9, 12)]  # 1+3+5 in, 0+4+8 out
    assert results[0][1][4] == [("m1", "p", 1 + 2 + 4, 2 + 6)]
