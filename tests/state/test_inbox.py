"""Contract: the inbox as every `Store` backend must keep it: what is new and what
is a redelivery, the turn's first and last writes, the rows a crash leaves open, and what
pruning forgets."""

from __future__ import annotations

import asyncio
import json
import time

from state import Store


async def _chat_session(store: Store) -> str:
    return await store.create_session(source="telegram", chat_id="c1", user_id="u1")


async def test_a_new_message_is_new_and_a_repeat_returns_its_row_storing_nothing(
    store: Store,
) -> None:
    rid, state, new = await store.accept_inbound("telegram", "c1", "m1", {"text": "hello"})
    assert (state, new) == ("received", True)
    assert await store.accept_inbound("telegram", "c1", "m1", {"text": "other"}) == (
        rid,
        "received",
        False,
    )
    # the key is (platform, chat, platform id): the same id elsewhere is another message
    elsewhere = [
        await store.accept_inbound("telegram", "c2", "m1", {"text": "x"}),
        await store.accept_inbound("slack", "c1", "m1", {"text": "y"}),
    ]
    assert all(new for _, _, new in elsewhere)
    assert len({rid, *(r for r, _, _ in elsewhere)}) == 3
    assert await store.inbox_counts() == {"received": 3}
    rows = await store.open_inbound()
    assert [r["id"] for r in rows][0] == rid
    assert json.loads(rows[0]["payload"]) == {"text": "hello"}  # the first delivery's
    assert (rows[0]["platform"], rows[0]["chat_id"], rows[0]["platform_message_id"]) == (
        "telegram",
        "c1",
        "m1",
    )


async def test_a_message_without_a_platform_id_is_always_new(store: Store) -> None:
    got = [await store.accept_inbound("api", "c1", None, {"text": "same"}) for _ in range(3)]
    assert [new for _, _, new in got] == [True, True, True]
    assert len({rid for rid, _, _ in got}) == 3
    assert await store.inbox_counts() == {"received": 3}


async def test_redeliveries_arriving_together_get_one_row(store: Store) -> None:
    """Concurrent accepts reach the writer in one batch: the batched path keeps the key."""
    got = await asyncio.gather(
        *(store.accept_inbound("telegram", "c1", "m9", {"n": i}) for i in range(6)),
        store.accept_inbound("telegram", "c1", None, {"n": "a"}),
        store.accept_inbound("telegram", "c1", None, {"n": "b"}),
    )
    keyed, unkeyed = got[:6], got[6:]
    assert len({rid for rid, _, _ in keyed}) == 1 and sum(new for _, _, new in keyed) == 1
    assert all(new for _, _, new in unkeyed) and unkeyed[0][0] != unkeyed[1][0]
    assert await store.inbox_counts() == {"received": 3}


async def test_begin_turn_stores_the_message_once_and_reads_history_up_to_it(
    store: Store,
) -> None:
    sid = await _chat_session(store)
    await store.append_messages(
        sid,
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": "two"},
        ],
    )
    rid, _, _ = await store.accept_inbound("telegram", "c1", "m1", {"text": "third"})
    msg = {"role": "user", "content": "third", "platform_message_id": "m1"}
    mid, history = await store.begin_turn(rid, sid, msg, last=3)
    assert history == [
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "third"},
    ]
    (row,) = await store.open_inbound()
    assert (row["state"], row["session_id"], row["message_id"]) == ("started", sid, mid)
    # a turn run again (after a crash) finds its message there, even with a reply after it
    await store.append_messages(sid, [{"role": "assistant", "content": "late"}])
    again_mid, again = await store.begin_turn(rid, sid, msg, last=2)
    assert again_mid == mid
    assert again == [{"role": "assistant", "content": "two"}, {"role": "user", "content": "third"}]
    assert await store.message_count(sid) == 6
    stored = await store.get_messages(sid)
    assert [m["content"] for m in stored].count("third") == 1
    assert next(m for m in stored if m["id"] == mid)["platform_message_id"] == "m1"
    _, everything = await store.begin_turn(rid, sid, msg)  # no `last`: the whole history
    assert [m["content"] for m in everything] == ["first", "one", "second", "two", "third"]


async def test_begin_turn_twice_at_once_stores_the_message_once(store: Store) -> None:
    sid = await _chat_session(store)
    rid, _, _ = await store.accept_inbound("telegram", "c1", "m1", {"text": "hi"})
    msg = {"role": "user", "content": "hi", "platform_message_id": "m1"}
    got = await asyncio.gather(store.begin_turn(rid, sid, msg), store.begin_turn(rid, sid, msg))
    assert got[0] == got[1] and got[0][1] == [{"role": "user", "content": "hi"}]
    assert await store.message_count(sid) == 1


async def test_end_turn_stores_the_reply_and_a_repeat_is_then_a_closed_duplicate(
    store: Store,
) -> None:
    sid = await _chat_session(store)
    rid, _, _ = await store.accept_inbound("telegram", "c1", "m1", {"text": "hi"})
    mid, _ = await store.begin_turn(rid, sid, {"role": "user", "content": "hi"})
    ids = await store.end_turn(
        rid,
        sid,
        [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]},
            {"role": "tool", "content": "42", "tool_call_id": "t1"},
            {"role": "assistant", "content": "hello back"},
        ],
        input_tokens=12,
        output_tokens=5,
    )
    assert len(ids) == 3 and mid < ids[0] < ids[1] < ids[2]
    assert await store.inbox_counts() == {"answered": 1}
    assert await store.open_inbound() == []
    assert await store.accept_inbound("telegram", "c1", "m1", {"text": "hi"}) == (
        rid,
        "answered",
        False,
    )
    row = await store.require_session(sid)
    assert (row["message_count"], row["tool_call_count"]) == (4, 1)
    assert (row["input_tokens"], row["output_tokens"]) == (12, 5)
    assert [m["content"] for m in await store.get_messages(sid)][-1] == "hello back"


async def test_open_inbound_lists_received_and_started_rows_oldest_first(store: Store) -> None:
    sid = await _chat_session(store)
    before = time.time()
    a, _, _ = await store.accept_inbound("telegram", "c1", "a", {"text": "a"})
    b, _, _ = await store.accept_inbound("telegram", "c1", "b", {"text": "b"})
    c, _, _ = await store.accept_inbound("telegram", "c1", "c", {"text": "c"})
    d, _, _ = await store.accept_inbound("telegram", "c1", "d", {"text": "d"})
    mid, _ = await store.begin_turn(
        b, sid, {"role": "user", "content": "b", "platform_message_id": "b"}
    )
    await asyncio.gather(  # closed together: one writer batch
        store.finish_inbound(c, "dropped", "not_stored"),
        store.finish_inbound(d, "answered", "command"),
    )
    rows = await store.open_inbound()
    assert [(r["id"], r["state"], r["session_id"], r["message_id"]) for r in rows] == [
        (a, "received", None, None),
        (b, "started", sid, mid),
    ]
    assert all(isinstance(r["received_at"], float) and r["received_at"] >= before for r in rows)
    assert await store.inbox_counts() == {
        "received": 1,
        "started": 1,
        "dropped": 1,
        "answered": 1,
    }
    # a dropped row stays closed for a redelivery too
    assert await store.accept_inbound("telegram", "c1", "c", {}) == (c, "dropped", False)


async def test_prune_forgets_only_closed_rows_older_than_the_cut(store: Store) -> None:
    sid = await _chat_session(store)
    old_answered, _, _ = await store.accept_inbound("telegram", "c1", "m1", {})
    await store.begin_turn(old_answered, sid, {"role": "user", "content": "one"})
    await store.end_turn(old_answered, sid, [{"role": "assistant", "content": "r1"}])
    old_dropped, _, _ = await store.accept_inbound("telegram", "c1", "m2", {})
    await store.finish_inbound(old_dropped, "dropped", "too_old")
    still_open, _, _ = await store.accept_inbound("telegram", "c1", "m3", {})
    cut = time.time()  # after those writes committed
    recent, _, _ = await store.accept_inbound("telegram", "c1", "m4", {})
    await store.finish_inbound(recent, "answered", "command")
    assert await store.prune_inbox(0.0) == 0
    assert await store.prune_inbox(cut) == 2
    assert await store.inbox_counts() == {"received": 1, "answered": 1}
    assert await store.message_count(sid) == 2  # the conversation is never pruned
    # a forgotten row no longer dedupes; the open and the recent ones still do
    assert (await store.accept_inbound("telegram", "c1", "m1", {}))[2] is True
    assert await store.accept_inbound("telegram", "c1", "m3", {}) == (
        still_open,
        "received",
        False,
    )
    assert await store.accept_inbound("telegram", "c1", "m4", {}) == (recent, "answered", False)


async def test_the_outbox_keeps_a_reply_until_it_is_marked(store: Store) -> None:
    """end_turn puts the reply in the outbox as 'ready' (sent again after a crash) or
    'sending' (never sent again); mark_reply closes it; unsent_replies lists the rest with
    their text, oldest first."""
    sid = await _chat_session(store)
    rows = []
    for pmid, state in (("a", "ready"), ("b", "sending"), ("c", "ready")):
        rid, _, _ = await store.accept_inbound("telegram", "c1", pmid, {"text": pmid})
        await store.begin_turn(
            rid, sid, {"role": "user", "content": pmid, "platform_message_id": pmid}
        )
        await store.end_turn(
            rid, sid, [{"role": "assistant", "content": f"re {pmid}"}], reply_state=state
        )
        rows.append(rid)
    await store.mark_reply(rows[2], "sent", '["99"]')
    unsent = await store.unsent_replies()
    assert [(r["id"], r["reply_state"], r["content"]) for r in unsent] == [
        (rows[0], "ready", "re a"),
        (rows[1], "sending", "re b"),
    ]
    assert all(r["session_id"] == sid for r in unsent)
    await store.mark_reply(rows[0], "failed")
    await store.mark_reply(rows[1], "unconfirmed")
    assert await store.unsent_replies() == []
