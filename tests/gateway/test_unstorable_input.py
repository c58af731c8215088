"""A value PostgreSQL refuses as data can never be stored, however often it is sent: the
HTTP API answers 400 `unstorable_input` for it (never 503 "try again"), stores nothing of
it, and the chat goes on. A trigger that raises PostgreSQL's own data exception
(22021, character_not_in_repertoire, what a NUL in text raises) stands in for such a value,
on both of the router's paths: a chat's first message (inbox, then the turn's begin) and a
later one (both in one commit)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psycopg
import pytest

from gateway.app import Gateway
from gateway.config import load_config
from tests import pgserver
from tests.fakes.webhook_receiver import SECRET, post_signed

REFUSE = """
CREATE FUNCTION refuse_doomed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.content = 'doomed' THEN
        RAISE EXCEPTION 'doomed text' USING ERRCODE = 'character_not_in_repertoire';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_doomed BEFORE INSERT ON messages
    FOR EACH ROW EXECUTE FUNCTION refuse_doomed();
"""


@pytest.fixture
async def gw(tmp_path: Path, pg_server: str) -> AsyncIterator[tuple[Gateway, str]]:
    schema = pgserver.fresh_schema(pg_server)
    dsn = pgserver.with_schema(pg_server, schema)
    (tmp_path / "config.yaml").write_text(
        "platforms:\n  api:\n    port: 0\n  webhook:\n    enabled: true\n    allow_all_users: true\n"
        "    endpoints:\n      ci:\n        secret_env: SB_HOOK_SECRET\n"
        "state:\n  backend: postgres\n  dsn_env: SB_DSN\n"
    )
    env = {"SB_DSN": dsn, "SB_HOOK_SECRET": SECRET}
    gateway = Gateway(config=load_config(tmp_path / "config.yaml", env), home=tmp_path / "home")
    await gateway.start()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(REFUSE)
    api = next(a for a in gateway.adapters if a.platform == "api")
    try:
        yield gateway, f"http://127.0.0.1:{api.bound_port}"  # type: ignore[attr-defined]
    finally:
        await gateway.stop()
        pgserver.drop_schema(pg_server, schema)


async def _say(http: aiohttp.ClientSession, url: str, chat: str, text: str) -> tuple[int, dict]:
    async with http.post(f"{url}/v1/messages", json={"chat_id": chat, "text": text}) as resp:
        return resp.status, await resp.json()


async def test_a_value_the_database_refuses_as_data_is_answered_400_not_503(
    gw: tuple[Gateway, str],
) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        first = await _say(http, url, "new-chat", "doomed")  # inbox, then the turn's begin
        hello = await _say(http, url, "chat", "hello")
        assert hello[0] == 200 and hello[1]["reply"] == "echo: hello"
        later = await _say(http, url, "chat", "doomed")  # inbox and begin in one commit
        after = await _say(http, url, "chat", "still here")
    for status, body in (first, later):
        assert status == 400, body
        assert body["error"]["code"] == "unstorable_input"
    assert after[0] == 200 and after[1]["reply"] == "echo: still here"
    assert gateway.db is not None
    contents = [
        m["content"]
        for s in await gateway.db.list_sessions("api", limit=50)
        for m in await gateway.db.get_messages(s["id"])
    ]
    assert "doomed" not in contents


async def test_the_signed_webhook_answers_400_for_it_too(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    status, body = await post_signed(
        f"{url}/webhooks/ci", {"id": "1", "user": "ann", "text": "doomed"}
    )
    assert status == 400, body
    status, body = await post_signed(
        f"{url}/webhooks/ci", {"id": "2", "user": "ann", "text": "fine"}
    )
    assert status == 200 and body["reply"] == "echo: fine"


async def test_an_id_too_long_for_the_databases_index_is_answered_400_not_503(
    gw: tuple[Gateway, str],
) -> None:
    """A message id past what a btree index row holds (about 2,700 bytes) fails the same
    way every time: PostgreSQL's program_limit_exceeded, an OperationalError on a live
    connection, is refused as data, never taken for a lost connection and answered 503."""
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/v1/messages",
            json={
                "chat_id": "c",
                "text": "a long id",
                "message_id": secrets.token_hex(10_000),
            },
        ) as resp:
            status, body = resp.status, await resp.json()
        after = await _say(http, url, "c", "still here")
    assert status == 400, body
    assert body["error"]["code"] == "unstorable_input"
    assert after[0] == 200 and after[1]["reply"] == "echo: still here"
