"""The echo workload the cluster tests drive through the balancer, and the senders that
play the platforms' side of delivery.

K keys per platform, each sending `k:0 .. k:m-1` in order: message i+1 goes out only once
i was acknowledged (2xx), so acknowledgement order is the order the chat sent in. With
webhooks a key often sends i+1 before the reply to i arrived (a burst); the HTTP API
answers with the reply, so its keys are sequential. Senders deliver again whatever was not
acknowledged (any non-2xx, a refused or cut connection), and Telegram and Slack also
deliver a share of acknowledged messages a second time, as those platforms do after a
slow ack. Everything is bounded: m messages per key and a deadline for the whole run.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.cluster.harness import TELEGRAM_SECRET
from tests.fakes.slack import FakeSlack, event, signed
from tests.fakes.telegram import FakeTelegram

PLATFORMS = ("api", "telegram", "slack")
RETRY_S = (0.05, 0.4)  # a sender's pause before delivering again (uniform)


@dataclass
class Sent:
    """One workload message and what its delivery saw."""

    platform: str
    key: int
    i: int
    attempts: int = 0
    acked: bool = False
    api_replies: list[dict[str, Any]] = field(default_factory=list)  # every 2xx body (API)

    @property
    def text(self) -> str:
        return text_of(self.platform, self.key, self.i)

    @property
    def chat(self) -> str:
        return chat_of(self.platform, self.key)


def text_of(platform: str, key: int, i: int) -> str:
    return f"{platform[0]}{key}:{i}"


def chat_of(platform: str, key: int) -> str:
    """The chat id the replicas see (and send replies to) for a workload key."""
    return {"api": f"a{key}", "telegram": str(10_000 + key), "slack": f"D{key:05d}"}[platform]


def parse_text(text: str) -> tuple[str, int, int] | None:
    """(platform letter, key, i) of a workload text (or of "echo: <text>")."""
    text = text.removeprefix("echo: ")
    head, _, tail = text.partition(":")
    if not head[1:].isdigit() or not tail.isdigit():
        return None
    return head[0], int(head[1:]), int(tail)


class Replies:
    """The replies the platform fakes received, read incrementally: per text how many
    times it was sent, and per chat the order of the `i`s."""

    def __init__(self, telegram: FakeTelegram | None, slack: FakeSlack | None) -> None:
        self.telegram, self.slack = telegram, slack
        self.count: Counter[str] = Counter()  # workload text -> replies seen
        self.order: dict[str, list[int]] = defaultdict(list)  # chat -> i of each reply
        self._read = {"telegram": 0, "slack": 0}

    def update(self) -> None:
        for platform, fake, method, chat in (
            ("telegram", self.telegram, "sendMessage", "chat_id"),
            ("slack", self.slack, "chat.postMessage", "channel"),
        ):
            if fake is None:
                continue
            calls = fake.calls
            for name, params in calls[self._read[platform] :]:
                if name == method:
                    self._note(platform, str(params.get(chat)), str(params.get("text", "")))
            self._read[platform] = len(calls)

    def _note(self, platform: str, chat: str, text: str) -> None:
        parsed = parse_text(text)
        if parsed is None or not text.startswith("echo: "):
            return
        self.count[text.removeprefix("echo: ")] += 1
        self.order[f"{platform}:{chat}"].append(parsed[2])

    def seen(self, text: str) -> bool:
        self.update()
        return self.count[text] > 0


@dataclass
class Workload:
    """K keys x m messages on each platform in `platforms`, through `url` (the balancer)."""

    url: str
    keys: int
    messages: int
    platforms: tuple[str, ...] = PLATFORMS
    telegram: FakeTelegram | None = None
    slack: FakeSlack | None = None
    burst: float = 0.5  # chance that a webhook key sends i+1 before the reply to i
    redeliver: float = 0.1  # chance that an acknowledged webhook delivery comes again
    deadline_s: float = 120.0
    seed: int = 1
    sent: list[Sent] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)  # every answer's status (0: no answer)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.replies = Replies(self.telegram, self.slack)
        self._extra: set[asyncio.Task[None]] = set()
        self._stop_at = 0.0

    @property
    def acked(self) -> list[Sent]:
        return [s for s in self.sent if s.acked]

    async def run(self) -> None:
        """Every key to its last message (or the deadline), then every second delivery."""
        self._stop_at = time.monotonic() + self.deadline_s
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await asyncio.gather(
                *(self._key(http, p, k) for p in self.platforms for k in range(self.keys))
            )
            if self._extra:
                await asyncio.gather(*self._extra)

    def finish(self) -> None:
        """Start no new message (those under way are still delivered until acknowledged)."""
        self._stop_at = min(self._stop_at, time.monotonic())

    async def _key(self, http: aiohttp.ClientSession, platform: str, key: int) -> None:
        for i in range(self.messages):
            if time.monotonic() > self._stop_at:
                return
            item = Sent(platform, key, i)
            self.sent.append(item)
            await self._deliver(http, item)
            if not item.acked or platform == "api":
                continue
            if self.rng.random() < self.redeliver:
                task = asyncio.create_task(self._again(http, item))
                self._extra.add(task)
            if self.rng.random() >= self.burst:
                await self._reply_to(item)

    async def _reply_to(self, item: Sent, limit_s: float = 15.0) -> None:
        """Wait (bounded) for the reply before the next message: a conversation's pace.
        Telegram may never answer one (at most once), so this never fails."""
        until = min(self._stop_at, time.monotonic() + limit_s)
        while time.monotonic() < until:
            if self.replies.seen(item.text):
                return
            await asyncio.sleep(0.05)

    async def _again(self, http: aiohttp.ClientSession, item: Sent) -> None:
        await asyncio.sleep(self.rng.uniform(0.1, 1.5))
        await self._post(http, item, retry=1)

    async def _deliver(self, http: aiohttp.ClientSession, item: Sent) -> None:
        """Until a 2xx (or the deadline): every other answer is delivered again."""
        while time.monotonic() < self._stop_at + 30:
            status = await self._post(http, item, retry=item.attempts)
            item.attempts += 1
            if 200 <= status < 300:
                item.acked = True
                return
            await asyncio.sleep(self.rng.uniform(*RETRY_S))

    async def _post(self, http: aiohttp.ClientSession, item: Sent, retry: int) -> int:
        try:
            if item.platform == "api":
                status = await self._post_api(http, item)
            elif item.platform == "telegram":
                status = await self._post_telegram(http, item)
            else:
                status = await self._post_slack(http, item, retry)
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        self.statuses[status] += 1
        return status

    async def _post_api(self, http: aiohttp.ClientSession, item: Sent) -> int:
        async with http.post(
            f"{self.url}/v1/messages",
            json={"chat_id": item.chat, "text": item.text},
            headers={"Idempotency-Key": item.text},
        ) as resp:
            if resp.status == 200:
                item.api_replies.append(await resp.json())
            return resp.status

    async def _post_telegram(self, http: aiohttp.ClientSession, item: Sent) -> int:
        chat = int(item.chat)
        # one update per message: its ids are fixed, so a redelivery is the same update
        update = {
            "update_id": 1_000_000 + item.key * 10_000 + item.i,
            "message": {
                "message_id": 1 + item.i,
                "date": int(time.time()),
                "text": item.text,
                "chat": {"id": chat, "type": "private", "first_name": f"u{item.key}"},
                "from": {"id": chat, "is_bot": False, "first_name": f"u{item.key}"},
            },
        }
        async with http.post(
            f"{self.url}/telegram/webhook",
            json=update,
            headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
        ) as resp:
            return resp.status

    async def _post_slack(self, http: aiohttp.ClientSession, item: Sent, retry: int) -> int:
        # before every ts the Slack fake gives the bot's posts (1700000000.*), as a user's
        # message precedes its reply: a resend reads the history after the message's ts
        ts = f"{1_600_000_000 + item.key}.{item.i:06d}"
        ev = {
            "type": "message",
            "channel": item.chat,
            "user": f"U{item.key:05d}",
            "text": item.text,
            "ts": ts,
            "event_ts": ts,
            "channel_type": "im",
        }
        body, headers = signed(event(ev, event_id=f"Ev{item.key}x{item.i}"))
        if retry:
            headers.update({"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_error"})
        async with http.post(f"{self.url}/slack/events", data=body, headers=headers) as resp:
            return resp.status

    def figures(self) -> dict[str, int]:
        return {
            "messages": len(self.sent),
            "acknowledged": len(self.acked),
            "deliveries": sum(self.statuses.values()),
            "not_2xx": sum(n for s, n in self.statuses.items() if not 200 <= s < 300),
        }
