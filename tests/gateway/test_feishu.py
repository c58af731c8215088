"""Feishu through the whole daemon: encrypted, signed event POSTs to the daemon's HTTP
server, replies through lark-oapi to a loopback fake of the Open API; and the checks and
translation as pure functions."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.feishu import LIMIT, FeishuAdapter
from gateway.adapters.feishu_events import Refused, card_size, open_request, to_inbound
from gateway.adapters.kit.split import split_message
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage
from gateway.ops.doctor import run_doctor
from tests.daemon import free_port
from tests.fakes.feishu import (
    APP_ID,
    BOT_OPEN_ID,
    ENCRYPT_KEY,
    ENV,
    VERIFICATION_TOKEN,
    FakeFeishu,
    mention,
    message_event,
    signed,
)
from tests.gateway.conftest import refused_at_start


@pytest.fixture
async def fake() -> AsyncIterator[FakeFeishu]:
    server = FakeFeishu()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _config(tmp_path: Path, fake: FakeFeishu) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  feishu:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake.base_url}\n"
    )
    return cfg


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeFeishu) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(config=load_config(_config(tmp_path, fake), ENV), home=tmp_path / "home")
    await gateway.start()
    api = next(a for a in gateway.adapters if a.platform == "api")
    try:
        yield gateway, f"http://127.0.0.1:{api.bound_port}/feishu/events"  # type: ignore[attr-defined]
    finally:
        await gateway.stop()


async def _post(url: str, payload: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    body, headers = signed(payload, **kw)
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


# --- through the daemon ------------------------------------------------------------------


async def test_a_dm_is_answered_with_a_markdown_card(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    assert await _post(url, message_event("hello feishu")) == (200, {"msg": "success"})
    [sent] = await fake.wait_sent(1)
    assert (sent["receive_id_type"], sent["chat_id"], sent["msg_type"]) == (
        "chat_id",
        "oc_dm",
        "interactive",
    )
    assert sent["markdown"] == "echo: hello feishu"
    assert await _stored(gateway, "agent:main:feishu:dm:oc_dm") == [
        "hello feishu",
        "echo: hello feishu",
    ]
    assert gateway.health()["adapters"]["feishu"]["bot_open_id"] == BOT_OPEN_ID


async def test_the_url_verification_challenge_is_echoed_once_decrypted_and_token_checked(
    gw: tuple[Gateway, str],
) -> None:
    _, url = gw
    challenge = {"challenge": "c-123", "token": VERIFICATION_TOKEN, "type": "url_verification"}
    assert await _post(url, challenge, signature=False) == (200, {"challenge": "c-123"})
    wrong = {**challenge, "token": "someone-else"}
    assert (await _post(url, wrong, signature=False))[0] == 403


async def test_group_messages_need_a_mention_and_the_answer_quotes_them(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    group = {"chat_id": "oc_grp", "chat_type": "group"}
    assert (
        await _post(
            url, message_event("humans talking", message_id="om_a", event_id="e_a", **group)
        )
    )[0] == 200
    mentioned = message_event(
        "@_user_1 what time is it",
        message_id="om_b",
        event_id="e_b",
        mentions=[mention("@_user_1")],
        **group,
    )
    assert (await _post(url, mentioned))[0] == 200
    status = message_event(
        "@_user_1 /status",
        user="ou_bob",
        message_id="om_c",
        event_id="e_c",
        mentions=[mention("@_user_1")],
        **group,
    )
    assert (await _post(url, status))[0] == 200
    sent = await fake.wait_sent(2)
    await asyncio.sleep(0.2)
    assert len(fake.sent()) == 2
    by_parent = {s["parent_id"]: s for s in sent}
    assert by_parent["om_b"]["markdown"] == "echo: what time is it"
    assert by_parent["om_b"]["reply_in_thread"] is False
    assert by_parent["om_c"]["markdown"].startswith("Session: ")
    assert await _stored(gateway, "agent:main:feishu:group:oc_grp:ou_alice") == [
        "what time is it",
        "echo: what time is it",
    ]


async def test_a_thread_is_one_shared_session_answered_in_the_thread(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    thread = {"chat_id": "oc_grp", "chat_type": "group", "root_id": "om_root", "thread_id": "omt_1"}
    first = message_event(
        "@_user_1 start here",
        message_id="om_t1",
        event_id="e_t1",
        mentions=[mention("@_user_1")],
        **thread,
    )
    assert (await _post(url, first))[0] == 200
    await fake.wait_sent(1)
    second = message_event(
        "and me, no mention", user="ou_bob", message_id="om_t2", event_id="e_t2", **thread
    )
    assert (await _post(url, second))[0] == 200
    sent = await fake.wait_sent(2)
    assert all((s["parent_id"], s["reply_in_thread"]) == ("om_root", True) for s in sent)
    assert await _stored(gateway, "agent:main:feishu:group:oc_grp:t=om_root") == [
        "[ou_alice] start here",
        "echo: [ou_alice] start here",
        "[ou_bob] and me, no mention",
        "echo: [ou_bob] and me, no mention",
    ]


async def test_redeliveries_are_answered_once(gw: tuple[Gateway, str], fake: FakeFeishu) -> None:
    _, url = gw
    event = message_event("once please", message_id="om_once", event_id="e_once")
    assert (await _post(url, event))[0] == 200
    assert (await _post(url, event))[0] == 200  # Feishu's retry: the same event id
    again = message_event("once please", message_id="om_once", event_id="e_other")
    assert (await _post(url, again))[0] == 200  # the same message under another event id
    await fake.wait_sent(1)
    await asyncio.sleep(0.3)
    assert len(fake.sent()) == 1


async def test_forged_missing_stale_and_wrong_token_requests_are_refused_and_never_stored(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    assert (await _post(url, message_event("forged", message_id="om_f1"), sign_key="guess"))[
        0
    ] == 401
    assert (await _post(url, message_event("unsigned", message_id="om_f2"), signature=False))[
        0
    ] == 401
    assert (await _post(url, message_event("replayed", message_id="om_f3"), age_s=3600))[0] == 401
    assert (await _post(url, message_event("other key", message_id="om_f4"), key="other"))[0] == 401
    bad_token = message_event("wrong token", message_id="om_f5")
    bad_token["header"]["token"] = "not-ours"
    assert (await _post(url, bad_token))[0] == 403
    async with aiohttp.ClientSession() as http, http.post(url, data=b"{not json") as resp:
        assert resp.status == 401
    await asyncio.sleep(0.2)
    assert fake.sent() == []
    assert gateway.index is not None and gateway.index.get("agent:main:feishu:dm:oc_dm") is None


@pytest.mark.slow
async def test_rate_limits_are_waited_out(gw: tuple[Gateway, str], fake: FakeFeishu) -> None:
    _, url = gw
    fake.fail_next(400, 99991400, {"x-ogw-ratelimit-reset": "1"})
    fake.fail_next(429, 99991400)
    assert (await _post(url, message_event("patience", message_id="om_p", event_id="e_p")))[
        0
    ] == 200
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["markdown"] == "echo: patience"
    attempts = [p for m, p in fake.calls if m == "create"]
    assert len(attempts) == 3 and len({a["uuid"] for a in attempts}) == 1  # one message, retried


async def test_an_invalid_app_secret_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeFeishu
) -> None:
    gateway = Gateway(
        config=load_config(_config(tmp_path, fake), {**ENV, "FEISHU_APP_SECRET": "wrong"}),
        home=tmp_path / "home",
    )
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "feishu",
            r"^feishu refused the app credentials: app secret invalid \(10014\)$",
            [
                "platforms.feishu.token_env",
                "platforms.feishu.app_id_env",
                "platforms.feishu.encrypt_key_env",
                "platforms.feishu.verification_token_env",
            ],
        )
    finally:
        await gateway.stop()


async def test_create_thread_posts_a_root_and_the_handoff_text_opens_the_thread_under_it(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    adapter = next(a for a in gateway.adapters if isinstance(a, FeishuAdapter))
    ref = await adapter.create_thread("oc_home", "Handoff from the terminal")
    [root] = fake.sent()
    assert ref is not None and (ref.chat_id, ref.thread_id) == ("oc_home", root["message_id"])
    assert root["markdown"] == "Handoff from the terminal"
    await adapter.send(OutboundMessage("feishu", "oc_home", "continuing", thread_id=ref.thread_id))
    opened = fake.sent()[1]
    assert (opened["parent_id"], opened["reply_in_thread"]) == (ref.thread_id, True)
    # someone answering in that thread needs no mention
    reply = message_event(
        "thanks",
        chat_id="oc_home",
        chat_type="group",
        root_id=ref.thread_id,
        thread_id=opened["thread_id"],
        message_id="om_h1",
        event_id="e_h1",
    )
    assert (await _post(url, reply))[0] == 200
    answer = (await fake.wait_sent(3))[2]
    assert (answer["parent_id"], answer["markdown"]) == (ref.thread_id, "echo: [ou_alice] thanks")


async def test_a_message_the_gateway_cannot_store_gets_503_and_its_redelivery_is_taken(
    fake: FakeFeishu,
) -> None:
    adapter = FeishuAdapter(
        APP_ID, fake.app_secret, ENCRYPT_KEY, VERIFICATION_TOKEN, domain=fake.base_url
    )
    api = ApiAdapter(port=0, routes=dict(adapter.routes()))
    taken: list[InboundMessage] = []
    refuse = [True]

    async def emit(msg: InboundMessage) -> None:
        if refuse.pop():
            raise NotAccepted("the store is shutting down")
        taken.append(msg)

    await adapter.start(emit)
    await api.start(emit)
    try:
        url = f"http://127.0.0.1:{api.bound_port}/feishu/events"
        event = message_event("keep me", message_id="om_k", event_id="e_k")
        assert (await _post(url, event))[0] == 503
        refuse.append(False)
        assert (await _post(url, event))[0] == 200  # Feishu delivers it again
        assert [m.text for m in taken] == ["keep me"]
    finally:
        await api.stop()
        await adapter.stop()


# --- pure: checks and translation ----------------------------------------------------------


def _open(payload: dict[str, Any], now: float | None = None, **kw: Any) -> Any:
    body, headers = signed(payload, **kw)
    return open_request(
        headers,
        body,
        encrypt_key=ENCRYPT_KEY,
        verification_token=VERIFICATION_TOKEN,
        now=time.time() if now is None else now,
    )


def test_a_signed_encrypted_event_opens_to_its_payload() -> None:
    event = message_event("hi")
    opened = _open(event)
    assert opened.challenge is None and opened.event == event


@pytest.mark.parametrize(
    ("kw", "status"),
    [
        ({"sign_key": "guess"}, 401),
        ({"signature": False}, 401),
        ({"age_s": 301}, 401),
        ({"age_s": -400}, 401),
        ({"key": "other"}, 401),
    ],
)
def test_requests_failing_a_check_are_refused(kw: dict[str, Any], status: int) -> None:
    with pytest.raises(Refused) as err:
        _open(message_event("x"), **kw)
    assert err.value.status == status


def test_a_correctly_signed_body_that_does_not_decrypt_is_a_bad_request() -> None:
    body = json.dumps({"encrypt": "bm90IGNpcGhlcnRleHQ="}).encode()
    _, headers = signed({}, signature=True)
    from gateway.adapters.feishu_events import signature

    headers["X-Lark-Signature"] = signature(
        headers["X-Lark-Request-Timestamp"], headers["X-Lark-Request-Nonce"], ENCRYPT_KEY, body
    )
    with pytest.raises(Refused) as err:
        open_request(
            headers,
            body,
            encrypt_key=ENCRYPT_KEY,
            verification_token=VERIFICATION_TOKEN,
            now=time.time(),
        )
    assert err.value.status == 400


def _event(**kw: Any) -> dict[str, Any]:
    return message_event(kw.pop("text", "hi"), **kw)


def test_translation_of_dms_groups_threads_and_mentions() -> None:
    dm = to_inbound(_event(text="hello"), BOT_OPEN_ID)
    assert dm is not None and (dm.source.chat_type, dm.source.chat_id, dm.source.user_id) == (
        "dm",
        "oc_dm",
        "ou_alice",
    )
    assert (dm.text, dm.platform_message_id, dm.mentioned) == ("hello", "om_1", True)
    plain = to_inbound(_event(chat_id="oc_g", chat_type="group"), BOT_OPEN_ID)
    assert plain is not None and not plain.mentioned and plain.source.thread_id is None
    both = _event(
        text="@_user_1 ask @_user_2 about it",
        chat_id="oc_g",
        chat_type="group",
        mentions=[mention("@_user_1"), mention("@_user_2", "ou_bob", "Bob")],
    )
    msg = to_inbound(both, BOT_OPEN_ID)
    assert msg is not None and msg.mentioned and msg.text == "ask @Bob about it"
    only_bob = _event(
        text="@_user_1 hi",
        chat_id="oc_g",
        chat_type="group",
        mentions=[mention("@_user_1", "ou_bob", "Bob")],
    )
    msg = to_inbound(only_bob, BOT_OPEN_ID)
    assert msg is not None and not msg.mentioned and msg.text == "@Bob hi"
    in_thread = _event(
        chat_id="oc_g", chat_type="group", root_id="om_r", thread_id="omt_r", message_id="om_x"
    )
    msg = to_inbound(in_thread, BOT_OPEN_ID, {("oc_g", "om_r")})
    assert msg is not None and msg.mentioned and msg.source.thread_id == "om_r"
    assert to_inbound(in_thread, BOT_OPEN_ID, set()).mentioned is False  # type: ignore[union-attr]
    assert to_inbound(_event(chat_id="oc_g", chat_type="group"), BOT_OPEN_ID, None, False).mentioned  # type: ignore[union-attr]


def test_post_content_is_read_as_text() -> None:
    post = {
        "title": "Plan",
        "content": [
            [
                {"tag": "at", "user_id": "@_user_1", "user_name": "switchboard"},
                {"tag": "text", "text": " read "},
                {"tag": "a", "text": "this", "href": "https://x.io"},
            ],
            [{"tag": "img", "image_key": "k"}, {"tag": "text", "text": "then answer"}],
        ],
    }
    msg = to_inbound(
        _event(
            message_type="post",
            content=post,
            mentions=[mention("@_user_1")],
            chat_id="oc_g",
            chat_type="group",
        ),
        BOT_OPEN_ID,
    )
    assert msg is not None and msg.mentioned and msg.text == "Plan\nread this\nthen answer"
    localised = {"en_us": {"title": "", "content": [[{"tag": "text", "text": "hi there"}]]}}
    msg = to_inbound(_event(message_type="post", content=localised), BOT_OPEN_ID)
    assert msg is not None and msg.text == "hi there"


@pytest.mark.parametrize(
    "event",
    [
        _event(sender_type="app"),
        _event(message_type="image", content={"image_key": "img_1"}),
        _event(text="   "),
        {**_event(), "header": {"event_type": "im.message.message_read_v1"}},
        {"schema": "2.0", "header": {"event_type": "im.message.receive_v1"}},
        {
            "schema": "2.0",
            "header": {"event_type": "im.message.receive_v1"},
            "event": {"sender": {}, "message": None},
        },
        {
            **_event(),
            "event": {
                "sender": {"sender_type": "user", "sender_id": {"open_id": "ou_a"}},
                "message": {
                    "chat_id": "oc",
                    "message_id": "om",
                    "message_type": "text",
                    "content": "{bad",
                },
            },
        },
    ],
)
def test_events_that_are_not_text_from_a_person_are_ignored(event: dict[str, Any]) -> None:
    assert to_inbound(event, BOT_OPEN_ID) is None


def test_long_answers_split_into_cards_under_the_documented_limit() -> None:
    text = "这是一个很长的句子，带着“引号”和\n换行。" * 3000
    parts = split_message(text, LIMIT, card_size)
    assert len(parts) > 1 and all(card_size(p) <= LIMIT for p in parts)
    assert "".join(p.replace("\n", "") for p in parts) == text.replace("\n", "")


# --- configuration and doctor --------------------------------------------------------------


def test_config_names_the_missing_library_and_a_base_url_lark_oapi_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  feishu:\n    enabled: true\n    allow_all_users: true\n"
        "    base_url: http://open.larksuite.com/api\n"
    )
    monkeypatch.setitem(sys.modules, "lark_oapi", None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ENV)
    found = {e.key: e.problem for e in err.value.all()}
    assert (
        found["platforms.feishu"]
        == "needs the lark-oapi package: pip install 'switchboard[feishu]'"
    )
    assert found["platforms.feishu.base_url"].startswith("must be an https origin")


async def test_doctor_reports_an_unreachable_feishu_in_one_word(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  feishu:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: http://127.0.0.1:{free_port()}\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, ENV), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == "feishu reachable"]
    assert (reach.ok, reach.detail) == (False, "unreachable (ConnectError)")


async def test_a_handoff_opens_a_thread_in_the_home_group_that_continues_the_session(
    gw: tuple[Gateway, str], fake: FakeFeishu
) -> None:
    gateway, url = gw
    assert gateway.db is not None and gateway.handoffs is not None
    gateway.handoffs.poll_s = 0.05
    await gateway.db.set_meta(HOME_KEY.format("feishu"), json.dumps({"chat_id": "oc_home"}))
    sid = await gateway.db.create_session(source="cli", title="deploy plan")
    await gateway.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gateway.db, sid, "feishu", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    root, confirm = await fake.wait_sent(2)
    assert (root["chat_id"], root["markdown"]) == ("oc_home", "deploy plan")
    assert (confirm["parent_id"], confirm["reply_in_thread"]) == (root["message_id"], True)
    follow = message_event(
        "follow-up",
        chat_id="oc_home",
        chat_type="group",
        root_id=root["message_id"],
        thread_id=confirm["thread_id"],
        message_id="om_f",
        event_id="e_f",
    )
    assert (await _post(url, follow))[0] == 200
    await fake.wait_sent(3)
    assert [m["content"] for m in await gateway.db.get_messages(sid)][-2] == "[ou_alice] follow-up"
