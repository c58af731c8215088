"""Home Assistant through the whole daemon: the adapter's websocket client (aiohttp) against a
loopback fake of Home Assistant's websocket API; conversation events in, reply events,
notify calls and persistent notifications out; reconnects after a restart; watched
entities' notes; the received event after the store took a message (inbox before ack) with
the adapter alone; translation as pure functions; config and doctor."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.homeassistant import NOTIFY_LIMIT, HomeAssistantAdapter
from gateway.adapters.homeassistant_events import chat_of, to_inbound
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted, PlatformRefused
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import SEND_BY, InboundMessage, OutboundMessage, SetOutLate, ThreadRef
from gateway.ops.doctor import run_doctor
from gateway.pipeline import REFUSAL
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes import running, wait_for_count
from tests.fakes.homeassistant import ENV, TOKEN, FakeHomeAssistant
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import adapter_of, fake_fixture, platform_daemon, stored
from tests.gateway.test_receiver import Pair, _cut_off, ledger, server  # noqa: F401

FAST = Backoff(initial_s=0.05, max_s=0.2)
ALICE = "6a1b2c3d4e5f60718293a4b5c6d7e8f9"  # a Home Assistant user id
KITCHEN = "d41d8cd98f00b204e9800998ecf8427e"  # a voice satellite's device id


fake = fake_fixture(FakeHomeAssistant)


def _gateway(
    tmp_path: Path, fake: FakeHomeAssistant, extra: str = "", env: dict[str, str] | None = None
) -> Gateway:
    return platform_daemon(tmp_path, "homeassistant", f"    url: {fake.url}\n{extra}", env or ENV)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeHomeAssistant) -> AsyncIterator[Gateway]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        await fake.wait_subscribed()
        yield gateway


def _ids_grow(fake: FakeHomeAssistant) -> None:
    assert fake.id_errors == []


# --- through the daemon ------------------------------------------------------------------


async def test_two_users_and_a_device_each_get_a_session_of_their_own(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    await fake.fire({"text": "hello from alice"}, context=fake.context(ALICE))
    await fake.fire({"text": "hello from bob", "user": "bob"})
    await fake.fire({"text": "what's the weather", "device_id": KITCHEN})
    replies = await fake.wait_replies(3)
    by_chat = {r["conversation_id"]: r for r in replies}
    assert {c: r["text"] for c, r in by_chat.items()} == {
        f"user.{ALICE}": "echo: hello from alice",
        "user.bob": "echo: hello from bob",
        f"device.{KITCHEN}": "echo: what's the weather",
    }
    assert by_chat[f"device.{KITCHEN}"]["device_id"] == KITCHEN
    assert by_chat["user.bob"]["user"] == "bob"
    assert await stored(gw, f"agent:main:homeassistant:dm:user.{ALICE}") == [
        "hello from alice",
        "echo: hello from alice",
    ]
    assert await stored(gw, "agent:main:homeassistant:dm:user.bob") == [
        "hello from bob",
        "echo: hello from bob",
    ]
    received = await fake.wait_received(3)
    assert sorted(r["conversation_id"] for r in received) == sorted(by_chat)
    assert fake.calls == []  # no notify service, no persistent notification configured
    health = gw.health()["adapters"]["homeassistant"]
    assert (health["state"], health["connected"], health["receiving"]) == ("running", True, True)
    _ids_grow(fake)


async def test_a_reply_answers_the_event_it_came_from(gw: Gateway, fake: FakeHomeAssistant) -> None:
    """The reply event names the message it answers, so an automation that fired the
    question can wait for its own answer."""
    await fake.fire({"text": "lights?", "device_id": KITCHEN, "message_id": "ask-1"})
    [received] = await fake.wait_received(1)
    [reply] = await fake.wait_replies(1)
    assert received == {"message_id": "ask-1", "conversation_id": f"device.{KITCHEN}"}
    assert (reply["reply_to"], reply["text"]) == ("ask-1", "echo: lights?")


async def test_an_event_delivered_again_after_a_reconnect_is_answered_once(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    context = fake.context(ALICE)
    await fake.fire({"text": "only once"}, context=context)
    await fake.wait_replies(1)
    first = fake.subscribed("switchboard_conversation")[0].ws
    await fake.restart()  # Home Assistant restarts: the websocket drops
    [again] = await fake.wait_subscribed()
    assert again.ws is not first and fake.auths == [True, True]
    await fake.fire({"text": "only once"}, context=context)  # the same event, delivered again
    await fake.wait_received(2)  # taken (a duplicate is decided, and acknowledged)
    await fake.fire({"text": "after the restart"}, context=fake.context(ALICE))
    replies = await fake.wait_replies(2)
    await asyncio.sleep(0.2)
    assert [r["text"] for r in fake.replies()] == ["echo: only once", "echo: after the restart"]
    assert [r["text"] for r in replies] == ["echo: only once", "echo: after the restart"]
    assert adapter_of(gw, HomeAssistantAdapter).health()["connections"] == 2
    _ids_grow(fake)


async def test_while_home_assistant_is_down_the_adapter_keeps_trying(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    fake.accept = False
    await fake.restart()
    await wait_for_count(
        lambda: [1] if not adapter_of(gw, HomeAssistantAdapter).health()["connected"] else [],
        1,
        10,
        "a lost connection",
    )
    await asyncio.sleep(0.3)  # several refused attempts
    assert gw.health()["adapters"]["homeassistant"]["state"] == "running"
    fake.accept = True
    await fake.wait_subscribed()
    await fake.fire({"text": "back"}, context=fake.context(ALICE))
    [reply] = await fake.wait_replies(1)
    assert reply["text"] == "echo: back"


async def test_replies_also_go_to_the_notify_service_and_a_persistent_notification(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    extra = (
        "    notify_service: notify.mobile_app_alice_phone\n"
        "    persistent_notification: true\n    notify_title: Agent\n"
    )
    gateway = _gateway(tmp_path, fake, extra)
    await gateway.start()
    try:
        await fake.wait_subscribed()
        await fake.fire({"text": "remind me"}, context=fake.context(ALICE))
        await wait_for_count(lambda: fake.calls, 2, 10, "service calls")
        assert fake.notified("notify.mobile_app_alice_phone") == [
            {"message": "echo: remind me", "title": "Agent"}
        ]
        assert fake.notified("persistent_notification.create") == [
            {"message": "echo: remind me", "title": "Agent"}
        ]
        assert [r["text"] for r in fake.replies()] == ["echo: remind me"]
    finally:
        await gateway.stop()


async def test_sending_to_a_notify_target_splits_long_text_and_maps_refusals(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    adapter = adapter_of(gw, HomeAssistantAdapter)
    long = "\n\n".join(f"paragraph {i} " + "word " * 100 for i in range(8))  # ~4,100 chars
    ref = await adapter.send(OutboundMessage("homeassistant", "notify.mobile_app_bob_phone", long))
    parts = [d["message"] for d in fake.notified("notify.mobile_app_bob_phone")]
    assert len(parts) == 3 and all(len(p) <= NOTIFY_LIMIT for p in parts)
    assert len(ref.message_ids) == 4  # the reply event and three notify calls
    assert fake.replies()[-1]["text"] == long  # the event carries the whole reply
    with pytest.raises(PlatformRefused, match="not_found"):
        await adapter.send(OutboundMessage("homeassistant", "notify.mobile_app_nobody", "x"))
    # an error Home Assistant may recover from is tried again
    fake.failures.append(("notify.mobile_app_bob_phone", "home_assistant_error", "push failed"))
    await adapter.send(OutboundMessage("homeassistant", "notify.mobile_app_bob_phone", "again"))
    assert fake.notified("notify.mobile_app_bob_phone")[-1]["message"] == "again"
    _ids_grow(fake)


async def test_title_resume_and_sethome_then_handoff_work_in_a_conversation(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05

    async def say(text: str) -> str:
        before = len(fake.replies())
        await fake.fire({"text": text, "device_id": KITCHEN})
        return str((await fake.wait_replies(before + 1))[-1]["text"])

    assert await say("/title kitchen plans") == "Title set: kitchen plans"
    await say("first topic")
    assert (await say("/new")).startswith("Started a new session")
    listing = await say("/resume")
    assert "kitchen plans" in listing
    assert (await say("/resume kitchen plans")).startswith("Resumed kitchen plans")
    assert await say("/sethome") == "Home channel for homeassistant set to this chat."
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "homeassistant", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    handed = fake.replies()[-1]
    assert handed["conversation_id"] == f"device.{KITCHEN}"
    assert handed["text"].startswith("Continuing here from the terminal (deploy plan).")
    assert await say("and now?") == "echo: and now?"
    assert (await gw.db.get_session(sid))["chat_id"] == f"device.{KITCHEN}"  # type: ignore[index]


async def test_a_handoff_to_the_configured_notify_target_continues_when_it_is_named(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    """A home channel is a notify target: the handoff goes to the phone, and an event
    naming that target as its conversation_id continues the handed-off session."""
    target = "notify.mobile_app_alice_phone"
    gw = _gateway(tmp_path, fake, f"    home_channel: {target}\n")
    await gw.start()
    try:
        await fake.wait_subscribed()
        await _handed_off_to_a_phone(gw, fake, target)
    finally:
        await gw.stop()


async def _handed_off_to_a_phone(gw: Gateway, fake: FakeHomeAssistant, target: str) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    assert await gw.db.get_meta(HOME_KEY.format("homeassistant")) is None  # no /sethome
    sid = await gw.db.create_session(source="cli", title="garden")
    await gw.db.append_messages(sid, [{"role": "user", "content": "water the roses"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(
            gw.db, sid, "homeassistant", enabled=True, configured_home=target, poll_s=0.05
        ),
        30,
    )
    assert ok, why
    [push] = fake.notified("notify.mobile_app_alice_phone")
    assert push["message"].startswith("Continuing here from the terminal (garden).")
    await fake.fire(
        {"text": "done", "conversation_id": "notify.mobile_app_alice_phone"},
        context=fake.context(ALICE),
    )
    await wait_for_count(lambda: fake.notified("notify.mobile_app_alice_phone"), 2, 10, "pushes")
    assert fake.notified("notify.mobile_app_alice_phone")[1]["message"] == "echo: done"
    assert (await gw.db.get_messages(sid))[-1]["content"] == "echo: done"


async def test_watched_entities_reach_the_agent_as_rate_limited_notes(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    extra = "    watch_entities: [lock.front_door]\n    watch_interval_seconds: 0.5\n"
    gateway = _gateway(tmp_path, fake, extra)
    await gateway.start()
    try:
        await fake.wait_subscribed()
        [trigger] = [c for c in fake.commands if c["type"] == "subscribe_trigger"]
        assert trigger["trigger"] == {
            "platform": "state",
            "entity_id": ["lock.front_door"],
            "to": None,
        }
        await wait_for_count(lambda: [s for s in fake.subs if s.kind == "trigger"], 1, 10, "t")
        await fake.change("lock.front_door", "locked", "unlocked", "Front door")
        await fake.change("lock.front_door", "unlocked", "locked", "Front door")
        await fake.change("lock.front_door", "locked", "unlocked", "Front door")
        await fake.change("light.porch", "off", "on")  # not watched: never a note
        notes = await wait_for_count(
            lambda: [r for r in fake.replies() if r["conversation_id"] == "entities"], 2, 10, "n"
        )
        stamp = " at 2026-12-06T08:00:00+00:00"
        assert [n["text"] for n in notes] == [
            f"echo: [state change] Front door (lock.front_door): locked -> unlocked{stamp}",
            f"echo: [state change] Front door (lock.front_door): locked -> unlocked{stamp}"
            " (1 earlier change folded into this note)",
        ]
        await asyncio.sleep(0.7)
        assert len(fake.replies()) == 2
        assert fake.received() == []  # notes are no one's messages to acknowledge
    finally:
        await gateway.stop()


async def test_a_bad_token_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeHomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = _gateway(tmp_path, fake, env={"HOMEASSISTANT_TOKEN": "wrong"})
    try:
        with caplog.at_level(logging.ERROR):
            await gateway.start()
        refused_at_start(
            gateway,
            "homeassistant",
            "^home assistant refused the access token: Invalid access token$",
            ["platforms.homeassistant.token_env"],
        )
        lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(lines) == 1 and "platforms.homeassistant.token_env" in lines[0].getMessage()
    finally:
        await gateway.stop()
    assert fake.auths == [False]


async def test_a_token_of_a_user_who_is_not_an_administrator_is_refused(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    fake.admin = False
    gateway = _gateway(tmp_path, fake)
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "homeassistant",
            "must be an administrator",
            ["platforms.homeassistant.token_env"],
        )
    finally:
        await gateway.stop()


async def test_a_token_revoked_while_running_stops_the_reconnects(
    gw: Gateway, fake: FakeHomeAssistant
) -> None:
    fake.token = "rotated"
    await fake.restart()
    await wait_for_count(lambda: [a for a in fake.auths if not a], 1, 10, "a refused auth")
    await asyncio.sleep(0.5)
    assert fake.auths == [True, False]  # no further attempt
    assert gw.health()["adapters"]["homeassistant"]["state"] == "failed: invalid token"


async def test_allowlists_are_by_the_user_or_device_the_event_names(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  homeassistant:\n    enabled: true\n"
        f"    allowed_users: [{ALICE}, {KITCHEN}]\n    url: {fake.url}\n"
    )
    gateway = Gateway(config=load_config(cfg, ENV), home=tmp_path / "home")
    await gateway.start()
    try:
        await fake.wait_subscribed()
        await fake.fire({"text": "from alice"}, context=fake.context(ALICE))
        await fake.fire({"text": "from the kitchen", "device_id": KITCHEN})
        await fake.fire({"text": "from a stranger", "user": "mallory"})
        replies = await fake.wait_replies(3)
        assert sorted((r["conversation_id"], r["text"]) for r in replies) == [
            (f"device.{KITCHEN}", "echo: from the kitchen"),
            (f"user.{ALICE}", "echo: from alice"),
            ("user.mallory", REFUSAL),
        ]
    finally:
        await gateway.stop()


async def test_a_reply_past_its_send_by_is_not_sent(gw: Gateway, fake: FakeHomeAssistant) -> None:
    """A replica that stood still before its reply went out finds its SEND_BY passed
    just before the frame is written, and the reply stays unsent (SetOutLate)."""
    adapter = adapter_of(gw, HomeAssistantAdapter)
    limit = SEND_BY.set(time.monotonic() - 1.0)
    try:
        with pytest.raises(SetOutLate):
            await adapter.send(OutboundMessage("homeassistant", "user.bob", "too late"))
    finally:
        SEND_BY.reset(limit)
    assert fake.replies() == [] and fake.calls == []
    await adapter.send(OutboundMessage("homeassistant", "user.bob", "on time"))
    assert [r["text"] for r in fake.replies()] == ["on time"]


# --- inbox before ack, with the adapter alone ---------------------------------------------


async def test_the_received_event_follows_the_store_and_an_unstored_message_is_tried_again(
    fake: FakeHomeAssistant,
) -> None:
    adapter = HomeAssistantAdapter(TOKEN, fake.url, backoff=FAST)
    release = asyncio.Event()
    entered: list[str] = []
    taken: list[InboundMessage] = []
    refuse = [False, True]  # the first attempt cannot be stored, the next can

    async def emit(msg: InboundMessage) -> None:
        entered.append(msg.text)
        if refuse.pop():
            raise NotAccepted("the store is busy")
        await release.wait()
        taken.append(msg)

    await adapter.start(emit)
    try:
        await fake.wait_subscribed()
        context = await fake.fire({"text": "keep me", "device_id": KITCHEN})
        await wait_for_count(lambda: entered, 2, 10, "emits")
        await asyncio.sleep(0.2)
        assert fake.received() == []  # emit has not returned: nothing acknowledged yet
        release.set()
        [received] = await fake.wait_received(1)
        assert received["message_id"] == context["id"]
        assert [m.platform_message_id for m in taken] == [context["id"]]
    finally:
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"


async def test_a_message_that_cannot_be_stored_gets_no_received_event(
    fake: FakeHomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = HomeAssistantAdapter(TOKEN, fake.url, backoff=FAST)

    async def emit(msg: InboundMessage) -> None:
        raise NotAccepted("the store is gone")

    await adapter.start(emit)
    try:
        await fake.wait_subscribed()
        with caplog.at_level(logging.ERROR):
            await fake.fire({"text": "lost?", "message_id": "m-9", "user": "bob"})
            await wait_for_count(
                lambda: [r for r in caplog.records if "m-9" in r.getMessage()], 1, 10, "error"
            )
        assert fake.received() == []  # the sender's script fires it again
    finally:
        await adapter.stop()


async def test_a_sending_only_adapter_subscribes_to_nothing(fake: FakeHomeAssistant) -> None:
    """`switchboard send` without the daemon: authenticated, no subscription."""
    adapter = HomeAssistantAdapter(TOKEN, fake.url, notify_service="mobile_app_alice_phone")
    await adapter.open_outbound()
    try:
        ref = await adapter.send(OutboundMessage("homeassistant", "user.bob", "from the terminal"))
        assert ref.message_ids
        assert fake.subs == [] and fake.replies()[0]["user"] == "bob"
        assert fake.notified("notify.mobile_app_alice_phone")[0]["message"] == "from the terminal"
        assert await adapter.create_thread("user.bob", "x") is None
    finally:
        await adapter.stop()


# --- replicas and the daemon process --------------------------------------------------------


async def test_among_replicas_one_subscribes_and_any_replica_sends(
    server: str,  # noqa: F811
    ledger: Any,  # noqa: F811
    fake: FakeHomeAssistant,
) -> None:
    """Two adapters on one PostgreSQL ledger, as two replicas: both connect (each sends
    over its own websocket), one subscribes; when it is cut off the other subscribes, and
    the first, rejoined, unsubscribes."""
    pair = Pair(
        lambda: HomeAssistantAdapter(TOKEN, fake.url, backoff=FAST), "homeassistant", cursors=False
    )
    got, links = pair.got, pair.links
    try:
        a, b = await pair.start(ledger)
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        assert fake.open_sockets() == 2 and len(fake.subscribed("switchboard_conversation")) == 1
        await fake.fire({"text": "hello", "user": "bob"})
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        await b.send(OutboundMessage("homeassistant", "user.bob", "from b"))
        assert [r["text"] for r in fake.replies()] == ["from b"]

        _cut_off(server, links["a"])
        await b._receiver.sync()
        assert b.health()["receiving"] is True
        await fake.wait_subscribed(n=2)
        await links["a"].close()
        await links["a"].open()
        await a._receiver.sync()
        assert a.health()["receiving"] is False
        await wait_for_count(
            lambda: [1] if len(fake.subscribed("switchboard_conversation")) == 1 else [],
            1,
            10,
            "one subscription",
        )
        await fake.fire({"text": "again", "user": "bob"})
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        assert got == {"a": ["hello"], "b": ["again"]}
        _ids_grow(fake)
    finally:
        await pair.stop()


def _daemon(home: Path, port: int, url: str) -> subprocess.Popen[str]:
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  homeassistant:\n    enabled: true\n"
        f"    allow_all_users: true\n    url: {url}\n"
    )
    return subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(**ENV),
    )


@pytest.mark.slow
async def test_sigterm_of_a_daemon_running_the_adapter_exits_zero(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    port = free_port()
    proc = _daemon(tmp_path / "home", port, fake.url)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        await fake.wait_subscribed(timeout=30)
        await fake.fire({"text": "before the stop", "user": "bob"})
        [reply] = await fake.wait_replies(1, timeout=30)
        assert reply["text"] == "echo: before the stop"
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    _out, err = proc.communicate()
    assert rc == 0, err
    await wait_for_count(lambda: [1] if fake.open_sockets() == 0 else [], 1, 10, "closed")


def _cli_home(home: Path, url: str, token: str) -> Path:
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(
        "platforms:\n  homeassistant:\n    enabled: true\n    allow_all_users: true\n"
        f"    url: {url}\n"
    )
    (home / "switchboard.env").write_text(f"HOMEASSISTANT_TOKEN={token}\n")
    return home


async def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )


async def test_switchboard_send_without_a_daemon_subscribes_to_nothing(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    home = _cli_home(tmp_path / "home", fake.url, TOKEN)
    sent = await _cli(home, "send", "homeassistant", "user.bob", "release 2.4 is out")
    assert sent.returncode == 0, sent.stderr
    assert [(r["user"], r["text"]) for r in fake.replies()] == [("bob", "release 2.4 is out")]
    assert not [c for c in fake.commands if str(c["type"]).startswith("subscribe")]
    _cli_home(home, fake.url, "wrong")
    refused = await _cli(home, "send", "homeassistant", "user.bob", "again")
    assert refused.returncode == 77, refused.stderr
    assert "refused the access token" in refused.stderr and len(fake.replies()) == 1


async def test_setup_checks_the_token_live_and_shows_the_steps_in_home_assistant(
    tmp_path: Path, fake: FakeHomeAssistant
) -> None:
    home = _cli_home(tmp_path / "home", fake.url, TOKEN)
    proc = await _cli(home, "setup", "--non-interactive", "--platform", "homeassistant")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the token is accepted (Home (Home Assistant 2026.11.3) as Alice)" in proc.stdout
    _, header, after = proc.stdout.partition("On homeassistant's side:\n")
    steps = [line for line in after.splitlines() if line.startswith("  - ")]
    assert header and len(steps) == 3 and "administrator" in steps[0]


# --- pure ----------------------------------------------------------------------------------


def _event(data: dict[str, Any], context: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "event_type": "switchboard_conversation",
        "data": data,
        "time_fired": "2026-12-06T08:00:00+00:00",
        "context": context or {"id": "ctx1", "parent_id": None, "user_id": None},
    }


def test_translation_keys_sessions_by_conversation_device_or_user() -> None:
    msg = to_inbound(_event({"text": " hi ", "device_id": KITCHEN, "user": "alice"}))
    assert msg is not None
    assert (msg.text, msg.platform_message_id, msg.reply_to) == ("hi", "ctx1", "ctx1")
    assert (msg.source.chat_id, msg.source.user_id, msg.source.chat_type) == (
        f"device.{KITCHEN}",
        "alice",
        "dm",
    )
    assert msg.received_at == 1796544000.0
    assert chat_of({}, {"user_id": ALICE}) == (f"user.{ALICE}", ALICE)
    assert chat_of({"device_id": KITCHEN}, {}) == (f"device.{KITCHEN}", KITCHEN)
    assert chat_of({"conversation_id": "notify.x", "user": "bob"}, {}) == ("notify.x", "bob")
    assert chat_of({}, {"user_id": None}) is None
    explicit = to_inbound(_event({"text": "x", "user": "bob", "message_id": 42}))
    assert explicit is not None and explicit.platform_message_id == "42"


@pytest.mark.parametrize(
    "event",
    [
        _event({"device_id": KITCHEN}),
        _event({"text": "   ", "device_id": KITCHEN}),
        _event({"text": ["a"], "device_id": KITCHEN}),
        _event({"text": "nobody"}),
        _event({"text": "no id", "user": "bob"}, {"id": None, "user_id": None}),
        {"event_type": "switchboard_conversation", "data": "text"},
    ],
)
def test_events_without_text_id_or_sender_are_ignored(event: dict[str, Any]) -> None:
    assert to_inbound(event) is None


def test_setup_steps_say_what_to_create_in_home_assistant() -> None:
    steps = HomeAssistantAdapter.setup_steps(HomeAssistantAdapter.settings())
    assert "administrator" in steps[0] and "'switchboard_conversation'" in steps[1]
    assert "'switchboard_reply'" in steps[2]


def test_chats_and_handoffs_stay_where_they_are() -> None:
    assert HomeAssistantAdapter.home_chat_type("notify.mobile_app_alice_phone") == "dm"
    home = HomeAssistantAdapter.thread_source(ThreadRef("homeassistant", "notify.x", "notify.x"))
    assert (home.chat_id, home.chat_type, home.thread_id) == ("notify.x", "dm", None)


# --- configuration and doctor --------------------------------------------------------------


def _config(tmp_path: Path, body: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n  homeassistant:\n    enabled: true\n" + body)
    load_config(cfg, ENV)


@pytest.mark.parametrize(
    "body, key, phrase",
    [
        ("    allow_all_users: true\n", "platforms.homeassistant.url", "is required"),
        (
            "    allow_all_users: true\n    url: homeassistant.local\n",
            "platforms.homeassistant.url",
            "must be Home Assistant's address",
        ),
        (
            "    allow_all_users: true\n    url: http://ha:8123\n    reply_event: switchboard_conversation\n",
            "platforms.homeassistant.reply_event",
            "must differ from event_type",
        ),
        (
            "    allow_all_users: true\n    url: http://ha:8123\n    reply_event: null\n",
            "platforms.homeassistant.reply_event",
            "replies would reach no one",
        ),
        (
            "    allowed_users: [bob]\n    url: http://ha:8123\n    watch_entities: [lock.door]\n",
            "platforms.homeassistant.allowed_users",
            "must list 'entities'",
        ),
        (
            "    allow_all_users: true\n    url: http://ha:8123\n    watch_entities: [Front Door]\n",
            "platforms.homeassistant.watch_entities",
            "must be entity ids",
        ),
        (
            "    allow_all_users: true\n    url: http://ha:8123\n    notify_service: 'my phone'\n",
            "platforms.homeassistant.notify_service",
            "must be a notify service",
        ),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, body: str, key: str, phrase: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, body)
    found = [e for e in err.value.all() if e.key == key]
    assert found and phrase in found[0].problem, err.value


def test_a_working_config_loads(tmp_path: Path) -> None:
    _config(
        tmp_path,
        "    allowed_users: [bob, entities]\n    url: https://ha.example:8123\n"
        "    notify_service: notify.mobile_app_bob\n    watch_entities: [lock.door]\n"
        "    home_channel: notify.mobile_app_bob\n",
    )


@pytest.mark.parametrize("case", ["not an admin", "no such notify service", "good"])
async def test_doctor_says_what_the_token_or_the_notify_service_lacks(
    tmp_path: Path, fake: FakeHomeAssistant, case: str
) -> None:
    fake.admin = case != "not an admin"
    service = (
        "mobile_app_carol_phone" if case == "no such notify service" else "mobile_app_bob_phone"
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  homeassistant:\n    enabled: true\n    allow_all_users: true\n"
        f"    url: {fake.url}\n    notify_service: {service}\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, ENV), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == "homeassistant reachable"]
    assert (reach.ok, reach.detail) == {
        "not an admin": (
            False,
            "the token's user (Alice) is not an administrator: "
            "subscribing to 'switchboard_conversation' needs one",
        ),
        "no such notify service": (
            False,
            "Home Assistant has no notify.mobile_app_carol_phone (notify_service)",
        ),
        "good": (True, "Home (Home Assistant 2026.11.3) as Alice"),
    }[case]


async def test_doctor_reports_an_unreachable_home_assistant(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  homeassistant:\n    enabled: true\n    allow_all_users: true\n"
        f"    url: http://127.0.0.1:{free_port()}\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, ENV), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == "homeassistant reachable"]
    assert (reach.ok, reach.detail) == (False, "unreachable (ClientConnectorError)")
