"""Isolation through a real platform library: in a Telegram group with per-user sessions, no
member reaches another's session by title, id, prefix or search; strangers get nothing from
the agent and nothing is stored for them. (The full access matrix is tests/gateway/test_access.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.telegram import TelegramAdapter
from gateway.adapters.telegram_polling import readable
from gateway.app import Gateway
from gateway.pipeline import REFUSAL
from tests.fakes import wait_for_count
from tests.fakes.telegram import FakeTelegram
from tests.inprocess import gateway_with_telegram


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeTelegram]]:
    async with gateway_with_telegram(tmp_path, "allowed_users: [1, 2]") as running:
        yield running


async def _say(fake: FakeTelegram, text: str, user: int, chat: dict) -> str:
    n = len(fake.sent())
    fake.push(fake.message(text, chat, user_id=user, name=f"u{user}"))
    return str((await fake.wait_sent(n + 1))[n]["text"])


async def test_members_of_a_group_cannot_reach_each_others_sessions(
    gw: tuple[Gateway, FakeTelegram],
) -> None:
    gateway, fake = gw
    group = fake.group_chat(-100500)
    assert await _say(fake, "/title alpha secrets", 1, group) == "Title set: alpha secrets"
    await _say(fake, "@switchboard_bot the vault code is 4711", 1, group)
    assert gateway.index is not None
    sid = gateway.index.get("agent:main:telegram:group:-100500:1").session_id  # type: ignore[union-attr]
    for ref in ("alpha secrets", sid, sid[:-2]):
        assert (await _say(fake, f"/resume {ref}", 2, group)).startswith("No session found"), ref
    assert await _say(fake, "/search vault", 2, group) == "Nothing found."
    assert "alpha" not in await _say(fake, "/sessions", 2, group)
    assert (await _say(fake, "/search vault", 1, group)).startswith("1. alpha secrets")


async def test_strangers_get_one_refusal_and_nothing_is_stored(
    gw: tuple[Gateway, FakeTelegram],
) -> None:
    gateway, fake = gw
    assert await _say(fake, "let me in", 9, fake.dm_chat(9)) == REFUSAL
    fake.push(fake.message("please", fake.dm_chat(9), user_id=9))
    fake.push(fake.message("@switchboard_bot hello", fake.group_chat(-100600), user_id=9))
    await _say(fake, "hi", 1, fake.dm_chat(1))  # a member's message still comes through after them
    assert [s["text"] for s in fake.sent()].count(REFUSAL) == 1
    assert gateway.db is not None
    assert {r["user_id"] for r in await gateway.db.list_sessions(include_children=True)} == {"1"}


async def test_poison_updates_are_passed_over_and_the_next_message_is_answered(
    gw: tuple[Gateway, FakeTelegram],
) -> None:
    """Updates python-telegram-bot could not parse (a batch of them failed whole there):
    each is ignored on its own, the offset moves past it, and nothing of it is stored."""
    gateway, fake = gw
    poison = [
        {"message": 42},
        {"message": {"message_id": 1, "chat": "not a chat", "text": "x"}},
        {"message": {"message_id": 2, "date": "soon", "chat": {"id": 1}, "text": ["x"]}},
        {"edited_message": None},
    ]
    for body in poison:
        fake.push_raw(body)
    assert await _say(fake, "still here", 1, fake.dm_chat(1)) == "echo: still here"
    assert [s["text"] for s in fake.sent()] == ["echo: still here"]
    assert gateway.db is not None
    sessions = await gateway.db.list_sessions(include_children=True)
    assert [s["message_count"] for s in sessions] == [2]


async def test_a_getupdates_answer_that_is_not_a_list_is_waited_out(
    gw: tuple[Gateway, FakeTelegram],
) -> None:
    gateway, fake = gw
    adapter = next(a for a in gateway.adapters if isinstance(a, TelegramAdapter))
    fake.answer_next("getUpdates", {"not": "a list"})
    await _say(fake, "wake the poll", 1, fake.dm_chat(1))  # the poll after it is answered so
    await wait_for_count(
        lambda: [1] if adapter.health()["last_error"] == "not a list of updates" else [],
        1,
        10.0,
        "the odd answer noted",
    )
    assert await _say(fake, "after it", 1, fake.dm_chat(1)) == "echo: after it"


def test_a_getupdates_answer_keeps_the_updates_with_an_id() -> None:
    good = {"update_id": 2, "message": {"message_id": 1, "chat": {"id": 1}, "text": "x"}}
    junk = [{"update_id": "1"}, "junk", None, {"message": {}}]
    assert readable([*junk, good, {"update_id": 3}]) == [good, {"update_id": 3}]
    assert readable({"not": "a list"}) is None  # the poller backs off as from a server error
