"""Microsoft Teams through the whole daemon: activities signed like the Bot Connector's,
posted to the daemon's HTTP server, answered through the Connector REST API of a loopback
fake, with a real SQLite home."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from gateway.adapters.teams import TeamsAdapter, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.handoff import handoff_from_terminal
from gateway.messages import OutboundMessage
from tests.daemon import free_port
from tests.fakes import stalled_then_on_time, started, wait_for_count
from tests.fakes.teams import APP_ID, BOT_ID, PASSWORD, FakeTeams, _rsa
from tests.gateway.conftest import ScriptedAgent, refused_at_start

CHANNEL = "19:ops-channel@thread.tacv2"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTeams]:
    server = FakeTeams()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _config(tmp_path: Path, fake: FakeTeams, extra: str = "", base_url: str | None = None) -> Any:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  teams:\n    enabled: true\n    allow_all_users: true\n"
        f"    openid_metadata_url: {fake.metadata_url}\n    token_url: {fake.token_url}\n"
        f"    base_url: {base_url or fake.service_url}\n{extra}"
    )
    return load_config(cfg, {"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": PASSWORD})


class Daemon:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        api = next(a for a in gateway.adapters if a.platform == "api")
        self.url = f"http://127.0.0.1:{api.bound_port}/teams/messages"  # type: ignore[attr-defined]
        self.adapter = next(a for a in gateway.adapters if isinstance(a, TeamsAdapter))

    def key(self, key: str) -> Any:
        assert self.gateway.index is not None
        return self.gateway.index.get(key)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeTeams) -> AsyncIterator[Daemon]:
    gateway = Gateway(config=_config(tmp_path, fake), home=tmp_path / "home")
    await gateway.start()
    try:
        yield Daemon(gateway)
    finally:
        await gateway.stop()


async def test_an_activity_with_a_token_shaped_like_the_connectors_is_accepted_and_answered(
    gw: Daemon, fake: FakeTeams
) -> None:
    """The Bot Connector's token: RS256 with typ, kid and x5t headers; exactly the claims
    serviceurl (lowercase), nbf, exp, iss (https://api.botframework.com) and aud (app id)."""
    act = fake.activity("hello from teams")
    now = int(time.time())
    claims = {
        "serviceurl": act["serviceUrl"],
        "nbf": now - 300,
        "exp": now + 3600,
        "iss": "https://api.botframework.com",
        "aud": APP_ID,
    }
    token = jwt.encode(
        claims,
        fake.key,
        algorithm="RS256",
        headers={"typ": "JWT", "kid": fake.kid, "x5t": fake.kid},
    )
    assert jwt.get_unverified_header(token) == {
        "alg": "RS256",
        "typ": "JWT",
        "kid": fake.kid,
        "x5t": fake.kid,
    }
    assert await fake.deliver(gw.url, act, token) == 200
    [reply] = await fake.wait_posted(1)
    assert reply["text"] == "echo: hello from teams"


async def test_a_personal_chat_is_a_dm_answered_as_a_reply_with_typing_first(
    tmp_path: Path, fake: FakeTeams
) -> None:
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 0.5
    gateway = Gateway(config=_config(tmp_path, fake), home=tmp_path / "home", agent=agent)
    await gateway.start()
    try:
        d = Daemon(gateway)
        act = fake.activity("a slow hello")
        assert await fake.deliver(d.url, act) == 200
        [reply] = await fake.wait_posted(1)
        assert (reply["_conversation"], reply["_reply_to"]) == ("a:1personal", act["id"])
        assert (reply["text"], reply["textFormat"]) == ("echo: a slow hello", "markdown")
        [typing, *_] = fake.posted("typing")
        assert typing["_conversation"] == "a:1personal"
        paths = [p for k, p, b in fake.calls if k == "activity" and b["type"] == "message"]
        assert paths == [f"/amer/v3/conversations/a%3A1personal/activities/{act['id']}"]
        order = [b["type"] for k, _p, b in fake.calls if k == "activity"]
        assert order.index("typing") < order.index("message")
        entry = d.key("agent:main:teams:dm:a%3A1personal")
        assert entry is not None
        assert gateway.db is not None
        session = await gateway.db.get_session(entry.session_id)
        assert (
            session is not None and session["user_id"] == "aad-ann"
        )  # the Entra object id, stable across bots
    finally:
        await gateway.stop()


async def test_in_a_group_chat_only_a_mention_of_the_bot_is_answered(
    gw: Daemon, fake: FakeTeams
) -> None:
    group = {"kind": "groupChat", "conversation": "19:group-chat@thread.v2"}
    assert await fake.deliver(gw.url, fake.activity("just people talking", **group)) == 200
    other = fake.activity(
        "<at>Bob</at> what do you think",
        **group,
        entities=[
            {
                "type": "mention",
                "text": "<at>Bob</at>",
                "mentioned": {"id": "29:1bob", "name": "Bob"},
            }
        ],
    )
    assert await fake.deliver(gw.url, other) == 200
    assert (
        await fake.deliver(gw.url, fake.activity("summarise please", mention=True, **group)) == 200
    )
    [reply] = await fake.wait_posted(1)
    assert reply["_conversation"] == "19:group-chat@thread.v2"
    assert reply["text"] == "echo: summarise please"  # <at>Switchboard</at> stripped
    await asyncio.sleep(0.3)
    assert len(fake.posted()) == 1
    assert gw.key("agent:main:teams:group:19%3Agroup-chat@thread.v2:aad-ann") is not None


async def test_a_channel_thread_is_one_session_shared_by_everyone_in_it(
    gw: Daemon, fake: FakeTeams
) -> None:
    root = fake.activity(
        "plan the release",
        kind="channel",
        conversation=CHANNEL + ";messageid=500",
        activity_id="500",
        mention=True,
    )
    assert await fake.deliver(gw.url, root) == 200
    [first] = await fake.wait_posted(1)
    assert first["_conversation"] == CHANNEL + ";messageid=500"
    assert first["text"] == "echo: [Ann] plan the release"
    reply = fake.activity(
        "and the changelog",
        kind="channel",
        conversation=CHANNEL + ";messageid=500",
        activity_id="501",
        user="29:1bob",
        name="Bob",
        aad="aad-bob",
    )
    assert await fake.deliver(gw.url, reply) == 200  # no mention: the bot takes part here
    posts = await fake.wait_posted(2)
    assert posts[1]["_conversation"] == CHANNEL + ";messageid=500"
    assert posts[1]["text"] == "echo: [Bob] and the changelog"
    assert gw.key("agent:main:teams:channel:19%3Aops-channel@thread.tacv2:t=500") is not None
    elsewhere = fake.activity(
        "unrelated", kind="channel", conversation=CHANNEL + ";messageid=900", activity_id="901"
    )
    assert await fake.deliver(gw.url, elsewhere) == 200
    await asyncio.sleep(0.3)
    assert len(fake.posted()) == 2  # another thread, no mention: not for the bot


async def test_a_chat_command_is_answered_in_a_channel_thread(gw: Daemon, fake: FakeTeams) -> None:
    act = fake.activity(
        "/help",
        kind="channel",
        conversation=CHANNEL + ";messageid=700",
        activity_id="700",
        mention=True,
    )
    assert await fake.deliver(gw.url, act) == 200
    [reply] = await fake.wait_posted(1)
    assert "/status" in reply["text"] and reply["_conversation"] == CHANNEL + ";messageid=700"


async def test_a_redelivered_or_replayed_activity_is_answered_once(
    gw: Daemon, fake: FakeTeams
) -> None:
    act = fake.activity("once please", activity_id="1700000000999")
    token = fake.token_for(act)
    assert await fake.deliver(gw.url, act, token) == 200
    assert await fake.deliver(gw.url, act, token) == 200  # the very same request, replayed
    assert await fake.deliver(gw.url, dict(act)) == 200  # redelivered under a fresh token
    await fake.wait_posted(1)
    await asyncio.sleep(0.3)
    assert len(fake.posted()) == 1


def _alg_none(act: dict[str, Any], fake: FakeTeams) -> str:
    return jwt.encode(
        {
            "iss": "https://api.botframework.com",
            "aud": APP_ID,
            "exp": 4102444800,
            "serviceurl": act["serviceUrl"],
        },
        None,
        algorithm="none",
        headers={"kid": fake.kid},
    )


@pytest.mark.parametrize(
    ("case", "status"),
    [
        ("missing", 401),
        ("basic", 401),
        ("garbage", 401),
        ("forged", 401),  # our kid, someone else's key
        ("unknown_kid", 401),
        ("expired", 401),  # stale: past exp beyond the clock skew
        ("not_yet", 401),
        ("alg_none", 401),
        ("wrong_audience", 403),
        ("wrong_issuer", 403),
        ("service_url", 403),  # the activity points replies (and our token) elsewhere
        ("no_service_url", 403),
        ("not_endorsed", 403),
    ],
)
async def test_requests_that_fail_verification_are_refused_and_never_stored(
    gw: Daemon, fake: FakeTeams, case: str, status: int
) -> None:
    act = fake.activity(f"case {case}")
    tokens = {
        "forged": lambda: fake.token_for(act, key=_rsa()),
        "unknown_kid": lambda: fake.token_for(act, key=_rsa(), kid="someone-elses"),
        "expired": lambda: fake.token_for(act, age_s=7200),
        "not_yet": lambda: fake.token_for(act, nbf=int(__import__("time").time()) + 3600),
        "alg_none": lambda: _alg_none(act, fake),
        "wrong_audience": lambda: fake.token_for(act, aud="another-bot"),
        "wrong_issuer": lambda: fake.token_for(act, iss="https://sts.windows.net/x/"),
        "service_url": lambda: fake.token_for(act, serviceurl="https://evil.example/amer/"),
        "no_service_url": lambda: fake.token_for(act, serviceurl=None),
        "not_endorsed": lambda: fake.token_for({**act}),
    }
    auth = {"missing": "", "basic": "Basic dXNlcjpwYXNz", "garbage": "Bearer not.a.jwt"}
    if case == "not_endorsed":
        act["channelId"] = "webchat"  # the key is endorsed for msteams only
    if case in auth:
        got = await fake.deliver(gw.url, act, authorization=auth[case])
    else:
        got = await fake.deliver(gw.url, act, tokens[case]())
    assert got == status
    await asyncio.sleep(0.2)
    assert fake.posted() == [] and gw.key("agent:main:teams:dm:a%3A1personal") is None
    assert gw.gateway.db is not None and await gw.gateway.db.list_sessions() == []
    assert await gw.adapter._ref("a:1personal") is None  # not even the conversation reference


@pytest.mark.slow
async def test_a_rate_limit_is_waited_out_and_a_server_error_retried(
    gw: Daemon, fake: FakeTeams
) -> None:
    fake.fail_next("message", 429, {"Retry-After": "1"})
    fake.fail_next("message", 503)
    assert await fake.deliver(gw.url, fake.activity("patience")) == 200
    posts = await wait_for_count(
        lambda: [p for p in fake.posted() if not p.get("_failed")], 1, 20, "a delivered reply"
    )
    assert posts[0]["text"] == "echo: patience"
    assert sum(1 for p in fake.posted() if p.get("_failed")) == 2


async def test_replies_reach_a_conversation_after_a_restart(
    tmp_path: Path, fake: FakeTeams
) -> None:
    """Proactive messages use the stored conversation reference; the configured fallback
    service URL points nowhere, so only the stored one can work."""
    dead = f"http://127.0.0.1:{free_port()}/nowhere/"
    first = Gateway(config=_config(tmp_path, fake, base_url=dead), home=tmp_path / "home")
    await first.start()
    try:
        d = Daemon(first)
        assert await fake.deliver(d.url, fake.activity("remember me")) == 200
        thread = fake.activity(
            "and this thread",
            kind="channel",
            conversation=CHANNEL + ";messageid=42",
            activity_id="42",
            mention=True,
        )
        assert await fake.deliver(d.url, thread) == 200
        await fake.wait_posted(2)
    finally:
        await first.stop()
    second = Gateway(config=_config(tmp_path, fake, base_url=dead), home=tmp_path / "home")
    await second.start()
    try:
        d = Daemon(second)
        await d.adapter.send(OutboundMessage("teams", "a:1personal", "still here"))
        [_, _, proactive] = await fake.wait_posted(3)
        assert (proactive["_conversation"], proactive["_reply_to"], proactive["text"]) == (
            "a:1personal",
            None,
            "still here",
        )
        assert proactive["from"] == {"id": BOT_ID}
        later = fake.activity(
            "no mention needed",
            kind="channel",
            conversation=CHANNEL + ";messageid=42",
            activity_id="43",
            user="29:1bob",
            name="Bob",
            aad="aad-bob",
        )
        assert await fake.deliver(d.url, later) == 200  # a thread it answered in before the restart
        posts = await fake.wait_posted(4)
        assert (posts[3]["_conversation"], posts[3]["text"]) == (
            CHANNEL + ";messageid=42",
            "echo: [Bob] no mention needed",
        )
    finally:
        await second.stop()


async def test_handoff_opens_a_new_thread_in_the_home_channel_that_continues_the_session(
    tmp_path: Path, fake: FakeTeams
) -> None:
    cfg = _config(tmp_path, fake, extra=f"    home_channel: '{CHANNEL}'\n")
    gateway = Gateway(config=cfg, home=tmp_path / "home")
    await gateway.start()
    assert gateway.db is not None and gateway.handoffs is not None
    gateway.handoffs.poll_s = 0.05
    try:
        d = Daemon(gateway)
        assert await fake.deliver(d.url, fake.installed(CHANNEL)) == 200  # the bot joins the team
        sid = await gateway.db.create_session(source="cli", title="deploy plan")
        await gateway.db.append_messages(sid, [{"role": "user", "content": "migrate the database"}])
        ok, message = await asyncio.wait_for(
            handoff_from_terminal(gateway.db, sid, "teams", enabled=True, configured_home=CHANNEL),
            30,
        )
        assert ok, message
        [created] = fake.created()
        assert created["isGroup"] is True and created["channelData"]["channel"]["id"] == CHANNEL
        assert created["channelData"]["tenant"]["id"] == created["tenantId"]
        assert created["activity"]["text"] == "deploy plan"
        [confirm] = await fake.wait_posted(1)
        conv = confirm["_conversation"]
        assert conv.startswith(CHANNEL + ";messageid=") and "Continuing here" in confirm["text"]
        root = conv.split("=")[-1]
        follow = fake.activity(
            "carry on",
            kind="channel",
            conversation=conv,
            activity_id="9001",
            user="29:1bob",
            name="Bob",
            aad="aad-bob",
        )
        assert await fake.deliver(d.url, follow) == 200  # no mention needed in the bot's thread
        posts = await fake.wait_posted(2)
        assert posts[1]["_conversation"] == conv
        contents = [m["content"] for m in await gateway.db.get_messages(sid)]
        assert contents[-2:] == ["[Bob] carry on", "echo: [Bob] carry on"]  # the same session
        assert d.key(f"agent:main:teams:channel:19%3Aops-channel@thread.tacv2:t={root}") is not None
    finally:
        await gateway.stop()


async def test_a_refused_app_password_stops_the_adapter_with_one_clear_line(
    tmp_path: Path, fake: FakeTeams, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  teams:\n    enabled: true\n    allow_all_users: true\n"
        f"    openid_metadata_url: {fake.metadata_url}\n    token_url: {fake.token_url}\n"
    )
    config = load_config(cfg, {"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": "wrong-password"})
    gateway = Gateway(config=config, home=tmp_path / "home")
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "teams",
            "rejected the bot's app id or password",
            ["platforms.teams.token_env", "platforms.teams.app_id_env"],
        )
    finally:
        await gateway.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "gateway.adapters.teams"]
    assert lines == [
        "teams: the token endpoint refused the app id or password (invalid_client); the adapter is stopped"
    ]
    assert len(fake.token_requests()) == 1  # refused for good: not retried


async def test_the_bot_token_is_fetched_once_and_reused(gw: Daemon, fake: FakeTeams) -> None:
    for i in range(3):
        assert await fake.deliver(gw.url, fake.activity(f"message {i}")) == 200
    await fake.wait_posted(3)
    assert len(fake.token_requests()) == 1
    form = fake.token_requests()[0]
    assert (form["client_id"], form["scope"]) == (APP_ID, "https://api.botframework.com/.default")


async def test_a_long_answer_is_split_under_the_activity_size_limit(
    gw: Daemon, fake: FakeTeams
) -> None:
    text = "\n\n".join("é" * 900 + f" paragraph {i}" for i in range(40))  # ~73 KB of UTF-16
    await gw.adapter.send(OutboundMessage("teams", "a:1personal", text))
    posts = fake.posted()
    assert len(posts) >= 3 and all(len(p["text"].encode("utf-16-le")) <= 24_000 for p in posts)
    assert "".join(p["text"] for p in posts).replace("\n", "") == text.replace("\n", "")


async def test_a_teams_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeTeams,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its Connector request left. Once the request has its connection it
    finds its SEND_BY passed and stops unsent (SetOutLate), so the turn can ask its lease
    first (gateway/turns.py's send_checked). On time, it is posted once."""
    adapter = TeamsAdapter(
        APP_ID,
        PASSWORD,
        metadata_url=fake.metadata_url,
        token_url=fake.token_url,
        service_url=fake.service_url,
    )

    fake.keep_alive = False  # each call connects: the send waits for its connection
    async with started(adapter):  # the bot token is fetched here, before the sends
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("teams", "a:1personal", "once")),
            lambda: [p["text"] for p in fake.posted()],
        )


async def test_an_activity_the_gateway_could_not_store_is_answered_503_and_taken_again(
    fake: FakeTeams,
) -> None:
    """Inbox before ack: NotAccepted from emit is a 503 (the Bot Framework sends it again),
    and the redelivery is not mistaken for a duplicate."""
    from gateway.adapters.api import ApiAdapter
    from gateway.errors import NotAccepted
    from gateway.messages import InboundMessage

    taken: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        if not taken and not getattr(emit, "refused", False):
            emit.refused = True  # type: ignore[attr-defined]
            raise NotAccepted("the store is full")
        taken.append(msg)

    adapter = TeamsAdapter(
        APP_ID,
        PASSWORD,
        metadata_url=fake.metadata_url,
        token_url=fake.token_url,
        service_url=fake.service_url,
    )
    api = ApiAdapter(port=0, routes=dict(adapter.routes()))
    await adapter.start(emit)
    await api.start(emit)
    try:
        url = f"http://127.0.0.1:{api.bound_port}/teams/messages"
        act = fake.activity("keep me", activity_id="77")
        assert await fake.deliver(url, act) == 503
        assert await fake.deliver(url, act) == 200
        assert await fake.deliver(url, act) == 200  # now a duplicate: not emitted again
        assert [m.text for m in taken] == ["keep me"]
    finally:
        await api.stop()
        await adapter.stop()


# --- pure translation, on recorded activities -----------------------------------------------

RECORDED_CHANNEL_REPLY = {
    "text": "<at>Switchboard</at> can you ask <at>Bob Lee</at>?\n",
    "textFormat": "plain",
    "type": "message",
    "timestamp": "2026-11-30T09:15:02.123Z",
    "id": "1764494102123",
    "channelId": "msteams",
    "serviceUrl": "https://smba.trafficmanager.net/amer/",
    "from": {"id": "29:1ann", "name": "Ann Ito", "aadObjectId": "aad-ann"},
    "conversation": {
        "isGroup": True,
        "conversationType": "channel",
        "tenantId": "t1",
        "id": "19:abc@thread.tacv2;messageid=1764494000000",
    },
    "recipient": {"id": BOT_ID, "name": "Switchboard"},
    "entities": [
        {
            "mentioned": {"id": BOT_ID, "name": "Switchboard"},
            "text": "<at>Switchboard</at>",
            "type": "mention",
        },
        {
            "mentioned": {"id": "29:1bob", "name": "Bob Lee"},
            "text": "<at>Bob Lee</at>",
            "type": "mention",
        },
        {"locale": "en-US", "country": "US", "platform": "Web", "type": "clientInfo"},
    ],
    "channelData": {
        "teamsChannelId": "19:abc@thread.tacv2",
        "teamsTeamId": "19:team@thread.tacv2",
        "channel": {"id": "19:abc@thread.tacv2"},
        "team": {"id": "19:team@thread.tacv2"},
        "tenant": {"id": "t1"},
    },
    "replyToId": "1764494000000",
    "locale": "en-US",
}


def test_a_recorded_channel_reply_becomes_a_shared_channel_thread_message() -> None:
    msg = to_inbound(RECORDED_CHANNEL_REPLY, {BOT_ID})
    assert msg is not None and msg.mentioned
    src = msg.source
    assert (src.chat_id, src.chat_type, src.thread_id) == (
        "19:abc@thread.tacv2",
        "channel",
        "1764494000000",
    )
    assert (src.user_id, src.user_name, msg.text) == ("aad-ann", "Ann Ito", "can you ask @Bob Lee?")
    assert msg.platform_message_id == msg.reply_to == "1764494102123"
    assert msg.received_at == pytest.approx(1796030102.123)  # 2026-11-30T09:15:02.123Z


@pytest.mark.parametrize(
    "activity",
    [
        {**RECORDED_CHANNEL_REPLY, "type": "conversationUpdate"},
        {**RECORDED_CHANNEL_REPLY, "type": "messageReaction"},
        {**RECORDED_CHANNEL_REPLY, "from": {"id": BOT_ID}},  # the bot's own
        {**RECORDED_CHANNEL_REPLY, "text": "<at>Switchboard</at>"},  # nothing but the mention
        {**RECORDED_CHANNEL_REPLY, "text": None},  # an attachment only
        {**RECORDED_CHANNEL_REPLY, "conversation": {"id": "x", "conversationType": "meeting-bot"}},
        {"type": "message", "text": "hi"},
        {"type": "message", "text": "hi", "from": "29:1", "conversation": {"id": "a:1"}, "id": "1"},
        {},
    ],
)
def test_activities_that_are_not_a_message_for_the_bot_translate_to_none(activity: dict) -> None:
    assert to_inbound(activity, {BOT_ID}) is None


def test_a_group_chat_mention_of_someone_else_does_not_address_the_bot() -> None:
    act = {
        **RECORDED_CHANNEL_REPLY,
        "conversation": {"id": "19:g@thread.v2", "conversationType": "groupChat"},
        "entities": RECORDED_CHANNEL_REPLY["entities"][1:],
    }
    msg = to_inbound(act, {BOT_ID})
    assert msg is not None and not msg.mentioned and msg.source.chat_type == "group"
    assert to_inbound(act, {BOT_ID}, require_mention=False).mentioned  # type: ignore[union-attr]


def test_stored_references_are_json_per_conversation(tmp_path: Path) -> None:
    from gateway.adapters.teams_connector import ConversationRef

    chat, ref = ConversationRef.of(RECORDED_CHANNEL_REPLY)  # type: ignore[misc]
    assert (chat, ref.kind, ref.tenant_id, ref.bot_id) == (
        "19:abc@thread.tacv2",
        "channel",
        "t1",
        BOT_ID,
    )
    assert ConversationRef.loads(ref.dumps()) == ref
    assert ConversationRef.loads("not json") is None
    assert json.loads(ref.dumps())["service_url"] == "https://smba.trafficmanager.net/amer/"
