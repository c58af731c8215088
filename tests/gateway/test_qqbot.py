"""QQ Bot through the whole daemon: the adapter's aiohttp client against a loopback fake of
QQ's API v2 (token service, websocket gateway, send calls); the sequence-number order
(inbox before ack) with the adapter alone; a `switchboard run` subprocess under SIGTERM and
`switchboard send`; translation as pure functions."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.qqbot import ATTACHMENT_NOTE, LIMIT, QQBotAdapter, to_inbound
from gateway.adapters.qqbot_api import QQApi
from gateway.adapters.qqbot_gateway import GROUP_AND_C2C_EVENT
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted, PlatformRefused, RetryAfter
from gateway.handoff import handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage, ThreadRef
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes import running, stalled_then_on_time, started, wait_for_count
from tests.fakes.qqbot import (
    ALICE,
    APP_ID,
    BOB,
    BOT_NAME,
    CHANNEL,
    ENV,
    GROUP,
    RATE_LIMITED,
    FakeQQ,
    c2c_message,
    group_message,
    guild_message,
)
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import adapter_of, fake_fixture, stored

FAST = Backoff(initial_s=0.05, max_s=0.2)
DM_KEY = f"agent:main:qqbot:dm:{ALICE}"


fake = fake_fixture(FakeQQ)


def _config(fake: FakeQQ, extra: str = "") -> str:
    return (
        "platforms:\n  api:\n    enabled: false\n  qqbot:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.api_url}\n"
        f"    token_url: {fake.token_url}\n{extra}"
    )


def _gateway(
    tmp_path: Path, fake: FakeQQ, env: dict[str, str] | None = None, extra: str = ""
) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(_config(fake, extra))
    return Gateway(config=load_config(cfg, env or ENV), home=tmp_path / "home")


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeQQ) -> AsyncIterator[Gateway]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        await fake.wait_ready(1)
        yield gateway


# --- through the daemon ------------------------------------------------------------------


async def test_a_c2c_message_is_answered_as_a_passive_reply(gw: Gateway, fake: FakeQQ) -> None:
    msg_id = await fake.c2c("hello qq")
    [sent] = await fake.wait_sent(1)
    assert (sent["kind"], sent["chat"], sent["text"], sent["msg_type"]) == (
        "c2c",
        ALICE,
        "echo: hello qq",
        0,
    )
    assert (sent["msg_id"], sent["msg_seq"]) == (msg_id, 1)
    assert await stored(gw, DM_KEY) == ["hello qq", "echo: hello qq"]
    [identify] = fake.identifies
    assert identify["token"] == f"QQBot {fake.tokens[0]}"
    assert identify["intents"] == GROUP_AND_C2C_EVENT == 1 << 25
    health = gw.health()["adapters"]["qqbot"]
    assert (health["state"], health["connected"], health["bot"]) == ("running", True, BOT_NAME)


async def test_two_users_get_two_sessions_and_a_group_at_message_its_own(
    gw: Gateway, fake: FakeQQ
) -> None:
    await fake.c2c("from alice", ALICE)
    await fake.c2c("from bob", BOB)
    await fake.push("GROUP_ADD_ROBOT", {"group_openid": GROUP, "op_member_openid": BOB})
    group_msg = await fake.group_at("what time is it", member=BOB)
    sent = await fake.wait_sent(3)
    await asyncio.sleep(0.2)
    assert len(fake.sent()) == 3  # the GROUP_ADD_ROBOT event is no message: no answer
    by_chat = {s["chat"]: s for s in sent}
    assert by_chat[f"group-{GROUP}"]["kind"] == "group"
    assert by_chat[f"group-{GROUP}"]["msg_id"] == group_msg
    assert by_chat[f"group-{GROUP}"]["text"] == "echo: what time is it"  # the @ space stripped
    alice = await stored(gw, DM_KEY)
    bob = await stored(gw, f"agent:main:qqbot:dm:{BOB}")
    group = await stored(gw, f"agent:main:qqbot:group:group-{GROUP}:{BOB}")
    assert (alice, bob, group) == (
        ["from alice", "echo: from alice"],
        ["from bob", "echo: from bob"],
        ["what time is it", "echo: what time is it"],
    )
    assert gw.index is not None
    ids = {gw.index.get(k).session_id for k in (DM_KEY, f"agent:main:qqbot:dm:{BOB}")}  # type: ignore[union-attr]
    assert len(ids) == 2


async def test_a_redelivered_message_is_answered_once(gw: Gateway, fake: FakeQQ) -> None:
    await fake.c2c("once please", msg_id="ROBOT1.0_dup")
    await fake.c2c("once please", msg_id="ROBOT1.0_dup")
    await fake.wait_sent(1)
    await asyncio.sleep(0.3)
    assert fake.texts() == ["echo: once please"]


async def test_title_resume_and_a_handoff_to_the_home_group(gw: Gateway, fake: FakeQQ) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    await fake.c2c("/title Trip to Kyoto")
    await fake.wait_sent(1)
    await fake.c2c("/new")
    await fake.wait_sent(2)
    await fake.c2c("/resume Trip to Kyoto")
    [_, _, resumed] = await fake.wait_sent(3)
    assert resumed["text"].startswith("Resumed Trip to Kyoto"), fake.texts()
    assert gw.index is not None
    entry = gw.index.get(DM_KEY)
    assert entry is not None
    assert (await gw.db.get_session(entry.session_id))["title"] == "Trip to Kyoto"  # type: ignore[index]

    sethome = await fake.group_at("/sethome")
    await fake.wait_sent(4)
    assert fake.sent()[3]["text"].startswith("Home channel for qqbot set to")
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "qqbot", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    handed = (await fake.wait_sent(5))[4]
    # no message to answer was named: the group's latest one (still in its window) is
    assert (handed["chat"], handed["msg_id"], handed["msg_seq"]) == (f"group-{GROUP}", sethome, 2)
    assert handed["text"].startswith("Continuing here from the terminal (deploy plan).")
    assert (await gw.db.get_session(sid))["chat_id"] == f"group-{GROUP}"  # type: ignore[index]


async def test_long_replies_take_a_fresh_msg_seq_per_part(gw: Gateway, fake: FakeQQ) -> None:
    adapter = adapter_of(gw, QQBotAdapter)
    long = "\n\n".join(f"paragraph {i} " + "word " * 80 for i in range(12))  # ~5,000 chars
    ref = await adapter.send(OutboundMessage("qqbot", ALICE, long, reply_to="ROBOT1.0_q1"))
    parts = fake.sent()
    assert len(parts) == len(ref.message_ids) == 3 and all(len(p["text"]) <= LIMIT for p in parts)
    assert [(p["msg_id"], p["msg_seq"]) for p in parts] == [("ROBOT1.0_q1", n) for n in (1, 2, 3)]
    # more parts than QQ takes replies to one message: the rest go actively
    await adapter.send(OutboundMessage("qqbot", ALICE, long, reply_to="ROBOT1.0_q1"))
    assert [(p["msg_id"], p["msg_seq"]) for p in fake.sent()[3:]] == [
        ("ROBOT1.0_q1", 4),
        ("ROBOT1.0_q1", 5),
        (None, None),
    ]


async def test_a_taken_msg_seq_moves_on_and_a_lost_answer_is_not_sent_twice(
    gw: Gateway, fake: FakeQQ
) -> None:
    adapter = adapter_of(gw, QQBotAdapter)
    adapter._backoff = FAST
    await adapter.send(OutboundMessage("qqbot", ALICE, "first", reply_to="ROBOT1.0_s"))
    adapter._seqs.clear()  # as another replica would: it has not used this message yet
    await adapter.send(OutboundMessage("qqbot", ALICE, "second", reply_to="ROBOT1.0_s"))
    assert [(p["text"], p["msg_seq"]) for p in fake.sent()] == [("first", 1), ("second", 2)]
    # a 502 whose request QQ took after all: the retry is a duplicate, and counts as sent
    fake.fail_next(502, {"code": 0, "message": "bad gateway"})
    fake._used.add(("ROBOT1.0_s", 3))
    ref = await adapter.send(OutboundMessage("qqbot", ALICE, "third", reply_to="ROBOT1.0_s"))
    assert ref.message_ids == () and len(fake.sent()) == 2


async def test_markdown_goes_as_msg_type_2_and_guild_at_messages_when_asked_for(
    tmp_path: Path, fake: FakeQQ
) -> None:
    extra = "    markdown: true\n    guild_messages: true\n"
    gateway = _gateway(tmp_path, fake, extra=extra)
    await gateway.start()
    try:
        await fake.wait_ready(1)
        assert fake.identifies[0]["intents"] == (1 << 25) | (1 << 30)
        await fake.c2c("**bold**")
        [sent] = await fake.wait_sent(1)
        assert (sent["msg_type"], sent["text"]) == (2, "echo: **bold**")
        asked = await fake.guild_at("status of the build")
        answer = (await fake.wait_sent(2))[1]
        assert (answer["kind"], answer["chat"], answer["msg_id"], answer["msg_seq"]) == (
            "channel",
            f"channel-{CHANNEL}",
            asked,
            None,
        )
        assert answer["text"] == "echo: status of the build"  # the bot's <@!id> left out
        # markdown QQ refuses (no permission) goes again as text, and so does what follows
        fake.fail_next(400, {"code": 50056, "message": "不允许发送markdown content"})
        await fake.c2c("plain please")
        third = (await fake.wait_sent(3))[2]
        assert (third["msg_type"], third["text"], third["msg_seq"]) == (0, "echo: plain please", 1)
        assert not adapter_of(gateway, QQBotAdapter).markdown
        key = f"agent:main:qqbot:group:channel-{CHANNEL}:10001"
        assert await stored(gateway, key) == [
            "status of the build",
            "echo: status of the build",
        ]
    finally:
        await gateway.stop()


@pytest.mark.slow
async def test_rate_limits_are_waited_out(gw: Gateway, fake: FakeQQ) -> None:
    api = adapter_of(gw, QQBotAdapter).api
    fake.fail_next(400, RATE_LIMITED)
    with pytest.raises(RetryAfter):
        await api.send(ALICE, {"msg_type": 0, "content": "x", "msg_id": "m", "msg_seq": 1})
    fake.fail_next(429, {"code": 0, "message": "too many"})
    with pytest.raises(RetryAfter):
        await api.send(ALICE, {"msg_type": 0, "content": "x", "msg_id": "m", "msg_seq": 1})
    fake.fail_next(400, RATE_LIMITED)
    await fake.c2c("patience")
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["text"] == "echo: patience"
    assert len([k for k, p in fake.calls if k == "send"]) == 4  # two refused, one waited, one sent


async def test_an_active_message_qq_refuses_is_refused_with_its_reason(
    gw: Gateway, fake: FakeQQ
) -> None:
    fake.allow_active = False
    adapter = adapter_of(gw, QQBotAdapter)
    with pytest.raises(PlatformRefused) as err:
        await adapter.send(OutboundMessage("qqbot", BOB, "unprompted"))
    assert "主动消息失败, 无权限 (code 40034102)" in str(err.value)
    assert "replies within 60 minutes" in str(err.value)
    assert adapter.health()["last_error"] == str(err.value)
    # once Bob wrote, a message without a reply_to answers his latest one
    said = await fake.c2c("hi", BOB)
    await fake.wait_sent(1)
    await adapter.send(OutboundMessage("qqbot", BOB, "a follow-up"))
    assert [(p["text"], p["msg_id"], p["msg_seq"]) for p in fake.sent()] == [
        ("echo: hi", said, 1),
        ("a follow-up", said, 2),
    ]


async def test_the_gateway_resumes_after_a_reconnect_request_and_a_drop(
    gw: Gateway, fake: FakeQQ
) -> None:
    await fake.c2c("before")
    await fake.wait_sent(1)
    await fake.op(7)  # Reconnect: a new connection resumes the session
    await fake.wait_ready(2)
    assert fake.resumes[-1]["session_id"] == "session-1"
    assert fake.resumes[-1]["seq"] == len(fake.events)
    await fake.close_with(4000)  # dropped; a message comes while nobody is connected
    await fake.c2c("in the gap")
    await fake.wait_ready(3)
    await fake.wait_sent(2)
    assert fake.texts() == ["echo: before", "echo: in the gap"]
    await fake.op(9, False)  # Invalid Session: identify again
    await wait_for_count(lambda: fake.identifies, 2, 10, "identifies")
    await fake.wait_ready(4)
    await fake.c2c("after")
    await fake.wait_sent(3)
    assert adapter_of(gw, QQBotAdapter).gateway.resumes == 2  # type: ignore[union-attr]


async def test_a_restarted_daemon_resumes_its_session_and_answers_what_came_meanwhile(
    tmp_path: Path, fake: FakeQQ
) -> None:
    first = _gateway(tmp_path, fake)
    await first.start()
    try:
        await fake.wait_ready(1)
        await fake.c2c("before the restart")
        await fake.wait_sent(1)
    finally:
        await first.stop()
    await fake.c2c("while it was down")
    second = _gateway(tmp_path, fake)
    await second.start()
    try:
        await fake.wait_sent(2)
        assert fake.resumes[-1]["session_id"] == "session-1" and len(fake.identifies) == 1
        await asyncio.sleep(0.2)
        assert fake.texts() == ["echo: before the restart", "echo: while it was down"]
        assert await stored(second, DM_KEY) == [
            "before the restart",
            "echo: before the restart",
            "while it was down",
            "echo: while it was down",
        ]
    finally:
        await second.stop()


async def test_qqs_close_codes_decide_between_resume_identify_and_stop(
    gw: Gateway, fake: FakeQQ
) -> None:
    await fake.close_with(4009)  # the session timed out: a new one is identified
    await wait_for_count(lambda: fake.identifies, 2, 10, "identifies")
    await fake.wait_ready(2)
    assert fake.resumes == []
    await fake.close_with(4004)  # the token was refused: a fresh one, a new session
    await wait_for_count(lambda: fake.identifies, 3, 10, "identifies")
    assert fake.identifies[-1]["token"] == f"QQBot {fake.tokens[-1]}" and len(fake.tokens) == 2
    await fake.wait_ready(3)
    await fake.close_with(4915)  # the bot is banned: the adapter stops, the daemon runs
    adapter = adapter_of(gw, QQBotAdapter)
    await wait_for_count(
        lambda: [1] if str(adapter.health()["state"]).startswith("failed") else [], 1, 10, "failed"
    )
    assert adapter.health()["last_error"] == "qq closed the gateway: the bot is banned (code 4915)"
    await asyncio.sleep(0.3)
    assert len(fake.identifies) + len(fake.resumes) == 3  # no connection after it


async def test_a_token_qq_stops_taking_early_is_fetched_again(gw: Gateway, fake: FakeQQ) -> None:
    adapter_of(gw, QQBotAdapter)._backoff = FAST
    fake.revoked.update(fake.tokens)
    await fake.op(7)  # the next connection's /gateway call is refused once, then resumes
    await fake.wait_ready(2)
    assert fake.resumes[-1]["token"] == f"QQBot {fake.tokens[-1]}" and len(fake.tokens) == 2
    fake.revoked.update(fake.tokens)
    await adapter_of(gw, QQBotAdapter).send(
        OutboundMessage("qqbot", ALICE, "still here", reply_to="ROBOT1.0_t")
    )
    assert fake.texts() == ["still here"] and len(fake.tokens) == 3
    assert gw.health()["adapters"]["qqbot"]["state"] == "running"


async def test_heartbeats_name_the_last_sequence_number_taken(gw: Gateway, fake: FakeQQ) -> None:
    seq_before = len(fake.events)
    await fake.c2c("beat")
    await fake.wait_sent(1)
    seq = len(fake.events)
    await wait_for_count(lambda: [h for h in fake.heartbeats if h == seq], 1, 10, "heartbeats")
    assert seq > seq_before


async def test_a_bad_app_secret_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeQQ, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = _gateway(tmp_path, fake, {**ENV, "QQBOT_CLIENT_SECRET": "wrong"})
    try:
        with caplog.at_level(logging.INFO):
            await gateway.start()
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "platforms.qqbot.token_env" in errors[0], errors
        refused_at_start(
            gateway,
            "qqbot",
            r"^qq refused the app credentials: invalid appid or secret \(code 100016\)$",
            ["platforms.qqbot.token_env", "platforms.qqbot.app_id_env"],
        )
    finally:
        await gateway.stop()
    assert [k for k, _ in fake.calls] == ["token"] and not fake.sockets


# --- inbox before ack, with the adapter alone ---------------------------------------------


async def test_the_sequence_number_moves_only_after_emit_and_a_refused_message_comes_again(
    fake: FakeQQ,
) -> None:
    adapter = QQBotAdapter(
        APP_ID, fake.secret, api_base=fake.api_url, token_base=fake.token_url, backoff=FAST
    )
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
        await fake.wait_ready(1)
        ready_seq = len(fake.events)
        await fake.c2c("keep me", msg_id="ROBOT1.0_k1")
        # not stored: the connection is dropped and the resume names the number before it
        await fake.wait_ready(2)
        assert fake.resumes[-1]["seq"] == ready_seq
        await wait_for_count(lambda: entered, 2, 10, "deliveries")  # replayed on resume
        beats = len(fake.heartbeats)
        await wait_for_count(lambda: fake.heartbeats[beats:], 2, 10, "heartbeats")
        assert set(fake.heartbeats[beats:]) == {ready_seq}  # emit still running: not past it
        release.set()
        await wait_for_count(
            lambda: [h for h in fake.heartbeats if h == ready_seq + 1], 1, 10, "heartbeat past it"
        )
        assert [m.platform_message_id for m in taken] == ["ROBOT1.0_k1"]
    finally:
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"


async def test_a_qq_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeQQ,
) -> None:
    """Replicas: the process stands still after a reply's send began and before its request
    left. Once the request has its connection it finds its SEND_BY passed and stops unsent
    (SetOutLate), so the turn can ask its lease first. On time, it is sent once."""
    adapter = QQBotAdapter(
        APP_ID, fake.secret, api_base=fake.api_url, token_base=fake.token_url, backoff=FAST
    )
    async with started(adapter):
        await fake.wait_ready(1)
        fake.keep_alive = False  # each call connects: the send waits for its connection
        reply = OutboundMessage("qqbot", ALICE, "once", reply_to="ROBOT1.0_so1")
        await stalled_then_on_time(
            lambda: adapter.send(reply), lambda: [p["text"] for k, p in fake.calls if k == "send"]
        )
        assert [(p["text"], p["msg_seq"]) for p in fake.sent()] == [("once", 2)]


# --- a real daemon ---------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_daemon_running_qqbot_exits_0_on_sigterm_and_send_names_qqs_refusal(
    tmp_path: Path, fake: FakeQQ
) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        _config(fake).replace("  api:\n    enabled: false\n", f"  api:\n    port: {port}\n")
    )

    def send(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            switchboard(home, "send", "qqbot", BOB, text),
            capture_output=True,
            text=True,
            timeout=90,
            env=clean_env(**ENV),
        )

    went = await asyncio.to_thread(send, "release notes")  # no daemon: sent actively
    assert went.returncode == 0, went.stderr
    assert [(p["chat"], p["text"], p["msg_id"]) for p in fake.sent()] == [
        (BOB, "release notes", None)
    ]
    assert not fake.sockets  # sending only: the gateway was never opened
    fake.allow_active = False
    refused = await asyncio.to_thread(send, "nightly report")
    assert refused.returncode == 77, refused.stderr
    assert "主动消息失败, 无权限 (code 40034102)" in refused.stderr
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(**ENV),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        await fake.wait_ready(1, timeout=30)
        await fake.c2c("through the daemon")
        await fake.wait_sent(2, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "Traceback" not in err.decode()


@pytest.mark.slow
async def test_setup_checks_the_app_secret_with_qq_and_shows_the_console_steps(
    tmp_path: Path, fake: FakeQQ
) -> None:
    def setup(secret: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *switchboard(tmp_path / secret, "setup", "--non-interactive"),
                *("--agent", "echo", "--platform", "qqbot", "--allow", "qqbot=all"),
                *(
                    "--secret",
                    f"QQBOT_APP_ID={APP_ID}",
                    "--secret",
                    f"QQBOT_CLIENT_SECRET={secret}",
                ),
                *("--set", f"platforms.qqbot.base_url={fake.api_url}"),
                *("--set", f"platforms.qqbot.token_url={fake.token_url}"),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            env=clean_env(),
        )

    done = await asyncio.to_thread(setup, fake.secret)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"qqbot: the token is accepted ({BOT_NAME})" in done.stdout
    assert "q.qq.com: create a bot" in done.stdout and "IP allowlist" in done.stdout
    refused = await asyncio.to_thread(setup, "wrong")
    assert refused.returncode != 0
    assert "invalid appid or secret (code 100016)" in refused.stdout + refused.stderr


# --- pure ------------------------------------------------------------------------------------


def test_translation_of_c2c_and_group_messages() -> None:
    dm = to_inbound("C2C_MESSAGE_CREATE", c2c_message(" hello ", ALICE, "m1"))
    assert dm is not None
    assert (dm.source.chat_type, dm.source.chat_id, dm.source.user_id, dm.text) == (
        "dm",
        ALICE,
        ALICE,
        "hello",
    )
    assert (dm.platform_message_id, dm.reply_to, dm.mentioned) == ("m1", "m1", True)
    assert dm.received_at == 1796522280.0  # 2026-12-06T09:58:00+08:00
    picture = {**c2c_message(""), "attachments": [{"content_type": "image/png", "url": "u"}]}
    assert to_inbound("C2C_MESSAGE_CREATE", picture).text == ATTACHMENT_NOTE  # type: ignore[union-attr]
    guild = to_inbound("AT_MESSAGE_CREATE", guild_message("<@!42> hi there", "10001"))
    assert guild is not None
    assert (guild.source.chat_id, guild.source.user_id, guild.source.user_name, guild.text) == (
        f"channel-{CHANNEL}",
        "10001",
        "alice",
        "hi there",
    )
    group = to_inbound("GROUP_AT_MESSAGE_CREATE", group_message("hi all", BOB, GROUP, "g1"))
    assert group is not None
    assert (group.source.chat_type, group.source.chat_id, group.source.user_id, group.text) == (
        "group",
        f"group-{GROUP}",
        BOB,
        "hi all",
    )


@pytest.mark.parametrize(
    "kind, data",
    [
        ("C2C_MESSAGE_CREATE", c2c_message("   ")),
        ("C2C_MESSAGE_CREATE", {**c2c_message("x"), "author": {}}),
        ("C2C_MESSAGE_CREATE", {k: v for k, v in c2c_message("x").items() if k != "id"}),
        ("GROUP_AT_MESSAGE_CREATE", {**group_message("x"), "group_openid": None}),
        ("AT_MESSAGE_CREATE", c2c_message("a guild message without a channel")),
        ("MESSAGE_CREATE", c2c_message("a guild's every message")),
        ("C2C_MESSAGE_CREATE", {**c2c_message("x"), "author": "nobody"}),
    ],
)
def test_events_without_text_or_ids_are_passed_over(kind: str, data: dict[str, object]) -> None:
    assert to_inbound(kind, data) is None


def test_the_home_chat_type_and_thread_source() -> None:
    assert QQBotAdapter.home_chat_type(f"group-{GROUP}") == "group"
    assert QQBotAdapter.home_chat_type(f"channel-{CHANNEL}") == "group"
    assert QQBotAdapter.home_chat_type(ALICE) == "dm"
    home = QQBotAdapter.thread_source(ThreadRef("qqbot", f"group-{GROUP}", f"group-{GROUP}"))
    assert (home.chat_type, home.thread_id) == ("group", None)


async def test_the_access_token_is_fetched_again_before_it_expires(fake: FakeQQ) -> None:
    now = [1000.0]
    api = QQApi(APP_ID, fake.secret, fake.api_url, fake.token_url, clock=lambda: now[0])
    try:
        first = await api.access_token()
        now[0] += 7200 - 45  # inside the last minute QQ leaves a token
        assert await api.access_token() != first and api.tokens_fetched == 2
        now[0] += 60
        assert api.tokens_fetched == 2 and await api.access_token() == fake.tokens[-1]
    finally:
        await api.close()
    assert json.dumps(fake.calls[0][1]) == json.dumps(
        {"appId": APP_ID, "clientSecret": fake.secret}
    )


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, env, key",
    [
        ("    token_url: ftp://bots.example\n", ENV, "platforms.qqbot.token_url"),
        ("    base_url: api.sgroup.qq.com\n", ENV, "platforms.qqbot.base_url"),
        ("    markdown: maybe\n", ENV, "platforms.qqbot.markdown"),
        ("", {"QQBOT_CLIENT_SECRET": "s"}, "platforms.qqbot.app_id_env"),
        ("", {"QQBOT_APP_ID": "1"}, "platforms.qqbot.token_env"),
    ],
)
def test_bad_config_names_the_key(
    tmp_path: Path, extra: str, env: dict[str, str], key: str
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n  qqbot:\n    enabled: true\n    allow_all_users: true\n" + extra)
    with pytest.raises(ConfigError) as err:
        load_config(cfg, env)
    assert key in str(err.value) and err.value.exit_code == 78
