"""The outbox of one-off sends on every backend (the `store` fixture): rows stored pending
before they go out, claimed for another try once due (by one scan only), finished once."""

from __future__ import annotations

from state import Store
from state.sqlite.sends import FAILED, PENDING, SENT


async def test_a_pending_send_is_claimed_once_due_and_finished_once(store: Store) -> None:
    first = await store.send_add("telegram", "555", None, "disk full", now=100)
    second = await store.send_add("telegram", "-100", "7", "in a topic", now=101)
    assert await store.sends_pending() == 2
    assert await store.sends_claim_due(before=100, now=150) == []  # nothing older than 100
    due = await store.sends_claim_due(before=120, now=150)
    assert [(r["id"], r["chat_id"], r["thread_id"], r["text"], r["state"]) for r in due] == [
        (first, "555", None, "disk full", PENDING),
        (second, "-100", "7", "in a topic", PENDING),
    ]
    assert await store.sends_claim_due(before=120, now=151) == []  # stamped: taken already
    await store.send_finish(first, SENT, None, ["17", "18"], now=152)
    await store.send_finish(second, PENDING, "unreachable", (), now=152)
    await store.send_finish(first, FAILED, "late", (), now=153)  # a finished row stays finished
    assert await store.sends_pending() == 1
    again = await store.sends_claim_due(before=200, now=201)
    assert [(r["id"], r["attempts"], r["error"]) for r in again] == [(second, 1, "unreachable")]


async def test_pending_sends_survive_reopening_the_store(open_test_store: object) -> None:
    opener = open_test_store  # type: ignore[assignment]
    first: Store = await opener("home")  # type: ignore[operator]
    await first.send_add("slack", "C1", None, "kept", now=10)
    await first.close()
    again: Store = await opener("home")  # type: ignore[operator]
    assert await again.sends_pending() == 1
    assert [r["text"] for r in await again.sends_claim_due(before=20, now=30)] == ["kept"]
