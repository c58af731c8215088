"""Isolation through the slack_sdk / Events API library: one user's titled session, its id and its contents
are out of reach from another user's DM, by /resume (title, id, prefix), /search and /sessions.
(Telegram groups are in test_isolation.py; the full matrix is tests/gateway/test_access.py.)"""

from __future__ import annotations

import itertools

from gateway.app import Gateway
from tests.fakes.slack import FakeSlack, event
from tests.gateway.test_slack import _post, fake, gw, msg  # noqa: F401 - fixtures and helpers


async def test_slack_users_cannot_reach_each_others_sessions(
    gw: tuple[Gateway, str],  # noqa: F811
    fake: FakeSlack,  # noqa: F811
) -> None:
    gateway, url = gw
    ids = itertools.count(1)

    async def say(text: str, user: str, channel: str) -> str:
        n = len(fake.posted())
        i = next(ids)
        ts = f"1700000{i:03d}.000100"
        assert await _post(url, event(msg(text, channel, user, ts), event_id=f"Ev{i}")) == 200
        return str((await fake.wait_posted(n + 1))[n]["text"])

    assert await say("/title slack secrets", "U1", "D0ANN") == "Title set: slack secrets"
    await say("the vault code is 4711", "U1", "D0ANN")
    assert gateway.index is not None
    sid = gateway.index.get("agent:main:slack:dm:D0ANN").session_id  # type: ignore[union-attr]
    for ref in ("slack secrets", sid, sid[:-2]):
        assert (await say(f"/resume {ref}", "U2", "D0BOB")).startswith("No session found"), ref
    assert await say("/search vault", "U2", "D0BOB") == "Nothing found."
    assert "slack secrets" not in await say("/sessions", "U2", "D0BOB")
    assert (await say("/search vault", "U1", "D0ANN")).startswith("1. slack secrets")
