"""The outbox's read of a session's undelivered replies, on every backend (the `store`
fixture): a turn's reply held, refused or expired is found by its message, with the reason
of a refused or expired one; a delivered one is not."""

from __future__ import annotations

from state import Store


async def _turn(store: Store, sid: str, mid: str, text: str) -> tuple[int, int]:
    rid, _, _ = await store.accept_inbound("telegram", "c1", mid, {"text": text})
    await store.begin_turn(rid, sid, {"role": "user", "content": text})
    ids = await store.end_turn(rid, sid, [{"role": "assistant", "content": f"echo: {text}"}])
    return rid, ids[-1]


async def test_undelivered_replies_name_their_state_and_reason(store: Store) -> None:
    sid = await store.create_session(source="telegram", chat_id="c1", user_id="u1")
    other = await store.create_session(source="telegram", chat_id="c2", user_id="u2")
    held, held_msg = await _turn(store, sid, "m1", "one")
    refused, refused_msg = await _turn(store, sid, "m2", "two")
    expired, expired_msg = await _turn(store, sid, "m3", "three")
    sent, _ = await _turn(store, sid, "m4", "four")
    elsewhere, _ = await _turn(store, other, "m5", "five")
    await store.mark_reply(held, "ready")
    await store.mark_reply(refused, "refused", "refused: Forbidden: bot was blocked")
    await store.mark_reply(expired, "expired", "expired: not delivered in time")
    await store.mark_reply(sent, "sent", '["17"]')
    await store.mark_reply(elsewhere, "expired", "expired")
    assert await store.undelivered_replies(sid) == {
        held_msg: ("ready", None),
        refused_msg: ("refused", "refused: Forbidden: bot was blocked"),
        expired_msg: ("expired", "expired: not delivered in time"),
    }
    assert await store.undelivered_replies("no-such-session") == {}
