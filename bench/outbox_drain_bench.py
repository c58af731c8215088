"""How fast the outbox drains a backlog once a platform is back, per platform, within the
rate it paces each platform at (outbox.drain_per_second; gateway/pipeline/backlog.py).

    python bench/outbox_drain_bench.py                      # every platform below, 3 runs
    python bench/outbox_drain_bench.py --platform telegram --messages 200 --runs 5
    python bench/outbox_drain_bench.py --unpaced            # the adapters' own speed

Each run: the platform's loopback fake (tests/fakes) fails every send (502) while
`--messages` replies to `--chats` chats are held by a real Backlog on a real SQLite store,
through the platform's real adapter and client library; then the fake is brought back and
the time from then to the last delivery is measured. Printed per platform: the drain rate
(messages a second; the median of the runs and their spread), the pace the outbox keeps
to, and whether every chat received its replies in order, each once.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.adapters.base import Backoff  # noqa: E402
from gateway.errors import TransientError  # noqa: E402
from gateway.messages import OutboundMessage, SentRef  # noqa: E402
from gateway.ops.metrics import Metrics  # noqa: E402
from gateway.pipeline.backlog import Backlog, DeliveryRules  # noqa: E402
from state import open_store  # noqa: E402

QUICK = Backoff(initial_s=0.01, factor=2.0, max_s=0.02, jitter=0.0)


def _telegram() -> tuple[
    Any, Callable[[Any], Any], Callable[[Any], list[tuple[str, str]]], Callable[[int], str]
]:
    from gateway.adapters.telegram import TelegramAdapter
    from tests.fakes.telegram import FakeTelegram

    return (
        FakeTelegram(),
        lambda f: TelegramAdapter(f.token, base_url=f.base_url, poll_timeout_s=1, backoff=QUICK),
        lambda f: [(str(p["chat_id"]), str(p["text"])) for p in f.sent()],
        lambda i: str(100 + i),
    )


def _slack() -> tuple[
    Any, Callable[[Any], Any], Callable[[Any], list[tuple[str, str]]], Callable[[int], str]
]:
    from gateway.adapters.slack import SlackAdapter
    from tests.fakes.slack import SECRET, FakeSlack

    return (
        FakeSlack(),
        lambda f: SlackAdapter("xoxb-fake", SECRET, base_url=f.base_url),
        lambda f: [(str(p["channel"]), str(p["text"])) for p in f.posted()],
        lambda i: f"C{i:04d}",
    )


def _whatsapp() -> tuple[
    Any, Callable[[Any], Any], Callable[[Any], list[tuple[str, str]]], Callable[[int], str]
]:
    from gateway.adapters.whatsapp import WhatsAppAdapter
    from tests.fakes import whatsapp
    from tests.fakes.whatsapp import FakeGraph

    return (
        FakeGraph(),
        lambda f: WhatsAppAdapter(
            whatsapp.PHONE_ID,
            whatsapp.TOKEN,
            whatsapp.APP_SECRET,
            whatsapp.VERIFY,
            base_url=f.base_url,
        ),
        lambda f: [(str(p["to"]), str(p["text"]["body"])) for p in f.sent()],
        lambda i: f"1555000{i:04d}",
    )


def _sms() -> tuple[
    Any, Callable[[Any], Any], Callable[[Any], list[tuple[str, str]]], Callable[[int], str]
]:
    from gateway.adapters.sms import SmsAdapter
    from tests.fakes import twilio
    from tests.fakes.twilio import FakeTwilio

    return (
        FakeTwilio(),
        lambda f: SmsAdapter(
            twilio.ACCOUNT, twilio.AUTH_TOKEN, twilio.FROM, twilio.PUBLIC_URL, base_url=f.base_url
        ),
        lambda f: [(str(p["To"]), str(p["Body"])) for p in f.sent()],
        lambda i: f"+1555123{i:04d}",
    )


PLATFORMS = {"telegram": _telegram, "slack": _slack, "whatsapp": _whatsapp, "sms": _sms}


async def one_run(
    platform: str, messages: int, chats: int, rules: DeliveryRules, tmp: Path
) -> tuple[float, bool]:
    fake, build, delivered, chat_of = PLATFORMS[platform]()
    await fake.start()
    adapter = build(fake)

    async def ignore(_msg: Any) -> None:
        return None

    await adapter.start(ignore)
    db = await open_store({"backend": "sqlite"}, tmp)
    backlog = Backlog(db, _sender(adapter), Metrics(), rules)
    try:
        fake.outage.down("502")
        sent: dict[str, list[str]] = {}
        for i in range(messages):
            chat = chat_of(i % chats)
            text = f"reply {i}"
            sent.setdefault(chat, []).append(text)
            failure = TransientError("Bad Gateway") if i == 0 else None
            await backlog.hold(OutboundMessage(platform, chat, text), failure=failure)
        await _poll(lambda: fake.outage.failed > 0)  # the drain is trying: the platform is down
        fake.outage.up()
        back = time.perf_counter()
        await _poll(lambda: not sum(backlog.pending().values()))
        took = time.perf_counter() - back
        got: dict[str, list[str]] = {}
        for chat, text in delivered(fake):
            got.setdefault(chat, []).append(text)
        return messages / took, got == sent
    finally:
        await backlog.stop()
        await adapter.stop()
        await db.close()
        await fake.stop()


async def _poll(done: Callable[[], bool]) -> None:
    for _ in itertools.count():
        if done():
            return
        await asyncio.sleep(0.002)


def _sender(adapter: Any) -> Callable[[OutboundMessage], Any]:
    async def send(out: OutboundMessage) -> SentRef:
        ref: SentRef = await adapter.send(out)
        return ref

    return send


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--platform", choices=sorted(PLATFORMS), action="append")
    parser.add_argument(
        "--messages", type=int, help="held per run (default: about 5 s at the pace, 10-200)"
    )
    parser.add_argument("--chats", type=int, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--unpaced", action="store_true", help="no pacing: the adapter's speed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the held sends' warnings, not the figures
    for platform in args.platform or sorted(PLATFORMS):
        pace = {platform: 10_000.0} if args.unpaced else {}
        rules = DeliveryRules(first_retry_s=0.05, retry_cap_s=0.1, drain_per_second=pace)
        limit = 1 / rules.spacing(platform)
        messages = args.messages or max(10, min(200, int(5 * limit)))
        rates, ordered = [], True
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="outbox-drain-") as tmp:
                rate, ok = await one_run(platform, messages, args.chats, rules, Path(tmp))
            rates.append(rate)
            ordered = ordered and ok
        print(
            f"{platform:9s} {messages:3d} held over {args.chats} chats: drained at "
            f"{statistics.median(rates):7.1f} msg/s (runs {min(rates):.1f}-{max(rates):.1f}; "
            f"pace {limit:g}/s){'' if ordered else '  OUT OF ORDER OR MISSING'}",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
