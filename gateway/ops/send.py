"""One message to a chat from outside any conversation (`switchboard send`, the daemon's
`POST /v1/send`): the target resolved (a chat id, `chat_id:thread_id`, or the platform's
home channel), the text sent through the platform adapter's own send path (its splitting,
rate limits and retries), and a failure sorted into "refused" (sending again will not
help) or "unreachable" (try later), each with its own exit code.

Through the daemon (`OneOffSends`), each message is a `sends` row before it goes out; one
the platform does not take now joins the outbox's backlog (gateway.pipeline.backlog),
which delivers it with the same rule as replies, behind the chat's held replies. On the
leader, a scan every little while adopts the pending rows nobody holds (a stop or a crash
left them, or a replica that is gone)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.adapters.base import Outbound
from gateway.errors import (
    EXIT_USAGE,
    AdapterError,
    GatewayError,
    InvalidToken,
    PlatformRefused,
    PlatformUnreachable,
    RetryAfter,
    TransientError,
)
from gateway.messages import OutboundMessage, SentRef
from gateway.ops.metrics import Metrics
from gateway.pipeline.backlog import Backlog
from state import SEND_FAILED, SEND_PENDING, SEND_SENT, Store

if TYPE_CHECKING:
    from gateway.config import Config

log = logging.getLogger("gateway.outbox")

DEFAULT_TIMEOUT_S = 60.0
HOME = "home"  # the target that names the platform's home channel


class BadTarget(GatewayError):
    """A target the platform's adapter cannot address (not a chat id there)."""

    exit_code = EXIT_USAGE


def split_target(platform: str, target: str) -> tuple[str, str | None]:
    """`chat_id` or `chat_id:thread_id` as the platform reads them (an adapter whose ids
    contain ':' says how to split, as for its home channel)."""
    from gateway.handoff import configured_home

    found = configured_home(platform, target)
    if found is None:
        raise BadTarget(f"{target!r} is not a chat id (give a chat id, chat_id:thread_id, or home)")
    return str(found["chat_id"]), found["thread_id"]


def home_target(home: Mapping[str, Any] | None, platform: str) -> tuple[str, str | None]:
    from gateway.errors import NoHomeChannel

    if home is None:
        raise NoHomeChannel(platform)
    thread = home.get("thread_id")
    return str(home["chat_id"]), str(thread) if thread else None


def sorted_error(exc: BaseException, platform: str) -> GatewayError:
    """A send's failure as refused or unreachable (or a target the adapter cannot use)."""
    if isinstance(exc, InvalidToken):
        return PlatformRefused(f"{platform} refused the bot's credentials ({exc})")
    if isinstance(exc, (TransientError, RetryAfter)):
        return PlatformUnreachable(f"{platform} could not be reached ({exc})")
    if isinstance(exc, AdapterError):
        return PlatformRefused(str(exc))
    if isinstance(exc, (OSError, TimeoutError)):
        why = "no answer in time" if isinstance(exc, TimeoutError) else type(exc).__name__
        return PlatformUnreachable(f"{platform} could not be reached ({why})")
    if isinstance(exc, ValueError):
        return BadTarget(f"not a chat id {platform} can address ({exc})")
    import aiohttp

    if isinstance(exc, aiohttp.ClientError):
        return PlatformUnreachable(f"{platform} could not be reached ({type(exc).__name__})")
    return PlatformRefused(f"{platform} did not take the message ({type(exc).__name__}: {exc})")


async def deliver(adapter: Any, msg: OutboundMessage, timeout_s: float) -> SentRef:
    """`adapter.send(msg)` within `timeout_s`; its failure comes out sorted."""
    try:
        return await asyncio.wait_for(adapter.send(msg), timeout_s)
    except GatewayError as exc:
        if isinstance(exc, (PlatformRefused, PlatformUnreachable, BadTarget)):
            raise
        raise sorted_error(exc, msg.platform) from exc
    except Exception as exc:
        raise sorted_error(exc, msg.platform) from exc


async def send_direct(
    adapter: Any, platform: str, chat_id: str, thread_id: str | None, text: str, timeout_s: float
) -> SentRef:
    """Without a daemon: open the adapter for sending only (it receives nothing), send,
    close it."""
    if not isinstance(adapter, Outbound):
        raise GatewayError(
            f"{platform} cannot send without the daemon (its adapter only sends while it "
            "runs); start it (switchboard run) and send again"
        )
    try:
        try:
            await asyncio.wait_for(adapter.open_outbound(), timeout_s)
        except GatewayError as exc:
            raise sorted_error(exc, platform) from exc
        except Exception as exc:
            raise sorted_error(exc, platform) from exc
        msg = OutboundMessage(platform, chat_id, text, thread_id=thread_id)
        return await deliver(adapter, msg, timeout_s)
    finally:
        await adapter.stop()


class OneOffSends:
    """`send_one` and the leader's scan of pending rows (see the module docstring)."""

    def __init__(
        self,
        db: Store,
        backlog: Backlog,
        adapters: Mapping[str, Any],
        config: Callable[[], Config],
        metrics: Metrics,
        leads: Callable[[], bool],
    ) -> None:
        self.db = db
        self.backlog = backlog
        self._adapters = adapters
        self._config = config
        self.metrics = metrics
        self._leads = leads

    async def send_one(self, platform: str, target: str | None, text: str) -> dict[str, Any]:
        """One message to a chat of a running adapter: `target` is a chat id or
        chat_id:thread_id, None for the home channel. Stored first; one the platform does
        not take now (or that must wait behind the chat's held replies) stays in the
        outbox and is delivered later."""
        from gateway.handoff import home_channel

        adapter = self._adapters.get(platform)
        if adapter is None or platform == "api":
            from gateway.errors import ConfigError

            raise ConfigError(
                f"platforms.{platform}",
                "is not running on this daemon (not enabled in its config, or not a chat platform)",
            )
        config = self._config()
        if target is None:
            configured = config.platforms[platform].home_channel
            chat_id, thread_id = home_target(
                await home_channel(self.db, platform, configured), platform
            )
        else:
            chat_id, thread_id = split_target(platform, target)
        send_id = await self.db.send_add(platform, chat_id, thread_id, text, time.time())
        row = {
            "id": send_id,
            "platform": platform,
            "chat_id": chat_id,
            "thread_id": thread_id,
            "text": text,
            "created_at": time.time(),
        }
        answer: dict[str, Any] = {
            "id": send_id,
            "platform": platform,
            "chat_id": chat_id,
            "message_ids": [],
            "state": SEND_PENDING,
        }
        if self.backlog.waiting(platform, chat_id):  # behind the chat's held items
            self.backlog.adopt_send(row)
            return {**answer, "error": "waiting behind earlier undelivered messages"}
        msg = OutboundMessage(platform, chat_id, text, thread_id=thread_id)
        try:
            sent = await deliver(adapter, msg, config.outbox.retry_seconds)
        except PlatformUnreachable as exc:
            await self.db.send_finish(send_id, SEND_PENDING, str(exc), (), time.time())
            self.backlog.adopt_send({**row, "error": str(exc)}, failure=exc)
            return {**answer, "error": str(exc)}
        except GatewayError as exc:
            await self.db.send_finish(send_id, SEND_FAILED, str(exc), (), time.time())
            log.warning("outbox send %d to %s refused: %s", send_id, platform, exc)
            raise
        await self.db.send_finish(send_id, SEND_SENT, None, sent.message_ids, time.time())
        self.metrics.messages_out.inc(platform=platform)
        return {**answer, "state": SEND_SENT, "message_ids": list(sent.message_ids)}

    async def scan(self, alone: bool = False) -> None:
        """Every little while, on the leader: pending rows nobody tried for
        outbox.retry_seconds join the backlog (the backlog stamps each try). `alone` (one
        daemon: no other process holds any): the first pass takes every pending row."""
        first = alone
        while True:
            every = self._config().outbox.retry_seconds
            if self._leads():
                try:
                    now = time.time()
                    before = now + 1 if first else now - every
                    first = False
                    for row in await self.db.sends_claim_due(before, now):
                        if self.backlog.adopt_send(row):
                            log.info("outbox send %d to %s held again", row["id"], row["platform"])
                except Exception as exc:
                    log.warning("outbox scan failed: %s", exc)
            await asyncio.sleep(min(30.0, max(0.2, every / 4)))
