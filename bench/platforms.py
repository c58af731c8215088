"""The platform paths the benchmarks feed a daemon through: its config for the Telegram
adapter (webhook or long polling) and the Slack adapter on the Events API, each pointed at its
loopback fake (tests/fakes/), the environment holding their tokens and secrets, the signed
requests those platforms POST to the daemon, and the fakes counting the replies that reach
them, each handed to whoever waits for a reply in that chat."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import slack as slack_fake
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

WEBHOOK_PATH = "/telegram/webhook"  # gateway/adapters/telegram.py's route on the api server
EVENTS_PATH = "/slack/events"  # gateway/adapters/slack.py's
WEBHOOK_SECRET = "bench-webhook-secret"
SLACK_TOKEN = "xoxb-bench-token"


def telegram_config(bot_api: str, webhook_url: str | None) -> dict[str, Any]:
    """`platforms.telegram` against the Bot API at `bot_api`: in webhook mode, or in long
    polling mode without a `webhook_url`."""
    if webhook_url is None:
        return {"enabled": True, "allow_all_users": True, "base_url": bot_api, "mode": "polling"}
    return {
        "enabled": True,
        "allow_all_users": True,
        "base_url": bot_api,
        "mode": "webhook",
        "webhook_url": webhook_url,
    }


def telegram_env(fake: FakeTelegram) -> dict[str, str]:
    return {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_WEBHOOK_SECRET": WEBHOOK_SECRET}


def telegram_update(
    fake: FakeTelegram, update_id: int, chat: int, text: str
) -> tuple[bytes, dict[str, str]]:
    """A private chat's message as Telegram POSTs it to a webhook: (body, headers), the
    secret set with setWebhook in its header. In a private chat the chat id is the user's."""
    message = fake.message(text, fake.dm_chat(chat), user_id=chat)
    body = json.dumps({"update_id": update_id, "message": message}).encode()
    return body, {
        "X-Telegram-Bot-Api-Secret-Token": WEBHOOK_SECRET,
        "Content-Type": "application/json",
    }


def slack_config(web_api: str) -> dict[str, Any]:
    """`platforms.slack` on the Events API (POST /slack/events) against the Web API at
    `web_api`."""
    return {"enabled": True, "allow_all_users": True, "base_url": web_api, "mode": "http"}


def slack_env() -> dict[str, str]:
    """The bot token and the signing secret tests/fakes/slack.py signs events with."""
    return {"SLACK_BOT_TOKEN": SLACK_TOKEN, "SLACK_SIGNING_SECRET": slack_fake.SECRET}


def slack_event(i: int, channel: str, user: str, text: str) -> tuple[bytes, dict[str, str]]:
    """Message `i` of a DM as a signed Events API request: (body, headers) with
    `X-Slack-Signature` (v0, HMAC-SHA256 of `v0:{timestamp}:{body}` under the signing
    secret) and `X-Slack-Request-Timestamp`. Its ts is unique per i (the message's id)."""
    ts = f"{int(time.time())}.{i % 1_000_000:06d}"
    ev = slack_fake.message(text, channel, user, ts, channel_type="im")
    return slack_fake.signed(slack_fake.event(ev, f"Ev{i}"))


class Replies:
    """The replies reaching a platform fake: each goes to the oldest waiter of its chat (a
    chat's replies come in the order of its messages); one nobody waits for is counted as
    unexpected."""

    def __init__(self) -> None:
        self.count = 0
        self.unexpected = 0
        self._waiting: collections.defaultdict[str, collections.deque[asyncio.Future[str]]] = (
            collections.defaultdict(collections.deque)
        )

    def expect(self, chat: str) -> asyncio.Future[str]:
        """A future for the chat's next reply; registered before its message is sent (the
        reply can reach the fake before the daemon has answered the POST)."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting[chat].append(fut)
        return fut

    def forget(self, chat: str, fut: asyncio.Future[str]) -> None:
        """A waiter whose message was not taken (no reply is coming for it)."""
        waiting = self._waiting.get(chat)
        if waiting and fut in waiting:
            waiting.remove(fut)

    def arrived(self, chat: str, text: str) -> None:
        self.count += 1
        waiting = self._waiting.get(chat)
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(text)
                return
        self.unexpected += 1


class _NoCallLog:
    """A platform fake that keeps no log of the calls it answered (a bench sends too many)."""

    calls: list[Any]

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            return await super()._handle(request)  # the fake it is mixed into
        finally:
            self.calls.clear()


@dataclass
class RepliedTelegram(_NoCallLog, FakeTelegram):
    """The Bot API fake handing each sendMessage to `replies`; no call log kept."""

    replies: Replies = field(default_factory=Replies)

    async def _m_sendMessage(self, params: dict[str, Any]) -> Any:
        self.replies.arrived(str(params["chat_id"]), str(params.get("text", "")))
        return await super()._m_sendMessage(params)


@dataclass
class RepliedSlack(_NoCallLog, FakeSlack):
    """The Web API fake handing each chat.postMessage to `replies`; no call log kept (the
    posts stay in `history`, which a resend reads)."""

    replies: Replies = field(default_factory=Replies)

    def _post_message(self, params: dict[str, Any]) -> dict[str, Any]:
        out = super()._post_message(params)
        if out.get("ok"):
            self.replies.arrived(str(params.get("channel")), str(params.get("text", "")))
        return out
