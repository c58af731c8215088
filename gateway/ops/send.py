"""One message to a chat from outside any conversation (`switchboard send`, the daemon's
`POST /v1/send`): the target resolved (a chat id, `chat_id:thread_id`, or the platform's
home channel), the text sent through the platform adapter's own send path (its splitting,
rate limits and retries), and a failure sorted into "refused" (sending again will not
help) or "unreachable" (try later), each with its own exit code."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

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
    try:
        import aiohttp

        if isinstance(exc, aiohttp.ClientError):
            return PlatformUnreachable(f"{platform} could not be reached ({type(exc).__name__})")
    except ImportError:  # pragma: no cover - aiohttp is a dependency
        pass
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
