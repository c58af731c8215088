"""The Teams adapter's own parts against the loopback Bot Framework fake: the JWT verifier's
key cache (fetched once, refreshed on an unknown kid, never in a storm), the bot token's
cache and refresh, and the config rules of the section."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.adapters.teams import TeamsAdapter
from gateway.adapters.teams_auth import BotFrameworkAuth, TokenRefused
from gateway.adapters.teams_connector import BotToken, Connector
from gateway.config import load_config
from gateway.errors import ConfigError, InvalidToken, TransientError
from gateway.handoff import configured_home
from gateway.messages import OutboundMessage
from tests.daemon import free_port
from tests.fakes.teams import APP_ID, PASSWORD, FakeTeams


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    server = FakeTeams()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_keys_are_fetched_once_then_refreshed_for_a_rotated_key(fake: FakeTeams) -> None:
    auth = BotFrameworkAuth(APP_ID, fake.metadata_url, refresh_floor_s=0)
    act = fake.activity("hi")
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            verified = await auth.verify(f"Bearer {fake.token_for(act)}", http)
        assert fake.key_fetches == 1 and verified.claims["aud"] == APP_ID
        BotFrameworkAuth.check_activity(verified, act)
        fake.rotate_key()  # Microsoft publishes a new key and signs with it
        verified = await auth.verify(f"Bearer {fake.token_for(act)}", http)
        assert fake.key_fetches == 2 and verified.endorsements == frozenset({"msteams"})


async def test_unknown_kids_cannot_force_a_fetch_storm(fake: FakeTeams) -> None:
    from tests.fakes.teams import _rsa

    auth = BotFrameworkAuth(APP_ID, fake.metadata_url, refresh_floor_s=60)
    act = fake.activity("hi")
    async with aiohttp.ClientSession() as http:
        await auth.verify(f"Bearer {fake.token_for(act)}", http)
        for i in range(5):
            with pytest.raises(TokenRefused) as refused:
                await auth.verify(f"Bearer {fake.token_for(act, key=_rsa(), kid=f'k{i}')}", http)
            assert refused.value.status == 401
    assert fake.key_fetches == 1


async def test_unreachable_keys_are_a_transient_error_not_a_refusal() -> None:
    auth = BotFrameworkAuth(APP_ID, f"http://127.0.0.1:{free_port()}/meta")
    fake = FakeTeams()  # only to sign a token; not started
    async with aiohttp.ClientSession() as http:
        with pytest.raises(TransientError, match="signing keys"):
            await auth.verify(f"Bearer {fake.token_for(fake.activity('x'))}", http)


async def test_the_bot_token_is_cached_and_fetched_again_when_the_connector_refuses_it(
    fake: FakeTeams,
) -> None:
    async with aiohttp.ClientSession() as http:
        token = BotToken(http, fake.token_url, APP_ID, PASSWORD)
        connector = Connector(http, token)
        await connector.post_activity(fake.service_url, "a:1", {"type": "message", "text": "1"})
        await connector.post_activity(fake.service_url, "a:1", {"type": "message", "text": "2"})
        assert len(fake.token_requests()) == 1
        fake.tokens.clear()  # the Connector no longer takes the cached token (revoked)
        sent = await connector.post_activity(
            fake.service_url, "a:1", {"type": "message", "text": "3"}
        )
        assert sent["id"] and len(fake.token_requests()) == 2
        assert [p["text"] for p in fake.posted()] == ["1", "2", "3", "3"]  # one refused, then sent


async def test_a_token_endpoint_refusal_is_invalid_token_and_a_429_waits(fake: FakeTeams) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(InvalidToken, match="invalid_client"):
            await BotToken(http, fake.token_url, APP_ID, "nope").get()
        fake.fail_next("token", 429, {"Retry-After": "1"})
        connector = Connector(http, BotToken(http, fake.token_url, APP_ID, PASSWORD))
        await connector.post_activity(fake.service_url, "a:1", {"type": "message", "text": "x"})
        assert len(fake.token_requests()) == 3 and len(fake.posted()) == 1


async def test_create_thread_in_a_group_chat_is_none_and_in_a_channel_a_root_id(
    fake: FakeTeams,
) -> None:
    adapter = TeamsAdapter(
        APP_ID,
        PASSWORD,
        metadata_url=fake.metadata_url,
        token_url=fake.token_url,
        service_url=fake.service_url,
    )

    async def emit(msg: object) -> None:
        return None

    await adapter.start(emit)
    try:
        assert await adapter.create_thread("19:group@thread.v2", "x") is None
        ref = await adapter.create_thread("19:chan@thread.tacv2", "a topic")
        assert ref is not None and ref.thread_id.isdigit() and ref.chat_id == "19:chan@thread.tacv2"
        await adapter.send(OutboundMessage("teams", ref.chat_id, "in it", thread_id=ref.thread_id))
        [post] = fake.posted()
        assert post["_conversation"] == f"19:chan@thread.tacv2;messageid={ref.thread_id}"
    finally:
        await adapter.stop()


def test_a_home_channel_is_a_teams_conversation_id() -> None:
    assert configured_home("teams", "19:abc@thread.tacv2") == {
        "chat_id": "19:abc@thread.tacv2",
        "thread_id": None,
        "chat_type": "group",
    }
    assert configured_home("teams", "19:abc@thread.tacv2;messageid=17")["thread_id"] == "17"  # type: ignore[index]
    assert configured_home("teams", "a:1xyz")["chat_type"] == "dm"  # type: ignore[index]


def test_the_section_needs_the_api_server_and_both_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  teams:\n    enabled: true\n    allow_all_users: true\n"
        "    home_channel: '19:abc@thread.tacv2;messageid=1'\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"TEAMS_APP_PASSWORD": "changeme"})
    found = {e.key: e.problem for e in err.value.all()}
    assert set(found) == {
        "platforms.teams.enabled",
        "platforms.teams.token_env",
        "platforms.teams.app_id_env",
    }
    assert "enable platforms.api" in found["platforms.teams.enabled"]
    assert "placeholder" in found["platforms.teams.token_env"]
    assert found["platforms.teams.app_id_env"].startswith("TEAMS_APP_ID is not set")


async def test_a_password_revoked_while_running_stops_the_adapter(
    fake: FakeTeams, caplog: pytest.LogCaptureFixture
) -> None:
    from gateway.errors import AdapterError

    adapter = TeamsAdapter(
        APP_ID,
        PASSWORD,
        metadata_url=fake.metadata_url,
        token_url=fake.token_url,
        service_url=fake.service_url,
    )

    async def emit(msg: object) -> None:
        return None

    await adapter.start(emit)
    try:
        fake.password, fake.tokens = "rotated-by-an-admin", set()  # the old secret is revoked
        with pytest.raises(AdapterError, match="refused the app id or password"):
            await adapter.send(OutboundMessage("teams", "a:1personal", "hello?"))
        assert adapter.health()["state"] == "failed: invalid app password"
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == [
            "teams: the token endpoint refused the app id or password "
            "(invalid_client); the adapter is stopped"
        ]
    finally:
        await adapter.stop()
