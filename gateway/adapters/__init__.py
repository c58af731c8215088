"""Platform adapters: each turns platform events into InboundMessage and OutboundMessage
into API calls, and nothing else.

This module is the registry: platform name -> adapter class. The built-in adapters and
those other packages register under the `switchboard.adapters` entry-point group are
imported only when asked for, and an adapter module imports its client library only when
it starts, so neither the registry nor the config ever loads a chat library.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import cast

from gateway.adapters.base import PlatformAdapter
from gateway.errors import GatewayError

ENTRY_POINT_GROUP = "switchboard.adapters"
BUILTIN = {
    "telegram": "gateway.adapters.telegram:TelegramAdapter",
    "discord": "gateway.adapters.discord:DiscordAdapter",
    "slack": "gateway.adapters.slack:SlackAdapter",
    "signal": "gateway.adapters.signal:SignalAdapter",
    "matrix": "gateway.adapters.matrix:MatrixAdapter",
    "mattermost": "gateway.adapters.mattermost:MattermostAdapter",
    "teams": "gateway.adapters.teams:TeamsAdapter",
    "whatsapp": "gateway.adapters.whatsapp:WhatsAppAdapter",
    "sms": "gateway.adapters.sms:SmsAdapter",
    "email": "gateway.adapters.email:EmailAdapter",
    "feishu": "gateway.adapters.feishu:FeishuAdapter",
    "dingtalk": "gateway.adapters.dingtalk:DingTalkAdapter",
    "qqbot": "gateway.adapters.qqbot:QQBotAdapter",
    "wecom": "gateway.adapters.wecom:WeComAdapter",
    "bluebubbles": "gateway.adapters.bluebubbles:BlueBubblesAdapter",
    "webhook": "gateway.adapters.webhook:WebhookAdapter",
    "homeassistant": "gateway.adapters.homeassistant:HomeAssistantAdapter",
    "weixin": "gateway.adapters.weixin:WeixinAdapter",
}
RESERVED = frozenset({"api", "cli"})  # sources of the core, never a chat platform
CORE = {"api": "gateway.adapters.api:ApiAdapter"}  # the core's own adapters (not platforms)


class AdapterNotFound(GatewayError):
    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"no adapter for platform {name!r} (known: {', '.join(known)})")
        self.name = name


@cache
def _targets() -> dict[str, str]:
    """Name -> "module:Class"; a built-in name wins over an entry point of the same name."""
    from importlib.metadata import entry_points  # ~30 ms to import: only when asked

    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in RESERVED:
            found.setdefault(ep.name, ep.value)
    return found


def names() -> tuple[str, ...]:
    """Every registered chat platform: the built-ins first, then entry points."""
    return tuple(_targets())


def sources() -> tuple[str, ...]:
    """Every value a session's source can take (the core's and each platform's), sorted."""
    return tuple(sorted({*RESERVED, *names()}))


def adapter_class(name: str) -> type[PlatformAdapter]:
    try:
        target = _targets()[name]
    except KeyError:
        raise AdapterNotFound(name, names()) from None
    return _load(target)


@cache  # asked on every turn
def idempotent_replies(name: str) -> bool:
    """Whether the platform's adapter class declares `idempotent_replies`: a reply sent
    again under the same `OutboundMessage.dedupe_key` is never shown twice. False for the
    core's own sources and for a platform whose adapter cannot be loaded."""
    try:
        return bool(getattr(adapter_class(name), "idempotent_replies", False))
    except GatewayError:
        return False


@cache
def reply_window_s(name: str) -> float | None:
    """How long after the user's message the platform lets a reply go, when its adapter
    class declares `reply_window_s` (WhatsApp's customer-service window); None for no
    such rule. The outbox lets a held reply expire at the window's end."""
    try:
        window = getattr(adapter_class(name), "reply_window_s", None)
    except GatewayError:
        return None
    return float(window) if window else None


DEFAULT_DRAIN_PER_SECOND = 5.0


@cache
def drain_per_second(name: str) -> float:
    """How fast the outbox drains the platform's backlog (messages a second, the whole
    platform), as its adapter class declares `drain_per_second` (under the platform's
    published limit for a bot); DEFAULT_DRAIN_PER_SECOND where it declares none."""
    try:
        rate = getattr(adapter_class(name), "drain_per_second", None)
    except GatewayError:
        return DEFAULT_DRAIN_PER_SECOND
    return float(rate) if rate else DEFAULT_DRAIN_PER_SECOND


@cache  # asked on every turn
def replies_in_request(name: str) -> bool:
    """Whether the platform's adapter class declares `replies_in_request`: each reply is
    the response to its own request (the HTTP API), so no other reply of the chat can come
    before or after it, and a repeat of the request reads it from the store. Such a reply
    is stored as sent with its turn's end (there is nothing to deliver again after a
    crash), and a replica frees the key's lease in that same commit."""
    try:
        cls = _load(CORE[name]) if name in CORE else adapter_class(name)
    except GatewayError:
        return False
    return bool(getattr(cls, "replies_in_request", False))


@cache
def _load(target: str) -> type[PlatformAdapter]:
    module, _, attr = target.partition(":")
    try:
        obj: object = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise GatewayError(f"adapter {target} cannot be loaded ({exc})") from exc
    return cast("type[PlatformAdapter]", obj)


def rescan() -> None:
    """Look for entry points again (after a package was installed into this process)."""
    _targets.cache_clear()
    _load.cache_clear()
    idempotent_replies.cache_clear()
    reply_window_s.cache_clear()
