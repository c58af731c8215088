"""Isolation through the discord.py library: one user's titled session, its id and its contents
are out of reach from another user's DM, by /resume (title, id, prefix), /search and /sessions.
(Telegram groups are in test_isolation.py; the full matrix is tests/gateway/test_access.py.)"""

from __future__ import annotations

from gateway.app import Gateway
from tests.fakes.discord import FakeDiscord
from tests.gateway.test_discord import fake, gw  # noqa: F401 - the daemon + fake fixtures

ANN, BOB = "500000000000000001", "500000000000000002"
ANN_DM, BOB_DM = "600000000000000001", "600000000000000002"


async def test_discord_users_cannot_reach_each_others_sessions(
    gw: Gateway,  # noqa: F811
    fake: FakeDiscord,  # noqa: F811
) -> None:
    async def say(text: str, user: str, channel: str) -> str:
        n = len(fake.posted())
        await fake.dispatch("MESSAGE_CREATE", fake.message(text, channel, user=user, guild=False))
        return str((await fake.wait_posted(n + 1))[n]["content"])

    await fake.wait_connected()
    assert await say("/title discord secrets", ANN, ANN_DM) == "Title set: discord secrets"
    await say("the vault code is 4711", ANN, ANN_DM)
    assert gw.index is not None
    sid = gw.index.get(f"agent:main:discord:dm:{ANN_DM}").session_id  # type: ignore[union-attr]
    for ref in ("discord secrets", sid, sid[:-2]):
        assert (await say(f"/resume {ref}", BOB, BOB_DM)).startswith("No session found"), ref
    assert await say("/search vault", BOB, BOB_DM) == "Nothing found."
    assert "discord secrets" not in await say("/sessions", BOB, BOB_DM)
    assert (await say("/search vault", ANN, ANN_DM)).startswith("1. discord secrets")
