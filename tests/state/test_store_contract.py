"""Contract: the handoff state machine, the index's source queries, lineage repair, the
schema version and write statistics, as every `Store` backend must provide them."""

from __future__ import annotations

import pytest

from state import SessionNotFound, Store


async def test_handoff_moves_pending_running_completed_and_one_claim_wins(store: Store) -> None:
    sid = await store.create_session(source="cli")
    assert await store.request_handoff(sid, "telegram", now=100.0) is True
    assert await store.request_handoff(sid, "slack", now=101.0) is False  # already in flight
    assert await store.claim_handoff(["discord"], now=102.0) is None  # not for this platform
    assert await store.claim_handoff([]) is None
    assert await store.claim_handoff(["telegram", "slack"], now=103.0) == {
        "id": sid,
        "platform": "telegram",
    }
    assert await store.claim_handoff(["telegram"], now=104.0) is None  # taken once only
    assert await store.finish_handoff(sid, "completed", expect="pending") is False
    assert await store.finish_handoff(sid, "completed", expect="running") is True
    row = await store.require_session(sid)
    assert (row["handoff_state"], row["handoff_platform"], row["handoff_error"]) == (
        "completed",
        "telegram",
        None,
    )
    assert await store.request_handoff(sid, "slack") is True  # a finished one may go again
    with pytest.raises(SessionNotFound):
        await store.request_handoff("missing", "telegram")


async def test_a_running_handoff_whose_daemon_went_away_fails_with_a_reason(store: Store) -> None:
    stale = await store.create_session(source="cli")
    fresh = await store.create_session(source="cli")
    for sid, at in ((stale, 1_000.0), (fresh, 1_900.0)):
        await store.request_handoff(sid, "telegram", now=at)
        assert (await store.claim_handoff(["telegram"], now=at))["id"] == sid  # type: ignore[index]
    assert await store.fail_stale_handoffs(300, now=2_000.0) == [stale]
    row = await store.require_session(stale)
    assert row["handoff_state"] == "failed" and row["handoff_error"]
    assert (await store.require_session(fresh))["handoff_state"] == "running"


async def test_live_sessions_by_key_name_the_newest_live_session_of_each_key(
    store: Store,
) -> None:
    old = await store.create_session(source="telegram", session_key="k1", started_at=10.0)
    await store.end_session(old, "idle")
    new = await store.fork_session(old, "reset", end_reason="idle")  # the key's next session
    other = await store.create_session(
        source="slack", session_key="k2", chat_type="dm", started_at=15.0
    )
    ended = await store.create_session(source="slack", session_key="k3", started_at=5.0)
    await store.end_session(ended, "idle")
    await store.create_session(source="cli")  # no key: not routed
    assert await store.newest_live_session_by_key() == {"k1": new, "k2": other}
    live = await store.live_sessions_by_key()
    assert [(r["session_key"], r["id"]) for r in live] == [("k2", other), ("k1", new)]
    assert live[0]["source"] == "slack" and live[0]["chat_type"] == "dm"
    assert (await store.live_session_for_key("k1"))["id"] == new  # type: ignore[index]
    assert await store.live_session_for_key("k3") is None
    states = await store.session_states([old, ended, "missing"])
    assert set(states) == {old, ended}
    assert states[old][1] == "idle" and states[ended][1] == "idle"
    assert (await store.require_session(new))["session_key"] == "k1"


async def test_dangling_parent_links_are_counted_and_cleared(store: Store) -> None:
    root = await store.create_session(source="api")
    child = await store.fork_session(root, "branch")
    assert await store.count_dangling_parents() == 0
    # written by another program: a parent id that names no session
    stray = await store.create_session(source="api", parent_session_id="20200101_000000_deadbeef")
    assert await store.count_dangling_parents() == 1
    assert await store.clear_dangling_parents() == 1
    assert (await store.require_session(stray))["parent_session_id"] is None
    assert (await store.require_session(child))["parent_session_id"] == root
    assert await store.count_dangling_parents() == 0


async def test_a_fresh_store_is_at_the_latest_schema_version(store: Store) -> None:
    assert await store.schema_version() == store.latest_schema_version() > 0


async def test_a_store_only_switchboard_wrote_has_nothing_to_catch_up(store: Store) -> None:
    sid = await store.create_session(None, "api", title="mine")
    await store.append_message(sid, "user", "a question of its own")
    assert await store.catch_up() == 0
    assert [h["session_id"] for h in await store.search_messages("question")] == [sid]


async def test_write_stats_count_committed_operations(store: Store) -> None:
    before = store.write_stats()
    sid = await store.create_session(source="api")
    for i in range(5):
        await store.append_message(sid, "user", f"message {i}")
    after = store.write_stats()
    assert after.operations >= before.operations + 6
    assert after.batches > before.batches
    assert after.queue_depth == 0  # every write above has been awaited
    assert len(after.recent_commit_ms) == len(after.recent_batch_sizes) > 0


async def test_the_reply_to_a_platform_message_is_its_turns_final_answer(store: Store) -> None:
    """An idempotent repeat finds the first answer. The reply is the turn's last
    assistant text (not a tool call) before the chat's next user message; a message that
    was stored but not answered has none; ids are per chat and per source."""
    sid = await store.create_session(source="api", session_key="k:api:c1", chat_id="c1")
    await store.append_messages(
        sid, [{"role": "user", "content": "one", "platform_message_id": "key-1"}]
    )
    await store.append_messages(
        sid,
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "t",
                        "type": "function",
                        "function": {"name": "session_search", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "content": "found nothing", "tool_call_id": "t"},
            {"role": "assistant", "content": "the answer to one"},
        ],
    )
    await store.append_messages(
        sid, [{"role": "user", "content": "two", "platform_message_id": "key-2"}]
    )
    got = await store.reply_to_platform_message("api", "c1", "key-1")
    assert got is not None
    assert (got.session_id, got.session_key, got.reply) == (sid, "k:api:c1", "the answer to one")
    waiting = await store.reply_to_platform_message("api", "c1", "key-2")
    assert waiting is not None and waiting.reply is None  # stored, no reply yet
    await store.append_messages(sid, [{"role": "assistant", "content": "the answer to two"}])
    assert (
        await store.reply_to_platform_message("api", "c1", "key-2")
    ).reply == "the answer to two"  # type: ignore[union-attr]
    assert await store.reply_to_platform_message("api", "c2", "key-1") is None  # another chat
    assert await store.reply_to_platform_message("telegram", "c1", "key-1") is None
    assert await store.reply_to_platform_message("api", "c1", "never") is None
    # the chat's later session (after a reset) still answers for its own ids
    await store.end_session(sid, "new")
    new = await store.create_session(source="api", session_key="k:api:c1", chat_id="c1")
    await store.append_messages(
        new,
        [
            {"role": "user", "content": "three", "platform_message_id": "key-3"},
            {"role": "assistant", "content": "the answer to three"},
        ],
    )
    assert (await store.reply_to_platform_message("api", "c1", "key-3")).session_id == new  # type: ignore[union-attr]
    assert (await store.reply_to_platform_message("api", "c1", "key-1")).session_id == sid  # type: ignore[union-attr]


async def test_platform_message_ids_belong_to_the_sessions_chat_as_it_is_now(
    store: Store,
) -> None:
    """has_platform_message asks by (platform, chat): a session moved to another chat (a
    handoff binds a terminal session to a thread) takes its stored ids along."""
    sid = await store.create_session(source="telegram", chat_id="1")
    await store.append_messages(
        sid,
        [{"role": "user", "content": "hi", "platform_message_id": "5"}],
        dedupe=("telegram", "1"),
    )
    assert await store.has_platform_message("telegram", "1", "5") is True
    await store.update_session(sid, chat_id="2")
    assert await store.has_platform_message("telegram", "2", "5") is True
    assert await store.has_platform_message("telegram", "1", "5") is False
    again = [{"role": "user", "content": "hi", "platform_message_id": "5"}]
    assert await store.append_messages(sid, again, dedupe=("telegram", "2")) == []
    assert len(await store.append_messages(sid, again, dedupe=("telegram", "1"))) == 1
    assert await store.has_platform_message("telegram", "1", "5") is False  # it is in chat 2
