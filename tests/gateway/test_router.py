"""The router: ordering, concurrency, dedupe, authorisation, agent failures, commands."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.errors import NotAccepted
from gateway.index import SessionIndex
from gateway.pipeline import APOLOGY, REFUSAL, AccessRules, Router, RouterSettings
from gateway.session_keys import KeySettings
from state import SessionDB

from .conftest import Outbox, RouterRig, ScriptedAgent, dm, group


async def test_a_dm_round_trip_stores_both_messages_under_the_dm_key(rig: RouterRig) -> None:
    await rig.router.handle(dm("hello", mid="1"))
    [out] = await rig.outbox.wait(1)
    assert (
        out.text == "echo: hello"
        and out.chat_id == "42"
        and out.session_key == "agent:main:telegram:dm:42"
    )
    entry = rig.index.get("agent:main:telegram:dm:42")
    assert entry is not None and entry.session_id == out.session_id
    msgs = await rig.db.get_messages(out.session_id)
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("user", "hello"),
        ("assistant", "echo: hello"),
    ]
    assert msgs[0]["platform_message_id"] == "1"
    row = await rig.db.require_session(out.session_id)
    assert (row["session_key"], row["chat_id"], row["chat_type"], row["source"]) == (
        "agent:main:telegram:dm:42",
        "42",
        "dm",
        "telegram",
    )


async def test_messages_in_one_session_are_answered_in_order_one_at_a_time(rig: RouterRig) -> None:
    rig.agent.delay_on = {"first": 0.2}
    await rig.router.handle(dm("first"))
    await rig.router.handle(dm("second"))
    await rig.router.handle(dm("third"))
    sent = await rig.outbox.wait(3)
    assert [m.text for m in sent] == ["echo: first", "echo: second", "echo: third"]
    # the second turn saw the first exchange complete (not run concurrently on the history)
    assert [m["content"] for m in rig.agent.seen[1]] == ["first", "echo: first", "second"]


async def test_different_sessions_run_concurrently(rig: RouterRig) -> None:
    rig.agent.delay_on = {"slow": 0.5}
    await rig.router.handle(dm("slow", chat="1"))
    await rig.router.handle(dm("fast", chat="2"))
    sent = await rig.outbox.wait(2)
    assert [m.text for m in sent] == ["echo: fast", "echo: slow"]


async def test_a_redelivered_update_is_answered_once(rig: RouterRig) -> None:
    await rig.router.handle(dm("hi", mid="77"))
    await rig.router.handle(dm("hi", mid="77"))
    await rig.outbox.wait(1)
    await rig.router.drain(5)
    assert len(rig.outbox.sent) == 1


async def test_a_redelivery_after_a_restart_is_caught_by_state_db(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        for attempt in range(2):  # a fresh router each time: its memory is empty
            index = SessionIndex(tmp_path / "s.json", db, 0.05)
            await index.load()
            outbox = Outbox()
            router = Router(db, index, ScriptedAgent(), outbox.send)
            await router.handle(dm("once", mid="900"))
            await router.drain(5)
            await index.close()
            assert len(outbox.sent) == (1 if attempt == 0 else 0)
        assert await db.message_count() == 2
    finally:
        await db.close()


async def test_an_agent_failure_apologises_and_keeps_the_users_message(rig: RouterRig) -> None:
    rig.agent.fail_on = {"boom"}
    await rig.router.handle(dm("boom please"))
    [out] = await rig.outbox.wait(1)
    assert out.text == APOLOGY
    assert "exploded" not in out.text
    msgs = await rig.db.get_messages(out.session_id)
    assert [m["content"] for m in msgs] == ["boom please"]
    assert rig.router.last_error and "exploded" in rig.router.last_error
    await rig.router.handle(dm("again"))
    await rig.outbox.wait(2)
    assert rig.outbox.sent[1].text == "echo: again"


async def test_authorisation(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    index = SessionIndex(tmp_path / "s.json", db, 0.05)
    await index.load()
    outbox = Outbox()
    settings = RouterSettings(
        access={"telegram": AccessRules(allowed=frozenset({"7"}), admins=frozenset({"9"}))}
    )
    router = Router(db, index, ScriptedAgent(), outbox.send, settings)
    try:
        await router.handle(dm("let me in", chat="5"))  # unknown user in a DM: one refusal
        await router.handle(dm("please", chat="5"))
        await router.handle(group("hello", user="6"))  # unknown user in a group: silence
        await router.handle(dm("allowed", chat="7"))
        await router.handle(dm("admin", chat="9"))
        await outbox.wait(3)
        await router.drain(5)
        texts = sorted(m.text for m in outbox.sent)
        assert texts == sorted([REFUSAL, "echo: allowed", "echo: admin"])
        assert await db.session_count() == 2  # nothing stored for the strangers
    finally:
        await router.drain(5)
        await index.close()
        await db.close()


async def test_group_sessions_are_per_user_and_shared_rooms_prefix_names(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    index = SessionIndex(tmp_path / "s.json", db, 0.05)
    await index.load()
    outbox = Outbox()
    try:
        router = Router(db, index, ScriptedAgent(), outbox.send)
        await router.handle(group("hi from 1", user="1"))
        await router.handle(group("hi from 2", user="2"))
        sent = await outbox.wait(2)
        assert len({m.session_id for m in sent}) == 2
        shared = Router(
            db,
            index,
            ScriptedAgent(),
            outbox.send,
            RouterSettings(keys=KeySettings(group_sessions_per_user=False)),
        )
        await shared.handle(group("room one", user="1", chat="-200", name="Ann"))
        await outbox.wait(3)
        await shared.handle(group("room two", user="2", chat="-200", name="Bob"))
        sent = await outbox.wait(4)
        assert sent[2].session_id == sent[3].session_id
        msgs = await db.get_messages(sent[3].session_id)
        assert [m["content"] for m in msgs if m["role"] == "user"] == [
            "[Ann] room one",
            "[Bob] room two",
        ]
        await shared.drain(5)
    finally:
        await index.close()
        await db.close()


async def test_commands(rig: RouterRig) -> None:
    await rig.router.handle(dm("hello"))
    await rig.outbox.wait(1)
    await rig.router.handle(dm("/status@my_bot"))
    await rig.router.handle(dm("/HELP"))
    await rig.router.handle(dm("/frobnicate now"))
    sent = await rig.outbox.wait(4)
    status, help_, unknown = sent[1].text, sent[2].text, sent[3].text
    assert (
        f"Session: {sent[0].session_id}" in status
        and "Messages: 2" in status
        and "Live jobs: none" in status
    )
    assert "/status" in help_ and "/help" in help_
    assert unknown == "Unknown command /frobnicate. Send /help for the list."
    assert await rig.db.message_count(sent[0].session_id) == 2  # commands are not agent turns


async def test_drain_lets_turns_finish_and_refuses_new_ones(rig: RouterRig) -> None:
    rig.agent.delay_on = {"slow": 0.3}
    await rig.router.handle(dm("slow"))
    await asyncio.sleep(0.05)
    rig.router.stop_intake()
    with pytest.raises(NotAccepted):  # not taken: the adapter does not acknowledge it
        await rig.router.handle(dm("late", chat="99"))
    cancelled = await rig.router.drain(5)
    assert cancelled == 0
    assert [m.text for m in rig.outbox.sent] == ["echo: slow"]


async def test_the_same_platform_id_in_two_chats_is_two_messages(rig: RouterRig) -> None:
    """Telegram numbers messages per chat: id 5 in chat 1 and id 5 in chat 2 both count;
    a redelivery of id 5 in chat 1 does not, even after the router forgets it."""
    await rig.router.handle(dm("in chat one", chat="1", mid="5"))
    await rig.router.handle(dm("in chat two", chat="2", mid="5"))
    await rig.outbox.wait(2)
    rig.router.services.coordinator._seen.clear()  # type: ignore[attr-defined]  # as after a restart: only state.db remembers
    await rig.router.handle(dm("in chat one", chat="1", mid="5"))
    await rig.router.drain(5)
    assert sorted(m.text for m in rig.outbox.sent) == ["echo: in chat one", "echo: in chat two"]
    assert await rig.db.has_platform_message("telegram", "1", "5")
    assert not await rig.db.has_platform_message("telegram", "3", "5")


async def test_a_session_deleted_by_another_process_starts_afresh_on_the_next_message(
    rig: RouterRig,
) -> None:
    # `sessions delete <live id>` (its own connection) while the daemon runs
    async def say(msg) -> list[str]:  # noqa: ANN001
        n = len(rig.outbox.sent)
        await rig.router.handle(msg)
        await rig.router.drain(5)
        return [m.text for m in rig.outbox.sent[n:]]

    async def delete_elsewhere(sid: str) -> None:
        other = await SessionDB.open(rig.db.path)
        try:
            await other.delete_session(sid)
        finally:
            await other.close()

    for chat, first in (("1", "hello again"), ("2", "/new fresh start")):
        assert await say(dm("hello", chat=chat)) == ["echo: hello"]
        key = f"agent:main:telegram:dm:{chat}"
        old = rig.index.get(key).session_id  # type: ignore[union-attr]
        await delete_elsewhere(old)
        replies = await say(dm(first, chat=chat))
        assert not any(o.error for o in rig.outbox.sent), replies
        new = rig.index.get(key).session_id  # type: ignore[union-attr]
        assert new != old and await rig.db.get_session(old) is None  # never resurrected
        assert (await rig.db.require_session(new))["end_reason"] is None
        assert await say(dm("and then", chat=chat)) == ["echo: and then"]
        contents = [m["content"] for m in await rig.db.get_messages(new)]
        assert contents[-2:] == ["and then", "echo: and then"]
        if chat == "1":
            assert contents == ["hello again", "echo: hello again", "and then", "echo: and then"]

    # deleted mid-turn: the agent's reply cannot be stored, so the turn runs again afresh
    rig.agent.delay_on = {"slow": 0.5}
    assert await say(dm("hi", chat="3")) == ["echo: hi"]
    old = rig.index.get("agent:main:telegram:dm:3").session_id  # type: ignore[union-attr]
    await rig.router.handle(dm("slow one", chat="3"))
    for _ in range(200):
        if await rig.db.message_count(old) == 3:
            break
        await asyncio.sleep(0.01)
    await delete_elsewhere(old)
    await rig.router.drain(5)
    assert rig.outbox.sent[-1].text == "echo: slow one" and not rig.outbox.sent[-1].error
    new = rig.index.get("agent:main:telegram:dm:3").session_id  # type: ignore[union-attr]
    assert new != old
    assert [m["content"] for m in await rig.db.get_messages(new)] == ["slow one", "echo: slow one"]


async def test_after_a_crash_a_chats_replies_keep_its_order_through_recovery(
    tmp_path: Path,
) -> None:
    """A crash left a chat's first reply committed and unsent and its second
    message taken but not run; a third arrives as the adapters start, before `recover`.
    Its turn is held: the chat gets the first reply (resent), the second, then the third,
    never the new one first."""
    db = await SessionDB.open(tmp_path / "state.db")
    index = SessionIndex(tmp_path / "sessions" / "sessions.json", db, flush_interval=0.05)
    await index.load()
    stuck = asyncio.Event()

    async def never_returns(msg: object) -> object:  # the platform call the crash cut off
        stuck.set()
        await asyncio.Event().wait()

    settings = RouterSettings(resend_unconfirmed=True)  # the reply is 'ready': resent
    before = Router(db, index, ScriptedAgent(), never_returns, settings)  # type: ignore[arg-type]
    await before.handle(dm("first", mid="1"))
    await asyncio.wait_for(stuck.wait(), 5)
    await before.handle(dm("second", mid="2"))  # waits for the first's lock
    assert await before.drain(0) == 2  # the crash: both turns end where they were
    outbox = Outbox()
    after = Router(db, index, ScriptedAgent(), outbox.send, RouterSettings(resend_unconfirmed=True))
    try:
        await after.hold_until_recovered()
        await after.handle(dm("third", mid="3"))  # taken while the adapters start
        await after.recover(3600)
        sent = await outbox.wait(3)
        assert [m.text for m in sent] == ["echo: first", "echo: second", "echo: third"]
    finally:
        await after.drain(5)
        await index.close()
        await db.close()


async def test_a_message_still_committing_is_not_overtaken_when_its_keys_lock_comes_free(
    rig: RouterRig,
) -> None:
    """A message committing to the inbox while the key was busy (here: start-up recovery
    held turns) is not overtaken by a later message of the key that arrives once the key
    is free, before that commit returns: the later one may not take the idle key's fast
    path past it. (Seen in test_fault_chains: Slack resends taken during the hold were
    answered after the first new message.) The database is locked from outside so the
    earlier commit is still waiting when the later message comes."""
    await rig.router.handle(dm("hello", mid="1"))  # the key has a session: a fast path
    await rig.outbox.wait(1)
    # its reply's 'sent' mark committed too (a posted write): left 'sending', recovery
    # below would have it to mark while the database is locked
    for _ in range(500):
        if not await rig.db.unsent_replies():
            break
        await asyncio.sleep(0.01)
    assert not await rig.db.unsent_replies()
    await rig.router.hold_until_recovered()
    outside = sqlite3.connect(rig.db.path, isolation_level=None)
    try:
        outside.execute("BEGIN IMMEDIATE")  # the writer waits on it (its busy timeout)
        second = asyncio.create_task(rig.router.handle(dm("second", mid="2")))
        await asyncio.sleep(0.05)  # its commit is with the writer
        assert not second.done()
        await rig.router.recover(3600)  # nothing to recover: the hold ends
        third = asyncio.create_task(rig.router.handle(dm("third", mid="3")))
        await asyncio.sleep(0.05)
        outside.execute("ROLLBACK")
    finally:
        outside.close()
    await asyncio.gather(second, third)
    sent = await rig.outbox.wait(3)
    assert [m.text for m in sent] == ["echo: hello", "echo: second", "echo: third"]
    session = sent[0].session_id
    stored = [m["content"] for m in await rig.db.get_messages(session)]
    assert stored == ["hello", "echo: hello", "second", "echo: second", "third", "echo: third"]


async def test_recovery_runs_a_turn_already_begun_before_an_older_row_of_its_key(
    rig: RouterRig,
) -> None:
    """The inbox id order is not always the order turns began (a message to an
    idle key takes the key's lock before its commit, which the writer may place after a
    waiting message's). A crash left the key's second row begun (its message stored) and the
    first only received: recovery finishes the begun turn first, so the session never holds
    a message between another message and its reply."""
    from gateway.session_keys import build_key
    from gateway.turns import user_message

    waiting, begun = dm("waiting", mid="1"), dm("begun", mid="2")
    key = build_key(begun.source, rig.router.settings.keys)
    entry = await rig.router.entry_for(key, begun)
    db = rig.db
    await db.accept_inbound("telegram", "42", "1", waiting.as_payload())
    second, _state, _new = await db.accept_inbound("telegram", "42", "2", begun.as_payload())
    await db.begin_turn(second, entry.session_id, user_message(begun, key))  # then the crash
    await rig.router.recover(3600)
    sent = await rig.outbox.wait(2)
    assert [m.text for m in sent] == ["echo: begun", "echo: waiting"]
    stored = [(m["role"], m["content"]) for m in await db.get_messages(entry.session_id)]
    assert stored == [
        ("user", "begun"),
        ("assistant", "echo: begun"),
        ("user", "waiting"),
        ("assistant", "echo: waiting"),
    ]


async def test_messages_taken_while_recovery_runs_are_answered_once_each(rig: RouterRig) -> None:
    """Messages committed while recovery runs (the adapters start first) are run once
    each: by the hold, never also as rows a crash left. (The race this guards, recovery
    reading a row this process just committed before its handler resumed, showed in
    test_crash.py's subprocess; in-process the timing rarely opens it.)"""
    await rig.router.hold_until_recovered()
    taking = [
        asyncio.create_task(rig.router.handle(dm(f"m{i}", chat=str(i), mid="1"))) for i in range(20)
    ]
    await asyncio.gather(rig.router.recover(3600), *taking)
    sent = await rig.outbox.wait(20)
    await asyncio.sleep(0.2)  # a second answer would come within this
    assert sorted(m.text for m in rig.outbox.sent) == sorted(f"echo: m{i}" for i in range(20))
    assert len(sent) == 20


def test_an_early_begin_is_decided_from_the_route_row_the_policies_and_the_clock() -> None:
    """The replicas' begin-in-accept test runs inside the writer's transaction: it reads
    nothing but its arguments. A live session, the key's only open row: begun there; idle
    past the policy: not (the turn resets first); a live job on the session (the route's
    `jobs`) holds the reset, so it begins; another open row or a notice owed: not."""
    from gateway.pipeline.intake import begins_in
    from gateway.reset.policy import PolicySet, ResetPolicy
    from gateway.vocab import ResetMode

    idle = PolicySet(default=ResetPolicy(mode=ResetMode.IDLE, idle_minutes=10))
    route = {
        "open": [{"id": 7}],
        "unsent": [],
        "session_id": "s1",
        "route_found": True,
        "route_ended": None,
        "pending_notice": None,
        "updated_at": 1000.0,
        "created_at": 900.0,
        "platform": "api",
        "chat_type": "dm",
        "jobs": [],
    }
    soon, late = (lambda: 1000.0 + 60), (lambda: 1000.0 + 3600)
    assert begins_in(idle, soon, route, 7) == "s1"
    assert begins_in(idle, late, route, 7) is None
    assert begins_in(None, late, route, 7) == "s1"  # no reset policies at all
    assert begins_in(idle, late, {**route, "jobs": ["bg1.3"]}, 7) == "s1"
    assert begins_in(idle, soon, {**route, "open": [{"id": 6}, {"id": 7}]}, 7) is None
    assert begins_in(idle, soon, {**route, "pending_notice": "reset"}, 7) is None
