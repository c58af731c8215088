"""Lineage, end reasons, delete and prune rules."""

from __future__ import annotations

import secrets
import time

import pytest

from state import AmbiguousSession, SessionNotFound, Store, ids
from state.sqlite.keyset import PageQuery

DAY = 86400.0


async def test_first_end_wins_and_reopen_clears(store: Store) -> None:
    sid = await store.create_session(source="api")
    assert await store.end_session(sid, "idle") is True
    assert await store.end_session(sid, "daily") is False
    row = await store.require_session(sid)
    assert row["end_reason"] == "idle"
    assert await store.reopen_session(sid) is True
    row = await store.require_session(sid)
    assert row["ended_at"] is None and row["end_reason"] is None
    with pytest.raises(ValueError):
        await store.end_session(sid, "  ")
    # any other reason is kept as written (Hermes Agent records its own, e.g. agent_close)
    assert await store.end_session(sid, "ws_orphan_reap") is True
    assert (await store.require_session(sid))["end_reason"] == "ws_orphan_reap"
    with pytest.raises(SessionNotFound):
        await store.end_session("missing", "idle")


async def test_branch_copies_history_and_compression_tip_follows_compression_only(
    store: Store,
) -> None:
    root = await store.create_session(source="api", title="plan")
    await store.append_messages(
        root, [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    )
    branch = await store.fork_session(root, "branch", copy_messages=True, end_reason="branched")
    assert [m["content"] for m in await store.get_messages(branch)] == ["one", "two"]
    assert await store.get_session_title(branch) == "plan #2"
    assert (await store.require_session(root))["end_reason"] == "branched"
    # compression of the root: tip follows it, never the branch
    await store.reopen_session(root)
    comp = await store.fork_session(
        root,
        "compression",
        seed_messages=[{"role": "system", "content": "summary"}],
        end_reason="compression",
    )
    comp2 = await store.fork_session(comp, "compression", end_reason="compression")
    assert await store.get_compression_tip(root) == comp2
    assert await store.resolve_resume_session_id(root) == comp2
    assert await store.get_compression_tip(branch) == branch
    assert [a["id"] for a in await store.get_ancestors(comp2)] == [comp, root]
    desc = {d["id"]: d["depth"] for d in await store.get_descendants(root)}
    assert desc == {branch: 1, comp: 1, comp2: 2}
    # the default listing folds a compression chain into its live tip
    listed = {r["id"] for r in await store.list_sessions()}
    assert listed == {comp2, branch}
    assert {r["id"] for r in await store.list_sessions(include_children=True)} == {
        root,
        branch,
        comp,
        comp2,
    }
    conv = await store.get_messages_as_conversation(comp, include_ancestors=True)
    assert [m["content"] for m in conv] == ["one", "two", "summary"]


async def test_deleting_a_parent_orphans_its_children(store: Store) -> None:
    root = await store.create_session(source="api")
    await store.append_message(root, "user", "doomed text")
    child = await store.fork_session(root, "compression", end_reason="compression")
    await store.delete_session(root)
    assert await store.get_session(root) is None
    assert (await store.require_session(child))["parent_session_id"] is None
    assert await store.search_messages("doomed") == []
    with pytest.raises(SessionNotFound):
        await store.delete_session(root)


@pytest.mark.parametrize(
    "ended, idle_days, source, older_than, prune_source, pruned",
    [
        (True, 100, "api", 90, None, True),  # ended and old
        (False, 100, "api", 90, None, False),  # live: never pruned
        (True, 10, "api", 90, None, False),  # ended but recent
        (True, 100, "api", 90, "telegram", False),  # other source
        (True, 100, "telegram", 90, "telegram", True),
    ],
)
async def test_prune_rules(
    store: Store,
    ended: bool,
    idle_days: float,
    source: str,
    older_than: float,
    prune_source: str | None,
    pruned: bool,
) -> None:
    now = time.time()
    sid = await store.create_session(source=source, started_at=now - idle_days * DAY)
    await store.append_message(sid, "user", "hi", timestamp=now - idle_days * DAY)
    child = await store.fork_session(sid, "reset", started_at=None)
    if ended:
        await store.end_session(sid, "idle")
    count = await store.prune_sessions(older_than, prune_source, now=now)
    assert count == (1 if pruned else 0)
    assert (await store.get_session(sid) is None) == pruned
    child_row = await store.require_session(child)
    assert (child_row["parent_session_id"] is None) == pruned


async def test_prune_ages_by_last_activity_not_start(store: Store) -> None:
    now = time.time()
    sid = await store.create_session(source="api", started_at=now - 200 * DAY)
    await store.append_message(sid, "user", "recent", timestamp=now - DAY)
    await store.end_session(sid, "idle")
    assert await store.prune_sessions(90, now=now) == 0


@pytest.mark.slow
async def test_large_prune_runs_in_chunks_and_counts_everything(store: Store) -> None:
    now = time.time()
    for _ in range(450):
        sid = await store.create_session(source="api", started_at=now - 100 * DAY)
        await store.end_session(sid, "idle")
    assert await store.prune_sessions(90, now=now) == 450
    assert await store.session_count() == 0


async def test_auto_prune_runs_once_per_interval_and_vacuums_only_when_worth_it(
    store: Store,
) -> None:
    now = time.time()
    for _ in range(30):
        sid = await store.create_session(source="api", started_at=now - 100 * DAY)
        await store.append_message(sid, "user", "x" * 5000, timestamp=now - 100 * DAY)
        await store.end_session(sid, "idle")
    first = await store.maybe_auto_prune_and_vacuum(90, 24, True, now=now, min_vacuum_bytes=1)
    assert first == {"ran": True, "pruned": 30, "vacuumed": True}
    second = await store.maybe_auto_prune_and_vacuum(90, 24, True, now=now + 3600)
    assert second["ran"] is False
    third = await store.maybe_auto_prune_and_vacuum(90, 24, True, now=now + 25 * 3600)
    assert third == {"ran": True, "pruned": 0, "vacuumed": False}
    assert await store.get_meta("switchboard.auto_prune.last_run") == repr(now + 25 * 3600)


async def test_resolve_by_prefix(store: Store) -> None:
    a = await store.create_session("20250305_091523_a1b2c3d4", source="api")
    await store.create_session("20250305_091523_a1b2ffff", source="api")
    assert await store.resolve_session_id(a) == a
    assert await store.resolve_session_id("20250305_091523_a1b2c") == a
    with pytest.raises(AmbiguousSession):
        await store.resolve_session_id("20250305_091523_a1b2")
    with pytest.raises(SessionNotFound):
        await store.resolve_session_id("2024")
    with pytest.raises(SessionNotFound):
        await store.resolve_session_id("%")  # wildcards are literal


async def test_order_within_a_session_ignores_clock_jumps(store: Store) -> None:
    sid = await store.create_session(source="api")
    await store.append_message(sid, "user", "first", timestamp=2_000_000_000)
    await store.append_message(
        sid, "assistant", "second", timestamp=1_000_000_000
    )  # clock went back
    assert [m["content"] for m in await store.get_messages(sid)] == ["first", "second"]


async def test_messages_around_and_counters(store: Store) -> None:
    sid = await store.create_session(source="api")
    ids = await store.append_messages(sid, [{"role": "user", "content": str(i)} for i in range(20)])
    around = await store.get_messages_around(sid, ids[10], 3)
    assert [m["id"] for m in around] == ids[7:14]
    assert [m["id"] for m in await store.get_messages_around(sid, ids[0], 2)] == ids[0:3]
    await store.append_message(sid, "assistant", None, tool_calls=[{"id": "a"}, {"id": "b"}])
    await store.append_message(sid, "tool", "result", tool_call_id="a", tool_name="terminal")
    row = await store.require_session(sid)
    assert row["message_count"] == 22 and row["tool_call_count"] == 2
    assert row["preview"] == "0"
    conv = await store.get_messages_as_conversation(sid)
    assert conv[-2]["tool_calls"] == [{"id": "a"}, {"id": "b"}]
    assert conv[-1] == {
        "role": "tool",
        "content": "result",
        "tool_call_id": "a",
        "name": "terminal",
    }
    assert await store.clear_messages(sid) == 22
    row = await store.require_session(sid)
    assert row["message_count"] == 0 and await store.message_count(sid) == 0


async def test_token_counts_delta_and_absolute(store: Store) -> None:
    sid = await store.create_session(source="api")
    await store.update_token_counts(sid, input_tokens=10, output_tokens=5, estimated_cost_usd=0.01)
    await store.update_token_counts(
        sid, input_tokens=3, reasoning_tokens=2, estimated_cost_usd=0.02
    )
    row = await store.require_session(sid)
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (13, 5, 2)
    assert row["estimated_cost_usd"] == pytest.approx(0.03)
    await store.update_token_counts(sid, input_tokens=100, output_tokens=50, absolute=True)
    row = await store.require_session(sid)
    assert (row["input_tokens"], row["output_tokens"], row["reasoning_tokens"]) == (100, 50, 0)
    with pytest.raises(SessionNotFound):
        await store.update_token_counts("missing", input_tokens=1)
    stats = await store.stats()
    assert stats["sessions"] == 1 and stats["input_tokens"] == 100 and stats["db_bytes"] > 0


async def test_list_sessions_pages_by_last_activity_with_preview(store: Store) -> None:
    sids = []
    for i in range(5):
        sid = await store.create_session(source="telegram" if i % 2 else "discord", user_id=f"u{i}")
        await store.append_message(
            sid, "user", f"  hello\nnumber {i} " + "x" * 100, timestamp=1000 + i
        )
        sids.append(sid)
    rows = await store.list_sessions(limit=2)
    assert [r["id"] for r in rows] == [sids[4], sids[3]]
    assert rows[0]["preview"] == ("hello number 4 " + "x" * 100)[:60]
    assert [r["id"] for r in await store.list_sessions(limit=2, offset=2)] == [sids[2], sids[1]]
    assert [r["id"] for r in await store.list_sessions("telegram")] == [sids[3], sids[1]]
    assert [r["id"] for r in await store.list_sessions(exclude_sources=["telegram"])] == [
        sids[4],
        sids[2],
        sids[0],
    ]
    assert [r["id"] for r in await store.list_sessions(user_id="u2")] == [sids[2]]


async def test_a_generated_id_that_repeats_is_drawn_again(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ids are a second's timestamp and 32 random bits: thousands of sessions created in
    one second can draw the same id twice. The store draws again instead of failing."""
    now = time.time()
    taken = [
        await store.create_session(
            time.strftime("%Y%m%d_%H%M%S", time.gmtime(now + s)) + "_deadbeef", "telegram"
        )
        for s in range(-1, 6)  # every id the next few seconds could draw first
    ]
    draws = iter(["deadbeef" * 4, "deadbeef" * 4])
    real_token_hex = secrets.token_hex

    def token_hex(n: int) -> str:
        return next(draws, None) or real_token_hex(n)

    monkeypatch.setattr(ids.secrets, "token_hex", token_hex)
    created = await store.create_session(source="telegram")
    assert created not in taken and not created.endswith("deadbeef")
    draws = iter(["deadbeef" * 4, "deadbeef" * 4])
    child = await store.fork_session(created, "branch")
    assert child not in taken and not child.endswith("deadbeef")
    assert {s["id"] for s in await store.list_sessions(limit=50, include_children=True)} >= {
        created,
        child,
    }


async def test_untold_resets_are_the_empty_reset_children_of_idle_or_daily_sessions(
    store: Store,
) -> None:
    """What a restarted daemon owes its chats a reset notice for (gateway/reset)."""
    told, untold, branched, other = [
        await store.create_session(source="telegram", session_key=f"k{i}", title=f"t{i}")
        for i in range(4)
    ]
    for sid in (told, untold, branched, other):
        await store.append_messages(sid, [{"role": "user", "content": "hi"}])
    told_child = await store.fork_session(told, "reset", end_reason="idle")
    await store.append_messages(told_child, [{"role": "user", "content": "back"}])
    untold_child = await store.fork_session(untold, "reset", end_reason="daily")
    await store.fork_session(branched, "branch", end_reason="branched")
    await store.fork_session(other, "reset", end_reason="deleted_by_user")
    assert await store.untold_resets() == [
        {
            "session_key": "k1",
            "session_id": untold_child,
            "old_id": untold,
            "old_title": "t1",
            "old_messages": 1,
            "end_reason": "daily",
        }
    ]


async def _default_listings(store: Store) -> tuple[list[str], list[str]]:
    """The ids the default listing and the dashboard's default page show, newest first."""
    listed = [r["id"] for r in await store.list_sessions(limit=50)]
    rows, _ = await store.session_page(PageQuery(limit=50))
    return listed, [r["id"] for r in rows]


async def test_every_live_session_shows_in_the_default_listings(store: Store) -> None:
    """/new and a reset policy start reset children, /compress a compression child: the
    live one is always listed (on both listings, the same way); an ancestor a compression
    continues is folded into its continuation; an ended reset child is reached through its
    lineage; an ended compression chain shows as its tip."""
    chat = {"session_key": "agent:main:telegram:dm:1", "chat_id": "1"}
    first = await store.create_session(source="telegram", started_at=1.0, **chat)
    osaka = await store.fork_session(
        first, "reset", title="Osaka food 🍜", end_reason="session_reset"
    )
    assert await _default_listings(store) == ([osaka, first], [osaka, first])
    compressed = await store.fork_session(osaka, "compression", end_reason="compression")
    assert await _default_listings(store) == ([compressed, first], [compressed, first])
    # a daily reset: the live session shows; the ended chain it replaced shows as its tip
    daily = await store.fork_session(compressed, "reset", end_reason="daily")
    assert await _default_listings(store) == ([daily, compressed, first],) * 2
    again = await store.fork_session(daily, "reset", end_reason="daily")
    assert await _default_listings(store) == ([again, compressed, first],) * 2
    everything = {r["id"] for r in await store.list_sessions(limit=50, include_children=True)}
    assert everything == {first, osaka, compressed, daily, again}
    # an ended compression chain shows as its tip, not as the root it grew from
    other = await store.create_session(source="cli", started_at=2.0)
    tip = await store.fork_session(other, "compression", end_reason="compression")
    await store.end_session(tip, "user_exit")
    listed, paged = await _default_listings(store)
    assert tip in listed and other not in listed and tip in paged and other not in paged
