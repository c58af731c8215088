"""Matrix: translation of recorded client-server payloads, the adapter on the real mautrix
against a loopback homeserver (tests/fakes/matrix.py), and the whole daemon (router,
state.db in tmp_path, echo agent) behind it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.adapters.base import Backoff
from gateway.adapters.matrix import MatrixAdapter
from gateway.adapters.matrix_events import (
    PART_BYTES,
    Me,
    RoomView,
    inviter,
    message_content,
    part_size,
    relations,
    to_inbound,
)
from gateway.adapters.matrix_html import to_html
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, InvalidToken, NotAccepted
from gateway.handoff import HOME_KEY, configured_home, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage
from gateway.session_keys import SessionSource, build_key
from gateway.vocab import ChatType
from gateway.wiring import StoreCursors
from state import open_store
from tests.fakes import stalled_then_on_time, wait_for_count
from tests.fakes.matrix import BOT, BOT_NAME, FakeMatrix
from tests.gateway.conftest import ScriptedAgent, refused_at_start

DM, GROUP = "!dm:fake.test", "!grp:fake.test"
ALICE, BOB = "@alice:fake.test", "@bob:fake.test"
ME = Me(BOT, BOT_NAME)
FAST = Backoff(initial_s=0.01, max_s=0.05)

# --- translation, on recorded payloads ---------------------------------------------------


def _ev(body: str, sender: str = ALICE, event_id: str = "$e1", **content: Any) -> dict[str, Any]:
    return {
        "type": "m.room.message",
        "sender": sender,
        "event_id": event_id,
        "origin_server_ts": 1_700_000_000_000,
        "unsigned": {"age": 5},
        "content": {"msgtype": "m.text", "body": body, **content},
    }


DM_ROOM = RoomView(DM, True, None, {BOT: BOT_NAME, ALICE: "Alice"})
GROUP_ROOM = RoomView(GROUP, False, "Ops", {BOT: BOT_NAME, ALICE: "Alice", BOB: "Bob"})


def test_a_dm_message_becomes_an_inbound_message() -> None:
    msg = to_inbound(_ev("hello **there**"), DM_ROOM, ME)
    assert msg is not None and msg.mentioned
    assert msg.source == SessionSource("matrix", DM, ChatType.DM, ALICE, "Alice", None, None)
    assert (msg.text, msg.platform_message_id, msg.reply_to, msg.received_at) == (
        "hello **there**",
        "$e1",
        "$e1",
        1_700_000_000.0,
    )


@pytest.mark.parametrize(
    "body, content, mentioned, text",
    [
        ("just people talking", {}, False, "just people talking"),
        ("switchboard: what time is it", {}, True, "what time is it"),
        ("SwitchBoard, status please", {}, True, "status please"),
        (f"{BOT} hi", {}, True, "hi"),
        ("hey you", {"m.mentions": {"user_ids": [BOT]}}, True, "hey you"),
        (
            "ask the bot",
            {
                "format": "org.matrix.custom.html",
                "formatted_body": f'ask <a href="https://matrix.to/#/{BOT}">the bot</a>',
            },
            True,
            "ask the bot",
        ),
        ("switchboards are old", {}, False, "switchboards are old"),  # a whole word only
        ("hey", {"m.mentions": {"user_ids": [BOB]}}, False, "hey"),
    ],
)
def test_group_mentions(body: str, content: dict[str, Any], mentioned: bool, text: str) -> None:
    msg = to_inbound(_ev(body, **content), GROUP_ROOM, ME)
    assert msg is not None and (msg.mentioned, msg.text) == (mentioned, text)
    assert msg.source.chat_type == ChatType.GROUP and msg.source.chat_name == "Ops"
    relaxed = to_inbound(_ev(body, **content), GROUP_ROOM, Me(BOT, BOT_NAME, require_mention=False))
    assert relaxed is not None and relaxed.mentioned


def test_a_thread_message_is_a_thread_session_addressed_when_the_bot_is_in_it() -> None:
    rel = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$latest"},
    }
    ev = _ev("and then?", sender=BOB, **{"m.relates_to": rel})
    assert relations(ev["content"]).reply_to is None  # the fallback is not a reply
    outside = to_inbound(ev, GROUP_ROOM, ME)
    assert outside is not None and not outside.mentioned
    assert (outside.source.chat_type, outside.source.thread_id) == (ChatType.THREAD, "$root")
    inside = to_inbound(ev, GROUP_ROOM, ME, bot_events={"$root"})
    assert inside is not None and inside.mentioned
    in_dm = to_inbound(ev, DM_ROOM, ME)  # a thread in a DM is its own session too
    assert in_dm is not None and in_dm.source.chat_type == ChatType.THREAD and in_dm.mentioned


def test_a_reply_loses_its_quoted_fallback_and_addresses_the_bot_when_it_answers_it() -> None:
    body = f"> <{BOT}> echo: earlier\n> second line\n\nthanks, and more"
    ev = _ev(body, **{"m.relates_to": {"m.in_reply_to": {"event_id": "$bot1"}}})
    plain = to_inbound(ev, GROUP_ROOM, ME)  # the quote names the bot, the person did not
    assert plain is not None and plain.text == "thanks, and more" and not plain.mentioned
    assert plain.source.thread_id is None
    to_bot = to_inbound(ev, GROUP_ROOM, ME, bot_events={"$bot1"})
    assert to_bot is not None and to_bot.mentioned


@pytest.mark.parametrize(
    "event",
    [
        _ev("mine", sender=BOT),
        _ev("a bot notice", msgtype="m.notice"),
        _ev("waves", msgtype="m.emote"),
        _ev("cat.png", msgtype="m.image", url="mxc://fake.test/abc"),
        _ev(
            "* fixed",
            **{
                "m.new_content": {"msgtype": "m.text", "body": "fixed"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"},
            },
        ),
        {
            "type": "m.room.encrypted",
            "sender": ALICE,
            "event_id": "$x",
            "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "..."},
        },
        {
            "type": "m.room.member",
            "sender": ALICE,
            "event_id": "$m",
            "state_key": ALICE,
            "content": {"membership": "join"},
        },
        {"type": "m.room.message", "sender": ALICE, "event_id": "$r", "content": {}},  # redacted
        {
            "type": "m.room.message",
            "sender": ALICE,
            "event_id": "$n",
            "content": {"msgtype": "m.text", "body": 42},
        },
        {"type": "m.room.message", "event_id": "$n", "content": {"msgtype": "m.text", "body": "x"}},
        {"type": "m.room.message", "sender": ALICE, "event_id": "$n", "content": "not a dict"},
        _ev("   "),
    ],
)
def test_ignored_events(event: dict[str, Any]) -> None:
    assert to_inbound(event, GROUP_ROOM, ME) is None


def test_reply_content_in_a_thread_and_as_a_plain_reply() -> None:
    threaded = message_content("**done**", thread_id="$root", reply_to="$ask", reply_sender=ALICE)
    assert threaded == {
        "msgtype": "m.text",
        "body": "**done**",
        "format": "org.matrix.custom.html",
        "formatted_body": "<strong>done</strong>",
        "m.relates_to": {
            "rel_type": "m.thread",
            "event_id": "$root",
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": "$ask"},
        },
        "m.mentions": {"user_ids": [ALICE]},
    }
    reply = message_content("plain words", reply_to="$ask")
    assert reply == {
        "msgtype": "m.text",
        "body": "plain words",
        "m.relates_to": {"m.in_reply_to": {"event_id": "$ask"}},
        "m.mentions": {},
    }
    assert message_content("note", notice=True)["msgtype"] == "m.notice"


def test_markdown_becomes_safe_html() -> None:
    text = (
        "# Plan\n\nSee [docs](https://x.io/a_b?q=1&r=2), **bold**, *it*, ~~old~~ and `a<b>`.\n\n"
        "- one\n- two\n  - nested\n\n2. second\n3. third\n\n```py\nif a < b:\n    pass\n```\n\n"
        "> quoted\n\n<script>alert(1)</script> [x](javascript:alert(1))"
    )
    assert to_html(text) == (
        "<h1>Plan</h1>"
        '<p>See <a href="https://x.io/a_b?q=1&amp;r=2">docs</a>, <strong>bold</strong>, <em>it</em>, '
        "<del>old</del> and <code>a&lt;b&gt;</code>.</p>"
        "<ul><li>one</li><li>two<ul><li>nested</li></ul></li></ul>"
        '<ol start="2"><li>second</li><li>third</li></ol>'
        '<pre><code class="language-py">if a &lt; b:\n    pass\n</code></pre>'
        "<blockquote><p>quoted</p></blockquote>"
        "<p>&lt;script&gt;alert(1)&lt;/script&gt; [x](javascript:alert(1))</p>"
    )
    assert to_html("snake_case and 2*3*4") == "snake_case and 2*3*4"
    assert to_html("at https://x.io/_a_/b. and _this_") == (
        'at <a href="https://x.io/_a_/b">https://x.io/_a_/b</a>. and <em>this</em>'
    )
    assert "formatted_body" not in message_content("nothing to format")


_TAG = re.compile(r"</?(p|br|strong|em|del|code|pre|a|ul|ol|li|blockquote|h[1-6]|hr)( [^<>]*)?>")
_MARKDOWNISH = st.text(
    alphabet=st.sampled_from(list("ab *_~`#>-1.[]()<>&\"'/:\n ")) | st.characters(), max_size=200
)


@settings(max_examples=300, deadline=None)
@given(_MARKDOWNISH)
def test_any_text_renders_to_known_tags_and_safe_links(text: str) -> None:
    rendered = to_html(text)
    assert "<" not in _TAG.sub("", rendered) and ">" not in _TAG.sub("", rendered)
    for href in re.findall(r'href="([^"]*)"', rendered):
        assert href.startswith(("http://", "https://", "mailto:", "matrix:"))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["type", "sender", "event_id", "content", "origin_server_ts", "state_key"]),
        _JSON,
    ),
    _JSON,
)
def test_no_event_makes_translation_raise(event: dict[str, Any], content: Any) -> None:
    for candidate in (event, {**event, "type": "m.room.message", "content": content}):
        msg = to_inbound(candidate, GROUP_ROOM, ME)
        assert msg is None or isinstance(msg.text, str) and msg.text.strip()


def test_long_replies_split_below_the_event_limit_even_when_html_grows() -> None:
    from gateway.adapters.kit.split import split_message

    text = "\n\n".join(f"para {i}: " + "<tag> & é " * 300 for i in range(40))  # escaping doubles it
    parts = split_message(text, PART_BYTES, part_size)
    assert len(parts) > 1 and all(part_size(p) <= PART_BYTES for p in parts)
    assert "".join(parts).replace("\n", "") == text.replace("\n", "")


def test_the_inviter_is_read_from_the_stripped_state() -> None:
    state = {
        "events": [
            {"type": "m.room.name", "state_key": "", "sender": ALICE, "content": {"name": "x"}},
            {
                "type": "m.room.member",
                "state_key": BOT,
                "sender": ALICE,
                "content": {"membership": "invite"},
            },
        ]
    }
    assert inviter(state, BOT) == ALICE and inviter({"events": "junk"}, BOT) is None


def test_config_needs_the_homeserver_and_user_id_and_checks_ids(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  matrix:\n    enabled: true\n    allow_all_users: true\n"
        "    user_id: switchboard\n    home_channel: 'general'\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"MATRIX_ACCESS_TOKEN": "syt_x"})
    found = {e.key: e.problem for e in err.value.all()}
    assert set(found) == {
        "platforms.matrix.homeserver",
        "platforms.matrix.user_id",
        "platforms.matrix.home_channel",
    }
    assert found["platforms.matrix.homeserver"].startswith("is required")
    # a room id holds a colon: the whole value is the room, not chat:thread
    assert configured_home("matrix", "!abc:example.org:8448") == {
        "chat_id": "!abc:example.org:8448",
        "thread_id": None,
        "chat_type": "group",
    }


def test_without_mautrix_installed_the_config_check_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "mautrix", None)  # what importlib sees when it is absent
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  matrix:\n    enabled: true\n    allow_all_users: true\n"
        f"    homeserver: https://matrix.example.org\n    user_id: '{BOT}'\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"MATRIX_ACCESS_TOKEN": "syt_x"})
    assert [(e.key, e.problem) for e in err.value.all()] == [
        ("platforms.matrix", "needs the mautrix package: pip install 'switchboard[matrix]'")
    ]
    assert err.value.exit_code == 78


def test_library_errors_become_the_gateways() -> None:
    import aiohttp
    from mautrix.errors import MatrixConnectionError, make_request_error

    from gateway.adapters.matrix_http import as_gateway_error
    from gateway.errors import RetryAfter, TransientError

    limited = make_request_error(429, "{}", "M_LIMIT_EXCEEDED", "slow down")
    assert isinstance(as_gateway_error(limited), RetryAfter)  # no retry_after_ms: a default wait
    assert isinstance(
        as_gateway_error(make_request_error(401, "", "M_UNKNOWN_TOKEN", "no")), InvalidToken
    )
    assert isinstance(as_gateway_error(make_request_error(401, "", None, None)), InvalidToken)
    for exc in (
        make_request_error(504, "", None, None),
        MatrixConnectionError("refused"),
        aiohttp.ClientConnectionError("reset"),
        TimeoutError(),
    ):
        assert isinstance(as_gateway_error(exc), TransientError)
    forbidden = make_request_error(403, "", "M_FORBIDDEN", "not in room")
    assert as_gateway_error(forbidden) is forbidden  # retrying cannot help: the caller decides


async def test_doctor_says_unreachable_when_nothing_listens(tmp_path: Path) -> None:
    from gateway.adapters.matrix import MatrixSettings
    from tests.daemon import free_port

    settings = MatrixSettings(
        enabled=True, homeserver=f"http://127.0.0.1:{free_port()}", user_id=BOT
    )
    ok, detail = await MatrixAdapter.check_credentials(settings, {"token_env": "syt_x"})
    assert not ok and detail.startswith("unreachable (")


# --- the adapter against the fake homeserver ----------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[FakeMatrix]:
    server = FakeMatrix()
    await server.start()
    server.add_room(DM, {ALICE: "Alice"})
    server.add_room(GROUP, {ALICE: "Alice", BOB: "Bob"}, name="Ops")
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def cursors(tmp_path: Path) -> AsyncIterator[StoreCursors]:
    db = await open_store({"backend": "sqlite"}, tmp_path)
    try:
        yield StoreCursors(db, "matrix")
    finally:
        await db.close()


def _adapter(fake: FakeMatrix, **kw: Any) -> MatrixAdapter:
    return MatrixAdapter(
        fake.base_url, BOT, kw.pop("token", fake.token), poll_timeout_s=2, backoff=FAST, **kw
    )


def _syncs(fake: FakeMatrix) -> list[dict[str, str]]:
    """The query of every /sync request, first to last (its filter aside)."""
    from urllib.parse import parse_qsl, urlsplit

    queries = [dict(parse_qsl(urlsplit(p).query)) for kind, p, _ in fake.calls if kind == "sync"]
    return [{k: v for k, v in q.items() if k != "filter"} for q in queries]


async def test_since_is_saved_only_after_every_event_of_the_batch_was_emitted(
    fake: FakeMatrix, cursors: StoreCursors
) -> None:
    fake.message(DM, ALICE, "history before the first start")
    seen: list[tuple[str, str | None]] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append((msg.text, await cursors.get("since")))

    adapter = _adapter(fake)
    adapter.use_cursors(cursors)
    await adapter.start(emit)
    try:
        await wait_for_count(
            lambda: [q for q in _syncs(fake) if "since" in q], 1, 10, "an incremental sync"
        )
        first = await cursors.get("since")
        assert first == "s1" and _syncs(fake)[0] == {"timeout": "0"}
        fake.message(DM, ALICE, "one")
        fake.message(DM, ALICE, "two")
        await wait_for_count(lambda: seen, 2, 10, "emitted messages")
        assert seen == [("one", "s1"), ("two", "s1")]  # history skipped; since still the old one
        await _until(lambda: _since(adapter) == "s3")
        assert await cursors.get("since") == "s3"
    finally:
        await adapter.stop()


def _since(adapter: Any) -> str | None:
    return adapter.health()["since"]


async def _until(cond: Any, timeout: float = 10.0) -> None:
    await wait_for_count(lambda: [1] if cond() else [], 1, timeout, "the condition")


async def test_a_message_the_gateway_could_not_store_is_synced_again(
    fake: FakeMatrix, cursors: StoreCursors
) -> None:
    await cursors.set("since", "s0")
    fake.message(DM, ALICE, "keep me")  # arrives after s0: not history
    attempts: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        attempts.append(msg.text)
        if len(attempts) == 1:
            raise NotAccepted("the store is busy")

    adapter = _adapter(fake)
    adapter.use_cursors(cursors)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: attempts, 2, 10, "a second delivery")
        assert attempts[:2] == ["keep me", "keep me"]
        assert _syncs(fake)[:2] == [{"timeout": "2000", "since": "s0"}] * 2
        await _until(lambda: _since(adapter) == "s1")
    finally:
        await adapter.stop()


async def test_a_gap_in_a_limited_timeline_is_paged_back_so_nothing_is_lost(
    fake: FakeMatrix, cursors: StoreCursors
) -> None:
    await cursors.set("since", f"s{len(fake.log)}")
    for i in range(250):  # while the daemon was down: more than one sync returns per room
        fake.message(DM, ALICE, f"missed {i}")
    got: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        got.append(msg.text)

    adapter = _adapter(fake)
    adapter.use_cursors(cursors)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: got, 250, 20, "every missed message")
        assert got == [f"missed {i}" for i in range(250)]  # in order, none twice
        assert len(fake.requests("messages")) == 2  # two pages of /messages filled the gap
        await _until(lambda: _since(adapter) == f"s{len(fake.log)}")
    finally:
        await adapter.stop()


async def test_rate_limits_are_waited_out_with_the_servers_retry_after(
    fake: FakeMatrix, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = _adapter(fake)
    await adapter.start(_nothing)
    try:
        fake.fail_next(
            "send", 429, {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many", "retry_after_ms": 300}
        )
        fake.fail_next("send", 502)  # then a gateway error: backed off and retried too
        with caplog.at_level(logging.WARNING, "gateway.adapters.matrix"):
            ref = await adapter.send(OutboundMessage("matrix", DM, "patience"))
        attempts = [p for k, p, _ in fake.calls if k == "send"]
        assert len(attempts) == 3 and len(set(attempts)) == 1  # one transaction id throughout
        assert [s["body"] for s in fake.sends()] == ["patience"] and ref.message_ids
        assert any("waiting 0.3s" in r.getMessage() for r in caplog.records)
    finally:
        await adapter.stop()


async def _nothing(msg: InboundMessage) -> None:
    return None


async def test_a_matrix_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeMatrix,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its request left. Once the request has its connection it finds its
    SEND_BY passed and stops unsent (SetOutLate, out of send() as it is), so the turn can
    ask its lease first (gateway/turns.py's send_checked). On time, it is sent once."""
    fake.keep_alive = False  # each request connects: the send waits for its connection
    adapter = _adapter(fake)
    await adapter.start(_nothing)
    try:
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("matrix", DM, "once")),
            lambda: [s["body"] for s in fake.sends()],
        )
        assert len(fake.requests("send")) == 1  # the stalled send never reached the server
    finally:
        await adapter.stop()


async def test_sync_recovers_from_server_errors(fake: FakeMatrix) -> None:
    got: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        got.append(msg.text)

    adapter = _adapter(fake)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: _syncs(fake), 2, 10, "syncs")
        fake.fail_next("sync", 502)
        fake.fail_next("sync", 503)
        fake.message(DM, ALICE, "after the outage")
        await wait_for_count(lambda: got, 1, 10, "the message")
        assert got == ["after the outage"] and adapter.health()["state"] == "running"
    finally:
        await adapter.stop()


async def test_an_invalid_token_stops_the_adapter_with_one_clear_line(
    fake: FakeMatrix, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, "gateway.adapters.matrix"):
        with pytest.raises(InvalidToken, match="rejected the access token"):
            await _adapter(fake, token="syt_wrong").start(_nothing)
        adapter = _adapter(fake)
        await adapter.start(_nothing)
        try:
            fake.token = "syt_rotated"  # revoked while running: the next sync is refused
            fake.message(DM, ALICE, "anyone?")
            await _until(lambda: adapter.health()["state"] != "running")
            assert adapter.health()["state"] == "failed: invalid token"
        finally:
            await adapter.stop()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(lines) == 2 and all("refused the access token" in line for line in lines)
    assert "M_UNKNOWN_TOKEN" in lines[1]


async def test_m_direct_makes_a_bigger_room_a_dm_at_start_and_when_it_changes(
    fake: FakeMatrix,
) -> None:
    fake.add_room("!trio:fake.test", {ALICE: "Alice", BOB: "Bob"})
    fake.set_direct({ALICE: [GROUP]})  # read with the account data at start
    got: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        got.append(msg)

    adapter = _adapter(fake)
    await adapter.start(emit)
    try:
        await _until(lambda: _since(adapter) is not None)
        fake.message(GROUP, ALICE, "no mention, but a DM")
        await wait_for_count(lambda: got, 1, 10, "the DM message")
        fake.set_direct({ALICE: [GROUP], BOB: ["!trio:fake.test"]})  # arrives through /sync
        fake.message("!trio:fake.test", BOB, "now this one too")
        await wait_for_count(lambda: got, 2, 10, "the second DM message")
        assert [(m.source.chat_type, m.mentioned) for m in got] == [(ChatType.DM, True)] * 2
    finally:
        await adapter.stop()


async def test_encrypted_rooms_are_logged_once_and_not_read(
    fake: FakeMatrix, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        got.append(msg.text)

    adapter = _adapter(fake)
    await adapter.start(emit)
    try:
        await wait_for_count(lambda: _syncs(fake), 2, 10, "syncs")
        with caplog.at_level(logging.WARNING, "gateway.adapters.matrix"):
            for _ in range(2):
                fake.event(
                    DM,
                    ALICE,
                    "m.room.encrypted",
                    {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"},
                )
            fake.message(DM, ALICE, "in the clear")
            await wait_for_count(lambda: got, 1, 10, "the clear message")
        notes = [r for r in caplog.records if "encrypted rooms are not supported" in r.getMessage()]
        assert got == ["in the clear"] and len(notes) == 1
    finally:
        await adapter.stop()


async def test_a_thread_the_bot_started_is_recognised_after_a_restart(
    fake: FakeMatrix, cursors: StoreCursors
) -> None:
    first = _adapter(fake)
    first.use_cursors(cursors)
    await first.start(_nothing)
    try:
        await _until(lambda: _since(first) is not None)  # past the first sync
        ref = await first.create_thread(GROUP, "Continued from the terminal")
        assert ref is not None and ref.thread_id == fake.sends()[0]["event_id"]
        assert MatrixAdapter.thread_source(ref) == SessionSource(
            "matrix", GROUP, ChatType.THREAD, thread_id=ref.thread_id
        )
        await _until(lambda: _since(first) == f"s{len(fake.log)}")  # its own echo synced too
    finally:
        await first.stop()
    got: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        got.append(msg)

    second = _adapter(fake)  # remembers nothing of the first: asks who sent the root
    second.use_cursors(cursors)
    await second.start(emit)
    try:
        rel = {
            "rel_type": "m.thread",
            "event_id": ref.thread_id,
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": ref.thread_id},
        }
        fake.message(GROUP, BOB, "no mention needed here", **{"m.relates_to": rel})
        fake.message(GROUP, BOB, "nor a reply to anyone")
        await wait_for_count(lambda: got, 2, 10, "two messages")
        assert [(m.text, m.mentioned) for m in got] == [
            ("no mention needed here", True),
            ("nor a reply to anyone", False),
        ]
        assert got[0].source.thread_id == ref.thread_id
        assert [p for k, p, _ in fake.calls if k == "event"]  # GET .../event/{root}
    finally:
        await second.stop()


def test_base_url_overrides_the_homeserver_for_requests(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  matrix:\n    enabled: true\n    allow_all_users: true\n"
        f"    homeserver: https://matrix.example.org\n    user_id: '{BOT}'\n"
        "    base_url: http://127.0.0.1:8008\n"
    )
    config = load_config(cfg, {"MATRIX_ACCESS_TOKEN": "syt_x"})
    adapter = MatrixAdapter.from_config(
        config.platforms["matrix"], config.platform_secrets("matrix")
    )
    assert (adapter.homeserver, adapter.user_id) == ("http://127.0.0.1:8008", BOT)


# --- the whole daemon ----------------------------------------------------------------------


async def _gateway(
    tmp_path: Path,
    fake: FakeMatrix,
    *,
    token: str | None = None,
    access: str = "allow_all_users: true",
    agent: Any = None,
) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  matrix:\n    enabled: true\n"
        f"    homeserver: {fake.base_url}\n    user_id: '{BOT}'\n    {access}\n"
    )
    env = {"MATRIX_ACCESS_TOKEN": token or fake.token}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home", agent=agent)
    await gw.start()
    adapter = next(a for a in gw.adapters if isinstance(a, MatrixAdapter))
    await _until(lambda: _since(adapter) is not None)  # past the first sync: history skipped
    return gw


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeMatrix) -> AsyncIterator[Gateway]:
    gateway = await _gateway(tmp_path, fake)
    try:
        yield gateway
    finally:
        await gateway.stop()


def _key(
    chat_id: str,
    chat_type: ChatType = ChatType.DM,
    user: str | None = None,
    thread: str | None = None,
) -> str:
    return build_key(SessionSource("matrix", chat_id, chat_type, user, thread_id=thread)).format()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


async def test_dm_round_trip_and_a_chat_command(gw: Gateway, fake: FakeMatrix) -> None:
    fake.message(DM, ALICE, "hello **matrix**")
    [reply] = await fake.wait_sends(1)
    assert (reply["room_id"], reply["body"]) == (DM, "echo: hello **matrix**")
    assert reply["formatted_body"] == "echo: hello <strong>matrix</strong>"
    assert "m.relates_to" not in reply  # a DM is a conversation, not a reply chain
    assert await _stored(gw, _key(DM)) == ["hello **matrix**", "echo: hello **matrix**"]
    fake.message(DM, ALICE, "/status")
    status = (await fake.wait_sends(2))[-1]
    assert status["body"].startswith("Session: ")
    assert gw.health()["adapters"]["matrix"]["state"] == "running"


async def test_group_rooms_need_a_mention_and_sessions_are_per_user(
    gw: Gateway, fake: FakeMatrix
) -> None:
    fake.message(GROUP, ALICE, "just people talking")
    ask = fake.message(GROUP, ALICE, "switchboard: what time is it")
    fake.message(GROUP, BOB, "hi", **{"m.mentions": {"user_ids": [BOT]}})
    replies = await fake.wait_sends(2)
    first = next(r for r in replies if r["body"] == "echo: what time is it")
    assert first["m.relates_to"] == {"m.in_reply_to": {"event_id": ask["event_id"]}}
    assert first["m.mentions"] == {"user_ids": [ALICE]}
    assert await _stored(gw, _key(GROUP, ChatType.GROUP, ALICE)) == [
        "what time is it",
        "echo: what time is it",
    ]
    assert await _stored(gw, _key(GROUP, ChatType.GROUP, BOB)) == ["hi", "echo: hi"]
    quoted = f"> <{BOT}> echo: what time is it\n\nand the date?"  # a reply with its fallback
    fake.message(
        GROUP, ALICE, quoted, **{"m.relates_to": {"m.in_reply_to": {"event_id": first["event_id"]}}}
    )
    fake.message(GROUP, ALICE, "last one, switchboard")
    replies = await fake.wait_sends(4)
    assert [r["body"] for r in replies[2:]] == [
        "echo: and the date?",
        "echo: last one, switchboard",
    ]
    assert len(fake.sends()) == 4  # "just people talking" was never answered


async def test_a_thread_is_shared_and_continues_without_mentions(
    gw: Gateway, fake: FakeMatrix
) -> None:
    root = fake.message(GROUP, ALICE, "planning the release")
    in_thread = {
        "rel_type": "m.thread",
        "event_id": root["event_id"],
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": root["event_id"]},
    }
    ask = fake.message(
        GROUP, ALICE, "switchboard: /title release talk", **{"m.relates_to": in_thread}
    )
    [titled] = await fake.wait_sends(1)
    assert titled["m.relates_to"] == {**in_thread, "m.in_reply_to": {"event_id": ask["event_id"]}}
    fake.message(GROUP, BOB, "what about the docs?", **{"m.relates_to": in_thread})  # no mention
    replies = await fake.wait_sends(2)
    assert replies[1]["body"] == "echo: [Bob] what about the docs?"
    assert replies[1]["m.relates_to"]["event_id"] == root["event_id"]
    key = _key(GROUP, ChatType.THREAD, thread=root["event_id"])
    assert await _stored(gw, key) == [
        "[Bob] what about the docs?",
        "echo: [Bob] what about the docs?",
    ]


async def test_a_redelivered_event_is_answered_once(gw: Gateway, fake: FakeMatrix) -> None:
    ev = fake.message(DM, ALICE, "only once")
    await fake.wait_sends(1)
    fake.redeliver(DM, ev)  # the homeserver sends the same event id again
    fake.message(DM, ALICE, "and this")
    replies = await fake.wait_sends(2)
    assert [r["body"] for r in replies] == ["echo: only once", "echo: and this"]


async def test_a_restart_resumes_from_the_saved_since_token(
    tmp_path: Path, fake: FakeMatrix
) -> None:
    first = await _gateway(tmp_path, fake)
    try:
        fake.message(DM, ALICE, "before the restart")
        await fake.wait_sends(1)
        await _until(lambda: _since(first.adapters[0]) == f"s{len(fake.log)}")
    finally:
        await first.stop()
    saved = f"s{len(fake.log)}"
    fake.message(DM, ALICE, "while the daemon was down")
    syncs_before = len(_syncs(fake))
    second = await _gateway(tmp_path, fake)
    try:
        replies = await fake.wait_sends(2)
        assert [r["body"] for r in replies] == [
            "echo: before the restart",
            "echo: while the daemon was down",
        ]
        resumed = _syncs(fake)[syncs_before]
        assert resumed == {"timeout": "30000", "since": saved}  # no initial sync
        assert await _stored(second, _key(DM)) == [
            "before the restart",
            "echo: before the restart",
            "while the daemon was down",
            "echo: while the daemon was down",
        ]
    finally:
        await second.stop()


async def test_a_rate_limited_reply_is_waited_out_not_dropped(
    gw: Gateway, fake: FakeMatrix
) -> None:
    fake.fail_next(
        "send", 429, {"errcode": "M_LIMIT_EXCEEDED", "error": "Too many", "retry_after_ms": 200}
    )
    fake.message(DM, ALICE, "are you there")
    [reply] = await fake.wait_sends(1)
    assert reply["body"] == "echo: are you there" and len(fake.requests("send")) == 2


async def test_an_invalid_token_at_start_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeMatrix
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  matrix:\n    enabled: true\n"
        f"    homeserver: {fake.base_url}\n    user_id: '{BOT}'\n    allow_all_users: true\n"
    )
    env = {"MATRIX_ACCESS_TOKEN": "syt_not_this_one"}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    try:
        await gw.start()
        refused_at_start(
            gw, "matrix", "matrix rejected the access token", ["platforms.matrix.token_env"]
        )
    finally:
        await gw.stop()


async def test_typing_shows_while_a_turn_runs_and_long_replies_are_split(
    tmp_path: Path, fake: FakeMatrix
) -> None:
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 0.3
    gateway = await _gateway(tmp_path, fake, agent=agent)
    try:
        fake.message(DM, ALICE, "slow question")
        await fake.wait_sends(1)
        await wait_for_count(lambda: fake.requests("typing"), 2, 10, "typing on and off")
        assert fake.requests("typing")[0] == {"typing": True, "timeout": 30000}
        assert fake.requests("typing")[-1] == {"typing": False}
        text = ("word " * 14_000).strip()  # the echo is ~70,000 characters
        fake.message(DM, ALICE, text)
        parts = (await fake.wait_sends(3))[1:]
        assert all(part_size(p["body"]) <= PART_BYTES for p in parts)
        assert " ".join(p["body"] for p in parts).split() == ("echo: " + text).split()
    finally:
        await gateway.stop()


async def test_invites_are_accepted_from_allowed_users_only(
    tmp_path: Path, fake: FakeMatrix
) -> None:
    gateway = await _gateway(tmp_path, fake, access=f"allowed_users: ['{ALICE}']")
    try:
        fake.invite("!spam:fake.test", "@mallory:evil.test")
        fake.invite("!new:fake.test", ALICE)
        await wait_for_count(lambda: fake.requests("join"), 1, 10, "a join")
        fake.message("!new:fake.test", ALICE, "thanks for joining")
        [reply] = await fake.wait_sends(1)
        assert reply["room_id"] == "!new:fake.test"  # two members: a DM, no mention needed
        joins = [p for k, p, _ in fake.calls if k == "join"]
        assert len(joins) == 1 and "%21new%3Afake.test" in joins[0]
    finally:
        await gateway.stop()


async def test_sethome_and_a_handoff_open_a_thread_that_continues_the_session(
    gw: Gateway, fake: FakeMatrix
) -> None:
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    fake.message(GROUP, ALICE, "switchboard /sethome")
    [ack] = await fake.wait_sends(1)
    assert ack["body"] == "Home channel for matrix set to this chat."
    assert json.loads(await gw.db.get_meta(HOME_KEY.format("matrix")) or "{}")["chat_id"] == GROUP
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(
        sid,
        [
            {"role": "user", "content": "we must migrate"},
            {"role": "assistant", "content": "echo: we must migrate"},
        ],
    )
    ok, message = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "matrix", enabled=True), 30
    )
    assert ok, message
    root, confirm = (await fake.wait_sends(3))[1:]
    assert (root["room_id"], root["body"]) == (GROUP, "deploy plan")
    assert confirm["m.relates_to"]["rel_type"] == "m.thread"
    assert confirm["m.relates_to"]["event_id"] == root["event_id"]
    follow = {
        "rel_type": "m.thread",
        "event_id": root["event_id"],
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": confirm["event_id"]},
    }
    fake.message(GROUP, BOB, "carry on", **{"m.relates_to": follow})  # no mention: the bot's thread
    await fake.wait_sends(4)
    contents = [m["content"] for m in await gw.db.get_messages(sid)]
    assert contents[-2:] == ["[Bob] carry on", "echo: [Bob] carry on"]  # the same session id
