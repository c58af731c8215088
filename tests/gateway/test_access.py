"""The access matrix: which chat may reach which session, by title, id or prefix.

Every cell is checked three ways: the predicate (`may_access`), the SQL scope used by
listings and searches, and resolution of title / id / 12-character prefix."""

from __future__ import annotations

import pytest

from gateway import access
from gateway.messages import InboundMessage
from gateway.pipeline import RouterSettings
from gateway.session_keys import KeySettings, SessionSource, build_key

from .conftest import RouterRig

S = SessionSource
OWNERS = {
    "tg_dm_42": S("telegram", "42", "dm", "42", "Ann"),
    "tg_group_u1": S("telegram", "-100", "group", "u1", "Ann"),
    "tg_thread_77": S("telegram", "-100", "group", "u1", "Ann", thread_id="77"),
    "slack_chan_u1": S("slack", "C1", "channel", "u1", "Ann"),
    "dc_dm_42": S("discord", "42", "dm", "42", "Ann"),
}
ACTORS = {
    "tg_dm_42": S("telegram", "42", "dm", "42", "Ann"),
    "tg_dm_43": S("telegram", "43", "dm", "43", "Bob"),
    "tg_group_u1": S("telegram", "-100", "group", "u1", "Ann"),
    "tg_group_u2": S("telegram", "-100", "group", "u2", "Bob"),
    "tg_thread_77_u2": S("telegram", "-100", "group", "u2", "Bob", thread_id="77"),
    "tg_thread_88_u1": S("telegram", "-100", "group", "u1", "Ann", thread_id="88"),
    "slack_chan_u1": S("slack", "C1", "channel", "u1", "Ann"),
    "slack_chan_u2": S("slack", "C1", "channel", "u2", "Bob"),
    "dc_dm_42": S("discord", "42", "dm", "42", "Ann"),
}
# (actor, owner) pairs that may reach each other; every other cell must not.
VISIBLE = {
    ("tg_dm_42", "tg_dm_42"),
    ("tg_group_u1", "tg_group_u1"),
    ("tg_thread_77_u2", "tg_thread_77"),  # a shared thread: its members share
    ("slack_chan_u1", "slack_chan_u1"),
    ("dc_dm_42", "dc_dm_42"),
}
CELLS = [(a, o) for a in ACTORS for o in OWNERS]


@pytest.fixture
async def owned(rig: RouterRig) -> dict[str, str]:
    rig.router.settings = RouterSettings(access={})
    ids = {}
    for name, src in OWNERS.items():
        await rig.router.handle(InboundMessage(src, f"/title secret {name}"))
        await rig.outbox.wait(len(ids) + 1)
        ids[name] = rig.index.get(build_key(src).format()).session_id  # type: ignore[union-attr]
    await rig.router.drain(5)
    return ids


@pytest.mark.parametrize("actor, owner", CELLS)
async def test_access_matrix(rig: RouterRig, owned: dict[str, str], actor: str, owner: str) -> None:
    key = build_key(ACTORS[actor], KeySettings())
    sid = owned[owner]
    expected = (actor, owner) in VISIBLE
    row = await rig.db.require_session(sid)
    assert access.may_access(row, key) is expected
    flt = access.scope(key)
    listed = {r["id"] for r in await rig.db.list_filtered(flt, limit=100)}
    assert (sid in listed) is expected
    for ref in (f"secret {owner}", sid, sid[:-2]):  # title, id, a prefix of it
        got = await rig.db.resolve_in_scope(ref, flt)
        assert (got == sid) is expected, ref
        if not expected:
            assert got is None
    await rig.db.append_message(sid, "user", f"matrix probe {owner}")
    found = {h["session_id"] for h in await rig.db.search_messages("matrix probe", scope=flt)}
    assert (sid in found) is expected


async def test_never_routed_sessions_are_not_reachable_from_a_chat(rig: RouterRig) -> None:
    sid = await rig.db.create_session(
        source="telegram", chat_id="42", user_id="42", title="made by a script"
    )
    key = build_key(ACTORS["tg_dm_42"])
    assert access.may_access(await rig.db.require_session(sid), key) is False
    assert await rig.db.resolve_in_scope("made by a script", access.scope(key)) is None


async def test_a_group_member_cannot_reach_anothers_session_through_commands(
    rig: RouterRig,
) -> None:
    ann = S("telegram", "-100", "group", "u1", "Ann")
    bob = S("telegram", "-100", "group", "u2", "Bob")

    async def say(src: SessionSource, text: str) -> str:
        n = len(rig.outbox.sent)
        await rig.router.handle(InboundMessage(src, text))
        await rig.outbox.wait(n + 1)
        return rig.outbox.sent[n].text

    await say(ann, "/title ann's plans")
    await say(ann, "the password is swordfish")
    ann_sid = rig.index.get(build_key(ann).format()).session_id  # type: ignore[union-attr]
    for ref in ("ann's plans", ann_sid, ann_sid[:-2]):
        assert (await say(bob, f"/resume {ref}")).startswith("No session found"), ref
    assert "Nothing found" in await say(bob, "/search swordfish")
    assert "ann" not in (await say(bob, "/sessions")).lower()
    assert "No titled sessions" in await say(bob, "/resume")
    # and Ann, in the same group, can
    await say(ann, "/new")
    assert (await say(ann, f"/resume {ann_sid[:-2]}")).startswith("Resumed ann's plans")


async def test_search_results_stay_inside_the_scope(rig: RouterRig, owned: dict[str, str]) -> None:
    for name, sid in owned.items():
        await rig.db.append_message(sid, "user", f"needle from {name}")
    for actor, src in ACTORS.items():
        found = {
            h["session_id"]
            for h in await rig.db.search_messages("needle", scope=access.scope(build_key(src)))
        }
        assert found == {owned[o] for a, o in VISIBLE if a == actor}, actor
