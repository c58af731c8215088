"""Acknowledge after commit, for the platforms that deliver by webhook: the messages of a
request are handed to the core in order, and the platform hears 2xx only once every one was
committed. A message the core could not store (`NotAccepted`) answers 503, so the platform
delivers the request again; a stopped adapter answers 503 too. Verifying and parsing the
request stay with the adapter."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gateway.errors import ConfigError, NotAccepted
from gateway.messages import InboundMessage
from gateway.vocab import AdapterState

Emit = Callable[[InboundMessage], Awaitable[None]]


@dataclass(frozen=True)
class WebhookReplies:
    """How one platform's webhook words its refusals: plain text, or a JSON object with the
    text under `key` (the platform's own error field)."""

    key: str | None = None
    not_running: str = "not running"
    deliver_again: str = "not stored; deliver again"

    def refuse(self, status: int, text: str) -> Any:
        from aiohttp import web

        if self.key is None:
            return web.Response(status=status, text=text)
        return web.json_response({self.key: text}, status=status)

    def stopped(self) -> Any:
        """503: the adapter is not running; the platform delivers the request again."""
        return self.refuse(503, self.not_running)

    def again(self) -> Any:
        """503: a message was not stored; the platform delivers the request again."""
        return self.refuse(503, self.deliver_again)


def api_server_off(
    platform: str, api_enabled: bool, *, key: str = "enabled", served: str = "the webhook is"
) -> list[ConfigError]:
    """The config problem of a platform whose webhooks the api server serves while that
    server is off (`served` says what it would serve, `key` which of the platform's keys
    asks for it); none while it is on."""
    if api_enabled:
        return []
    why = f"{served} served by the api server: enable platforms.api"
    return [ConfigError(f"platforms.{platform}.{key}", why)]


def taking(emit: Emit | None, state: str) -> Emit | None:
    """The adapter's emit while it runs and can hand messages to the core, else None."""
    return emit if emit is not None and state == AdapterState.RUNNING else None


async def committed(emit: Emit, messages: Iterable[InboundMessage | None]) -> bool:
    """Hand each message (None: nothing to hand over) to the core in order. True when all
    were committed; False at the first the core could not store, leaving the rest for the
    platform's next delivery."""
    for msg in messages:
        if msg is None:
            continue
        try:
            await emit(msg)
        except NotAccepted:
            return False
    return True
