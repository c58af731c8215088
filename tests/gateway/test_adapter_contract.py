"""The Adapter contract, checked on every adapter against its loopback fake: start with an
emit callback, deliver an OutboundMessage, answer create_thread with a ThreadRef or None,
report health, stop cleanly (twice is harmless)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.bluebubbles import BlueBubblesAdapter
from gateway.adapters.dingtalk import DingTalkAdapter
from gateway.adapters.discord import DiscordAdapter
from gateway.adapters.email import EmailAdapter, SmtpAccount
from gateway.adapters.email_imap import ImapAccount
from gateway.adapters.feishu import FeishuAdapter
from gateway.adapters.homeassistant import HomeAssistantAdapter
from gateway.adapters.matrix import MatrixAdapter
from gateway.adapters.mattermost import MattermostAdapter
from gateway.adapters.qqbot import QQBotAdapter
from gateway.adapters.signal import SignalAdapter
from gateway.adapters.slack import SlackAdapter
from gateway.adapters.sms import SmsAdapter
from gateway.adapters.teams import TeamsAdapter
from gateway.adapters.telegram import TelegramAdapter
from gateway.adapters.webhook import Endpoint, WebhookAdapter
from gateway.adapters.wecom import WeComAdapter
from gateway.adapters.weixin import WeixinAdapter
from gateway.adapters.whatsapp import WhatsAppAdapter
from gateway.errors import (
    SEND_REFUSED,
    SEND_RETRY_AFTER,
    SEND_TRANSIENT,
    PlatformRefused,
    send_failure,
)
from gateway.messages import ONE_TRY, InboundMessage, OutboundMessage, SentRef
from tests.fakes import (
    bluebubbles,
    dingtalk,
    feishu,
    matrix,
    teams,
    twilio,
    wait_for_count,
    wecom,
    whatsapp,
)
from tests.fakes.bluebubbles import FakeBlueBubbles
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.discord import GENERAL, FakeDiscord, restore_discord_globals
from tests.fakes.feishu import FakeFeishu
from tests.fakes.homeassistant import FakeHomeAssistant
from tests.fakes.imap import FakeImap
from tests.fakes.matrix import FakeMatrix
from tests.fakes.mattermost import TOWN, FakeMattermost
from tests.fakes.qqbot import GROUP as QQ_GROUP
from tests.fakes.qqbot import FakeQQ
from tests.fakes.signal import ALICE, BOT, FakeSignal
from tests.fakes.slack import SECRET, FakeSlack
from tests.fakes.smtp import FakeSmtp
from tests.fakes.teams import FakeTeams
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.fakes.webhook_receiver import CallbackReceiver
from tests.fakes.wecom import FakeWeCom
from tests.fakes.weixin import ALICE as WEIXIN_ALICE
from tests.fakes.weixin import FakeWeixin
from tests.fakes.whatsapp import FakeGraph

PLATFORMS = [
    "api",
    "telegram",
    "discord",
    "slack",
    "signal",
    "mattermost",
    "teams",
    "whatsapp",
    "sms",
    "email",
    "feishu",
    "dingtalk",
    "qqbot",
    "wecom",
    "matrix",
    "bluebubbles",
    "webhook",
    "homeassistant",
    "weixin",
]
FAKES: dict[str, type[Any]] = {
    "telegram": FakeTelegram,
    "discord": FakeDiscord,
    "slack": FakeSlack,
    "signal": FakeSignal,
    "mattermost": FakeMattermost,
    "teams": FakeTeams,
    "whatsapp": FakeGraph,
    "sms": FakeTwilio,
    "feishu": FakeFeishu,
    "dingtalk": FakeDingTalk,
    "qqbot": FakeQQ,
    "wecom": FakeWeCom,
    "matrix": FakeMatrix,
    "bluebubbles": FakeBlueBubbles,
    "webhook": CallbackReceiver,
    "homeassistant": FakeHomeAssistant,
    "weixin": FakeWeixin,
}


@pytest.fixture(params=PLATFORMS)
async def case(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, str, Any]]:
    if request.param == "api":
        yield ApiAdapter(port=0), "chat-1", None
        return
    if request.param == "email":
        imap, smtp = FakeImap(), FakeSmtp()
        await imap.start()
        await smtp.start()
        try:
            yield (
                EmailAdapter(
                    imap.user,
                    ImapAccount("127.0.0.1", imap.port, "plain", imap.user, imap.password),
                    SmtpAccount("127.0.0.1", smtp.port, "plain", smtp.user, smtp.password),
                ),
                "alice@example.com",
                smtp,
            )
        finally:
            await imap.stop()
            await smtp.stop()
        return
    if request.param == "discord":
        restore_discord_globals(monkeypatch)
    fake: Any = FAKES[request.param]()
    await fake.start()
    try:
        if isinstance(fake, FakeTelegram):
            yield TelegramAdapter(fake.token, base_url=fake.base_url, poll_timeout_s=1), "42", fake
        elif isinstance(fake, FakeDiscord):
            adapter = DiscordAdapter(
                fake.token, api_base=fake.api, gateway_url=fake.gateway, guild_ready_timeout_s=0.05
            )
            yield adapter, GENERAL, fake
        elif isinstance(fake, FakeSignal):
            yield SignalAdapter(fake.url, BOT), ALICE, fake
        elif isinstance(fake, FakeMattermost):
            yield MattermostAdapter(fake.token, fake.url), TOWN, fake
        elif isinstance(fake, FakeTeams):
            yield (
                TeamsAdapter(
                    teams.APP_ID,
                    teams.PASSWORD,
                    metadata_url=fake.metadata_url,
                    token_url=fake.token_url,
                    service_url=fake.service_url,
                ),
                "19:general@thread.tacv2",
                fake,
            )
        elif isinstance(fake, FakeTwilio):
            yield (
                SmsAdapter(
                    twilio.ACCOUNT,
                    twilio.AUTH_TOKEN,
                    twilio.FROM,
                    twilio.PUBLIC_URL,
                    base_url=fake.base_url,
                ),
                "+15551234567",
                fake,
            )
        elif isinstance(fake, FakeGraph):
            yield (
                WhatsAppAdapter(
                    whatsapp.PHONE_ID,
                    whatsapp.TOKEN,
                    whatsapp.APP_SECRET,
                    whatsapp.VERIFY,
                    base_url=fake.base_url,
                ),
                "15551234567",
                fake,
            )
        elif isinstance(fake, FakeFeishu):
            yield (
                FeishuAdapter(
                    feishu.APP_ID,
                    feishu.APP_SECRET,
                    feishu.ENCRYPT_KEY,
                    feishu.VERIFICATION_TOKEN,
                    domain=fake.base_url,
                ),
                "oc_grp",
                fake,
            )
        elif isinstance(fake, FakeDingTalk):
            yield (
                DingTalkAdapter(dingtalk.CLIENT_ID, dingtalk.CLIENT_SECRET, base_url=fake.base_url),
                "cidGROUP",
                fake,
            )
        elif isinstance(fake, FakeQQ):
            yield (
                QQBotAdapter(
                    "102000001", fake.secret, api_base=fake.api_url, token_base=fake.token_url
                ),
                f"group-{QQ_GROUP}",
                fake,
            )
        elif isinstance(fake, FakeWeCom):
            yield WeComAdapter(wecom.BOT_ID, wecom.SECRET, url=fake.url), "wrGROUP", fake
        elif isinstance(fake, FakeBlueBubbles):
            yield (
                BlueBubblesAdapter(fake.base_url, bluebubbles.PASSWORD, bluebubbles.SECRET),
                bluebubbles.GROUP,
                fake,
            )
        elif isinstance(fake, FakeHomeAssistant):
            yield HomeAssistantAdapter(fake.token, fake.url), "user.alice", fake
        elif isinstance(fake, FakeWeixin):
            yield WeixinAdapter(fake.token, base_url=fake.base_url), WEIXIN_ALICE, fake
        elif isinstance(fake, CallbackReceiver):
            yield WebhookAdapter([Endpoint("ci", fake.secret, "async", fake.url)]), "ci:ann", fake
        elif isinstance(fake, FakeMatrix):
            fake.add_room(
                "!general:fake.test", {"@alice:fake.test": "Alice", "@bob:fake.test": "Bob"}
            )
            yield (
                MatrixAdapter(fake.base_url, matrix.BOT, fake.token, poll_timeout_s=1),
                "!general:fake.test",
                fake,
            )
        else:
            yield SlackAdapter("xoxb-fake", SECRET, base_url=fake.base_url), "C0GEN", fake
    finally:
        await fake.stop()


def _delivered(fake: Any) -> str:
    if isinstance(fake, FakeSmtp):
        return str(fake.accepted[0].message.get_body(("plain",)).get_content()).strip()
    if isinstance(fake, FakeSignal):
        return str(fake.delivered()[0]["message"])
    if isinstance(fake, FakeMattermost):
        return str(fake.bot_posts()[0]["message"])
    if isinstance(fake, FakeTeams):
        return str(fake.posted()[0]["text"])
    if isinstance(fake, FakeTwilio):
        return str(fake.sent()[0]["Body"])
    if isinstance(fake, FakeGraph):
        return str(fake.sent()[0]["text"]["body"])
    if isinstance(fake, FakeFeishu):
        return str(fake.sent()[0]["markdown"])
    if isinstance(fake, FakeDingTalk):
        return str(fake.sent()[0][1]["text"])
    if isinstance(fake, FakeQQ):
        return str(fake.sent()[0]["text"])
    if isinstance(fake, FakeWeCom):
        return fake.sent()[0][2]
    if isinstance(fake, FakeTelegram):
        return str(fake.sent()[0]["text"])
    if isinstance(fake, FakeDiscord):
        return str(fake.posted(GENERAL)[0]["content"])
    if isinstance(fake, FakeMatrix):
        return str(fake.sends()[0]["body"])
    if isinstance(fake, FakeBlueBubbles):
        return str(fake.sent()[0]["message"])
    if isinstance(fake, CallbackReceiver):
        return str(fake.replies()[0]["text"])
    if isinstance(fake, FakeHomeAssistant):
        return str(fake.replies()[0]["text"])
    if isinstance(fake, FakeWeixin):
        return fake.texts()[0]
    return str(fake.posted()[0]["text"])


async def test_adapter_contract(case: tuple[Any, str, Any]) -> None:
    adapter, chat_id, fake = case
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen.append(msg)

    assert isinstance(adapter.platform, str) and adapter.platform
    await adapter.start(emit)
    try:
        assert adapter.health()["state"] == "running"
        if isinstance(fake, FakeWeixin):  # a Weixin reply needs the peer's context_token
            fake.say(chat_id, "hi")
            await wait_for_count(lambda: seen, 1, 10, "the peer's message")
        ref = await adapter.send(OutboundMessage(adapter.platform, chat_id, "hello"))
        assert (
            isinstance(ref, SentRef) and ref.platform == adapter.platform and ref.chat_id == chat_id
        )
        if fake is not None:
            assert _delivered(fake) == "hello" and ref.message_ids
        thread = await adapter.create_thread(chat_id, "a thread")
        assert thread is None or (thread.platform == adapter.platform and thread.thread_id)
        if isinstance(adapter, ApiAdapter):
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{adapter.bound_port}/health") as resp:
                    assert resp.status == 200
    finally:
        await adapter.stop()
        await adapter.stop()
    assert adapter.health()["state"] == "stopped"


# Each failure a platform's send path can meet, and what the outbox must make of it: a
# 5xx, a connection reset, an answer that is late (then a 504 or the platform's own word
# for a timeout) and a 429 are kept and tried again; a 403 is refused for good, and says
# so as PlatformRefused (what `switchboard send` exits 77 on).
INJECTED = [
    ("503", SEND_TRANSIENT),
    ("reset", SEND_TRANSIENT),
    ("timeout:0.2", SEND_TRANSIENT),
    ("429:1", SEND_RETRY_AFTER),
    ("403", SEND_REFUSED),
]
# a platform whose 403 means our credentials (kept until they are restored): its refusal
# of the message itself is a 400
REFUSAL = {"bluebubbles": "400"}
EXPECTED = {
    # SMTP has no rate-limit answer with a wait (the fake answers 451, try later)
    "email": {"429:1": SEND_TRANSIENT},
    # Home Assistant has no rate-limit answer either: a service over its limit fails as
    # home_assistant_error, kept and tried again with backoff
    "homeassistant": {"429:1": SEND_TRANSIENT},
}
# the platforms with no platform server to fail: the api answers in the caller's request
NO_SERVER = {"api"}
RECONNECT_S = 30.0  # a websocket platform's adapter connects again after a dropped one


async def _connected_again(adapter: Any) -> None:
    """A platform whose sends go over one connection (its health says "connected") has it
    back before the next send: a send while it reconnects is kept, whatever the failure."""
    if "connected" not in adapter.health():
        return
    await wait_for_count(
        lambda: [1] if adapter.health()["connected"] else [], 1, RECONNECT_S, "a connection"
    )


async def test_send_failures_map_onto_the_outbox_rule(case: tuple[Any, str, Any]) -> None:
    """The platform's fake fails every send with each injected failure in turn; the
    adapter's error says what the outbox does (gateway.errors.send_failure), and once the
    platform is back the adapter sends again. Tried once per send, as the outbox's drain
    tries (ONE_TRY). Every platform with a server carries the fake's `outage` switch."""
    adapter, chat_id, fake = case
    if adapter.platform in NO_SERVER:
        pytest.skip("no platform server to fail: the api answers in the caller's request")
    assert hasattr(fake, "outage"), f"the {adapter.platform} fake has no outage switch"
    seen_in: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        seen_in.append(msg)

    await adapter.start(emit)
    one_try = ONE_TRY.set(True)
    try:
        if isinstance(fake, FakeWeixin):  # a Weixin reply needs the peer's context_token
            fake.say(chat_id, "hi")
            await wait_for_count(lambda: seen_in, 1, 10, "the peer's message")
        seen: dict[str, str] = {}
        for failure, _expected in INJECTED:
            await _connected_again(adapter)
            fake.outage.down(REFUSAL.get(adapter.platform, "403") if failure == "403" else failure)
            try:
                await adapter.send(OutboundMessage(adapter.platform, chat_id, "hello"))
            except Exception as exc:
                seen[failure] = send_failure(exc)[0]
                if seen[failure] == SEND_REFUSED:
                    assert isinstance(exc, PlatformRefused), f"{failure}: {exc!r}"
            else:
                seen[failure] = "delivered"
            fake.outage.up()
        assert seen == dict(INJECTED) | EXPECTED.get(adapter.platform, {})
        await _connected_again(adapter)
        ref = await adapter.send(OutboundMessage(adapter.platform, chat_id, "back"))
        assert ref.platform == adapter.platform and ref.chat_id == chat_id
    finally:
        ONE_TRY.reset(one_try)
        await adapter.stop()


async def _ignore(_msg: InboundMessage) -> None:
    return None
