"""The history a turn reads is the session's newest messages, whatever happened in between.

The SQLite writer keeps each recent session's last window and reads only what is new
(state/sqlite/windows.py); these tests hold every backend to the same answer as a full read, and
the SQLite one to it after the changes the kept window must notice: a message edited or
deleted by another program, an operation that is not an append, a failed batch, a caller
editing the list it was given.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from state import SessionDB, Store


async def _turn(
    store: Store, sid: str, n: int, last: int, reply: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    rid, _, _ = await store.accept_inbound("telegram", sid, f"m{n}", {"n": n})
    msg = {"role": "user", "content": f"question {n}", "platform_message_id": f"m{n}"}
    _mid, history = await store.begin_turn(rid, sid, msg, last=last)
    await store.end_turn(rid, sid, reply or [{"role": "assistant", "content": f"answer {n}"}])
    return history


def _plain(history: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(m["role"], m.get("content")) for m in history]


@pytest.mark.slow
async def test_each_turn_reads_what_a_full_read_gives(store: Store) -> None:
    """Random turns (with tool calls) over a few sessions, with messages appended outside
    turns and a session cleared now and then: every history equals the newest `last`
    messages up to the turn's message read whole."""
    rng = random.Random(7)
    sids = [await store.create_session(source="telegram", chat_id=f"c{i}") for i in range(3)]
    for n in range(160):
        sid = rng.choice(sids)
        roll = rng.random()
        if roll < 0.05:
            await store.clear_messages(sid)
        elif roll < 0.12:
            await store.append_messages(sid, [{"role": "user", "content": f"aside {n}"}])
        reply = None
        if rng.random() < 0.2:
            reply = [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"t{n}",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {
                    "role": "tool",
                    "content": f"result {n}",
                    "tool_call_id": f"t{n}",
                    "tool_name": "f",
                },
                {"role": "assistant", "content": f"answer {n}"},
            ]
        history = await _turn(store, sid, n, last=7, reply=reply)
        whole = await store.get_messages_as_conversation(sid)
        upto = next(i for i, m in enumerate(whole) if m.get("content") == f"question {n}")
        assert history == whole[max(0, upto + 1 - 7) : upto + 1], n


async def test_a_caller_editing_its_history_does_not_edit_the_next(store: Store) -> None:
    sid = await store.create_session(source="telegram", chat_id="c1")
    first = await _turn(store, sid, 1, last=10)
    first[0]["content"] = "edited by an agent"
    first.append({"role": "system", "content": "appended by an agent"})
    second = await _turn(store, sid, 2, last=10)
    assert _plain(second) == [
        ("user", "question 1"),
        ("assistant", "answer 1"),
        ("user", "question 2"),
    ]


def _windows(db: SessionDB) -> Any:
    conn = db._writer._conn  # the writer's connection carries the kept windows
    assert conn is not None
    return conn.windows


async def test_the_kept_window_serves_the_next_turn(db: SessionDB) -> None:
    """The cache is used at all (the tests above would pass without it)."""
    sid = await db.create_session(source="telegram", chat_id="c1")
    windows = _windows(db)
    for n in range(5):
        await _turn(db, sid, n, last=4)
    assert windows.hits >= 4 and len(windows) == 1


# Replies of every shape a turn stores: each goes onto the kept window as the read would
# give it back, or makes the window be read again.
_SHAPES: list[list[dict[str, Any]]] = [
    [{"role": "assistant", "content": "plain"}],
    [{"role": "assistant", "content": None}],
    [{"role": "assistant", "content": ""}],
    [{"role": "assistant", "content": "thinks", "reasoning": "because <b>so</b>"}],
    [{"role": "assistant", "content": "a\x00b with a NUL"}],
    [{"role": "assistant", "content": [{"type": "text", "text": "parts"}]}],
    [{"role": "assistant", "content": {"type": "text", "text": "one part"}}],
    [{"role": "assistant", "content": "\u202eevil\u202c [b]x[/b] </x> \U0001f600 \u4e2d\u6587"}],
    [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f"}}],
        },
        {"role": "tool", "content": "result", "tool_call_id": "t1", "tool_name": "f"},
        {"role": "tool", "content": "anonymous"},
        {"role": "assistant", "content": "after tools", "tool_name": "not shown"},
    ],
    [{"role": "tool", "content": "numbered id", "tool_call_id": 7, "tool_name": "g"}],
    [{"role": "assistant", "content": "numbered reasoning", "reasoning": 12}],
]


async def test_replies_of_every_shape_read_back_as_a_full_read_gives(db: SessionDB) -> None:
    sid = await db.create_session(source="telegram", chat_id="c1")
    for n, reply in enumerate(_SHAPES * 2):
        history = await _turn(db, sid, n, last=6, reply=reply)
        whole = await db.get_messages_as_conversation(sid)
        upto = next(i for i, m in enumerate(whole) if m.get("content") == f"question {n}")
        assert history == whole[max(0, upto + 1 - 6) : upto + 1], n


async def test_a_window_the_appends_kept_current_is_served_without_a_read(
    db: SessionDB,
) -> None:
    sid = await db.create_session(source="telegram", chat_id="c1")
    await _turn(db, sid, 0, last=10)
    conn = db._writer._conn
    assert conn is not None
    reads: list[str] = []
    conn.set_trace_callback(lambda sql: reads.append(sql) if "json_group_" in sql else None)
    try:
        history = await _turn(db, sid, 1, last=10)
    finally:
        conn.set_trace_callback(None)
    assert _plain(history) == [
        ("user", "question 0"),
        ("assistant", "answer 0"),
        ("user", "question 1"),
    ]
    assert reads == []


async def test_a_change_in_the_same_batch_after_a_turn_is_seen_by_the_next(
    db: SessionDB,
) -> None:
    """A turn and a clear of its session in one group commit: the turn's batch runs first
    and keeps a window; the clear, after it, must leave the next turn a history without
    the cleared messages."""
    sid = await db.create_session(source="telegram", chat_id="c1")
    await _turn(db, sid, 0, last=10)
    rid, _, _ = await db.accept_inbound("telegram", sid, "m1", {"n": 1})
    msg = {"role": "user", "content": "question 1", "platform_message_id": "m1"}
    await asyncio.gather(db.begin_turn(rid, sid, msg, last=10), db.clear_messages(sid))
    await db.end_turn(rid, sid, [{"role": "assistant", "content": "answer 1"}])
    whole = await db.get_messages_as_conversation(sid)
    assert _plain(await _turn(db, sid, 2, last=10)) == _plain(whole) + [("user", "question 2")]


async def test_another_program_editing_or_deleting_a_message_is_seen(
    db: SessionDB, tmp_path: Path
) -> None:
    sid = await db.create_session(source="telegram", chat_id="c1")
    for n in range(3):
        await _turn(db, sid, n, last=10)
    other = sqlite3.connect(db.path)
    with other:
        other.execute(
            "UPDATE messages SET content = 'rewritten' WHERE session_id = ? AND content = 'answer 0'",
            (sid,),
        )
        other.execute(
            "DELETE FROM messages WHERE session_id = ? AND content = 'question 1'", (sid,)
        )
    other.close()
    history = await _turn(db, sid, 3, last=10)
    assert _plain(history) == [
        ("user", "question 0"),
        ("assistant", "rewritten"),
        ("assistant", "answer 1"),
        ("user", "question 2"),
        ("assistant", "answer 2"),
        ("user", "question 3"),
    ]


async def test_an_operation_that_is_not_an_append_forgets_the_windows(db: SessionDB) -> None:
    sid = await db.create_session(source="telegram", chat_id="c1")
    for n in range(3):
        await _turn(db, sid, n, last=10)
    windows = _windows(db)
    assert len(windows) == 1
    await db.set_session_title(sid, "named")  # any write that is not an append or inbox bookkeeping
    assert len(windows) == 0
    await db.clear_messages(sid)
    assert _plain(await _turn(db, sid, 9, last=10)) == [("user", "question 9")]


async def test_a_failed_batch_forgets_the_windows(db: SessionDB) -> None:
    sid = await db.create_session(source="telegram", chat_id="c1")
    await _turn(db, sid, 0, last=10)
    windows = _windows(db)
    assert len(windows) == 1

    def boom(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    with pytest.raises(Exception, match="disk I/O"):
        await db._writer.submit(boom)
    assert len(windows) == 0
    assert _plain(await _turn(db, sid, 1, last=10)) == [
        ("user", "question 0"),
        ("assistant", "answer 0"),
        ("user", "question 1"),
    ]


def test_the_windows_stay_within_their_budget() -> None:
    """Least recently used sessions go first; a window bigger than a quarter of the budget
    is served but not kept."""
    from state.history import PER_MESSAGE, HistoryWindows

    per = PER_MESSAGE + 10
    windows = HistoryWindows(budget=per * 40)
    for n, sid in enumerate("abcde"):
        windows.advance(sid, 10, 0, n + 1, [{"role": "user", "content": "x" * 10}] * 10)
        windows.trim()  # as the writer does after each batch
    assert len(windows) == 4 and windows.since("a", 10) == 0  # a went first
    assert windows.since("e", 10) == 5 and windows.since("e", 20) == 0  # another length
    got = windows.advance("e", 10, 5, 6, [{"role": "assistant", "content": "y" * 10}])
    assert len(got) == 10 and got[-1]["content"] == "y" * 10 and got[0] is not got[1]
    huge = windows.advance("f", 100, 0, 7, [{"role": "user", "content": "z" * 10}] * 11)
    assert len(huge) == 11 and windows.since("f", 100) == 0
    assert windows.since("e", 10) == 6


def test_a_batch_advances_every_window_it_was_promised_before_any_is_evicted() -> None:
    """A batch asks `since` for each of its sessions, then advances them one by one. When
    the first advances outgrow the budget, the windows still to be advanced stay until the
    batch is done (before, the eviction took one of them and its advance raised: seen in
    bench/gateway_bench.py with 10,000 chats); `trim` then brings the rest within budget."""
    from state.history import PER_MESSAGE, HistoryWindows

    per = PER_MESSAGE + 10
    windows = HistoryWindows(budget=per * 80)  # 80 messages; one window at most 20
    for n, sid in enumerate("abcde"):  # 70 messages kept
        windows.advance(sid, 20, 0, n + 1, [{"role": "user", "content": "x" * 10}] * 14)
    windows.trim()
    promised = {sid: windows.since(sid, 20) for sid in "abcde"}
    assert list(promised.values()) == [1, 2, 3, 4, 5]
    for sid, after in promised.items():  # 4 more each: over the budget from the third on
        got = windows.advance(
            sid, 20, after, after + 10, [{"role": "user", "content": "y" * 10}] * 4
        )
        assert len(got) == 18 and got[-1]["content"] == "y" * 10
    windows.trim()  # 90 messages: the least recently advanced goes
    assert len(windows) == 4 and windows.since("a", 20) == 0 and windows.since("e", 20) == 15
