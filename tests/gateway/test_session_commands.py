"""Session commands through the router with the echo agent: /new /title /resume /sessions
/search /branch /compress /background /sethome, automatic titles and lineage."""

from __future__ import annotations

import asyncio
import json

from gateway.pipeline import AccessRules, RouterSettings

from .conftest import RouterRig, dm, group


async def say(rig: RouterRig, msg) -> str:
    n = len(rig.outbox.sent)
    await rig.router.handle(msg)
    await rig.outbox.wait(n + 1)
    await asyncio.sleep(0)
    return rig.outbox.sent[n].text


def current(rig: RouterRig, key: str = "agent:main:telegram:dm:42") -> str:
    entry = rig.index.get(key)
    assert entry is not None
    return entry.session_id


async def settle(rig: RouterRig) -> None:
    """Let background work (automatic titles) finish; the deadline only catches a hang."""
    deadline = asyncio.get_running_loop().time() + 60
    while rig.router.inflight != 0:
        assert asyncio.get_running_loop().time() < deadline, "background work never finished"
        await asyncio.sleep(0.02)


async def test_title_as_first_message_then_show_and_errors(rig: RouterRig) -> None:
    assert await say(rig, dm("/title Kyoto trip")) == "Title set: Kyoto trip"
    sid = current(rig)
    assert await say(rig, dm("/title")) == "Title: Kyoto trip"
    assert "too long" in await say(rig, dm("/title " + "x" * 150))
    await say(rig, dm("/new", chat="43"))
    assert "already in use" in await say(rig, dm("/title KYOTO TRIP", chat="43"))
    assert await rig.db.get_session_title(sid) == "Kyoto trip"


async def test_a_title_clash_with_another_users_session_never_names_it(rig: RouterRig) -> None:
    """Titles are one namespace, but another user's session answers as if it did not
    exist: /title, /branch and /new say the title is taken and never give its id. The
    chat's own session holding the title is named, with the way back to it."""
    await say(rig, dm("/title Osaka food 🍜"))
    theirs = current(rig)
    await say(rig, dm("hello", chat="43"))
    for command in ("/title Osaka food 🍜", "/branch Osaka food 🍜", "/new Osaka food 🍜"):
        answer = await say(rig, dm(command, chat="43"))
        assert "that title is already in use" in answer, answer
        assert theirs not in answer
    ours = current(rig, "agent:main:telegram:dm:43")
    await say(rig, dm("/title Kyoto 🍵", chat="43"))
    await say(rig, dm("/new", chat="43"))
    answer = await say(rig, dm("/title Kyoto 🍵", chat="43"))
    assert answer == (
        f"Title not set: this chat's session {ours} already has that title "
        "(/resume Kyoto 🍵 goes back to it)."
    )
    assert await rig.db.get_session_title(theirs) == "Osaka food 🍜"


async def test_new_starts_a_reset_child_and_reports_a_bad_title(rig: RouterRig) -> None:
    await say(rig, dm("hello"))
    old = current(rig)
    reply = await say(rig, dm("/new " + "y" * 150))
    assert reply.startswith("Started a new session, but the title was not set")
    new = current(rig)
    assert new != old
    row = await rig.db.require_session(new)
    assert (row["parent_session_id"], row["child_kind"], row["title"]) == (old, "reset", None)
    assert (await rig.db.require_session(old))["end_reason"] == "session_reset"
    assert await say(rig, dm("after reset")) == "echo: after reset"
    assert [m["content"] for m in await rig.db.get_messages(new)] == [
        "after reset",
        "echo: after reset",
    ]


async def test_automatic_title_after_the_first_exchange_never_overwrites(rig: RouterRig) -> None:
    await say(rig, dm("Plan a trip to Kyoto please"))
    await settle(rig)
    first = current(rig)
    assert await rig.db.get_session_title(first) == "Plan a trip to Kyoto please"
    # same words in another chat: numbered, not refused
    await say(rig, dm("Plan a trip to Kyoto please", chat="7"))
    await settle(rig)
    assert (
        await rig.db.get_session_title(current(rig, "agent:main:telegram:dm:7"))
        == "Plan a trip to Kyoto please #2"
    )
    # a title the user set first is kept
    await say(rig, dm("/title mine", chat="8"))
    await say(rig, dm("something else entirely", chat="8"))
    await settle(rig)
    assert await rig.db.get_session_title(current(rig, "agent:main:telegram:dm:8")) == "mine"


async def test_resume_lists_switches_and_recaps(rig: RouterRig) -> None:
    await say(rig, dm("/title alpha"))
    await say(rig, dm("alpha talk"))
    alpha = current(rig)
    await say(rig, dm("/new beta"))
    await say(rig, dm("beta talk"))
    beta = current(rig)
    await say(rig, dm("/new"))
    listing = await say(rig, dm("/resume"))
    assert listing.splitlines()[1].startswith("1. beta") and listing.splitlines()[2].startswith(
        "2. alpha"
    )
    reply = await say(rig, dm("/resume 2"))
    assert (
        reply.startswith("Resumed alpha (2 messages).")
        and "You: alpha talk" in reply
        and "Agent: echo: alpha talk" in reply
    )
    assert current(rig) == alpha
    assert (await rig.db.require_session(alpha))["ended_at"] is None
    assert await say(rig, dm("/resume alpha")) == "You are already in that session."
    assert (await say(rig, dm(f"/resume {beta[:20]}"))).startswith("Resumed beta")
    assert current(rig) == beta
    assert (await rig.db.require_session(alpha))["end_reason"] == "session_switch"
    assert "No session found" in await say(rig, dm("/resume nonexistent"))
    assert "no number 9" in await say(rig, dm("/resume 9"))
    assert await say(rig, dm("more beta")) == "echo: more beta"
    assert await rig.db.message_count(beta) == 4


async def test_sessions_and_search_number_what_resume_takes(rig: RouterRig) -> None:
    await say(rig, dm("/title gardening"))
    await say(rig, dm("tomatoes need sun"))
    garden = current(rig)
    await say(rig, dm("/new cooking"))
    await say(rig, dm("pasta needs salt"))
    listing = await say(rig, dm("/sessions"))
    assert "cooking" in listing.splitlines()[1] and "current" in listing.splitlines()[1]
    found = await say(rig, dm("/search tomatoes"))
    assert found.startswith("1. gardening") and ">>>tomatoes<<<" in found
    assert (await say(rig, dm("/resume 1"))).startswith("Resumed gardening")
    assert current(rig) == garden
    assert "Nothing found" in await say(rig, dm("/search zucchini"))
    assert "not run" in await say(rig, dm("/search ***"))


async def test_branch_copies_history_and_resume_goes_back(rig: RouterRig) -> None:
    await say(rig, dm("/title plan"))
    await say(rig, dm("step one"))
    parent = current(rig)
    reply = await say(rig, dm("/branch"))
    assert reply.startswith("Branched into a new session (plan #2)")
    child = current(rig)
    assert [m["content"] for m in await rig.db.get_messages(child)] == [
        "step one",
        "echo: step one",
    ]
    assert (await rig.db.require_session(parent))["end_reason"] == "branched"
    await say(rig, dm("/resume plan"))  # the newest of the lineage
    assert current(rig) == child
    assert (await say(rig, dm("/resume plan #1"))).startswith(
        "No session found"
    )  # "#1" is no stored title
    back = await say(rig, dm(f"/resume {parent}"))
    assert back.startswith("Resumed plan (")
    assert current(rig) == parent
    assert f"session {child} already has that title" in await say(rig, dm("/branch plan #2"))


async def test_compress_keeps_the_tail_and_the_parent_transcript(rig: RouterRig) -> None:
    await say(rig, dm("/title long talk"))
    for i in range(6):
        await say(rig, dm(f"message {i} about zebras" if i == 0 else f"message {i}"))
    parent = current(rig)
    reply = await say(rig, dm("/compress zebras"))
    assert reply == "Compressed 6 earlier messages into a summary; continuing as long talk #2."
    child = current(rig)
    msgs = await rig.db.get_messages(child)
    assert msgs[0]["role"] == "system" and "zebras" in msgs[0]["content"]
    assert [m["content"] for m in msgs[1:]] == [
        "message 3",
        "echo: message 3",
        "message 4",
        "echo: message 4",
        "message 5",
        "echo: message 5",
    ]
    assert (await rig.db.require_session(parent))["end_reason"] == "compression"
    assert await rig.db.message_count(parent) == 12
    assert parent in {h["session_id"] for h in await rig.db.search_messages("zebras")}
    assert await rig.db.get_compression_tip(parent) == child
    assert await say(rig, dm("/compress")) == "Nothing to compress yet."


async def test_a_failed_compression_leaves_the_session_untouched(rig: RouterRig) -> None:
    for i in range(8):
        await say(rig, dm(f"m{i}"))
    before = current(rig)

    async def broken(history, focus):  # noqa: ANN001, ANN202
        raise RuntimeError("summariser down")

    rig.agent.summarize = broken  # type: ignore[method-assign]
    assert await say(rig, dm("/compress")) == "Compression failed; the session was left unchanged."
    assert current(rig) == before
    row = await rig.db.require_session(before)
    assert row["ended_at"] is None and row["message_count"] == 16
    assert await rig.db.get_children(before) == []


async def test_background_job_is_live_then_posts_its_result(rig: RouterRig) -> None:
    rig.agent.delay_on = {"slow job": 0.3}
    await say(rig, dm("hi"))
    assert (
        await say(rig, dm("/background slow job"))
        == "Started background job bg1; the result will be posted here."
    )
    status = await say(rig, dm("/status"))
    assert "Live jobs: bg1" in status
    await rig.outbox.wait(len(rig.outbox.sent) + 1)
    assert rig.outbox.sent[-1].text == "Background job bg1 finished:\necho: slow job"
    assert rig.router.live_jobs(current(rig)) == []
    contents = [m["content"] for m in await rig.db.get_messages(current(rig))]
    assert contents[-2:] == ["[background bg1] slow job", "echo: slow job"]


async def test_sethome_records_the_chat_and_thread(rig: RouterRig) -> None:
    reply = await say(rig, group("/sethome", user="1", chat="-100", thread="77"))
    assert reply == "Home channel for telegram set to thread 77 of this chat."
    home = json.loads(await rig.db.get_meta("home_channel.telegram") or "{}")
    assert (home["chat_id"], home["thread_id"]) == ("-100", "77")


async def test_unknown_commands_get_one_line_and_no_turn(rig: RouterRig) -> None:
    assert await say(rig, dm("/nope")) == "Unknown command /nope. Send /help for the list."
    help_text = await say(rig, dm("/help"))
    for name in (
        "/new",
        "/title",
        "/resume",
        "/sessions",
        "/search",
        "/branch",
        "/compress",
        "/background",
        "/sethome",
        "/status",
    ):
        assert name in help_text
    assert await rig.db.message_count() == 0


async def test_admins_may_resume_across_chats_only_when_they_ask(rig: RouterRig) -> None:
    rig.router.settings = RouterSettings(
        access={"telegram": AccessRules(allow_all=True, admins=frozenset({"99"}))}
    )
    await say(rig, dm("/title private of 42"))
    target = current(rig)
    assert "No session found" in await say(rig, dm("/resume private of 42", chat="99"))
    assert "Only admins" in await say(rig, dm("/resume --any private of 42", chat="5"))
    assert (await say(rig, dm("/resume --any private of 42", chat="99"))).startswith(
        "Resumed private of 42"
    )
    assert current(rig, "agent:main:telegram:dm:99") == target
