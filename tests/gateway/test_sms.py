"""SMS through Twilio and the whole daemon: form webhooks signed like Twilio's POSTed to the
daemon's HTTP server, replies through the twilio library's async client to a loopback fake
of the Messages REST API; plus the pure translation of recorded forms."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.adapters.kit.split import split_message
from gateway.adapters.sms import (
    SmsAdapter,
    keyword,
    plain_text,
    to_inbound,
    twilio_error,
)
from gateway.app import Gateway
from gateway.errors import (
    AdapterError,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
)
from gateway.messages import OutboundMessage
from tests.fakes import running, stalled_then_on_time
from tests.fakes.twilio import (
    ACCOUNT,
    AUTH_TOKEN,
    FROM,
    PUBLIC_URL,
    FakeTwilio,
    inbound,
    post_sms,
    sign,
)
from tests.gateway.conftest import refused_at_start
from tests.gateway.platform_rig import (
    StoreDown,
    adapter_of,
    config_problems,
    fake_fixture,
    platform_daemon,
    webhook_alone,
    webhook_url,
)

ANN = "+15551234567"
KEY = f"agent:main:sms:dm:{ANN}"


fake = fake_fixture(FakeTwilio)


def _gateway(tmp_path: Path, fake: FakeTwilio, token: str = AUTH_TOKEN) -> Gateway:
    keys = (
        f"    account_sid: {ACCOUNT}\n    from_number: '{FROM}'\n    webhook_url: {PUBLIC_URL}\n"
        f"    base_url: {fake.base_url}\n"
    )
    return platform_daemon(tmp_path, "sms", keys, {"TWILIO_AUTH_TOKEN": token}, api=True)


@pytest.fixture
async def gw(tmp_path: Path, fake: FakeTwilio) -> AsyncIterator[tuple[Gateway, str]]:
    async with running(_gateway(tmp_path, fake)) as gateway:
        yield gateway, webhook_url(gateway, "/sms/webhook")


# --- signatures -----------------------------------------------------------------------------


async def test_forged_missing_and_misdirected_signatures_are_refused_and_never_stored(
    gw: tuple[Gateway, str], fake: FakeTwilio
) -> None:
    gateway, url = gw
    form = inbound("forged", sid="SMF1")
    assert await post_sms(url, form, token="not-the-auth-token") == 403
    assert await post_sms(url, form, token=None) == 401
    # signed for another URL (here: the loopback address, not the public one Twilio calls)
    assert await post_sms(url, form, signed_url=url) == 403
    # a real signature of other fields: the form was changed on the way
    assert await post_sms(url, {**form, "Body": "changed"}, signature=sign(PUBLIC_URL, form)) == 403
    await asyncio.sleep(0.1)  # nothing may arrive; give a wrongly accepted one time to show
    assert fake.attempts() == []
    assert gateway.index is not None and gateway.index.get(KEY) is None


async def test_a_replayed_webhook_is_answered_once(
    gw: tuple[Gateway, str], fake: FakeTwilio
) -> None:
    """Twilio signs no timestamp: a replay carries a MessageSid the core has seen."""
    _, url = gw
    form = inbound("once please", sid="SMR1")
    assert await post_sms(url, form) == 200
    await fake.wait_sent(1)
    assert await post_sms(url, form) == 200
    assert await post_sms(url, inbound("next", sid="SMR2")) == 200
    sent = await fake.wait_sent(2)
    assert [s["Body"] for s in sent] == ["echo: once please", "echo: next"]


# --- conversations -------------------------------------------------------------------------


async def test_an_sms_is_answered_from_the_twilio_number(
    gw: tuple[Gateway, str], fake: FakeTwilio
) -> None:
    gateway, url = gw
    assert await post_sms(url, inbound("hello **sms**", sid="SMA1")) == 200
    [sent] = await fake.wait_sent(1)
    assert (sent["To"], sent["From"], sent["Body"]) == (ANN, FROM, "echo: hello sms")
    assert gateway.index is not None and gateway.index.get(KEY) is not None


async def test_a_chat_command_is_answered_by_the_core(
    gw: tuple[Gateway, str], fake: FakeTwilio
) -> None:
    _, url = gw
    assert await post_sms(url, inbound("/help", sid="SMC1")) == 200
    [sent] = await fake.wait_sent(1)
    assert sent["Body"].startswith("Commands:") and "/help" in sent["Body"]


@pytest.mark.parametrize("word", ["STOP", "help", "Start", "unsubscribe."])
async def test_carrier_keywords_are_left_to_twilio(
    gw: tuple[Gateway, str], fake: FakeTwilio, word: str
) -> None:
    gateway, url = gw
    assert await post_sms(url, inbound(word, sid="SMK1")) == 200
    assert await post_sms(url, inbound("a real question", sid="SMK2")) == 200
    [sent] = await fake.wait_sent(1)  # the only reply: the keyword got none
    assert sent["Body"] == "echo: a real question"
    assert adapter_of(gateway, SmsAdapter).health()["keywords_dropped"] == 1


async def test_a_long_reply_is_split_under_the_limit(
    gw: tuple[Gateway, str], fake: FakeTwilio
) -> None:
    _, url = gw
    words = " ".join(f"w{i}" for i in range(900))  # ~4,300 characters echoed back
    assert await post_sms(url, inbound(words, sid="SML1")) == 200
    parts = len(split_message(f"echo: {words}", 1600))
    sent = await fake.wait_sent(parts)
    assert parts >= 3 and all(len(s["Body"]) <= 1600 for s in sent)
    assert " ".join(s["Body"].strip() for s in sent) == f"echo: {words}"


async def test_a_rate_limit_is_waited_out(gw: tuple[Gateway, str], fake: FakeTwilio) -> None:
    _, url = gw
    fake.fail_next(429, 20429, "Too Many Requests")
    assert await post_sms(url, inbound("patience", sid="SMP1")) == 200
    [sent] = await fake.wait_sent(1, timeout=15)
    assert sent["Body"] == "echo: patience" and len(fake.attempts()) == 2


async def test_invalid_credentials_stop_the_adapter_while_the_daemon_runs(
    tmp_path: Path, fake: FakeTwilio
) -> None:
    gw = _gateway(tmp_path, fake, token="wrong-token")
    await gw.start()
    try:
        refused_at_start(
            gw, "sms", "rejected the account SID or auth token", ["platforms.sms.token_env"]
        )
    finally:
        await gw.stop()


async def test_an_uncommitted_message_is_not_acknowledged(fake: FakeTwilio) -> None:
    """Inbox before ack: emit raising NotAccepted answers 503."""
    adapter = SmsAdapter(ACCOUNT, AUTH_TOKEN, FROM, PUBLIC_URL, base_url=fake.base_url)
    store = StoreDown()
    async with webhook_alone(adapter, "/sms/webhook", store.emit) as url:
        assert await post_sms(url, inbound("keep me", sid="SMN1")) == 503
        store.up = True
        assert await post_sms(url, inbound("keep me", sid="SMN1")) == 200
        assert [(m.text, m.platform_message_id) for m in store.seen] == [("keep me", "SMN1")]


async def test_send_errors_map_to_the_gateway_errors(fake: FakeTwilio) -> None:
    adapter = SmsAdapter(ACCOUNT, AUTH_TOKEN, FROM, PUBLIC_URL, base_url=fake.base_url)
    fake.fail_next(400, 21610, "Attempt to send to unsubscribed recipient")
    try:
        with pytest.raises(AdapterError, match="opted out"):
            await adapter.send(OutboundMessage("sms", ANN, "x"))
        assert len(fake.attempts()) == 1  # not retried
        fake.token = "rotated"
        with pytest.raises(InvalidToken):
            await adapter.send(OutboundMessage("sms", ANN, "x"))
        assert adapter.health()["last_error"] == "invalid credentials"
    finally:
        await adapter.stop()


async def test_an_sms_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    fake: FakeTwilio,
) -> None:
    """Replicas: the process stands still after a reply's send began and before its request
    left. twilio's HTTP session (send_by_trace) finds its SEND_BY passed when the request
    has its connection and stops it unsent (SetOutLate), so the turn can ask its lease
    first. On time, it is sent once."""
    adapter = SmsAdapter(ACCOUNT, AUTH_TOKEN, FROM, PUBLIC_URL, base_url=fake.base_url)
    fake.keep_alive = False  # each call connects: the send waits for its connection
    try:
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("sms", ANN, "once")),
            lambda: [p["Body"] for p in fake.attempts()],
        )
    finally:
        await adapter.stop()


# --- pure translation -----------------------------------------------------------------------


def test_a_recorded_form_translates_to_a_dm_per_phone_number() -> None:
    msg = to_inbound(inbound("Is the shop open?", sid="SM8f3a"), now=1700000000.0)
    assert msg is not None
    assert (msg.source.platform, msg.source.chat_id, msg.source.chat_type, msg.source.user_id) == (
        "sms",
        ANN,
        "dm",
        ANN,
    )
    assert (msg.text, msg.platform_message_id, msg.received_at) == (
        "Is the shop open?",
        "SM8f3a",
        1700000000.0,
    )


@pytest.mark.parametrize(
    "form, text",
    [
        (inbound("look", media=2), "(MMS with 2 attachments: only text is read here) look"),
        (inbound("", media=1), "(MMS with 1 attachment: only text is read here)"),
        (inbound("   "), None),
        ({"Body": "no ids"}, None),
        ({**inbound("x"), "From": ""}, None),
        ({**inbound("odd"), "NumMedia": "many"}, "odd"),
    ],
)
def test_forms(form: dict[str, str], text: str | None) -> None:
    msg = to_inbound(form)
    assert (msg.text if msg else None) == text


@pytest.mark.parametrize(
    "text, word",
    [
        ("STOP", "STOP"),
        (" stop ", "STOP"),
        ("Help!", "HELP"),
        ("start", "START"),
        ("stop the music", None),
        ("helpful", None),
        ("", None),
    ],
)
def test_keywords(text: str, word: str | None) -> None:
    assert keyword(text) == word


@pytest.mark.parametrize(
    "status, code, kind, detail",
    [
        (429, 20429, RetryAfter, "rate limited"),
        (401, 20003, InvalidToken, "20003"),
        (503, None, TransientError, "503"),
        (400, 21610, PlatformRefused, "STOP"),
        (400, 21211, PlatformRefused, "21211"),
    ],
)
def test_twilio_errors(status: int, code: int | None, kind: type, detail: str) -> None:
    exc = twilio_error(status, code, "m")
    assert type(exc) is kind and detail in str(exc)


def test_markdown_becomes_plain_text() -> None:
    md = (
        "# Plan\n\n**Bold** and *italic* and _under_ and `code`, snake_case_name kept.\n"
        "* one\n- two\n> quoted\n\n```python\nprint(1)\n```\nSee [the docs](https://x.io/a) or ![](https://x.io/i.png)."
    )
    assert plain_text(md) == (
        "Plan\n\nBold and italic and under and code, snake_case_name kept.\n"
        "- one\n- two\nquoted\n\nprint(1)\n\nSee the docs (https://x.io/a) or https://x.io/i.png."
    )


# --- config ---------------------------------------------------------------------------------


def _problems(tmp_path: Path, section: str, env: dict[str, str] | None = None) -> dict[str, str]:
    return config_problems(
        tmp_path, section, {"TWILIO_AUTH_TOKEN": AUTH_TOKEN} if env is None else env
    )


def test_the_section_needs_its_keys_and_refuses_placeholders(tmp_path: Path) -> None:
    found = _problems(tmp_path, "  sms:\n    enabled: true\n    allow_all_users: true\n", env={})
    assert set(found) == {
        "platforms.sms.account_sid",
        "platforms.sms.from_number",
        "platforms.sms.webhook_url",
        "platforms.sms.token_env",
    }
    assert found["platforms.sms.token_env"].startswith("TWILIO_AUTH_TOKEN is not set")
    found = _problems(
        tmp_path,
        "  api:\n    enabled: false\n  sms:\n    enabled: true\n"
        "    allow_all_users: true\n    account_sid: ACxxxxxxxxxxxxxxxx\n"
        "    from_number: '5551234'\n    webhook_url: <your-url>\n",
    )
    assert "must be an AC" in found["platforms.sms.account_sid"]
    assert "E.164" in found["platforms.sms.from_number"]
    assert "placeholder" in found["platforms.sms.webhook_url"]
    assert "enable platforms.api" in found["platforms.sms.enabled"]


def test_a_missing_twilio_package_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "twilio", None)  # what an uninstalled package looks like
    found = _problems(
        tmp_path,
        f"  sms:\n    enabled: true\n    allow_all_users: true\n"
        f"    account_sid: {ACCOUNT}\n    from_number: '{FROM}'\n    webhook_url: {PUBLIC_URL}\n",
    )
    assert found == {"platforms.sms": "needs the twilio package: pip install 'switchboard[sms]'"}
