"""iMessage through BlueBubbles and the whole daemon: webhooks POSTed the way BlueBubbles Server
does (with the secret in the URL) to the daemon's HTTP server, replies through its REST API on
a loopback fake; plus the pure translation of recorded webhooks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.bluebubbles import (
    ATTACHMENT_NOTE,
    LIMIT,
    BlueBubblesAdapter,
    addressed,
    api_error,
    to_inbound,
)
from gateway.adapters.kit.split import split_message
from gateway.app import Gateway
from gateway.errors import (
    AdapterError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import OutboundMessage
from tests.fakes import running, stalled_then_on_time, started, wait_for_count
from tests.fakes.bluebubbles import (
    ANN,
    DM,
    GROUP,
    PASSWORD,
    SECRET,
    FakeBlueBubbles,
    new_message,
    post_webhook,
)
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import (
    StoreDown,
    adapter_of,
    config_problems,
    fake_fixture,
    platform_daemon,
    webhook_alone,
    webhook_url,
)

KEY = f"agent:main:bluebubbles:dm:{DM.replace(':', '%3A')}"
FAST = Backoff(initial_s=0.01, max_s=0.05)


fake = fake_fixture(FakeBlueBubbles)


def _gateway(
    tmp_path: Path, fake: FakeBlueBubbles, password: str = PASSWORD, extra: str = ""
) -> Gateway:
    keys = f"    url: {fake.base_url}\n    bot_name: Switchboard\n    max_age_seconds: 600\n{extra}"
    env = {"BLUEBUBBLES_PASSWORD": password, "BLUEBUBBLES_WEBHOOK_SECRET": SECRET}
    return platform_daemon(tmp_path, "bluebubbles", keys, env, api=True)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeBlueBubbles) -> AsyncIterator[tuple[Gateway, str]]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        yield gateway, webhook_url(gateway, "/bluebubbles/webhook")


# --- the webhook's secret, replays and stale messages -------------------------------------


async def test_a_missing_or_wrong_secret_is_refused_and_never_stored(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    gateway, url = gw
    payload = new_message("forged", guid="F1")
    assert await post_webhook(url, payload, secret=None) == 401
    assert await post_webhook(url, payload, secret="guessed") == 403
    assert await post_webhook(url, payload, secret=SECRET[:-1]) == 403
    await asyncio.sleep(0.1)  # nothing may arrive; give a wrongly accepted one time to show
    assert fake.attempts() == []
    assert gateway.index is not None and gateway.index.get(KEY) is None


async def test_a_replayed_webhook_is_answered_once(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    _, url = gw
    payload = new_message("once please", guid="R1")
    assert await post_webhook(url, payload) == 200
    await fake.wait_sent(1)
    assert await post_webhook(url, payload) == 200  # BlueBubbles resends on a slow answer
    assert await post_webhook(url, new_message("next", guid="R2")) == 200
    sent = await fake.wait_sent(2)
    assert [s["message"] for s in sent] == ["echo: once please", "echo: next"]


async def test_a_stale_message_is_acknowledged_and_dropped(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    gateway, url = gw
    assert await post_webhook(url, new_message("from last week", guid="S1", age_s=7200)) == 200
    assert await post_webhook(url, new_message("fresh", guid="S2")) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["message"] == "echo: fresh"
    assert adapter_of(gateway, BlueBubblesAdapter).health()["stale_dropped"] == 1


async def test_own_messages_and_tapbacks_start_no_turn(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    _, url = gw
    assert await post_webhook(url, new_message("echo: hi", guid="O1", from_me=True)) == 200
    assert await post_webhook(url, new_message(None, guid="O2", tapback="love")) == 200
    assert await post_webhook(url, {"type": "typing-indicator", "data": {"display": True}}) == 200
    assert await post_webhook(url, new_message("real", guid="O3")) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["message"] == "echo: real"


# --- conversations -------------------------------------------------------------------------


async def test_a_dm_is_answered_in_its_chat_with_a_fresh_temp_guid_per_part(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    gateway, url = gw
    assert await post_webhook(url, new_message("hello **imessage**", guid="A1")) == 200
    [sent] = await fake.wait_sent(1)
    assert (sent["chatGuid"], sent["message"], sent["method"]) == (
        DM,
        "echo: hello imessage",
        "apple-script",
    )
    assert sent["tempGuid"].startswith("switchboard-")
    assert gateway.index is not None and gateway.index.get(KEY) is not None
    assert fake.typing() == []  # no Private API: no typing calls


async def test_a_group_message_needs_the_bot_name_and_keys_per_user(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    gateway, url = gw
    assert await post_webhook(url, new_message("lunch at noon?", guid="G1", chat=GROUP)) == 200
    assert await post_webhook(url, new_message("@switchboard /help", guid="G2", chat=GROUP)) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["chatGuid"] == GROUP and sent["message"].startswith("Commands:")
    key = f"agent:main:bluebubbles:group:{GROUP}:{ANN}"
    assert gateway.index is not None and gateway.index.get(key) is not None


async def test_a_chat_command_is_answered_by_the_core(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    _, url = gw
    assert await post_webhook(url, new_message("/help", guid="C1")) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["message"].startswith("Commands:") and "/help" in sent["message"]


async def test_a_long_reply_is_split_under_the_limit(
    gw: tuple[Gateway, str], fake: FakeBlueBubbles
) -> None:
    _, url = gw
    words = " ".join(f"w{i}" for i in range(2000))  # ~11,000 characters echoed back
    assert await post_webhook(url, new_message(words, guid="L1")) == 200
    parts = len(split_message(f"echo: {words}", LIMIT))
    sent = await fake.wait_sent(parts)
    assert parts >= 3 and all(len(s["message"]) <= LIMIT for s in sent)
    assert " ".join(s["message"].strip() for s in sent) == f"echo: {words}"
    assert len({s["tempGuid"] for s in sent}) == parts


async def test_a_rate_limit_is_waited_out(gw: tuple[Gateway, str], fake: FakeBlueBubbles) -> None:
    _, url = gw
    fake.fail_next(429, "Too Many Requests", {"Retry-After": "1"})
    assert await post_webhook(url, new_message("patience", guid="P1")) == 200
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["message"] == "echo: patience" and len(fake.attempts()) == 2
    assert fake.attempts()[0]["tempGuid"] == fake.attempts()[1]["tempGuid"]


async def test_a_bad_password_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeBlueBubbles
) -> None:
    gw = _gateway(tmp_path, fake, password="wrong")
    await gw.start()
    try:
        refused_at_start(
            gw,
            "bluebubbles",
            "^bluebubbles rejected the server password$",
            ["platforms.bluebubbles.token_env", "platforms.bluebubbles.webhook_secret_env"],
        )
    finally:
        await gw.stop()


async def test_typing_shows_through_the_private_api_only_when_enabled(
    tmp_path: Path, fake: FakeBlueBubbles
) -> None:
    fake.private_api = True
    gateway = _gateway(tmp_path, fake, extra="    private_api: true\n")
    await gateway.start()
    try:
        url = webhook_url(gateway, "/bluebubbles/webhook")
        assert await post_webhook(url, new_message("type for me", guid="T1")) == 200
        await fake.wait_sent(1)
        typing = await wait_for_count(fake.typing, 2, 5, "typing calls")
        assert sorted(m for m, _ in typing) == ["DELETE", "POST"]
        assert all(p == f"/api/v1/chat/{DM}/typing" for _, p in typing)
    finally:
        await gateway.stop()


async def test_a_handoff_lands_in_the_home_chat(tmp_path: Path, fake: FakeBlueBubbles) -> None:
    gw = _gateway(tmp_path, fake)
    await gw.start()
    try:
        assert gw.db is not None and gw.handoffs is not None
        gw.handoffs.poll_s = 0.05
        await gw.db.set_meta(
            HOME_KEY.format("bluebubbles"), json.dumps({"chat_id": GROUP, "chat_type": "group"})
        )
        sid = await gw.db.create_session(source="cli", title="deploy plan")
        await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
        ok, why = await asyncio.wait_for(
            handoff_from_terminal(gw.db, sid, "bluebubbles", enabled=True, poll_s=0.05), 30
        )
        assert ok, why
        [sent] = await fake.wait_sent(1)
        assert sent["chatGuid"] == GROUP
        assert sent["message"].startswith("Continuing here from the terminal (deploy plan).")
    finally:
        await gw.stop()


async def test_an_uncommitted_message_is_not_acknowledged(fake: FakeBlueBubbles) -> None:
    """Inbox before ack: emit raising NotAccepted answers 503, so BlueBubbles sends it again."""
    adapter = BlueBubblesAdapter(fake.base_url, PASSWORD, SECRET)
    store = StoreDown()
    async with webhook_alone(adapter, "/bluebubbles/webhook", store.emit) as url:
        assert await post_webhook(url, new_message("keep me", guid="N1")) == 503
        store.up = True
        assert await post_webhook(url, new_message("keep me", guid="N1")) == 200
        assert [(m.text, m.platform_message_id) for m in store.seen] == [("keep me", "N1")]


async def test_a_retry_after_a_timed_out_send_is_not_sent_twice(fake: FakeBlueBubbles) -> None:
    """The first attempt outlives our timeout; the retry carries the same tempGuid, which the
    server refuses while it is still sending, so the text goes out once."""
    fake.send_delay_s = 0.6
    adapter = BlueBubblesAdapter(fake.base_url, PASSWORD, SECRET, timeout_s=0.3, backoff=FAST)
    try:
        ref = await adapter.send(OutboundMessage("bluebubbles", DM, "only once"))
        await asyncio.sleep(0.6)  # let the slow first attempt finish on the server
        assert [s["message"] for s in fake.sent()] == ["only once"]
        assert len(fake.attempts()) >= 2 and len({a["tempGuid"] for a in fake.attempts()}) == 1
        assert ref.message_ids == (fake.attempts()[0]["tempGuid"],)
    finally:
        await adapter.stop()


async def test_send_errors_map_to_the_gateway_errors(fake: FakeBlueBubbles) -> None:
    adapter = BlueBubblesAdapter(fake.base_url, PASSWORD, SECRET, backoff=FAST)
    try:
        fake.fail_next(503, "restarting")
        await adapter.send(OutboundMessage("bluebubbles", DM, "after a 503"))
        assert [s["message"] for s in fake.sent()] == ["after a 503"]
        fake.fail_next(400, "Chat does not exist")
        with pytest.raises(AdapterError, match="Chat does not exist"):
            await adapter.send(OutboundMessage("bluebubbles", DM, "x"))
        fake.password = "rotated"
        with pytest.raises(InvalidToken):
            await adapter.send(OutboundMessage("bluebubbles", DM, "x"))
        assert adapter.health()["last_error"] == "bad password"
    finally:
        await adapter.stop()


async def test_a_bluebubbles_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeBlueBubbles,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request left. Once the request has its connection it finds its
    SEND_BY passed and stops unsent (SetOutLate), so the turn can ask its lease first
    (gateway/turns.py's send_checked). On time, the text is sent once."""
    adapter = BlueBubblesAdapter(fake.base_url, PASSWORD, SECRET, backoff=FAST)

    fake.keep_alive = False  # each call connects: the send waits for its connection
    async with started(adapter):
        reply = OutboundMessage("bluebubbles", DM, "once", reply_to="MSG-1")
        await stalled_then_on_time(
            lambda: adapter.send(reply), lambda: [b["message"] for b in fake.attempts()]
        )
        assert [s["message"] for s in fake.sent()] == ["once"]


# --- pure translation -----------------------------------------------------------------------


def test_a_recorded_dm_translates_with_the_guid_as_message_id() -> None:
    payload = new_message("Is the shop open?", guid="p:0/ABC-123")
    payload["data"]["dateCreated"] = 1_700_000_000_000
    msg = to_inbound(payload, "Switchboard")
    assert msg is not None
    src = msg.source
    assert (src.platform, src.chat_id, src.chat_type, src.user_id) == ("bluebubbles", DM, "dm", ANN)
    assert (msg.text, msg.platform_message_id, msg.received_at, msg.mentioned) == (
        "Is the shop open?",
        "p:0/ABC-123",
        1_700_000_000.0,
        True,
    )


@pytest.mark.parametrize(
    "payload, text, mentioned",
    [
        (new_message("hi all", chat=GROUP, chat_name="Team"), "hi all", False),
        (new_message("Switchboard, what's up?", chat=GROUP), "what's up?", True),
        (new_message("ask @switchboard please", chat=GROUP), "ask @switchboard please", True),
        (new_message("switchboards are old", chat=GROUP), "switchboards are old", False),
        (new_message("look", attachments=1), f"{ATTACHMENT_NOTE} look", True),
        (new_message("\ufffc", attachments=1), ATTACHMENT_NOTE, True),
    ],
)
def test_group_mentions_and_attachments(
    payload: dict[str, Any], text: str, mentioned: bool
) -> None:
    msg = to_inbound(payload, "Switchboard")
    assert msg is not None and (msg.text, msg.mentioned) == (text, mentioned)


@pytest.mark.parametrize(
    "payload",
    [
        new_message("mine", from_me=True),
        new_message(None, tapback="like"),
        new_message("   "),
        {"type": "updated-message", "data": new_message("edited")["data"]},
        {"type": "new-message", "data": {**new_message("x")["data"], "handle": None}},
        {"type": "new-message", "data": {**new_message("x")["data"], "itemType": 2}},
        {"type": "new-message"},
        [],
    ],
)
def test_what_is_not_a_message_to_answer(payload: Any) -> None:
    assert to_inbound(payload, "Switchboard") is None


def test_without_require_mention_every_group_message_is_addressed() -> None:
    msg = to_inbound(new_message("hi all", chat=GROUP), "Switchboard", require_mention=False)
    assert msg is not None and msg.mentioned and msg.text == "hi all"
    msg = to_inbound(new_message("hi all", chat=GROUP), None, require_mention=False)
    assert msg is not None and msg.mentioned


def test_a_message_without_its_chat_falls_back_to_the_sender_dm() -> None:
    payload = new_message("hi")
    payload["data"]["chats"] = []
    msg = to_inbound(payload)
    assert msg is not None and msg.source.chat_id == f"iMessage;-;{ANN}"


def test_addressed_strips_a_leading_mention_only() -> None:
    assert addressed("@Switchboard /new", "switchboard") == (True, "/new")
    assert addressed("@switchboard", "switchboard") == (True, "@switchboard")
    assert addressed("hey", None) == (False, "hey")


@pytest.mark.parametrize(
    "status, kind, detail",
    [
        (429, RetryAfter, "rate limited"),
        (401, InvalidToken, "password"),
        (502, TransientError, "502"),
        (400, PlatformRefused, "nope"),
    ],
)
def test_api_errors(status: int, kind: type, detail: str) -> None:
    exc = api_error(status, {"status": status, "error": {"type": "x", "message": "nope"}})
    assert type(exc) is kind and detail in str(exc)


# --- config ---------------------------------------------------------------------------------


def _problems(tmp_path: Path, section: str, env: dict[str, str] | None = None) -> dict[str, str]:
    default = {"BLUEBUBBLES_PASSWORD": PASSWORD, "BLUEBUBBLES_WEBHOOK_SECRET": SECRET}
    return config_problems(tmp_path, section, default if env is None else env)


def test_the_section_needs_its_keys_and_refuses_placeholders(tmp_path: Path) -> None:
    found = _problems(
        tmp_path, "  bluebubbles:\n    enabled: true\n    allow_all_users: true\n", env={}
    )
    assert set(found) == {
        "platforms.bluebubbles.url",
        "platforms.bluebubbles.bot_name",
        "platforms.bluebubbles.token_env",
        "platforms.bluebubbles.webhook_secret_env",
    }
    assert found["platforms.bluebubbles.token_env"].startswith("BLUEBUBBLES_PASSWORD is not set")
    found = _problems(
        tmp_path,
        "  api:\n    enabled: false\n  bluebubbles:\n    enabled: true\n"
        "    allow_all_users: true\n    url: <your-server>\n    require_mention: false\n"
        "    method: private-api\n",
    )
    assert "placeholder" in found["platforms.bluebubbles.url"]
    assert "private_api: true" in found["platforms.bluebubbles.method"]
    assert "enable platforms.api" in found["platforms.bluebubbles.enabled"]
