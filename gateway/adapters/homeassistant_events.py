"""Home Assistant events as InboundMessages (pure functions), and the notes of watched
entities with their rate limit.

A conversation event (the configured type, fired by an automation, a script or a voice
pipeline) carries `text` and says whose it is: `conversation_id` (an explicit chat, e.g.
the notify target a session was handed off to), else `device_id` (a voice satellite: one
session per device), else `user` or the event context's `user_id` (one session per user).
Its id is `message_id` when the sender gives one (a script that fires again after a
timeout), else the event context's id, so an event delivered again is answered once.

A watched entity's state change becomes a note in the `entities` conversation; notes of
one entity come at most once per interval, and changes in between fold into the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime
from typing import Any

from gateway.messages import InboundMessage
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType

log = logging.getLogger("gateway.adapters.homeassistant")
PLATFORM = "homeassistant"
NOTES_CHAT = "entities"  # the conversation (and sender) of watched entities' notes
NOTES_NAME = "Home Assistant"


def _fired_at(event: Mapping[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(event.get("time_fired"))).timestamp()
    except (TypeError, ValueError):
        return time.time()


def _id(value: Any) -> str | None:
    """A usable id from an event field: a non-empty string or number, else None."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value).strip()
    return text or None


def chat_of(data: Mapping[str, Any], context: Mapping[str, Any]) -> tuple[str, str] | None:
    """(chat id, user id) of a conversation event, or None when it names nobody."""
    conversation, device = _id(data.get("conversation_id")), _id(data.get("device_id"))
    user = _id(data.get("user")) or _id(context.get("user_id"))
    if conversation:
        return conversation, user or device or conversation
    if device:
        return f"device.{device}", user or device
    if user:
        return f"user.{user}", user
    return None


def to_inbound(event: Mapping[str, Any]) -> InboundMessage | None:
    """A conversation event as an InboundMessage; None (logged) when it has no text, no
    id or names no user or device."""
    data, context = event.get("data"), event.get("context")
    if not isinstance(data, Mapping) or not isinstance(context, Mapping):
        log.info("ignored an event without data or context: %.200r", event)
        return None
    text = data.get("text")
    msg_id = _id(data.get("message_id")) or _id(context.get("id"))
    where = chat_of(data, context)
    if not isinstance(text, str) or not text.strip() or msg_id is None or where is None:
        log.info("ignored an event without text, id, user or device: %.200r", data)
        return None
    chat_id, user_id = where
    name = _id(data.get("name")) or _id(data.get("user"))
    source = SessionSource(PLATFORM, chat_id, ChatType.DM, user_id, name)
    return InboundMessage(
        source=source,
        text=text.strip(),
        platform_message_id=msg_id,
        received_at=_fired_at(event),
        reply_to=msg_id,
    )


def _state(value: Any) -> tuple[str, str | None]:
    """(state, friendly name) of a state object (either may be missing)."""
    if not isinstance(value, Mapping):
        return "unknown", None
    attributes = value.get("attributes")
    name = attributes.get("friendly_name") if isinstance(attributes, Mapping) else None
    return str(value.get("state", "unknown")), (str(name) if name else None)


def to_note(trigger: Mapping[str, Any], context: Mapping[str, Any]) -> InboundMessage | None:
    """A state trigger's variables (`from_state`, `to_state`) as a note to the agent."""
    entity = _id(trigger.get("entity_id"))
    if entity is None:
        return None
    old, _ = _state(trigger.get("from_state"))
    new, name = _state(trigger.get("to_state"))
    to_state = trigger.get("to_state")
    when = to_state.get("last_changed") if isinstance(to_state, Mapping) else None
    label = f"{name} ({entity})" if name else entity
    text = f"[state change] {label}: {old} -> {new}" + (f" at {when}" if when else "")
    context_id = _id(context.get("id")) or str(when or time.time())
    return InboundMessage(
        source=SessionSource(PLATFORM, NOTES_CHAT, ChatType.DM, NOTES_CHAT, NOTES_NAME),
        text=text,
        platform_message_id=f"{context_id}/{entity}",
        received_at=time.time(),
    )


class EntityNotes:
    """At most one note per entity per `interval_s`: a change within the interval after a
    note waits, and when the interval ends the latest waiting one is delivered (the
    changes between are folded into it, the note says how many)."""

    def __init__(
        self,
        entities: Collection[str],
        interval_s: float,
        deliver: Callable[[InboundMessage], Awaitable[None]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.entities = frozenset(entities)
        self._interval, self._deliver, self._clock = interval_s, deliver, clock
        self._last: dict[str, float] = {}  # entity -> when its last note went
        self._waiting: dict[str, tuple[InboundMessage, int]] = {}  # latest, changes held
        self._timers: dict[str, asyncio.Task[None]] = {}

    async def offer(self, trigger: Mapping[str, Any], context: Mapping[str, Any]) -> None:
        entity = _id(trigger.get("entity_id"))
        if entity not in self.entities:
            return
        note = to_note(trigger, context)
        if note is None or entity is None:
            return
        since = self._clock() - self._last.get(entity, float("-inf"))
        if since >= self._interval and entity not in self._waiting:
            self._last[entity] = self._clock()
            await self._deliver(note)
            return
        _, count = self._waiting.get(entity, (note, 0))
        self._waiting[entity] = (note, count + 1)
        if entity not in self._timers:
            wait = max(0.0, self._interval - since)
            self._timers[entity] = asyncio.create_task(
                self._later(entity, wait), name=f"homeassistant.note:{entity}"
            )

    async def _later(self, entity: str, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            note, count = self._waiting.pop(entity)
            folded = count - 1
            if folded:
                s = "s" if folded > 1 else ""
                note = InboundMessage(
                    source=note.source,
                    text=f"{note.text} ({folded} earlier change{s} folded into this note)",
                    platform_message_id=note.platform_message_id,
                    received_at=note.received_at,
                )
            self._last[entity] = self._clock()
            await self._deliver(note)
        finally:
            self._timers.pop(entity, None)

    async def close(self) -> None:
        timers = list(self._timers.values())
        for task in timers:
            task.cancel()
        for task in timers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._waiting.clear()
