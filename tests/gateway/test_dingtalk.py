"""DingTalk through the whole daemon: dingtalk-stream's frame routing over a websocket to a
loopback fake of the stream gateway, replies through the session webhook or the robot API;
the ack order (inbox before ack) with the adapter alone; translation as pure functions."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.dingtalk import LIMIT, DingTalkAdapter, title_of, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage, ThreadRef
from gateway.ops.doctor import run_doctor
from tests.daemon import free_port
from tests.fakes import running, stalled_then_on_time, started
from tests.fakes.dingtalk import BOT_ID, CLIENT_ID, ENV, TOPIC, FakeDingTalk, robot_message
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import adapter_of, fake_fixture, platform_daemon, stored

FAST = Backoff(initial_s=0.05, max_s=0.2)


fake = fake_fixture(FakeDingTalk)


def _gateway(tmp_path: Path, fake: FakeDingTalk, env: dict[str, str] | None = None) -> Gateway:
    return platform_daemon(tmp_path, "dingtalk", f"    base_url: {fake.base_url}\n", env or ENV)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeDingTalk) -> AsyncIterator[Gateway]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        await fake.wait_connected(1)
        yield gateway


# --- through the daemon ------------------------------------------------------------------


async def test_a_dm_is_acked_and_answered_through_the_session_webhook(
    gw: Gateway, fake: FakeDingTalk
) -> None:
    frame = await fake.push(robot_message("hello dingtalk", fake=fake))
    assert (await fake.wait_ack(frame))["code"] == 200
    [(kind, sent)] = await fake.wait_sent(1)
    assert (kind, sent["chat"], sent["title"], sent["text"]) == (
        "webhook",
        "s1",
        "echo: hello dingtalk",
        "echo: hello dingtalk",
    )
    assert await stored(gw, "agent:main:dingtalk:dm:alice01") == [
        "hello dingtalk",
        "echo: hello dingtalk",
    ]
    assert fake.subscriptions == [[{"type": "CALLBACK", "topic": TOPIC}]]
    assert gw.health()["adapters"]["dingtalk"]["state"] == "running"


async def test_group_messages_need_a_mention(gw: Gateway, fake: FakeDingTalk) -> None:
    group = {"conversation_type": "2", "conversation_id": "cidGROUP", "fake": fake}
    chatter = await fake.push(robot_message("humans talking", msg_id="g1", **group))
    asked = await fake.push(robot_message("what time is it", msg_id="g2", at_bot=True, **group))
    status = await fake.push(
        robot_message("/status", msg_id="g3", at_bot=True, staff_id="bob02", session="s2", **group)
    )
    for frame in (chatter, asked, status):
        assert (await fake.wait_ack(frame))["code"] == 200  # taken, even when not addressed
    sent = await fake.wait_sent(2)
    await asyncio.sleep(0.2)
    assert len(fake.sent()) == 2
    texts = [p["text"] for _, p in sent]
    assert "echo: what time is it" in texts and any(t.startswith("Session: ") for t in texts)
    assert await stored(gw, "agent:main:dingtalk:group:cidGROUP:alice01") == [
        "what time is it",
        "echo: what time is it",
    ]


async def test_redeliveries_are_answered_once(gw: Gateway, fake: FakeDingTalk) -> None:
    data = robot_message("once please", fake=fake, msg_id="dup1")
    first, second = await fake.push(data), await fake.push(data)
    assert (await fake.wait_ack(first))["code"] == 200
    assert (await fake.wait_ack(second))["code"] == 200
    await fake.wait_sent(1)
    await asyncio.sleep(0.3)
    assert len(fake.sent()) == 1


async def test_after_the_session_webhook_expires_replies_use_the_robot_api(
    gw: Gateway, fake: FakeDingTalk
) -> None:
    group = robot_message(
        "late",
        fake=fake,
        conversation_type="2",
        conversation_id="cidLATE",
        msg_id="l1",
        at_bot=True,
        expires_in_s=-5,
    )
    await fake.push(group)
    [(kind, sent)] = await fake.wait_sent(1)
    assert (kind, sent["chat"], sent["robotCode"], sent["msgKey"]) == (
        "group",
        "cidLATE",
        CLIENT_ID,
        "sampleMarkdown",
    )
    assert sent["text"] == "echo: late"
    # a webhook DingTalk refuses (expired early) falls back the same way
    fake.fail_next("webhook", 200, {"errcode": 300001, "errmsg": "session expired"})
    await fake.push(robot_message("refused hook", fake=fake, msg_id="l2"))
    kinds = [k for k, _ in await fake.wait_sent(2)]
    assert kinds == ["group", "dm"] and fake.sent()[1][1]["chat"] == "alice01"


async def test_proactive_messages_go_through_the_robot_api(gw: Gateway, fake: FakeDingTalk) -> None:
    adapter = adapter_of(gw, DingTalkAdapter)
    ref = await adapter.send(OutboundMessage("dingtalk", "alice01", "**hello** from the terminal"))
    [(kind, sent)] = fake.sent()
    assert (kind, sent["chat"], sent["title"]) == ("dm", "alice01", "hello from the terminal")
    assert ref.message_ids and ref.message_ids[0].startswith("pqk-")
    assert await adapter.create_thread("cidHOME", "handoff") is None  # no threads on DingTalk
    await adapter.send(OutboundMessage("dingtalk", "cidHOME", "Continuing here"))
    assert fake.sent()[1][0] == "group"
    long = "\n\n".join(f"paragraph {i} " + "word " * 200 for i in range(12))  # ~12,000 chars
    ref = await adapter.send(OutboundMessage("dingtalk", "cidHOME", long))
    parts = [p["text"] for _, p in fake.sent()[2:]]
    assert len(parts) == len(ref.message_ids) == 3 and all(len(p) <= LIMIT for p in parts)
    assert [p.split()[1] for p in parts] == ["0", "4", "8"]  # cut between paragraphs


@pytest.mark.slow
async def test_rate_limits_are_waited_out(gw: Gateway, fake: FakeDingTalk) -> None:
    fake.fail_next("webhook", 200, {"errcode": 130101, "errmsg": "send too fast"})
    await fake.push(robot_message("patience", fake=fake, msg_id="r1"))
    [(_, sent)] = await fake.wait_sent(1, timeout=15)
    assert sent["text"] == "echo: patience"
    assert len([k for k, _ in fake.calls if k == "webhook"]) == 2
    fake.fail_next(
        "dm", 429, {"code": "Forbidden.AccessDenied.QpsLimitForApi"}, {"Retry-After": "1"}
    )
    await adapter_of(gw, DingTalkAdapter).send(OutboundMessage("dingtalk", "alice01", "proactive"))
    assert fake.sent()[-1][1]["text"] == "proactive"


async def test_the_stream_reconnects_when_dingtalk_asks_and_answers_pings(
    gw: Gateway, fake: FakeDingTalk, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dingtalk_stream"):
        ping = await fake.system("ping", {"opaque": "abc"})
        ack = await fake.wait_ack(ping)
    assert ack["code"] == 200 and '"opaque": "abc"' in ack["data"]
    assert not [r for r in caplog.records if r.name.startswith("dingtalk_stream")]
    await fake.system("disconnect")
    await fake.wait_connected(2, timeout=15)
    frame = await fake.push(robot_message("after the reconnect", fake=fake, msg_id="rc1"))
    assert (await fake.wait_ack(frame))["code"] == 200
    [(_, sent)] = await fake.wait_sent(1)
    assert (
        sent["text"] == "echo: after the reconnect"
        and adapter_of(gw, DingTalkAdapter).connections == 2
    )


async def test_a_bad_client_secret_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeDingTalk
) -> None:
    gateway = _gateway(tmp_path, fake, {**ENV, "DINGTALK_CLIENT_SECRET": "wrong"})
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "dingtalk",
            "^dingtalk refused the client credentials: invalidClientSecret$",
            ["platforms.dingtalk.token_env", "platforms.dingtalk.client_id_env"],
        )
    finally:
        await gateway.stop()
    assert [k for k, _ in fake.calls] == ["token"]


# --- inbox before ack, with the adapter alone ---------------------------------------------


async def test_the_ack_follows_emit_and_an_unstored_message_is_refused(fake: FakeDingTalk) -> None:
    adapter = DingTalkAdapter(CLIENT_ID, fake.client_secret, base_url=fake.base_url, backoff=FAST)
    release = asyncio.Event()
    entered: list[str] = []
    taken: list[InboundMessage] = []
    refuse = [False, True]  # the first delivery cannot be stored, the redelivery can

    async def emit(msg: InboundMessage) -> None:
        entered.append(msg.text)
        if refuse.pop():
            raise NotAccepted("the store is shutting down")
        await release.wait()
        taken.append(msg)

    await adapter.start(emit)
    try:
        await fake.wait_connected(1)
        data = robot_message("keep me", fake=fake, msg_id="k1")
        assert (await fake.wait_ack(await fake.push(data)))["code"] == 500
        frame = await fake.push(data)  # DingTalk delivers it again
        await asyncio.sleep(0.2)
        assert entered == ["keep me", "keep me"] and frame not in fake.acks  # emit still running
        release.set()
        assert (await fake.wait_ack(frame))["code"] == 200
        assert [m.platform_message_id for m in taken] == ["k1"]
    finally:
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"


async def test_a_dingtalk_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeDingTalk,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request to the session webhook left. Once the request has its
    connection it finds its SEND_BY passed and stops unsent (SetOutLate), so the turn can
    ask its lease first (gateway/turns.py's send_checked). On time, it is sent once."""
    adapter = DingTalkAdapter(CLIENT_ID, fake.client_secret, base_url=fake.base_url, backoff=FAST)

    fake.keep_alive = False  # each call connects: the send waits for its connection
    async with started(adapter):
        await fake.wait_connected(1)
        data = robot_message("hello", fake=fake, msg_id="so1")
        assert (await fake.wait_ack(await fake.push(data)))["code"] == 200  # its webhook known
        reply = OutboundMessage("dingtalk", "alice01", "once", reply_to="so1")
        await stalled_then_on_time(
            lambda: adapter.send(reply),
            lambda: [p["text"] for k, p in fake.calls if k in ("webhook", "group", "dm")],
        )
        sends = [(k, p["text"]) for k, p in fake.calls if k in ("webhook", "group", "dm")]
        assert sends == [("webhook", "once")]
        assert [(k, p["text"]) for k, p in fake.sent()] == sends


# --- pure ------------------------------------------------------------------------------------


class _F:
    webhook = staticmethod(lambda session="s1": f"http://x/robot/sendBySession?session={session}")


def _msg(text: str = "hi", **kw: Any) -> dict[str, Any]:
    return robot_message(text, fake=_F(), **kw)  # type: ignore[arg-type]


def test_translation_of_dms_and_groups() -> None:
    dm = to_inbound(_msg("hello"))
    assert dm is not None and (dm.source.chat_type, dm.source.chat_id, dm.source.user_id) == (
        "dm",
        "alice01",
        "alice01",
    )
    assert (dm.text, dm.platform_message_id, dm.mentioned, dm.source.user_name) == (
        "hello",
        "msg1",
        True,
        "Alice",
    )
    external = to_inbound(_msg(staff_id=None))
    assert (
        external is not None
        and external.source.chat_id == "cidDM1"
        and external.source.user_id == "$:LWCP_v1:$alice"
    )
    group = to_inbound(_msg(" hi all", conversation_type="2", conversation_id="cidG"))
    assert group is not None and not group.mentioned and group.text == "hi all"
    assert (group.source.chat_type, group.source.chat_id, group.source.chat_name) == (
        "group",
        "cidG",
        "Team",
    )
    at = _msg(conversation_type="2", conversation_id="cidG")
    at["atUsers"] = [{"dingtalkId": BOT_ID}]
    assert to_inbound(at).mentioned  # type: ignore[union-attr]
    assert to_inbound(_msg(conversation_type="2", conversation_id="cidG", at_bot=True)).mentioned  # type: ignore[union-attr]
    assert to_inbound(
        _msg(conversation_type="2", conversation_id="cidG"), require_mention=False
    ).mentioned  # type: ignore[union-attr]
    rich = {
        **_msg(),
        "msgtype": "richText",
        "content": {"richText": [{"text": "see "}, {"downloadCode": "x"}, {"text": "this"}]},
    }
    assert to_inbound(rich).text == "see this"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [
        {**_msg(), "msgtype": "picture", "content": {"downloadCode": "x"}},
        _msg("   "),
        {k: v for k, v in _msg().items() if k != "msgId"},
        {**_msg(), "text": None},
        {**_msg(staff_id=None), "senderId": None},
        {
            "msgtype": "text",
            "text": {"content": "x"},
            "msgId": "m",
            "senderStaffId": "a",
            "conversationType": "2",
        },
    ],
)
def test_messages_without_text_or_ids_are_ignored(data: dict[str, Any]) -> None:
    assert to_inbound(data) is None


def test_titles_and_the_home_chat_type() -> None:
    assert title_of("## Plan\nsteps") == "Plan"
    assert title_of("```\n") == "switchboard"
    assert len(title_of("word " * 40)) <= 30
    assert DingTalkAdapter.home_chat_type("cidABC") == "group"
    assert DingTalkAdapter.home_chat_type("manager123") == "dm"
    home = DingTalkAdapter.thread_source(ThreadRef("dingtalk", "cidABC", "cidABC"))
    assert (home.chat_id, home.chat_type, home.thread_id) == ("cidABC", "group", None)


# --- configuration and doctor --------------------------------------------------------------


def test_config_names_the_missing_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n  dingtalk:\n    enabled: true\n    allow_all_users: true\n")
    monkeypatch.setitem(sys.modules, "dingtalk_stream", None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ENV)
    assert str(err.value) == (
        "platforms.dingtalk: needs the dingtalk-stream package: pip install 'switchboard[dingtalk]'"
    )


async def test_doctor_reports_an_unreachable_dingtalk_in_one_word(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  dingtalk:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: http://127.0.0.1:{free_port()}\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, ENV), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == "dingtalk reachable"]
    assert (reach.ok, reach.detail) == (False, "unreachable (ClientConnectorError)")


async def test_a_handoff_lands_in_the_home_group_through_the_robot_api(
    gw: Gateway, fake: FakeDingTalk
) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    await gw.db.set_meta(
        HOME_KEY.format("dingtalk"), json.dumps({"chat_id": "cidHOME", "chat_type": "group"})
    )
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "dingtalk", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    [(kind, sent)] = await fake.wait_sent(1)
    assert (kind, sent["chat"]) == ("group", "cidHOME")
    assert sent["text"].startswith("Continuing here from the terminal (deploy plan).")
    assert (await gw.db.get_session(sid))["chat_id"] == "cidHOME"  # type: ignore[index]
