"""The inbox's batched paths (state/sqlite/inbox.py): messages taken together in one group commit
get the same answers as one at a time: new ones consecutive ids, repeats (before or within
the batch) the earlier row, rows without a platform id always new."""

from __future__ import annotations

import asyncio
from pathlib import Path

from state import SessionDB


async def test_accepts_in_one_commit_answer_like_one_at_a_time(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        first = await db.accept_inbound("telegram", "1", "m1", {"text": "a"})
        assert first[1:] == ("received", True)
        calls = [("1", "m1"), ("1", "m2"), ("2", "m1"), ("1", "m2"), ("1", None), ("1", None)]
        got = await asyncio.gather(
            *(db.accept_inbound("telegram", chat, pmid, {"text": "x"}) for chat, pmid in calls)
        )
        assert db.write_stats().batches <= 3  # they shared a commit
        assert got[0] == (first[0], "received", False)  # taken before
        assert got[1][2] and got[2][2] and got[1][0] != got[2][0]  # same id, other chat
        assert got[3] == (got[1][0], "received", False)  # repeated within the batch
        assert got[4][2] and got[5][2] and got[4][0] != got[5][0]  # no platform id: always new
        ids = {g[0] for g in got} | {first[0]}
        assert len(ids) == 5
        await db.finish_inbound(got[1][0], "answered")
        again = await db.accept_inbound("telegram", "1", "m2", {"text": "x"})
        assert again == (got[1][0], "answered", False)
        assert [r["id"] for r in await db.open_inbound()] == sorted(ids - {got[1][0]})
    finally:
        await db.close()


async def test_a_turn_begun_twice_stores_its_message_once(tmp_path: Path) -> None:
    """A crash after the turn's first write: running it again finds the message there."""
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        sid = await db.create_session("s1", "telegram", chat_id="1")
        inbox_id, _state, _new = await db.accept_inbound("telegram", "1", "m1", {"text": "hi"})
        user = {"role": "user", "content": "hi", "platform_message_id": "m1"}
        mid, history = await db.begin_turn(inbox_id, sid, user, last=10)
        assert await db.inbox_counts() == {"started": 1}  # derived: its message is stored
        mid2, history2 = await db.begin_turn(inbox_id, sid, user, last=10)
        assert mid2 == mid and history2 == history == [{"role": "user", "content": "hi"}]
        await db.end_turn(inbox_id, sid, [{"role": "assistant", "content": "yo"}], input_tokens=3)
        assert [m["content"] for m in await db.get_messages(sid)] == ["hi", "yo"]
        assert await db.inbox_counts() == {"answered": 1}
        assert await db.prune_inbox(older_than=0) == 0  # not older than the cut
        assert await db.prune_inbox(older_than=4e9) == 1
    finally:
        await db.close()
