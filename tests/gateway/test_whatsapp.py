"""WhatsApp Cloud API through the whole daemon: deliveries signed like Meta's POSTed to the
daemon's HTTP server, replies through the Graph API to a loopback fake; plus the pure
translation of recorded payloads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.adapters.kit.split import split_message
from gateway.adapters.whatsapp import WhatsAppAdapter
from gateway.adapters.whatsapp_wire import (
    WindowClosed,
    graph_error,
    messages_of,
    signature_ok,
    to_inbound,
    to_whatsapp,
)
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import (
    AdapterError,
    ConfigError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import OutboundMessage
from tests.fakes import running, stalled_then_on_time, started, wait_for_count
from tests.fakes.whatsapp import (
    APP_SECRET,
    PHONE_ID,
    TOKEN,
    VERIFY,
    FakeGraph,
    deliver,
    delivery,
    sign,
    text_message,
)
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import (
    StoreDown,
    adapter_of,
    fake_fixture,
    platform_daemon,
    webhook_alone,
    webhook_url,
)

ANN = "15551234567"
KEY = f"agent:main:whatsapp:dm:{ANN}"


fake = fake_fixture(FakeGraph)


def _gateway(tmp_path: Path, fake: FakeGraph, token: str = TOKEN) -> Gateway:
    keys = f"    phone_number_id: '{PHONE_ID}'\n    base_url: {fake.base_url}\n    max_age_seconds: 600\n"
    env = {
        "WHATSAPP_TOKEN": token,
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "WHATSAPP_VERIFY_TOKEN": VERIFY,
    }
    return platform_daemon(tmp_path, "whatsapp", keys, env, api=True)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeGraph) -> AsyncIterator[tuple[Gateway, str]]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        yield gateway, webhook_url(gateway, "/whatsapp/webhook")


# --- the handshake and signatures --------------------------------------------------------


async def test_the_verification_handshake_echoes_the_challenge_only_for_our_token(
    gw: tuple[Gateway, str],
) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:
        good = {"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"}
        async with http.get(url, params=good) as resp:
            assert (resp.status, await resp.text()) == (200, "1158201444")
        for bad in ({**good, "hub.verify_token": "guess"}, {**good, "hub.mode": "unsubscribe"}, {}):
            async with http.get(url, params=bad) as resp:
                assert resp.status == 403 and "1158201444" not in await resp.text()


async def test_forged_missing_and_tampered_signatures_are_refused_and_never_stored(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    gateway, url = gw
    payload = delivery([text_message("forged", wamid="wamid.F1")])
    assert await deliver(url, payload, secret="not-the-app-secret") == 403
    assert await deliver(url, payload, secret=None) == 401
    assert await deliver(url, payload, signature="sha1=abc") == 403
    # a real signature of another body: the body was changed on the way
    other = json.dumps(delivery([text_message("original")]), separators=(",", ":")).encode()
    assert await deliver(url, payload, signature=sign(other)) == 403
    assert fake.calls == [c for c in fake.calls if c[0] == "GET"]  # no send, no typing
    assert gateway.index is not None and gateway.index.get(KEY) is None


async def test_a_replayed_delivery_is_answered_once(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    """Meta signs no timestamp: a replay (or Meta's own redelivery) is the same wamid."""
    _, url = gw
    payload = delivery([text_message("once please", wamid="wamid.R1")])
    assert await deliver(url, payload) == 200
    await fake.wait_sent(1)
    assert await deliver(url, payload) == 200
    assert await deliver(url, payload) == 200
    assert len(await fake.wait_sent(1)) == 1
    # a later, different message is still answered: the duplicates were dropped, not queued
    assert await deliver(url, delivery([text_message("next", wamid="wamid.R2")])) == 200
    sent = await fake.wait_sent(2)
    assert [s["text"]["body"] for s in sent] == ["echo: once please", "echo: next"]


async def test_a_stale_message_is_acknowledged_and_dropped(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    gateway, url = gw
    assert (
        await deliver(
            url, delivery([text_message("from an hour ago", wamid="wamid.S1", age_s=3600)])
        )
        == 200
    )
    assert await deliver(url, delivery([text_message("fresh", wamid="wamid.S2")])) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["text"]["body"] == "echo: fresh"
    assert adapter_of(gateway, WhatsAppAdapter).health()["stale_dropped"] == 1


# --- conversations -------------------------------------------------------------------------


async def test_a_message_is_answered_as_a_reply_with_a_typing_indicator(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    gateway, url = gw
    assert await deliver(url, delivery([text_message("hello whatsapp", wamid="wamid.A1")])) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["to"] == ANN and sent["text"]["body"] == "echo: hello whatsapp"
    assert sent["context"] == {"message_id": "wamid.A1"}
    [typing] = fake.typing()
    assert typing["message_id"] == "wamid.A1" and typing["status"] == "read"
    assert gateway.index is not None and gateway.index.get(KEY) is not None


async def test_a_chat_command_is_answered_by_the_core(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    _, url = gw
    assert await deliver(url, delivery([text_message("/help", wamid="wamid.C1")])) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["text"]["body"].startswith("Commands:") and "/help" in sent["text"]["body"]


async def test_a_long_reply_is_split_under_the_limit(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    _, url = gw
    words = " ".join(f"word{i}" for i in range(1500))  # ~11,900 characters echoed back
    assert await deliver(url, delivery([text_message(words, wamid="wamid.L1")])) == 200
    parts = len(split_message(f"echo: {words}", 4096))
    sent = await fake.wait_sent(parts)
    bodies = [s["text"]["body"] for s in sent]
    assert all(len(b) <= 4096 for b in bodies) and len(bodies) == parts >= 3
    assert " ".join(b.strip() for b in bodies) == f"echo: {words}"
    assert "context" in sent[0] and "context" not in sent[1]


async def test_a_rate_limit_is_waited_out(gw: tuple[Gateway, str], fake: FakeGraph) -> None:
    _, url = gw
    fake.fail_next(429, 130429, "Rate limit hit", {"Retry-After": "1"})
    assert await deliver(url, delivery([text_message("patience", wamid="wamid.P1")])) == 200
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["text"]["body"] == "echo: patience"
    attempts = [b for _m, p, b in fake.calls if p.endswith("/messages") and b.get("type") == "text"]
    assert len(attempts) == 2


async def test_a_closed_24_hour_window_is_reported_and_not_retried(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    gateway, url = gw
    fake.window_closed.add(ANN)
    assert await deliver(url, delivery([text_message("late", wamid="wamid.W1")])) == 200
    adapter = adapter_of(gateway, WhatsAppAdapter)
    await wait_for_count(lambda: [1] * int(adapter.health()["window_closed"]), 1, 10, "refusals")  # type: ignore[call-overload]
    attempts = [b for _m, p, b in fake.calls if p.endswith("/messages") and b.get("type") == "text"]
    assert len(attempts) == 1  # one refusal, no retry (the core's apology would hit it too)
    await wait_for_count(
        lambda: [gateway.router.last_error] if gateway.router and gateway.router.last_error else [],
        1,
        10,
        "a recorded send error",
    )
    assert "24-hour customer-service window" in str(gateway.router.last_error)  # type: ignore[union-attr]


async def test_a_failed_status_callback_is_logged_and_starts_no_turn(
    gw: tuple[Gateway, str], fake: FakeGraph
) -> None:
    gateway, url = gw
    failed = {
        "id": "wamid.OUT9",
        "status": "failed",
        "timestamp": "1",
        "recipient_id": ANN,
        "errors": [{"code": 131047, "title": "Re-engagement message"}],
    }
    delivered = {"id": "wamid.OUT8", "status": "delivered", "timestamp": "1", "recipient_id": ANN}
    assert await deliver(url, delivery(statuses=[delivered, failed])) == 200
    assert adapter_of(gateway, WhatsAppAdapter).health()["window_closed"] == 1
    assert await deliver(url, delivery([text_message("still here", wamid="wamid.T1")])) == 200
    [sent] = await fake.wait_sent(1)  # the only send: the statuses started nothing
    assert sent["text"]["body"] == "echo: still here"


async def test_an_invalid_token_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeGraph
) -> None:
    gw = _gateway(tmp_path, fake, token="EAAG-wrong")
    await gw.start()
    try:
        refused_at_start(
            gw,
            "whatsapp",
            "rejected the access token",
            [
                "platforms.whatsapp.token_env",
                "platforms.whatsapp.app_secret_env",
                "platforms.whatsapp.verify_token_env",
            ],
        )
    finally:
        await gw.stop()


async def test_an_uncommitted_message_is_not_acknowledged(fake: FakeGraph) -> None:
    """Inbox before ack: emit raising NotAccepted answers 503, so Meta delivers it again."""
    adapter = WhatsAppAdapter(PHONE_ID, TOKEN, APP_SECRET, VERIFY, base_url=fake.base_url)
    store = StoreDown()
    async with webhook_alone(adapter, "/whatsapp/webhook", store.emit) as url:
        payload = delivery([text_message("keep me", wamid="wamid.N1")])
        assert await deliver(url, payload) == 503
        store.up = True
        assert await deliver(url, payload) == 200
        assert [m.text for m in store.seen] == ["keep me"]


async def test_send_errors_map_to_the_gateway_errors(fake: FakeGraph) -> None:
    adapter = WhatsAppAdapter(PHONE_ID, TOKEN, APP_SECRET, VERIFY, base_url=fake.base_url)
    fake.fail_next(400, 100, "Invalid parameter")
    try:
        with pytest.raises(AdapterError, match=r"refused the call \(100\)"):
            await adapter.send(OutboundMessage("whatsapp", ANN, "x"))
        fake.token = "rotated"
        with pytest.raises(InvalidToken):
            await adapter.send(OutboundMessage("whatsapp", ANN, "x"))
        assert adapter.health()["last_error"] == "invalid token"
    finally:
        await adapter.stop()


async def test_a_whatsapp_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeGraph,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a reply's send
    began and before its Graph API request left. Once the request has its connection it
    finds its SEND_BY passed and stops unsent (SetOutLate, out of send() unchanged), so the
    turn can ask its lease first (gateway/turns.py's send_checked). On time, it is sent once."""
    fake.keep_alive = False  # each call connects: the send waits for its connection
    adapter = WhatsAppAdapter(PHONE_ID, TOKEN, APP_SECRET, VERIFY, base_url=fake.base_url)

    async with started(adapter):
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("whatsapp", ANN, "once")),
            lambda: [b["text"]["body"] for _m, p, b in fake.calls if p.endswith("/messages")],
        )
        assert [b["text"]["body"] for b in fake.sent()] == ["once"]


# --- pure translation on recorded payloads ----------------------------------------------


RECORDED = {  # a delivery as Meta's webhook reference shows it, two messages in one batch
    "object": "whatsapp_business_account",
    "entry": [
        {
            "id": "102290129340398",
            "changes": [
                {
                    "field": "messages",
                    "value": {
                        "messaging_product": "whatsapp",
                        "metadata": {
                            "display_phone_number": "15550783881",
                            "phone_number_id": "106540352242922",
                        },
                        "contacts": [
                            {"profile": {"name": "Sheena Nelson"}, "wa_id": "16505551234"}
                        ],
                        "messages": [
                            {
                                "from": "16505551234",
                                "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
                                "timestamp": "1749416383",
                                "type": "text",
                                "text": {"body": "Does it come in another color?"},
                                "context": {
                                    "from": "15550783881",
                                    "id": "wamid.HBgLMTY0NjcwNDM1OTUVAgARGBI1RjQyNUE3NEYxMzAzMzQ5MkEA",
                                },
                            },
                            {
                                "from": "16505551234",
                                "id": "wamid.IMG",
                                "timestamp": "1749416390",
                                "type": "image",
                                "image": {
                                    "caption": "this one",
                                    "mime_type": "image/jpeg",
                                    "sha256": "x",
                                    "id": "1003383421387256",
                                },
                            },
                        ],
                    },
                }
            ],
        }
    ],
}


def test_a_recorded_delivery_translates_to_dm_messages_with_names_and_reply_links() -> None:
    found = [to_inbound(m, names) for m, names in messages_of(RECORDED)]
    text, image = found
    assert text is not None and image is not None
    assert (text.source.platform, text.source.chat_id, text.source.chat_type) == (
        "whatsapp",
        "16505551234",
        "dm",
    )
    assert (text.source.user_id, text.source.user_name) == ("16505551234", "Sheena Nelson")
    assert text.text == "Does it come in another color?" and text.received_at == 1749416383.0
    assert text.platform_message_id.startswith("wamid.HBgLMTY1")  # type: ignore[union-attr]
    assert text.reply_to == "wamid.HBgLMTY0NjcwNDM1OTUVAgARGBI1RjQyNUE3NEYxMzAzMzQ5MkEA"
    assert image.text == "(image: only text messages are read here) this one"
    assert image.reply_to is None


@pytest.mark.parametrize(
    "message, text",
    [
        (
            {
                "type": "interactive",
                "interactive": {
                    "type": "button_reply",
                    "button_reply": {"id": "b1", "title": "Yes"},
                },
            },
            "Yes",
        ),
        (
            {"type": "button", "button": {"text": "Stop promotions", "payload": "p"}},
            "Stop promotions",
        ),
        (
            {"type": "location", "location": {"latitude": 1, "longitude": 2}},
            "(location: only text messages are read here)",
        ),
        (
            {"type": "unsupported", "errors": [{"code": 131051}]},
            "(unsupported: only text messages are read here)",
        ),
        ({"type": "reaction", "reaction": {"message_id": "wamid.X", "emoji": "👍"}}, None),
        ({"type": "system", "system": {"body": "changed number"}}, None),
        ({"type": "text", "text": {"body": "   "}}, None),
        ({"type": "text", "text": {"body": ["x"]}}, None),
    ],
)
def test_message_types(message: dict[str, Any], text: str | None) -> None:
    msg = to_inbound({"from": "1555", "id": "wamid.1", "timestamp": "1", **message}, {})
    assert (msg.text if msg else None) == text


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"object": "page", "entry": []},
        {"object": "whatsapp_business_account", "entry": [{}]},
        {"object": "whatsapp_business_account", "entry": [{"changes": [{"value": None}]}]},
        {
            "object": "whatsapp_business_account",
            "entry": [{"changes": [{"value": {"messages": ["x"]}}]}],
        },
    ],
)
def test_deliveries_without_messages_yield_nothing(payload: dict[str, Any]) -> None:
    assert messages_of(payload) == []


def test_a_message_without_its_ids_is_ignored() -> None:
    assert to_inbound({"type": "text", "text": {"body": "hi"}}, {}) is None
    assert to_inbound({"from": "1", "id": "w", "timestamp": "soon", "type": "text"}, {}) is None


def test_signature_check() -> None:
    body = b'{"object":"whatsapp_business_account"}'
    assert signature_ok(APP_SECRET, body, sign(body))
    assert signature_ok(APP_SECRET, body, sign(body).upper().replace("SHA256=", "sha256="))
    assert not signature_ok(APP_SECRET, body + b" ", sign(body))
    assert not signature_ok(APP_SECRET, body, sign(body, "other"))
    assert not signature_ok(APP_SECRET, body, None)
    assert not signature_ok("", body, sign(body, ""))  # no secret configured: nothing passes


@pytest.mark.parametrize(
    "status, code, retry_after, kind, detail",
    [
        (400, 131047, None, WindowClosed, "24-hour"),
        (429, 130429, "2", RetryAfter, 2.0),
        (400, 130429, None, RetryAfter, 6.0),
        (400, 131056, None, RetryAfter, 6.0),
        (401, 190, None, InvalidToken, "190"),
        (400, 190, None, InvalidToken, "190"),
        (503, 1, None, TransientError, "503"),
        (400, 100, None, PlatformRefused, "(100)"),
    ],
)
def test_graph_errors(
    status: int, code: int, retry_after: str | None, kind: type, detail: object
) -> None:
    exc = graph_error(status, {"error": {"code": code, "message": "m"}}, retry_after)
    assert type(exc) is kind
    assert exc.seconds == detail if isinstance(exc, RetryAfter) else str(detail) in str(exc)


def test_markdown_becomes_whatsapp_formatting_outside_code() -> None:
    assert to_whatsapp("**bold** and [docs](https://x.io/a)") == "*bold* and docs (https://x.io/a)"
    assert to_whatsapp("```\n**kept**\n```") == "```\n**kept**\n```"


def test_the_section_needs_its_keys_and_the_api_server(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  whatsapp:\n    enabled: true\n"
        "    allow_all_users: true\n    api_version: '23'\n    max_age_seconds: 5\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"WHATSAPP_TOKEN": "changeme"})
    found = {e.key: e.problem for e in err.value.all()}
    assert set(found) == {
        "platforms.whatsapp.enabled",
        "platforms.whatsapp.phone_number_id",
        "platforms.whatsapp.api_version",
        "platforms.whatsapp.max_age_seconds",
        "platforms.whatsapp.token_env",
        "platforms.whatsapp.app_secret_env",
        "platforms.whatsapp.verify_token_env",
    }
    assert "placeholder" in found["platforms.whatsapp.token_env"]
    assert found["platforms.whatsapp.app_secret_env"].startswith("WHATSAPP_APP_SECRET is not set")
