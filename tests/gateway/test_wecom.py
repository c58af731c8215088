"""WeCom AI bot through the whole daemon: the adapter's aiohttp websocket to a loopback
fake of WeCom's long connection (subscribe, callbacks, replies under the callback's
req_id, active messages, pings, a newer connection taking over); the order of commit and
answer with the adapter alone; translation as pure functions."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.wecom import WeComAdapter
from gateway.adapters.wecom_wire import MARKDOWN_BYTES, answer_error, to_inbound, utf8_len
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    NotAccepted,
    PlatformRefused,
    RetryAfter,
)
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage, ThreadRef
from gateway.ops.doctor import run_doctor
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes import running, started, wait_for_count
from tests.fakes.wecom import BOT_ID, ENV, SECRET, FakeWeCom, text_message
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import adapter_of, fake_fixture, platform_daemon, stored

FAST = Backoff(initial_s=0.05, max_s=0.2)


fake = fake_fixture(FakeWeCom)


def _gateway(tmp_path: Path, fake: FakeWeCom, env: dict[str, str] | None = None) -> Gateway:
    return platform_daemon(tmp_path, "wecom", f"    base_url: {fake.url}\n", env or ENV)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeWeCom) -> AsyncIterator[Gateway]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        await fake.wait_connected(1)
        adapter_of(gateway, WeComAdapter)._backoff = FAST
        yield gateway


# --- through the daemon ------------------------------------------------------------------


async def test_a_dm_is_answered_under_its_callback_as_a_finished_stream(
    gw: Gateway, fake: FakeWeCom
) -> None:
    req = await fake.push(text_message("hello wecom"))
    assert await fake.wait_sent(1) == [("reply", req, "echo: hello wecom")]
    [reply] = [c for c in fake.calls if c["cmd"] == "aibot_respond_msg"]
    assert reply["body"]["msgtype"] == "stream" and reply["body"]["stream"]["finish"] is True
    assert await stored(gw, "agent:main:wecom:dm:alice") == ["hello wecom", "echo: hello wecom"]
    subscribe = fake.calls[0]
    assert subscribe["body"] == {"bot_id": BOT_ID, "secret": SECRET}
    assert gw.health()["adapters"]["wecom"]["state"] == "running"


async def test_two_users_of_a_group_have_two_sessions_and_the_mention_is_taken_off(
    gw: Gateway, fake: FakeWeCom
) -> None:
    a = await fake.push(text_message("plan the trip", msg_id="g1", chat_id="wrGROUP"))
    b = await fake.push(text_message("plan dinner", msg_id="g2", chat_id="wrGROUP", user="bob"))
    sent = await fake.wait_sent(2)
    assert sorted(sent) == sorted(
        [("reply", a, "echo: plan the trip"), ("reply", b, "echo: plan dinner")]
    )
    assert await stored(gw, "agent:main:wecom:group:wrGROUP:alice") == [
        "plan the trip",
        "echo: plan the trip",
    ]
    assert await stored(gw, "agent:main:wecom:group:wrGROUP:bob") == [
        "plan dinner",
        "echo: plan dinner",
    ]


async def test_title_sethome_and_resume_work_from_wecom(gw: Gateway, fake: FakeWeCom) -> None:
    assert gw.db is not None
    await fake.push(text_message("first topic", msg_id="t1"))
    await fake.wait_sent(1)
    await fake.push(text_message("/title kyoto trip", msg_id="t2"))
    [*_, (_, _, titled)] = await fake.wait_sent(2)
    assert "kyoto trip" in titled
    await fake.push(text_message("/new", msg_id="t3"))
    await fake.wait_sent(3)
    await fake.push(text_message("/resume kyoto trip", msg_id="t4"))
    [*_, (_, _, resumed)] = await fake.wait_sent(4)
    assert resumed.startswith("Resumed kyoto trip"), resumed
    await fake.push(text_message("/sethome", msg_id="t5", chat_id="wrHOME"))
    await fake.wait_sent(5)
    home = json.loads(await gw.db.get_meta(HOME_KEY.format("wecom")) or "{}")
    assert (home["chat_id"], home["chat_type"]) == ("wrHOME", "group")


async def test_a_handoff_lands_in_the_home_chat_as_an_active_message(
    gw: Gateway, fake: FakeWeCom
) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    await gw.db.set_meta(
        HOME_KEY.format("wecom"), json.dumps({"chat_id": "wrHOME", "chat_type": "group"})
    )
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "wecom", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    [(how, chat, text)] = await fake.wait_sent(1)
    assert (how, chat) == ("send", "wrHOME")
    assert text.startswith("Continuing here from the terminal (deploy plan).")
    assert (await gw.db.get_session(sid))["chat_id"] == "wrHOME"  # type: ignore[index]
    # the next message there continues the handed-off session
    await fake.push(text_message("carry on", msg_id="h1", chat_id="wrHOME"))
    await fake.wait_sent(2)


async def test_a_redelivery_after_a_dropped_connection_is_answered_once(
    gw: Gateway, fake: FakeWeCom
) -> None:
    body = text_message("once please", msg_id="dup1")
    await fake.push(body)
    await fake.wait_sent(1)
    await fake.drop()
    await fake.wait_connected(2, timeout=15)
    await fake.push(body)  # WeCom delivers it again on the new connection
    await fake.push(text_message("after the drop", msg_id="dup2"))
    sent = await fake.wait_sent(2)
    await asyncio.sleep(0.3)
    assert [t for _, _, t in fake.sent()] == ["echo: once please", "echo: after the drop"]
    assert sent[1][0] == "reply" and adapter_of(gw, WeComAdapter).connections == 2


async def test_a_newer_connection_takes_over_and_the_adapter_comes_back(
    gw: Gateway, fake: FakeWeCom
) -> None:
    ok, who = await WeComAdapter.check_credentials(
        WeComAdapter.settings(base_url=fake.url),
        {"bot_id_env": BOT_ID, "token_env": SECRET},
    )
    assert (ok, who) == (True, BOT_ID)  # doctor's check took the connection over for a moment
    await fake.wait_connected(3, timeout=15)  # and the daemon took it back
    req = await fake.push(text_message("still here", msg_id="n1"))
    assert (await fake.wait_sent(1))[0] == ("reply", req, "echo: still here")
    assert (
        adapter_of(gw, WeComAdapter).health()["last_error"]
        == "another connection of this bot took over"
    )


async def test_pings_keep_the_connection_and_unanswered_pings_end_it(
    tmp_path: Path, fake: FakeWeCom
) -> None:
    adapter = WeComAdapter(BOT_ID, SECRET, url=fake.url, backoff=FAST, heartbeat_s=0.05)
    async with started(adapter):
        await fake.wait_connected(1)
        await wait_for_count(lambda: [1] * fake.pings, 3, 10, "pings")
        assert adapter.connections == 1
        fake.answer_pings = False
        await fake.wait_connected(2, timeout=15)  # two unanswered: closed and reopened
        fake.answer_pings = True
        # the adapter counts a connection once its subscription is answered, after the
        # fake saw the socket open
        await wait_for_count(lambda: [1] * adapter.connections, 2, 10, "a second connection")
        assert adapter.connections >= 2


async def test_replies_fall_back_to_active_messages_and_long_ones_are_split(
    gw: Gateway, fake: FakeWeCom
) -> None:
    adapter = adapter_of(gw, WeComAdapter)
    await adapter.send(OutboundMessage("wecom", "alice", "a reply to nothing", reply_to="gone"))
    assert fake.sent() == [("send", "alice", "a reply to nothing")]
    req = await fake.push(text_message("hi", msg_id="f1"))
    await fake.wait_sent(2)
    fake.callbacks.discard(req)  # WeCom no longer takes replies under that req_id
    await adapter.send(OutboundMessage("wecom", "alice", "late answer", reply_to="f1"))
    assert fake.sent()[-1] == ("send", "alice", "late answer")
    long = "\n\n".join(f"段落 {i} " + "字" * 600 for i in range(8))  # ~15,000 bytes
    await adapter.send(OutboundMessage("wecom", "wrGROUP", long))
    parts = [t for how, _, t in fake.sent()[3:]]
    assert len(parts) > 3 and all(utf8_len(p) <= MARKDOWN_BYTES for p in parts)
    assert "".join(p.replace("\n", "") for p in parts) == long.replace("\n", "")


async def test_a_second_reply_under_one_callback_waits_for_the_first_ones_answer(
    gw: Gateway, fake: FakeWeCom
) -> None:
    adapter = adapter_of(gw, WeComAdapter)
    fake.hold = asyncio.Event()
    req = await fake.push(text_message("hi", msg_id="t1"))
    await fake.wait_sent(1)  # the echo is taken; WeCom's answer to it is held back
    fake.callbacks.discard(req)
    late = asyncio.create_task(
        adapter.send(OutboundMessage("wecom", "alice", "late answer", reply_to="t1"))
    )
    await asyncio.sleep(0.2)  # time for a second frame under the req_id to go out early
    fake.hold.set()
    await late
    # each reply got its own answer: the echo's "ok", the late one's "req_id gone" and then
    # the active message it falls back to
    assert fake.sent() == [("reply", req, "echo: hi"), ("send", "alice", "late answer")]
    responds = [c for c in fake.calls if c["cmd"] == "aibot_respond_msg"]
    assert [c["ok"] for c in responds] == [True, False]


async def test_rate_limits_are_waited_out_and_refusals_are_reported(
    gw: Gateway, fake: FakeWeCom
) -> None:
    adapter = adapter_of(gw, WeComAdapter)
    fake.fail_next("aibot_send_msg", 45009, "api freq out of limit")
    await adapter.send(OutboundMessage("wecom", "alice", "patience"))
    assert fake.sent() == [("send", "alice", "patience")]
    fake.fail_next("aibot_send_msg", 93004, "chat not found")
    with pytest.raises(AdapterError, match="chat not found"):
        await adapter.send(OutboundMessage("wecom", "nobody", "to no one"))


async def test_a_bad_secret_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeWeCom
) -> None:
    gateway = _gateway(tmp_path, fake, {**ENV, "WECOM_SECRET": "wrong"})
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "wecom",
            "^wecom refused the bot id or secret: invalid secret$",
            ["platforms.wecom.token_env", "platforms.wecom.bot_id_env"],
        )
    finally:
        await gateway.stop()
    assert [c["cmd"] for c in fake.calls] == ["aibot_subscribe"]


# --- commit before answer, with the adapter alone -------------------------------------------


async def test_a_message_is_committed_before_the_next_is_read_and_a_refused_one_comes_again(
    fake: FakeWeCom,
) -> None:
    adapter = WeComAdapter(BOT_ID, SECRET, url=fake.url, backoff=FAST)
    release = asyncio.Event()
    entered: list[str] = []
    taken: list[InboundMessage] = []
    refuse = [False, False, True]  # the first delivery cannot be stored, later ones can

    async def emit(msg: InboundMessage) -> None:
        entered.append(msg.text)
        if refuse.pop():
            raise NotAccepted("the store is shutting down")
        await release.wait()
        taken.append(msg)

    await adapter.start(emit)
    try:
        await fake.wait_connected(1)
        body = text_message("keep me", msg_id="k1")
        await fake.push(body)
        await wait_for_count(lambda: entered, 1, 10, "deliveries")
        assert adapter.health()["last_error"].startswith("a message could not be stored")
        await fake.push(body)  # WeCom delivers it again
        await fake.push(text_message("next", msg_id="k2"))
        await wait_for_count(lambda: entered, 2, 10, "deliveries")
        await asyncio.sleep(0.2)
        assert entered == ["keep me", "keep me"]  # "next" waits until "keep me" is committed
        release.set()
        await wait_for_count(lambda: taken, 2, 10, "commits")
        assert [m.platform_message_id for m in taken] == ["k1", "k2"]
        assert fake.sent() == []  # nothing is answered by the adapter itself
    finally:
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"


async def test_a_replica_without_the_connection_does_not_send(fake: FakeWeCom) -> None:
    class NoneOfIt:
        async def claim(self, count: int) -> Any:
            from gateway.shards import Claim

            return Claim({}, 0)  # another replica owns the connection

        async def release(self, count: int, shards: Any) -> None:
            return None

    adapter = WeComAdapter(BOT_ID, SECRET, url=fake.url, backoff=FAST)
    adapter.use_shards(NoneOfIt())
    async with started(adapter):
        assert adapter.health()["receiving"] is False and fake.calls == []
        with pytest.raises(AdapterError, match="another replica holds"):
            await adapter.send(OutboundMessage("wecom", "alice", "from the wrong replica"))
    assert fake.calls == []  # no connection was opened: it would have taken over


# --- pure ------------------------------------------------------------------------------------


def test_translation_of_single_and_group_chats() -> None:
    dm = to_inbound(text_message("hello"))
    assert dm is not None
    assert (dm.source.chat_type, dm.source.chat_id, dm.source.user_id) == ("dm", "alice", "alice")
    assert (dm.text, dm.platform_message_id, dm.mentioned, dm.reply_to) == (
        "hello",
        "msg1",
        True,
        "msg1",
    )
    group = to_inbound(text_message("/status", chat_id="wrG", user="bob"))
    assert group is not None and group.text == "/status" and group.mentioned
    assert (group.source.chat_type, group.source.chat_id, group.source.user_id) == (
        "group",
        "wrG",
        "bob",
    )
    mixed = {
        **text_message("x"),
        "msgtype": "mixed",
        "mixed": {
            "msg_item": [{"msgtype": "text", "text": {"content": "see"}}, {"msgtype": "image"}]
        },
    }
    assert to_inbound(mixed).text == "see"  # type: ignore[union-attr]
    voice = {**text_message("x"), "msgtype": "voice", "voice": {"content": "spoken words"}}
    assert to_inbound(voice).text == "spoken words"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        {**text_message("x"), "msgtype": "image", "image": {"url": "http://x"}},
        text_message("   "),
        text_message("", chat_id="wrG"),  # only the mention
        {k: v for k, v in text_message("x").items() if k != "msgid"},
        {**text_message("x"), "from": {}},
        {k: v for k, v in text_message("x", chat_id="wrG").items() if k != "chatid"},
    ],
)
def test_messages_without_text_or_ids_are_ignored(body: dict[str, Any]) -> None:
    assert to_inbound(body) is None


def test_errcodes_are_typed() -> None:
    assert answer_error({"errcode": 0, "errmsg": "ok"}, "x") is None
    assert isinstance(answer_error({"errcode": 45009}, "x"), RetryAfter)
    assert isinstance(answer_error({"errcode": 40001}, "x"), InvalidToken)
    busy = answer_error({"errcode": -1, "errmsg": "system busy"}, "x")
    assert type(busy).__name__ == "TransientError"
    refused = answer_error({"errcode": 93004, "errmsg": "no"}, "the message")
    assert type(refused) is PlatformRefused and "the message" in str(refused)
    assert WeComAdapter.home_chat_type("wrABC") == "group"
    home = WeComAdapter.thread_source(ThreadRef("wecom", "wrABC", "wrABC"))
    assert (home.chat_id, home.chat_type, home.thread_id) == ("wrABC", "group", None)


# --- configuration and doctor --------------------------------------------------------------


def test_config_checks_the_gateway_url(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  wecom:\n    enabled: true\n    allow_all_users: true\n"
        "    base_url: https://openws.work.weixin.qq.com\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ENV)
    assert str(err.value).startswith("platforms.wecom.base_url: must be a websocket URL")


async def test_doctor_reports_an_unreachable_wecom_in_one_word(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  wecom:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: ws://127.0.0.1:{free_port()}/\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, ENV), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == "wecom reachable"]
    assert (reach.ok, reach.detail) == (False, "unreachable (ClientConnectorError)")


# --- a real daemon, and `switchboard send` without one ------------------------------------


async def test_a_daemon_answers_wecom_exits_0_on_sigterm_and_send_then_goes_direct(
    tmp_path: Path, fake: FakeWeCom
) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  wecom:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.url}\n"
    )
    (home / "switchboard.env").write_text(f"WECOM_BOT_ID={BOT_ID}\nWECOM_SECRET={SECRET}\n")
    log = tmp_path / "daemon.log"
    with log.open("w") as err:
        proc = await asyncio.create_subprocess_exec(
            *switchboard(home, "run"),
            env=clean_env(),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )
        try:
            await wait_healthy(f"http://127.0.0.1:{port}", proc)
            await fake.wait_connected(1)
            req = await fake.push(text_message("hello daemon", msg_id="d1"))
            [(how, where, text)] = await fake.wait_sent(1, timeout=30)
            assert (how, where) == ("reply", req) and "hello daemon" in text
        finally:
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    sent = await asyncio.to_thread(
        subprocess.run,
        switchboard(home, "send", "wecom", "alice", "backup finished"),
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(),
    )
    assert sent.returncode == 0, sent.stderr
    assert "directly" in sent.stdout
    assert fake.sent()[-1] == ("send", "alice", "backup finished")


async def test_a_reply_that_stood_still_past_its_send_by_is_not_sent(fake: FakeWeCom) -> None:
    """Replicas: a reply whose turn's lease check is too long ago (the process stood
    still) stops before its frame is written (SetOutLate); on time, it goes."""
    import time

    from gateway.messages import SEND_BY, SetOutLate

    adapter = WeComAdapter(BOT_ID, SECRET, url=fake.url, backoff=FAST)
    async with started(adapter):
        await fake.wait_connected(1)
        late = SEND_BY.set(time.monotonic() - 1)
        try:
            with pytest.raises(SetOutLate):
                await adapter.send(OutboundMessage("wecom", "alice", "too late"))
        finally:
            SEND_BY.reset(late)
        assert [c["cmd"] for c in fake.calls] == ["aibot_subscribe"]
        on_time = SEND_BY.set(time.monotonic() + 30)
        try:
            await adapter.send(OutboundMessage("wecom", "alice", "on time"))
        finally:
            SEND_BY.reset(on_time)
        assert fake.sent() == [("send", "alice", "on time")]


async def test_send_with_a_refused_secret_exits_77_and_setup_shows_the_console_steps(
    tmp_path: Path, fake: FakeWeCom
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "platforms:\n  wecom:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.url}\n"
    )

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            switchboard(home, *args), capture_output=True, text=True, timeout=120, env=clean_env()
        )

    (home / "switchboard.env").write_text(f"WECOM_BOT_ID={BOT_ID}\nWECOM_SECRET=wrong\n")
    refused = await asyncio.to_thread(run, "send", "wecom", "alice", "hi")
    assert refused.returncode == 77, (refused.returncode, refused.stderr)
    assert fake.sent() == []
    (home / "switchboard.env").write_text(f"WECOM_BOT_ID={BOT_ID}\nWECOM_SECRET={SECRET}\n")
    setup = await asyncio.to_thread(run, "setup", "--non-interactive", "--platform", "wecom")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    _, header, after = setup.stdout.partition("On wecom's side:\n")
    assert header, setup.stdout
    steps = [line for line in after.splitlines() if line.startswith("  - ")]
    assert len(steps) >= 2 and any("WECOM_BOT_ID" in s for s in steps), setup.stdout


async def test_allowed_users_and_a_configured_home_channel(tmp_path: Path, fake: FakeWeCom) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  wecom:\n    enabled: true\n"
        f"    allowed_users: [alice]\n    home_channel: wrCONF\n    base_url: {fake.url}\n"
    )
    gateway = Gateway(config=load_config(cfg, ENV), home=tmp_path / "home")
    await gateway.start()
    try:
        await fake.wait_connected(1)
        other = await fake.push(text_message("me too", msg_id="a1", user="mallory"))
        hi = await fake.push(text_message("hi", msg_id="a2"))
        sent = {where: text for _, where, text in await fake.wait_sent(2)}
        assert sent[hi] == "echo: hi"
        assert sent[other] == "Sorry, you are not authorised to use this bot."
        assert gateway.db is not None and gateway.handoffs is not None
        gateway.handoffs.poll_s = 0.05
        sid = await gateway.db.create_session(source="cli", title="release")
        ok, why = await asyncio.wait_for(
            handoff_from_terminal(
                gateway.db, sid, "wecom", enabled=True, configured_home="wrCONF", poll_s=0.05
            ),
            30,
        )
        assert ok, why
        how, where, text = (await fake.wait_sent(3))[2]
        assert (how, where) == ("send", "wrCONF") and text.startswith("Continuing here")
    finally:
        await gateway.stop()
