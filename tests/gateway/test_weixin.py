"""Weixin through the whole daemon: the adapter's aiohttp client long-polling a loopback fake
of the iLink Bot API (its headers, cursor and context_token checked by the fake), replies
through sendmessage; the cursor and inbox-before-ack with the adapter alone; `switchboard
run` and `switchboard login weixin` as real subprocesses; translation as pure functions."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.weixin import LIMIT, VOICE_NOTE, WeixinAdapter, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted, PlatformRefused
from gateway.handoff import handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage, ThreadRef
from gateway.ops import envfile
from gateway.wiring import StoreCursors
from state import SessionDB
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes import running, stalled_then_on_time, started, wait_for_count
from tests.fakes.weixin import ALICE, BOB, BOT_ID, ENV, OWNER, TOKEN, FakeWeixin
from tests.gateway import test_receiver as replicas
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import adapter_of, fake_fixture, platform_daemon, stored

FAST = Backoff(initial_s=0.05, max_s=0.2)
server, ledger = replicas.server, replicas.ledger  # PostgreSQL replicas' fixtures, shared
ROOT = Path(__file__).resolve().parents[2]


fake = fake_fixture(FakeWeixin)


def _gateway(
    tmp_path: Path, fake: FakeWeixin, env: dict[str, str] | None = None, extra: str = ""
) -> Gateway:
    keys = f"    base_url: {fake.base_url}\n    poll_timeout_seconds: 5\n{extra}"
    return platform_daemon(tmp_path, "weixin", keys, env or ENV)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeWeixin) -> AsyncIterator[Gateway]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        await fake.wait_polls(1)
        yield gateway


# --- through the daemon ------------------------------------------------------------------


async def test_two_users_get_two_sessions_and_replies_echo_their_context_token(
    gw: Gateway, fake: FakeWeixin
) -> None:
    a = fake.say(ALICE, "hello from alice")
    b = fake.say(BOB, "hello from bob")
    sent = await fake.wait_sent(2)
    by_peer = {m["to_user_id"]: m for m in sent}
    assert by_peer[ALICE]["context_token"] == a["context_token"]
    assert by_peer[BOB]["context_token"] == b["context_token"]
    assert {m["item_list"][0]["text_item"]["text"] for m in sent} == {
        "echo: hello from alice",
        "echo: hello from bob",
    }
    assert await stored(gw, f"agent:main:weixin:dm:{ALICE}") == [
        "hello from alice",
        "echo: hello from alice",
    ]
    assert await stored(gw, f"agent:main:weixin:dm:{BOB}") == [
        "hello from bob",
        "echo: hello from bob",
    ]
    # a later message brings a new context_token: the reply echoes that one
    later = fake.say(ALICE, "again")
    third = (await fake.wait_sent(3))[2]
    assert third["context_token"] == later["context_token"] != a["context_token"]
    assert fake.header_problems == []
    assert gw.health()["adapters"]["weixin"]["state"] == "running"


async def test_group_messages_are_not_addressed_to_the_bot(gw: Gateway, fake: FakeWeixin) -> None:
    fake.say(ALICE, "chatter in the group", group="grp1@chatroom")
    fake.say(BOB, "a direct question")
    [reply] = await fake.wait_sent(1)
    await asyncio.sleep(0.5)
    assert len(fake.sent()) == 1 and reply["to_user_id"] == BOB
    assert gw.index is not None
    assert gw.index.get(f"agent:main:weixin:group:grp1@chatroom:{ALICE}") is None


async def test_without_require_mention_a_group_message_is_answered_in_the_group(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    gateway = _gateway(tmp_path, fake, extra="    require_mention: false\n")
    await gateway.start()
    try:
        said = fake.say(ALICE, "anyone?", group="grp1@chatroom")
        [reply] = await fake.wait_sent(1)
        assert (reply["to_user_id"], reply["context_token"]) == (
            "grp1@chatroom",
            said["context_token"],
        )
        assert await stored(gateway, f"agent:main:weixin:group:grp1@chatroom:{ALICE}") == [
            "anyone?",
            "echo: anyone?",
        ]
    finally:
        await gateway.stop()


async def test_a_redelivered_message_is_answered_once(gw: Gateway, fake: FakeWeixin) -> None:
    fake.say(ALICE, "once please", msg_id=4242)
    await fake.wait_sent(1)
    fake.say(ALICE, "once please", msg_id=4242)  # iLink hands the same message out again
    fake.say(ALICE, "and then this")
    await fake.wait_sent(2)
    await asyncio.sleep(0.5)
    assert fake.texts() == ["echo: once please", "echo: and then this"]


async def test_long_replies_are_split_under_the_limit(gw: Gateway, fake: FakeWeixin) -> None:
    fake.say(ALICE, "hi")
    await fake.wait_sent(1)
    long = "\n\n".join(f"paragraph {i} " + "word " * 100 for i in range(12))  # ~6,000 chars
    ref = await adapter_of(gw, WeixinAdapter).send(OutboundMessage("weixin", ALICE, long))
    parts = fake.texts()[1:]
    assert len(parts) == len(ref.message_ids) == 4 and all(len(p) <= LIMIT for p in parts)
    assert all(p.startswith("paragraph ") for p in parts)  # cut between paragraphs
    assert len(set(ref.message_ids)) == 4  # each part its own client_id


async def test_a_user_who_never_wrote_cannot_be_messaged(gw: Gateway, fake: FakeWeixin) -> None:
    with pytest.raises(PlatformRefused, match="has not written to the bot"):
        await adapter_of(gw, WeixinAdapter).send(
            OutboundMessage("weixin", "o9cq80stranger@im.wechat", "hi")
        )
    assert fake.sent() == [] and not [c for c, _ in fake.calls if c == "sendmessage"]


@pytest.mark.slow
async def test_a_refused_context_token_is_a_permanent_refusal(
    gw: Gateway, fake: FakeWeixin
) -> None:
    fake.say(ALICE, "hi")
    await fake.wait_sent(1)
    fake.fail_next("sendmessage", 200, {"ret": -1, "errmsg": "context token expired"})
    with pytest.raises(PlatformRefused, match="-1 context token expired"):
        await adapter_of(gw, WeixinAdapter).send(OutboundMessage("weixin", ALICE, "late"))
    fake.fail_next("sendmessage", 503)
    fake.fail_next("sendmessage", 200, {"ret": -2, "errmsg": "frequency limit"})
    await adapter_of(gw, WeixinAdapter).send(
        OutboundMessage("weixin", ALICE, "after a 503 and a limit")
    )
    assert fake.texts()[-1] == "after a 503 and a limit"


async def test_title_resume_sethome_and_a_handoff(gw: Gateway, fake: FakeWeixin) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    fake.say(ALICE, "/title weixin plans")
    fake.say(ALICE, "/new")
    fake.say(ALICE, "/resume weixin plans")
    fake.say(ALICE, "/sethome")
    sent = await fake.wait_sent(4)
    texts = [m["item_list"][0]["text_item"]["text"] for m in sent]
    assert texts[0] == "Title set: weixin plans"
    assert texts[1].startswith("Started a new session")
    assert texts[2].startswith("Resumed weixin plans")
    assert texts[3] == "Home channel for weixin set to this chat."
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "weixin", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    confirm = (await fake.wait_sent(5))[4]
    assert confirm["to_user_id"] == ALICE
    assert confirm["context_token"] == fake.contexts[ALICE]
    assert "Continuing here from the terminal" in confirm["item_list"][0]["text_item"]["text"]
    fake.say(ALICE, "carry on")
    await fake.wait_sent(6)
    assert [m["content"] for m in await gw.db.get_messages(sid)][-2:] == [
        "carry on",
        "echo: carry on",
    ]


async def test_a_bad_token_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeWeixin, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = _gateway(tmp_path, fake, {"WEIXIN_TOKEN": "wrong"})
    try:
        with caplog.at_level(logging.INFO):
            await gateway.start()
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert line.startswith("platforms.weixin.token_env: weixin refused the bot token")
        assert line.endswith("the weixin adapter is stopped (the rest of the gateway runs)")
        refused_at_start(
            gateway,
            "weixin",
            r"^weixin refused the bot token: the session expired \(-14 session timeout\)",
            ["platforms.weixin.token_env"],
        )
    finally:
        await gateway.stop()
    assert [c for c, _ in fake.calls] == ["getconfig"]


# --- the cursor and inbox before ack, with the adapter alone ------------------------------


async def test_the_cursor_moves_only_after_emit_and_survives_a_restart(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    cursors = StoreCursors(db, "weixin")
    taken: list[InboundMessage] = []
    refuse = [True]  # the first delivery cannot be stored, the redelivery can

    async def emit(msg: InboundMessage) -> None:
        if refuse and refuse.pop():
            raise NotAccepted("the store is shutting down")
        taken.append(msg)

    def adapter() -> WeixinAdapter:
        made = WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=5, backoff=FAST)
        made.use_cursors(cursors)
        return made

    try:
        first = adapter()
        await first.start(emit)
        try:
            fake.say(ALICE, "keep me")
            await wait_for_count(lambda: taken, 1, 10, "the message taken")
            await wait_for_count(lambda: [p for p in fake.polls if p == "buf-1"], 1, 10, "a poll")
        finally:
            await first.stop()
        assert [m.text for m in taken] == ["keep me"]
        assert fake.polls[:3] == ["", "", "buf-1"]  # refused: the same cursor asked again
        assert await cursors.get("get_updates_buf") == "buf-1"
        assert await cursors.get(f"ctx:{ALICE}") == fake.contexts[ALICE]
        fake.say(BOB, "while it was down")
        polled = len(fake.polls)
        second = adapter()
        await second.start(emit)
        try:
            await wait_for_count(lambda: taken, 2, 10, "the message sent while down")
        finally:
            await second.stop()
        assert fake.polls[polled] == "buf-1"  # a restart goes on from the stored cursor
        assert [m.text for m in taken] == ["keep me", "while it was down"]
        # any replica sends: another adapter on the same store knows the peer's token
        async with started(adapter()) as sender:
            await sender.send(OutboundMessage("weixin", BOB, "from another replica"))
        assert fake.sent()[-1]["context_token"] == fake.contexts[BOB]
    finally:
        await db.close()


async def test_a_poll_held_past_its_timeout_is_asked_again_from_the_same_cursor(
    fake: FakeWeixin,
) -> None:
    fake.hold_s = 2.0  # iLink holds the poll longer than the adapter waits
    adapter = WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=0.3, backoff=FAST)
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    await adapter.start(emit)
    try:
        await fake.wait_polls(3)
        assert set(fake.polls) == {""} and adapter.health()["last_error"] is None
        fake.say(ALICE, "still there?")
        await wait_for_count(lambda: seen, 1, 10, "the message")
    finally:
        await adapter.stop()


async def test_a_token_that_expires_while_polling_stops_the_poll(
    fake: FakeWeixin, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=5, backoff=FAST)
    async with started(adapter):
        await fake.wait_polls(1)
        fake.token = "rotated"
        await wait_for_count(
            lambda: [1] if str(adapter.health()["state"]).startswith("failed") else [],
            1,
            10,
            "the poll stopped",
        )
        assert "session expired" in str(adapter.health()["last_error"])
        [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert line.startswith("platforms.weixin.token_env: weixin refused the bot token")


async def test_a_weixin_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeWeixin,
) -> None:
    adapter = WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=5, backoff=FAST)
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    await adapter.start(emit)
    try:
        fake.say(ALICE, "hello")
        await wait_for_count(lambda: seen, 1, 10, "the message")
        fake.keep_alive = False  # each call connects: the send waits for its connection
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("weixin", ALICE, "once")), fake.texts
        )
    finally:
        await adapter.stop()


# --- real subprocesses -----------------------------------------------------------------------


@pytest.mark.slow
async def test_sigterm_exits_0_a_restart_neither_reanswers_nor_skips_and_send_reaches_users(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  weixin:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n    poll_timeout_seconds: 5\n"
    )
    env = clean_env(WEIXIN_TOKEN=TOKEN, PYTHONPATH=str(ROOT))

    async def send(*args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *switchboard(home, "send", "weixin", *args),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, (out + err).decode()

    async def run_once(expect: int, sends: bool = False) -> None:
        proc = await asyncio.create_subprocess_exec(
            *switchboard(home, "run"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            await wait_healthy(f"http://127.0.0.1:{port}", proc)
            await fake.wait_sent(expect, timeout=30)
            if sends:  # through the daemon: a user who wrote is reached, a stranger is not
                code, said = await send(ALICE, "from a script")
                assert code == 0 and "through the daemon" in said, said
                code, said = await send("o9cq80stranger@im.wechat", "hello?")
                assert code == 77 and "that user has not written to the bot" in said, said
        finally:
            proc.send_signal(signal.SIGTERM)
            _out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()

    fake.say(ALICE, "first")
    await run_once(1, sends=True)
    fake.say(ALICE, "while the daemon was down")
    polled = len(fake.polls)
    await run_once(3)
    assert fake.polls[polled] == "buf-1"  # from the cursor the first daemon stored
    polls_when_stopped = len(fake.polls)
    await asyncio.sleep(0.3)
    assert fake.texts() == ["echo: first", "from a script", "echo: while the daemon was down"]
    # no daemon: the adapter opens for sending only, with the context tokens in the store
    code, said = await send(ALICE, "without the daemon")
    assert code == 0 and "directly" in said, said
    last = fake.sent()[-1]
    assert (last["to_user_id"], last["context_token"]) == (ALICE, fake.contexts[ALICE])
    code, said = await send("o9cq80stranger@im.wechat", "hello?")
    assert code == 77 and "that user has not written to the bot" in said, said
    assert len(fake.polls) == polls_when_stopped  # sending alone never polls


async def _login(home: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "login", "weixin", *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(PYTHONPATH=str(ROOT)),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.slow
async def test_weixin_login_prints_the_qr_code_and_stores_the_token(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "platforms:\n  weixin:\n    enabled: true\n    allow_all_users: true\n"
        "    token_env: MY_WX_TOKEN  # from the login\n"
    )
    fake.qr_statuses = [
        {"status": "wait"},
        {"status": "scaned"},
        {"status": "expired"},
        {"status": "confirmed"},  # on the second code
    ]
    code, out, err = await _login(home, "--base-url", fake.base_url, "--timeout", "30")
    assert code == 0, err
    assert fake.qr_issued == ["qr-1", "qr-2"]
    assert [q for c, q in fake.calls if c == "get_bot_qrcode"] == [{"bot_type": "3"}] * 2
    assert "or open: https://liteapp.weixin.qq.com/q/qr-1" in out
    assert "or open: https://liteapp.weixin.qq.com/q/qr-2" in out
    assert out.count("\u2588\u2588\u2588\u2588\u2588\u2588\u2588") >= 2  # drawn as text, twice
    assert "scanned: confirm the login in WeChat" in out and "the QR code expired" in out
    assert f"logged in as {BOT_ID}; scanned by WeChat user {OWNER}" in out
    secrets = envfile.path_of(home)
    assert envfile.read(secrets) == {"MY_WX_TOKEN": TOKEN}
    assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
    text = (home / "config.yaml").read_text()
    assert "token_env: MY_WX_TOKEN  # from the login" in text
    assert f"base_url: {fake.base_url}" in text
    # the stored token is what the config reads: the daemon's check accepts it
    config = load_config(home / "config.yaml", envfile.environment(home, {}))
    ok, detail = await WeixinAdapter.check_credentials(
        config.platforms["weixin"], config.platform_secrets("weixin")
    )
    assert (ok, detail) == (True, f"bot token accepted by {fake.base_url}")


@pytest.mark.slow
async def test_weixin_login_gives_up_on_codes_that_keep_expiring(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    home = tmp_path / "home"
    fake.qr_statuses = [{"status": "expired"}] * 4
    code, _out, err = await _login(home, "--base-url", fake.base_url, "--timeout", "30")
    assert code == 77 and "the QR code expired 4 times" in err
    assert not envfile.path_of(home).exists()
    code, _out, err = await _login(home, "--base-url", f"http://127.0.0.1:{free_port()}")
    assert code == 69 and "weixin unreachable" in err
    # with no config file yet: the token under the default variable, a config with the URL
    fake.qr_statuses = [{"status": "confirmed"}]
    code, out, err = await _login(home, "--base-url", fake.base_url, "--timeout", "30")
    assert code == 0, err
    assert envfile.read(envfile.path_of(home)) == {"WEIXIN_TOKEN": TOKEN}
    assert (home / "config.yaml").read_text() == (
        f"platforms:\n  weixin:\n    base_url: {fake.base_url}\n"
    )
    assert "next: switchboard config set platforms.weixin.enabled true" in out


# --- pure ------------------------------------------------------------------------------------


def _wire(**kw: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "message_id": 1,
        "from_user_id": ALICE,
        "to_user_id": BOT_ID,
        "create_time_ms": 1_700_000_000_000,
        "message_type": 1,
        "context_token": "ctx",
        "item_list": [{"type": 1, "text_item": {"text": " hi "}}],
    }
    msg.update(kw)
    return msg


def test_translation() -> None:
    dm = to_inbound(_wire())
    assert dm is not None
    assert (dm.source.chat_type, dm.source.chat_id, dm.source.user_id, dm.text) == (
        "dm",
        ALICE,
        ALICE,
        "hi",
    )
    assert (dm.platform_message_id, dm.received_at, dm.mentioned) == ("1", 1_700_000_000.0, True)
    group = to_inbound(_wire(group_id="g@chatroom"))
    assert group is not None and not group.mentioned and group.source.chat_id == "g@chatroom"
    assert to_inbound(_wire(group_id="g@chatroom"), require_mention=False).mentioned  # type: ignore[union-attr]
    two = _wire(item_list=[{"type": 2, "image_item": {}}, {"type": 1, "text_item": {"text": "x"}}])
    assert to_inbound(two).text == "x"  # type: ignore[union-attr]
    voice = to_inbound(_wire(item_list=[{"type": 3, "voice_item": {"text": " call me "}}]))
    assert voice is not None and voice.text == f"{VOICE_NOTE}\ncall me"


@pytest.mark.parametrize(
    "wire",
    [
        _wire(message_type=2),  # the bot's own
        _wire(item_list=[{"type": 3, "voice_item": {}}]),  # a voice message with no transcript
        _wire(item_list=[{"type": 1, "text_item": {"text": "   "}}]),
        _wire(from_user_id=""),
        _wire(message_id=None),
        _wire(item_list="nope"),
        _wire(create_time_ms="soon"),
    ],
)
def test_messages_without_text_or_ids_are_ignored(wire: dict[str, Any]) -> None:
    assert to_inbound(wire) is None


def test_home_and_threads() -> None:
    assert WeixinAdapter.home_chat_type(ALICE) == "dm"
    home = WeixinAdapter.thread_source(ThreadRef("weixin", ALICE, ALICE))
    assert (home.chat_id, home.chat_type, home.thread_id) == (ALICE, "dm", None)


# --- replicas on PostgreSQL: one polls, any sends -------------------------------------------


async def test_one_replica_polls_and_the_other_sends_and_takes_over(
    server: str, ledger: Any, fake: FakeWeixin
) -> None:
    pair = replicas.Pair(
        lambda: WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=5, backoff=FAST),
        "weixin",
    )
    got, links = pair.got, pair.links
    try:
        a, b = await pair.start(ledger)
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        fake.say(ALICE, "hello")
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        # b never polled, yet it knows Alice's context_token from the shared store
        await b.send(OutboundMessage("weixin", ALICE, "from b"))
        assert fake.sent()[-1]["context_token"] == fake.contexts[ALICE]
        assert b.health()["polls"] == 0
        replicas._cut_off(server, links["a"])
        await b._receiver.sync()
        assert b.health()["receiving"] is True
        await links["a"].close()
        await links["a"].open()
        await a._receiver.sync()
        assert a.health()["receiving"] is False
        fake.say(BOB, "again")
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        await asyncio.sleep(0.3)
        assert got == {"a": ["hello"], "b": ["again"]}  # b went on from a's cursor
    finally:
        await pair.stop()


# --- configuration, and what cannot be done ---------------------------------------------------


def test_a_bad_poll_timeout_names_its_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  weixin:\n    enabled: true\n    allow_all_users: true\n"
        "    poll_timeout_seconds: 1\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ENV)
    assert str(err.value).startswith("platforms.weixin.poll_timeout_seconds: must be between 5")
    cfg.write_text("platforms:\n  weixin:\n    enabled: true\n    allow_all_users: true\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    assert "WEIXIN_TOKEN" in str(err.value) and "platforms.weixin.token_env" in str(err.value)


def test_login_says_which_platforms_have_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        "platforms:\n  weixin:\n    enabled: true\n    allow_all_users: true\n"
    )
    env = clean_env(PYTHONPATH=str(ROOT), WEIXIN_TOKEN=TOKEN)
    other = subprocess.run(
        switchboard(home, "login", "telegram"), capture_output=True, text=True, env=env, timeout=60
    )
    assert other.returncode == 78
    assert "telegram has no terminal login" in other.stderr


async def test_typing_shows_while_a_turn_runs_and_stops_with_the_reply(fake: FakeWeixin) -> None:
    adapter = WeixinAdapter(TOKEN, base_url=fake.base_url, poll_timeout_s=5, backoff=FAST)
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    await adapter.start(emit)
    try:
        fake.say(ALICE, "think about it")
        [msg] = await wait_for_count(lambda: seen, 1, 10, "the message")
        adapter.turn_started(msg)
        await wait_for_count(lambda: fake.typing, 1, 10, "typing shown")
        await adapter.send(OutboundMessage("weixin", ALICE, "done thinking"))
        adapter.turn_ended(msg, None)
        await wait_for_count(lambda: fake.typing, 2, 10, "typing withdrawn")
        assert fake.typing == [(ALICE, 1), (ALICE, 2)] and fake.texts() == ["done thinking"]
        tickets = [b for c, b in fake.calls if c == "getconfig" and b.get("ilink_user_id")]
        assert [t["context_token"] for t in tickets] == [fake.contexts[ALICE]]
    finally:
        await adapter.stop()


@pytest.mark.slow
async def test_setup_checks_the_token_live_and_points_at_the_login(
    tmp_path: Path, fake: FakeWeixin
) -> None:
    home = tmp_path / "home"
    args = ["setup", "--non-interactive", "--platform", "weixin", "--allow", f"weixin={ALICE}"]
    args += ["--set", f"platforms.weixin.base_url={fake.base_url}"]
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, *args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_env(PYTHONPATH=str(ROOT), WEIXIN_TOKEN=TOKEN),
    )
    out_b, err_b = await asyncio.wait_for(proc.communicate(), 120)
    out = out_b.decode()
    assert proc.returncode == 0, out + err_b.decode()
    _, header, after = out.partition("On weixin's side:\n")
    assert header, out
    assert "`switchboard login weixin`" in after
    assert "getconfig" in [c for c, _ in fake.calls]  # the live check
    assert envfile.read(envfile.path_of(home)) == {"WEIXIN_TOKEN": TOKEN}
