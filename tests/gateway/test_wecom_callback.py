"""WeCom's callback mode (a self-built app) through the whole daemon: encrypted XML posted
to the api server's /wecom/callback, checked and decrypted by the adapter, replies through
a loopback fake of WeCom's REST API; the order of commit and answer with the adapter
alone; the checks as pure functions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.adapters.api import ApiAdapter
from gateway.adapters.wecom import WeComAdapter
from gateway.adapters.wecom_app import APP_MARKDOWN_BYTES, app_inbound
from gateway.adapters.wecom_crypto import Refused, aes_key, decrypt, xml_fields
from gateway.adapters.wecom_wire import utf8_len
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import (
    SEND_REFUSED,
    SEND_RETRY_AFTER,
    SEND_TRANSIENT,
    AdapterError,
    ConfigError,
    NotAccepted,
    PlatformRefused,
    send_failure,
)
from gateway.messages import ONE_TRY, InboundMessage, OutboundMessage
from gateway.ops.doctor import run_doctor
from tests.fakes.wecom_app import (
    AES_KEY,
    AGENT_ID,
    CORP_ID,
    ENV,
    FakeWeComApi,
    callback,
    seal,
    text_xml,
    url_check,
)
from tests.gateway.conftest import refused_at_start


@pytest.fixture
async def api() -> AsyncIterator[FakeWeComApi]:
    server = FakeWeComApi()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _config(tmp_path: Path, api: FakeWeComApi, extra: str = "") -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  wecom:\n    enabled: true\n    mode: callback\n"
        f"    allow_all_users: true\n    corp_id: {CORP_ID}\n    agent_id: {AGENT_ID}\n"
        f"    base_url: {api.base_url}\n{extra}"
    )
    return cfg


@pytest.fixture
async def gw(tmp_path: Path, api: FakeWeComApi) -> AsyncIterator[Gateway]:
    gateway = Gateway(config=load_config(_config(tmp_path, api), ENV), home=tmp_path / "home")
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


def _url(gw: Gateway) -> str:
    port = next(a for a in gw.adapters if isinstance(a, ApiAdapter)).bound_port
    return f"http://127.0.0.1:{port}/wecom/callback"


async def _post(url: str, query: str, body: bytes) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}?{query}", data=body) as resp:
        return resp.status, await resp.text()


async def _stored(gw: Gateway, key: str) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


# --- through the daemon ------------------------------------------------------------------


async def test_the_url_check_answers_the_decrypted_echostr(gw: Gateway) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{_url(gw)}?{url_check('echo-4711')}") as resp:
            assert (resp.status, await resp.text()) == (200, "echo-4711")
        async with http.get(f"{_url(gw)}?{url_check('echo', token='wrong')}") as resp:
            assert resp.status == 401


async def test_a_message_is_answered_through_the_app_api_and_a_redelivery_once(
    gw: Gateway, api: FakeWeComApi
) -> None:
    query, body = callback(text_xml("hello app", msg_id="9001"))
    assert await _post(_url(gw), query, body) == (200, "success")
    [sent] = await api.wait_sent(1)
    assert (sent["touser"], sent["agentid"], sent["markdown"]["content"]) == (
        "alice",
        AGENT_ID,
        "echo: hello app",
    )
    assert await _stored(gw, "agent:main:wecom:dm:alice") == ["hello app", "echo: hello app"]
    assert await _post(_url(gw), query, body) == (200, "success")  # WeCom retried it
    await asyncio.sleep(0.3)
    assert len(api.sent()) == 1
    voice = callback(text_xml("spoken", msg_id="9002", user="bob", kind="voice"))
    assert await _post(_url(gw), *voice) == (200, "success")
    assert (await api.wait_sent(2))[1]["markdown"]["content"] == "echo: spoken"
    assert gw.health()["adapters"]["wecom"]["state"] == "running"


async def test_forged_or_misaddressed_callbacks_are_refused_and_nothing_is_stored(
    gw: Gateway, api: FakeWeComApi
) -> None:
    forged = callback(text_xml("forged", msg_id="9101"), token="not-the-token")
    assert (await _post(_url(gw), *forged))[0] == 401
    elsewhere = callback(text_xml("elsewhere", msg_id="9102"), receiver="wwOTHERcorp")
    assert (await _post(_url(gw), *elsewhere))[0] == 403
    query, _ = callback(text_xml("x", msg_id="9103"))
    doctype = b'<!DOCTYPE x [<!ENTITY a "b">]><xml><Encrypt>&a;</Encrypt></xml>'
    assert (await _post(_url(gw), query, doctype))[0] == 400
    await asyncio.sleep(0.2)
    assert (
        api.sent() == []
        and gw.index is not None
        and gw.index.get("agent:main:wecom:dm:alice") is None
    )


async def test_long_replies_are_split_and_an_expired_token_is_fetched_again(
    gw: Gateway, api: FakeWeComApi
) -> None:
    adapter = next(a for a in gw.adapters if isinstance(a, WeComAdapter))
    api.fail_next("send", {"errcode": 42001, "errmsg": "access_token expired"})
    long = "\n\n".join(f"第{i}段 " + "字" * 300 for i in range(6))  # ~5,500 bytes
    ref = await adapter.send(OutboundMessage("wecom", "alice", long))
    parts = [s["markdown"]["content"] for s in api.sent()]
    assert len(parts) == len(ref.message_ids) >= 3
    assert all(utf8_len(p) <= APP_MARKDOWN_BYTES for p in parts)
    assert len(api.tokens) == 2  # the refused token was replaced


async def test_a_bad_app_secret_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, api: FakeWeComApi
) -> None:
    env = {**ENV, "WECOM_SECRET": "wrong"}
    gateway = Gateway(config=load_config(_config(tmp_path, api), env), home=tmp_path / "home")
    try:
        await gateway.start()
        refused_at_start(
            gateway,
            "wecom",
            "^wecom refused the corp id or app secret: invalid credential$",
            [
                "platforms.wecom.token_env",
                "platforms.wecom.callback_token_env",
                "platforms.wecom.encoding_aes_key_env",
            ],
        )
    finally:
        await gateway.stop()


# --- commit before answer, with the adapter alone -------------------------------------------


async def test_200_follows_the_commit_and_an_unstored_message_answers_503(
    api: FakeWeComApi,
) -> None:
    from gateway.adapters.wecom import AppMode
    from gateway.adapters.wecom_app import AppApi

    app_api = AppApi(CORP_ID, ENV["WECOM_SECRET"], AGENT_ID, api.base_url)
    adapter = WeComAdapter("", "", app=AppMode(app_api, ENV["WECOM_CALLBACK_TOKEN"], AES_KEY))
    release = asyncio.Event()
    taken: list[InboundMessage] = []
    refuse = [False, True]

    async def emit(msg: InboundMessage) -> None:
        if refuse.pop():
            raise NotAccepted("the store is shutting down")
        await release.wait()
        taken.append(msg)

    web_app = web.Application()
    for key, handler in adapter.routes().items():
        method, _, path = key.rpartition(" ")
        web_app.router.add_route(method or "POST", path, handler)
    runner = web.AppRunner(web_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/wecom/callback"  # type: ignore[union-attr]
    try:
        query, body = callback(text_xml("keep me", msg_id="8001"))
        assert (await _post(url, query, body))[0] == 503  # not started: WeCom posts again
        await adapter.start(emit)
        assert (await _post(url, query, body))[0] == 503  # not stored
        answer = asyncio.ensure_future(_post(url, query, body))
        await asyncio.sleep(0.2)
        assert not answer.done()  # no answer before the commit
        release.set()
        assert await answer == (200, "success")
        assert [m.platform_message_id for m in taken] == ["8001"]
    finally:
        await adapter.stop()
        await runner.cleanup()


# --- pure ----------------------------------------------------------------------------------


def test_decryption_checks_padding_length_and_receiver() -> None:
    key = aes_key(AES_KEY)
    assert decrypt(key, seal("<xml/>"), CORP_ID) == "<xml/>"
    with pytest.raises(Refused) as other:
        decrypt(key, seal("<xml/>", "wwOTHER"), CORP_ID)
    assert other.value.status == 403
    for bad in ("not base64!", "AAAA", seal("x")[:-8] + "AAAAAAA="):
        with pytest.raises(Refused):
            decrypt(key, bad, CORP_ID)
    with pytest.raises(ValueError):
        aes_key("too-short")


def test_app_messages_become_dms_and_events_are_skipped() -> None:
    fields = xml_fields(text_xml("hi", msg_id="1"))
    msg = app_inbound(fields)
    assert msg is not None and (msg.source.chat_type, msg.source.chat_id, msg.text) == (
        "dm",
        "alice",
        "hi",
    )
    event = {**fields, "MsgType": "event", "Event": "enter_agent"}
    assert app_inbound(event) is None
    assert app_inbound({**fields, "Content": "  "}) is None


def test_callback_mode_needs_its_keys_and_the_api_server(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  wecom:\n    enabled: true\n"
        "    mode: callback\n    allow_all_users: true\n    base_url: wss://x.example\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ENV)
    text = str(err.value)
    for key in ("corp_id", "agent_id", "base_url", "mode"):
        assert f"platforms.wecom.{key}" in text, text


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_the_app_secret_with_an_access_token(
    tmp_path: Path, api: FakeWeComApi, good: bool
) -> None:
    env: dict[str, Any] = {**ENV, **({} if good else {"WECOM_SECRET": "wrong"})}
    checks = await run_doctor(
        tmp_path / "home", load_config(_config(tmp_path, api), env), None, fix=False, full=False
    )
    [reach] = [c for c in checks if c.name == "wecom reachable"]
    expected = (
        f"{CORP_ID} app {AGENT_ID}"
        if good
        else "wecom refused the corp id or app secret: invalid credential"
    )
    assert (reach.ok, reach.detail) == (good, expected)


def test_callback_mode_names_the_missing_library(
    tmp_path: Path, api: FakeWeComApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cryptography", None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        load_config(_config(tmp_path, api), ENV)
    assert str(err.value) == (
        "platforms.wecom.mode: callback mode needs the cryptography package: "
        "pip install 'switchboard[wecom]'"
    )


async def test_switchboard_send_without_the_daemon_uses_the_app_api(api: FakeWeComApi) -> None:
    from gateway.adapters.wecom import AppMode
    from gateway.adapters.wecom_app import AppApi

    app_api = AppApi(CORP_ID, ENV["WECOM_SECRET"], AGENT_ID, api.base_url)
    adapter = WeComAdapter("", "", app=AppMode(app_api, ENV["WECOM_CALLBACK_TOKEN"], AES_KEY))
    try:
        await adapter.open_outbound()
        ref = await adapter.send(OutboundMessage("wecom", "bob", "nightly report"))
    finally:
        await adapter.stop()
    assert [s["markdown"]["content"] for s in api.sent()] == ["nightly report"]
    assert ref.message_ids and [k for k, _ in api.calls] == ["token", "send"]


async def test_app_send_failures_map_onto_the_outbox_rule(api: FakeWeComApi) -> None:
    """Callback mode's REST sends, failed by the fake's outage switch as WeCom answers:
    a 5xx, a reset and a late answer are kept, errcode 45009 is waited out, errcodes 60011
    and 40008 are refused for good (PlatformRefused); once WeCom is back the reply goes."""
    from gateway.adapters.wecom import AppMode
    from gateway.adapters.wecom_app import AppApi

    app_api = AppApi(CORP_ID, ENV["WECOM_SECRET"], AGENT_ID, api.base_url)
    adapter = WeComAdapter("", "", app=AppMode(app_api, ENV["WECOM_CALLBACK_TOKEN"], AES_KEY))
    expected = {
        "502": SEND_TRANSIENT,
        "reset": SEND_TRANSIENT,
        "timeout:0.2": SEND_TRANSIENT,
        "429:1": SEND_RETRY_AFTER,
        "403": SEND_REFUSED,
        "400": SEND_REFUSED,
    }
    seen: dict[str, str] = {}
    one_try = ONE_TRY.set(True)
    try:
        await adapter.open_outbound()
        for failure in expected:
            api.outage.down(failure)
            with pytest.raises(AdapterError) as err:
                await adapter.send(OutboundMessage("wecom", "bob", "hello"))
            seen[failure] = send_failure(err.value)[0]
            if seen[failure] == SEND_REFUSED:
                assert isinstance(err.value, PlatformRefused), failure
            api.outage.up()
        ref = await adapter.send(OutboundMessage("wecom", "bob", "back"))
    finally:
        ONE_TRY.reset(one_try)
        await adapter.stop()
    assert seen == expected and api.outage.failed == len(expected)
    assert [s["markdown"]["content"] for s in api.sent()] == ["back"] and ref.message_ids
