"""Signal: translation of recorded signal-cli payloads, the adapter against a loopback fake of
signal-cli's HTTP daemon (JSON-RPC + server-sent events), and the whole daemon (router,
state.db, echo agent) in process."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.adapters.base import Backoff
from gateway.adapters.signal import ATTACHMENTS_NOTE, LIMIT, SignalAdapter, to_inbound
from gateway.adapters.signal_rpc import SseParser, rpc_error
from gateway.adapters.signal_text import Me, parse_envelope, resolve_mentions, to_plain
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import (
    AdapterError,
    ConfigError,
    NotAccepted,
    RetryAfter,
    TransientError,
)
from gateway.messages import InboundMessage, OutboundMessage
from tests.daemon import free_port
from tests.fakes import stalled_then_on_time, wait_for_count
from tests.fakes.signal import (
    ALICE,
    ALICE_UUID,
    BOB,
    BOB_UUID,
    BOT,
    BOT_UUID,
    GROUP,
    FakeSignal,
    attachment,
    envelope,
    mention,
)

ME = Me(BOT, BOT_UUID, "Switchboard")
FAST = Backoff(initial_s=0.05, max_s=0.2)


# --- pure translation, on recorded payloads ---------------------------------------------


def test_a_dm_becomes_an_inbound_message_keyed_by_the_sender() -> None:
    msg = to_inbound(envelope("hello there", ts=1700000000123), ME)
    assert msg is not None and msg.text == "hello there" and msg.mentioned
    src = msg.source
    assert (src.platform, src.chat_id, src.chat_type, src.user_id, src.user_name) == (
        "signal",
        ALICE,
        "dm",
        ALICE,
        "Alice",
    )
    assert msg.platform_message_id == f"{ALICE_UUID}:1700000000123" == msg.reply_to
    assert msg.received_at == pytest.approx(1700000000.123)


def test_a_hidden_number_or_an_allowlisted_uuid_is_the_sender_id() -> None:
    hidden = to_inbound(envelope("hi", number=None), ME)
    assert hidden is not None and hidden.source.chat_id == hidden.source.user_id == ALICE_UUID
    listed = parse_envelope(envelope("hi"), ME, listed={ALICE_UUID})
    assert listed is not None and listed.source.user_id == ALICE_UUID


def test_group_messages_need_a_mention_a_name_or_a_quote_of_the_bot() -> None:
    plain = to_inbound(envelope("humans talking", group=GROUP), ME)
    assert plain is not None and not plain.mentioned
    assert (plain.source.chat_id, plain.source.chat_type, plain.source.chat_name) == (
        GROUP,
        "group",
        "Team",
    )
    by_number = to_inbound(
        envelope("\ufffc what time is it", group=GROUP, mentions=[mention(0, uuid="x")]), ME
    )
    assert by_number is not None and by_number.mentioned and by_number.text == "what time is it"
    by_uuid = to_inbound(envelope("hey \ufffc", group=GROUP, mentions=[mention(4, number="")]), ME)
    assert by_uuid is not None and by_uuid.mentioned and by_uuid.text == "hey"
    by_name = to_inbound(envelope("@switchboard status?", group=GROUP), ME)
    assert by_name is not None and by_name.mentioned and by_name.text == "status?"
    quote = {
        "id": 1699,
        "author": BOT,
        "authorNumber": BOT,
        "authorUuid": BOT_UUID,
        "text": "earlier",
    }
    quoting = to_inbound(envelope("and then?", group=GROUP, quote=quote), ME)
    assert quoting is not None and quoting.mentioned and quoting.source.thread_id is None
    other = {**quote, "authorNumber": BOB, "author": BOB, "authorUuid": BOB_UUID}
    assert not to_inbound(envelope("and then?", group=GROUP, quote=other), ME).mentioned  # type: ignore[union-attr]
    free = to_inbound(envelope("humans talking", group=GROUP), ME, require_mention=False)
    assert free is not None and free.mentioned


def test_mentions_of_people_read_as_at_names_and_offsets_count_utf16() -> None:
    body = "🎉 \ufffc ask \ufffc"  # the emoji is two UTF-16 units: the mentions sit at 3 and 9
    bob = {"name": BOB, "number": BOB, "uuid": BOB_UUID, "start": 3, "length": 1}
    assert resolve_mentions(body, [bob, mention(9)], ME) == (f"🎉 @{BOB} ask", True)
    assert resolve_mentions("\ufffc", [{"start": 5, "length": 1}], ME) == ("\ufffc", False)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"envelope": None},
        {"envelope": {"sourceNumber": ALICE, "timestamp": 1}},  # no dataMessage
        envelope("me, myself", number=BOT, uuid=BOT_UUID),  # our own message
        envelope("   "),
        envelope(None),  # e.g. a sticker
        envelope(None, reaction={"emoji": "👍", "targetTimestamp": 1}),
        envelope(None, remoteDelete={"timestamp": 1}),
        envelope(None, group=GROUP) | {},  # a group update without text
        envelope(["not", "text"]),  # type: ignore[arg-type]
        envelope("x", number=None, uuid=None),
        {
            "envelope": {
                "sourceNumber": ALICE,
                "timestamp": 1,
                "receiptMessage": {"when": 1, "isDelivery": True, "timestamps": [1]},
            }
        },
        {
            "envelope": {
                "sourceNumber": ALICE,
                "timestamp": 1,
                "typingMessage": {"action": "STARTED"},
            }
        },
        {
            "envelope": {
                "sourceNumber": BOT,
                "sourceUuid": BOT_UUID,
                "timestamp": 1,
                "syncMessage": {"sentMessage": {"destination": ALICE, "message": "hi"}},
            }
        },
        {
            "account": BOT,
            "exception": {"message": "InvalidMessageException", "type": "ProtocolException"},
        },
    ],
)
def test_what_is_not_a_persons_text_message_is_ignored(payload: dict) -> None:
    assert to_inbound(payload, ME) is None


def test_a_group_update_and_a_group_id_list_are_read_as_signal_cli_writes_them() -> None:
    update = envelope("renamed", group=GROUP)
    update["envelope"]["dataMessage"]["groupInfo"]["type"] = "UPDATE"
    assert to_inbound(update, ME) is None
    listed = envelope("\ufffc hi", group=GROUP, mentions=[mention(0)])
    listed["envelope"]["dataMessage"]["groupInfo"]["groupId"] = [GROUP]
    assert to_inbound(listed, ME).source.chat_id == GROUP  # type: ignore[union-attr]


def test_attachments_are_counted_and_the_text_kept() -> None:
    only = parse_envelope(envelope(None, attachments=[attachment()]), ME)
    assert only is not None and (only.text, only.attachments) == ("", 1)
    assert to_inbound(envelope(None, attachments=[attachment()]), ME) is None
    both = to_inbound(envelope("look at this", attachments=[attachment()]), ME)
    assert both is not None and both.text == "look at this"


def test_markdown_becomes_plain_text_and_code_is_kept_exactly() -> None:
    md = "# Plan\n**Bold** and *it* or _it_ ~~old~~\n- one\n* two\n> quoted\n[docs](https://x.io/a)\n---"
    assert (
        to_plain(md)
        == "Plan\nBold and it or it old\n• one\n• two\nquoted\ndocs (https://x.io/a)\n―――"
    )
    assert (
        to_plain("run `a **b** c` now\n```py\nx = 2 * 3 * 4\n```")
        == "run a **b** c now\nx = 2 * 3 * 4"
    )
    assert to_plain("snake_case_name and 2*3*4") == "snake_case_name and 2*3*4"


def test_server_sent_events_are_parsed_across_chunks() -> None:
    parser = SseParser()
    assert parser.feed(b":\n\nid:1-1\nevent:rec") == []
    [first] = parser.feed(b'eive\ndata:{"a": 1}\n\n:\n')
    assert (first.id, first.event, first.data) == ("1-1", "receive", '{"a": 1}')
    [second] = parser.feed(b"data: x\r\ndata:y\r\n\r\n")
    assert (second.id, second.event, second.data) == ("1-1", "message", "x\ny")
    raw = 'data:{"message": "héllo 🎉"}\n\n'.encode()
    cut = raw.index("🎉".encode()) + 2  # inside the emoji's four bytes
    assert parser.feed(raw[:cut]) == []
    [third] = parser.feed(raw[cut:])
    assert third.data == '{"message": "héllo 🎉"}'


def test_signal_cli_errors_map_to_the_gateways() -> None:
    limited = rpc_error(
        {
            "code": -5,
            "message": "Failed to send message due to rate limiting",
            "data": {
                "response": {
                    "timestamp": 1,
                    "results": [
                        {"type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": 7},
                        {"type": "RATE_LIMIT_FAILURE", "retryAfterSeconds": 3},
                    ],
                }
            },
        }
    )
    assert isinstance(limited, RetryAfter) and limited.seconds == 7
    assert isinstance(rpc_error({"code": -5, "message": "x", "data": None}), RetryAfter)
    network = {
        "code": -1,
        "message": "Failed to send message",
        "data": {"response": {"results": [{"type": "NETWORK_FAILURE"}]}},
    }
    assert isinstance(rpc_error(network), TransientError)
    assert isinstance(rpc_error({"code": -3, "message": "io"}), TransientError)
    unregistered = rpc_error(
        {
            "code": -1,
            "message": "Failed to send message",
            "data": {"response": {"results": [{"type": "UNREGISTERED_FAILURE"}]}},
        }
    )
    assert type(unregistered).__name__ == "SignalCliError" and not isinstance(
        unregistered, TransientError
    )


def test_the_config_section_names_its_problems(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  signal:\n    enabled: true\n    allow_all_users: true\n"
        "    url: ftp://x\n    base_url: http://127.0.0.1:1\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    found = {e.key for e in err.value.all()}
    assert found == {
        "platforms.signal.url",
        "platforms.signal.account",
        "platforms.signal.base_url",
    }
    cfg.write_text(
        "platforms:\n  signal:\n    enabled: true\n    allow_all_users: true\n    account: '5551'\n"
    )
    with pytest.raises(ConfigError, match="international form"):
        load_config(cfg, {})
    cfg.write_text(
        "platforms:\n  signal:\n    enabled: true\n    account: +15551234567\n"
        "    allowed_users: [+15557654321, '+15550000002']\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    unquoted = [(e.key, e.problem) for e in err.value.all()]
    assert unquoted[0] == (
        "platforms.signal.account",
        "YAML read 15551234567 as a number "
        "(dropping any +): quote phone numbers, e.g. '+15551234567'",
    )
    assert (
        "platforms.signal.allowed_users",
        "YAML read 15557654321 as a number "
        "(dropping any +): quote phone numbers, e.g. '+15557654321'",
    ) in unquoted
    cfg.write_text(
        f"platforms:\n  signal:\n    enabled: true\n    allowed_users: ['{ALICE}']\n"
        f"    account: '{BOT}'\n    token_env: PROXY_TOKEN\n"
    )
    with pytest.raises(ConfigError, match="PROXY_TOKEN is not set"):
        load_config(cfg, {})
    assert load_config(cfg, {"PROXY_TOKEN": "t0k3n"}).platform_secrets("signal") == {
        "token_env": "t0k3n"
    }


# --- the adapter against the fake daemon --------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeSignal]:
    server = FakeSignal()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Cursors:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        return self.values.get(name)

    async def set(self, name: str, value: str) -> None:
        self.values[name] = value


async def test_a_message_not_accepted_is_delivered_again_from_the_stream(fake: FakeSignal) -> None:
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST)
    cursors = Cursors()
    adapter.use_cursors(cursors)
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)
        if len(seen) == 2:
            raise NotAccepted("the store is busy")

    await adapter.start(emit)
    try:
        await fake.wait_connected(1)
        first = await fake.push(envelope("one"))
        await wait_for_count(lambda: seen, 1, 5, "the first message")
        assert cursors.values == {"last_event_id": first}
        await fake.push(envelope("two"))  # refused once: the cursor stays at `first`
        await wait_for_count(lambda: seen, 3, 10, "the second message, again")
        assert [m.text for m in seen] == ["one", "two", "two"]
        assert fake.last_event_ids[:2] == [None, first]  # the stream reopened from `first`
        assert seen[1].platform_message_id == seen[2].platform_message_id
    finally:
        await adapter.stop()


async def test_typing_starts_with_a_turn_and_stops_with_the_reply(fake: FakeSignal) -> None:
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST)

    async def emit(msg: InboundMessage) -> None:
        return None

    await adapter.start(emit)
    try:
        src = to_inbound(envelope("hi", group=GROUP, mentions=[mention(0)]), ME)
        assert src is not None
        adapter.turn_started(src)
        await wait_for_count(lambda: fake.sent("sendTyping"), 1, 5, "typing")
        await adapter.send(
            OutboundMessage("signal", GROUP, "**done**", reply_to=src.platform_message_id)
        )
        typing = await wait_for_count(lambda: fake.sent("sendTyping"), 2, 5, "typing stop")
        assert typing[0] == {"account": BOT, "groupId": GROUP} and typing[1]["stop"] is True
        [sent] = fake.delivered()
        assert sent["message"] == "done" and sent["groupId"] == GROUP
        assert (sent["quoteTimestamp"], sent["quoteAuthor"]) == (
            int(src.reply_to.split(":")[1]),
            ALICE_UUID,
        )  # type: ignore[union-attr]
        adapter.turn_ended(src, None)  # the reply already stopped it: no second stop
        await asyncio.sleep(0.1)
        assert len(fake.sent("sendTyping")) == 2
        assert await adapter.create_thread(GROUP, "a handoff") is None
    finally:
        await adapter.stop()


async def test_long_replies_are_split_below_the_limit(fake: FakeSignal) -> None:
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST)
    await adapter.start(lambda _m: asyncio.sleep(0))
    try:
        text = ("word " * 900).strip()  # 4,499 characters
        ref = await adapter.send(OutboundMessage("signal", ALICE, text))
    finally:
        await adapter.stop()
    sent = fake.delivered()
    assert len(sent) == len(ref.message_ids) == 3 and all(len(s["message"]) <= LIMIT for s in sent)
    assert " ".join(s["message"] for s in sent).split() == text.split()
    assert all(s["recipient"] == [ALICE] and "quoteTimestamp" not in s for s in sent)


async def test_network_failures_are_retried_and_refusals_raised(fake: FakeSignal) -> None:
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST)
    await adapter.start(lambda _m: asyncio.sleep(0))
    try:
        fake.fail_next("send", "network")
        fake.fail_next("send", "http", 503)
        await adapter.send(OutboundMessage("signal", ALICE, "persist"))
        assert len(fake.sent()) == 3 and fake.delivered()[0]["message"] == "persist"
        with pytest.raises(AdapterError, match="did not send"):
            await adapter.send(OutboundMessage("signal", ALICE, ""))  # signal-cli refuses
    finally:
        await adapter.stop()


async def test_a_signal_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeSignal,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its JSON-RPC request left. Once the request has its connection it finds
    its SEND_BY passed and stops unsent (SetOutLate, out of send() unchanged), so the turn
    can ask its lease first (gateway/turns.py's send_checked). On time, it is sent once."""
    fake.keep_alive = False  # each call connects: the send waits for its connection
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST)
    await adapter.start(lambda _m: asyncio.sleep(0))
    try:
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("signal", ALICE, "once")),
            lambda: [p["message"] for p in fake.sent()],
        )
        assert [p["message"] for p in fake.delivered()] == ["once"]
    finally:
        await adapter.stop()


# --- the whole daemon ---------------------------------------------------------------------


def _config(tmp_path: Path, url: str, extra: str = "    allow_all_users: true\n") -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  signal:\n    enabled: true\n"
        f"    url: {url}\n    account: '{BOT}'\n    bot_name: Switchboard\n{extra}"
    )
    return cfg


@contextlib.asynccontextmanager
async def _gateway(
    tmp_path: Path,
    fake: FakeSignal,
    extra: str = "    allow_all_users: true\n",
) -> AsyncIterator[Gateway]:
    gw = Gateway(config=load_config(_config(tmp_path, fake.url, extra), {}), home=tmp_path / "home")
    connections = len(fake.last_event_ids)
    try:
        await gw.start()
        await fake.wait_connected(connections + 1)
        yield gw
    finally:
        await gw.stop()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


async def test_dm_round_trip_with_typing(tmp_path: Path, fake: FakeSignal) -> None:
    async with _gateway(tmp_path, fake) as gw:
        await fake.push(envelope("hello **signal**"))
        [sent] = await fake.wait_sent(1)
        assert (sent["recipient"], sent["message"], sent["account"]) == (
            [ALICE],
            "echo: hello signal",
            BOT,
        )
        assert await _stored(gw, f"agent:main:signal:dm:{ALICE}") == [
            "hello **signal**",
            "echo: hello **signal**",
        ]
        typing = fake.sent("sendTyping")
        assert typing and typing[0]["recipient"] == [ALICE]
        assert gw.health()["adapters"]["signal"]["connected"] is True


async def test_groups_need_a_mention_are_per_user_and_take_commands(
    tmp_path: Path, fake: FakeSignal
) -> None:
    async with _gateway(tmp_path, fake) as gw:
        await fake.push(envelope("just humans talking", group=GROUP))
        await fake.push(envelope("\ufffc what time is it", group=GROUP, mentions=[mention(0)]))
        await fake.push(
            envelope(
                "\ufffc /status",
                group=GROUP,
                number=BOB,
                uuid=BOB_UUID,
                name="Bob",
                mentions=[mention(0)],
            )
        )
        sent = await fake.wait_sent(2)
        await asyncio.sleep(0.3)
        assert len(fake.delivered()) == 2 and all(s["groupId"] == GROUP for s in sent)
        texts = sorted(s["message"] for s in sent)
        assert texts[0].startswith("Session: ") and texts[1] == "echo: what time is it"
        assert await _stored(gw, f"agent:main:signal:group:{GROUP[:-1]}%3D:{ALICE}") == [
            "what time is it",
            "echo: what time is it",
        ]


async def test_a_redelivered_message_is_answered_once(tmp_path: Path, fake: FakeSignal) -> None:
    async with _gateway(tmp_path, fake):
        again = envelope("only once")
        await fake.push(again)
        await fake.wait_sent(1)
        await fake.push(again)  # signal-cli replays it (an unknown Last-Event-ID, a restart)
        await asyncio.sleep(0.5)
        assert len(fake.delivered()) == 1


async def test_attachments_get_a_note_and_text_beside_them_is_answered(
    tmp_path: Path, fake: FakeSignal
) -> None:
    async with _gateway(tmp_path, fake, f"    allowed_users: ['{ALICE}']\n") as gw:
        photo = envelope(None, attachments=[attachment()])
        await fake.push(photo)
        await fake.push(photo)  # redelivered: one note
        await fake.push(
            envelope(None, number=BOB, uuid=BOB_UUID, attachments=[attachment()])
        )  # not allowed
        await fake.push(envelope(None, group=GROUP, attachments=[attachment()]))  # not addressed
        await fake.push(envelope("what do you see", attachments=[attachment()]))
        await fake.wait_sent(2)
        await asyncio.sleep(0.3)
        sent = sorted((s["message"], s["recipient"]) for s in fake.delivered())
        assert sent == [(ATTACHMENTS_NOTE, [ALICE]), ("echo: what do you see", [ALICE])]
        assert await _stored(gw, f"agent:main:signal:dm:{ALICE}") == [
            "what do you see",
            "echo: what do you see",
        ]


async def test_the_stream_reconnects_and_replays_what_it_missed(
    tmp_path: Path, fake: FakeSignal
) -> None:
    async with _gateway(tmp_path, fake):
        first = await fake.push(envelope("before"))
        await fake.wait_sent(1)
        await fake.drop_streams()
        await fake.push(envelope("while away"))  # kept by signal-cli, replayed after the id
        await fake.wait_connected(2)
        assert fake.last_event_ids[1] == first
        await fake.push(envelope("after"))
        sent = await fake.wait_sent(3, timeout=15)
        assert [s["message"] for s in sent] == ["echo: before", "echo: while away", "echo: after"]


async def test_a_restart_resumes_from_the_stored_event_id(tmp_path: Path, fake: FakeSignal) -> None:
    async with _gateway(tmp_path, fake):
        await fake.push(envelope("first run"))
        await fake.wait_sent(1)
    last = await fake.push(envelope("while the gateway was down"))
    async with _gateway(tmp_path, fake):
        sent = await fake.wait_sent(2)
        assert sent[1]["message"] == "echo: while the gateway was down"
        assert fake.last_event_ids[-1] == fake.events[0][0] != last


async def test_rate_limits_are_waited_out_not_dropped(tmp_path: Path, fake: FakeSignal) -> None:
    async with _gateway(tmp_path, fake):
        fake.fail_next("send", "rate_limit", 1)
        await fake.push(envelope("are you there"))
        [sent] = await fake.wait_sent(1, timeout=15)
        assert sent["message"] == "echo: are you there"
        assert [s.get("_failed") for s in fake.sent()] == ["rate_limit", None]


async def test_an_unreachable_daemon_is_retried_with_one_clear_line_per_attempt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    gw = Gateway(config=load_config(_config(tmp_path, url), {}), home=tmp_path / "home")
    hint = (
        f"signal-cli is not reachable at {url}; start it with `signal-cli -a {BOT} daemon --http`"
    )
    try:
        await gw.start()
        signal = gw.health()["adapters"]["signal"]
        assert signal["state"] == "retrying" and signal["last_error"] == hint
    finally:
        await gw.stop()
    assert [r.getMessage() for r in caplog.records if r.name == "gateway.adapters.signal"] == []
    [line] = [r.getMessage() for r in caplog.records if "start attempt" in r.getMessage()]
    assert line.startswith(f"signal: start attempt 1 failed, the platform is unreachable: {hint};")


async def test_an_unregistered_account_stops_the_adapter(tmp_path: Path, fake: FakeSignal) -> None:
    fake.accounts = ["+15559999999"]
    gw = Gateway(config=load_config(_config(tmp_path, fake.url), {}), home=tmp_path / "home")
    try:
        await gw.start()  # the rest of the daemon runs
        signal = gw.health()["adapters"]["signal"]
        assert signal["state"].startswith("failed: ") and gw.health()["status"] == "degraded"
        assert re.search(
            rf"\{BOT} is not registered with signal-cli .* \+15559999999", signal["last_error"]
        )
    finally:
        await gw.stop()


async def test_sethome_and_a_handoff_land_in_the_home_chat_itself(
    tmp_path: Path, fake: FakeSignal
) -> None:
    from gateway.handoff import handoff_from_terminal

    async with _gateway(tmp_path, fake) as gw:
        assert gw.db is not None and gw.handoffs is not None
        gw.handoffs.poll_s = 0.05
        await fake.push(envelope("/sethome"))
        [done] = await fake.wait_sent(1)
        assert done["message"] == "Home channel for signal set to this chat."
        sid = await gw.db.create_session(source="cli", title="deploy plan")
        await gw.db.append_messages(
            sid, [{"role": "user", "content": "we must migrate the database"}]
        )
        ok, why = await asyncio.wait_for(
            handoff_from_terminal(gw.db, sid, "signal", enabled=True), 30
        )
        assert ok, why
        confirm = (await fake.wait_sent(2))[1]
        assert (
            confirm["recipient"] == [ALICE]
            and "Continuing here from the terminal" in confirm["message"]
        )
        await fake.push(envelope("carry on"))
        await fake.wait_sent(3)
        assert [m["content"] for m in await gw.db.get_messages(sid)][-2:] == [
            "carry on",
            "echo: carry on",
        ]


async def test_a_silent_stream_is_reopened_and_a_restarted_daemon_found_again(
    fake: FakeSignal,
) -> None:
    fake.keepalive_s = 30.0  # silent for longer than the adapter waits
    adapter = SignalAdapter(fake.url, BOT, backoff=FAST, keepalive_timeout_s=0.3)
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    await adapter.start(emit)
    try:
        await fake.wait_connected(2)  # the first stream said nothing for 0.3 s: reopened
        assert "TimeoutError" in str(adapter.last_error)
        fake.keepalive_s = 0.05  # keep-alives now come in time: the stream stays
        await fake.drop_streams()
        await fake.wait_connected(3)
        await asyncio.sleep(0.5)
        assert len(fake.last_event_ids) == 3
        await fake.stop()  # the daemon goes away, then comes back on the same port
        await asyncio.sleep(0.3)
        assert not adapter.health()["connected"]
        await fake.start()
        await fake.wait_connected(4)
        await fake.push(envelope("back again"))
        await wait_for_count(lambda: seen, 1, 5, "a message after the restart")
    finally:
        await adapter.stop()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=30,
)
_data_keys = st.sampled_from(
    [
        "message",
        "timestamp",
        "groupInfo",
        "mentions",
        "quote",
        "attachments",
        "reaction",
        "remoteDelete",
    ]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    env=st.dictionaries(
        st.sampled_from(
            ["source", "sourceNumber", "sourceUuid", "timestamp", "dataMessage", "syncMessage"]
        ),
        _json,
    ),
    data=st.dictionaries(_data_keys, _json),
)
def test_any_payload_is_read_or_refused_never_raised(env: dict, data: dict) -> None:
    for payload in ({"envelope": env}, {"envelope": {**env, "dataMessage": data}}):
        got = parse_envelope(payload, ME)
        assert got is None or (got.source.platform == "signal" and (got.text or got.attachments))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_plain_text_keeps_code_exactly_and_takes_any_text(text: str) -> None:
    clean = text.replace("\0", "")
    assert clean in to_plain(f"```\n{text}\n```") or "```" in text
    assert isinstance(to_plain(text), str)
    assert to_plain("\x000\x00 and `x`") == "0 and x"
