"""The outbox's backlog: replies and one-off sends a platform has not taken yet, kept
until they are delivered, expire, or the platform refuses them.

A send that fails transiently (5xx, 429, a reset, a timeout: gateway.errors.send_failure),
after the adapter's own quick retries, is held here instead of dropped, and so is every
later reply to the same chat, so a chat's replies keep their order. One drain task per
platform sends the held items oldest first, one at a time (the adapter's own limiter and
Retry-After handling pace them), with capped exponential backoff between failed tries
(outbox.first_retry_seconds doubling up to outbox.retry_seconds; a Retry-After is waited
out as asked). A refusal (PlatformRefused) ends the item at once with its reason. An item
older than its horizon expires: a reply after outbox.max_age_minutes (per platform:
outbox.max_age_by_platform; never past a platform's reply window, WhatsApp's 24 hours from
the user's message), a one-off send after outbox.give_up_hours; the chat of an expired
reply is told once, before the answer to its next message.

What a held item is, is in the store: a turn's reply is its inbox row ('ready': not in the
chat, so a restart sends it again; 'sending' during a try on a platform that cannot
deduplicate, so a crash mid-try leaves it unconfirmed: at most once), anything else a row
of the `sends` table (pending). A reply's end is its row's reply_state: 'sent' with the
platform's ids, 'refused' or 'expired' with the reason in reply_ref.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.adapters import drain_per_second, idempotent_replies, reply_window_s
from gateway.errors import SEND_REFUSED, SEND_RETRY_AFTER, TransientError, send_failure
from gateway.messages import ONE_TRY, OutboundMessage, SentRef
from gateway.ops.metrics import Metrics
from gateway.services import EXPIRY_NOTICE
from state import SEND_FAILED, SEND_PENDING, SEND_SENT, Store

log = logging.getLogger("gateway.outbox")

Chat = tuple[str, str]  # (platform, chat_id)
Send = Callable[[OutboundMessage], Awaitable["SentRef | None"]]

# reply_state of an inbox row (besides the turn's ready / sending / sent / unconfirmed /
# failed): the outbox's ends of a held reply
READY, SENDING, SENT = "ready", "sending", "sent"
REFUSED, EXPIRED = "refused", "expired"
EXPIRED_CHATS_META = "outbox.expired_chats"  # chats owed the expiry notice (a JSON list)
# platforms whose sends are failing now: {platform: {"since", "error"}} (for `doctor`)
FAILING_META = "outbox.failing"


@dataclass(frozen=True)
class DeliveryRules:
    """How long held items live and how their tries are spaced (the `outbox:` section)."""

    max_age_s: float = 3600.0
    max_age_by_platform: Mapping[str, float] = field(default_factory=dict)
    first_retry_s: float = 2.0
    retry_cap_s: float = 60.0
    sends_give_up_s: float = 86400.0
    drain_per_second: Mapping[str, float] = field(default_factory=dict)

    def spacing(self, platform: str) -> float:
        """The least time between two sends of a draining backlog on `platform`."""
        configured = self.drain_per_second.get(platform)
        return 1.0 / (configured or drain_per_second(platform))

    def backoff(self, failures: int) -> float:
        """The wait after the `failures`th failed try in a row (1: the first)."""
        return min(self.retry_cap_s, self.first_retry_s * 2 ** max(0, failures - 1))

    def reply_horizon(self, platform: str, due: float, received: float | None) -> float:
        """When a reply first due at `due` (its user's message at `received`) expires."""
        end = due + self.max_age_by_platform.get(platform, self.max_age_s)
        window = reply_window_s(platform)
        if window is not None:
            end = min(end, (received or due) + window)
        return end


@dataclass
class Held:
    """One undelivered item: a turn's reply (`inbox_id`) or any other send (`send_id`)."""

    out: OutboundMessage
    due: float  # when it was first to go
    horizon: float  # it expires after this (the clock's time)
    seq: int = 0  # the order it was held in: oldest first
    inbox_id: int | None = None
    send_id: int | None = None
    error: str = ""

    @property
    def chat(self) -> Chat:
        return (self.out.platform, self.out.chat_id)


class Backlog:
    """The held items, per chat in order, and one drain task per platform holding some."""

    def __init__(
        self,
        db: Store,
        send: Send,
        metrics: Metrics,
        rules: DeliveryRules | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self._send = send
        self.metrics = metrics
        self.rules = rules or DeliveryRules()
        self.clock = clock
        self._chats: dict[Chat, deque[Held]] = {}
        self._blocked: dict[str, float] = {}  # platform -> no try before (the clock's time)
        self._paced: dict[str, float] = {}  # platform -> next send of a drain (monotonic)
        self._failures: dict[str, int] = {}  # platform -> failed tries in a row
        self._owed: set[Chat] = set()  # chats owed the expiry notice
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._stopping = asyncio.Event()
        self._seq = 0
        self.last_failure: dict[str, tuple[float, str]] = {}  # platform -> (when, error)
        self.failing_since: dict[str, float] = {}  # platform -> time.time() it began failing
        self._noting: asyncio.Task[None] | None = None
        self._failing_changed = False
        metrics.outbox_pending.read = self.pending

    # --- what the reply path asks ---------------------------------------------------------

    def waiting(self, platform: str, chat_id: str) -> bool:
        """Must a new send to this chat wait in the backlog: the chat has held items, or
        its platform failed a moment ago and is not due another try yet?"""
        return (platform, chat_id) in self._chats or self._blocked.get(platform, 0.0) > self.clock()

    def pending(self) -> dict[str, int]:
        """Held items per platform."""
        out: dict[str, int] = {}
        for (platform, _), items in self._chats.items():
            out[platform] = out.get(platform, 0) + len(items)
        return out

    async def hold(
        self,
        out: OutboundMessage,
        *,
        inbox_id: int | None = None,
        received: float | None = None,
        failure: BaseException | None = None,
        due: float | None = None,
    ) -> None:
        """Keep `out` until it is delivered (a turn's reply: its inbox row; anything else
        gets a `sends` row). `failure`: the send failed just now (the platform waits its
        backoff before the next try); `due`: when it was first to go (recovery's)."""
        now = self.clock()
        due = now if due is None else due
        item = Held(out, due, 0.0, inbox_id=inbox_id)
        if inbox_id is not None:
            item.horizon = self.rules.reply_horizon(out.platform, due, received)
            await self._mark(inbox_id, READY)  # not in the chat: a restart sends it again
        else:
            item.horizon = due + self.rules.sends_give_up_s
            item.send_id = await self.db.send_add(
                out.platform, out.chat_id, out.thread_id, out.text, now
            )
        if failure is not None:
            self._failed(out.platform, failure)
            item.error = _one_line(failure)
        self._push(item)

    def adopt_send(self, row: Mapping[str, Any], failure: BaseException | None = None) -> bool:
        """A pending `sends` row (a one-off send, or a reply without an inbox row) found in
        the store: held here unless it already is. True when taken."""
        send_id = int(row["id"])
        for items in self._chats.values():
            if any(h.send_id == send_id for h in items):
                return False
        out = OutboundMessage(row["platform"], row["chat_id"], row["text"], row["thread_id"])
        created = float(row["created_at"])
        item = Held(out, created, created + self.rules.sends_give_up_s, send_id=send_id)
        item.error = row.get("error") or ""
        if failure is not None:
            self._failed(out.platform, failure)
        self._push(item)
        return True

    def reply_horizon(self, platform: str, due: float, received: float | None) -> float:
        return self.rules.reply_horizon(platform, due, received)

    async def refuse(self, out: OutboundMessage, inbox_id: int, exc: BaseException) -> bool:
        """A turn's reply the platform refused for good at its first send: recorded with
        its reason (False when the store could not record it)."""
        item = Held(out, self.clock(), 0.0, inbox_id=inbox_id, error=_one_line(exc))
        self.metrics.outbox_refused.inc(platform=out.platform)
        try:
            await self._end(item, REFUSED, f"refused: {item.error}")
        except Exception as store_exc:
            log.warning("outbox: a refusal could not be recorded (%s)", store_exc)
            return False
        return True

    async def expire_unsent(self, inbox_id: int, platform: str, chat_id: str) -> None:
        """A reply a stop left undelivered that is past its horizon at the restart: it
        expires without a try, and its chat is owed the notice."""
        item = Held(OutboundMessage(platform, chat_id, ""), 0.0, 0.0, inbox_id=inbox_id)
        item.error = "the gateway was stopped"
        await self._expire(item)

    async def owed_notice(self, platform: str, chat_id: str) -> bool:
        """Is this chat owed the expiry notice? Taken: asked once per notice."""
        chat = (platform, chat_id)
        if chat not in self._owed:
            return False
        self._owed.discard(chat)
        await self._save_owed()
        return True

    async def restore(self) -> None:
        """The chats owed a notice, as a stop left them."""
        with contextlib.suppress(Exception):
            raw = await self.db.get_meta(EXPIRED_CHATS_META)
            self._owed = {(str(p), str(c)) for p, c in json.loads(raw or "[]")}

    async def stop(self, budget_s: float = 10.0) -> None:
        """End the drains: a try under way may finish within `budget_s` (so its reply's
        fate is known), then they are cancelled; what they hold stays in the store for the
        next start."""
        self._stopping.set()
        tasks, self._drains = list(self._drains.values()), {}
        if tasks:
            await asyncio.wait(tasks, timeout=budget_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._noting is not None:
            await asyncio.gather(self._noting, return_exceptions=True)

    # --- the drain ------------------------------------------------------------------------

    def _push(self, item: Held) -> None:
        self._seq += 1
        item.seq = self._seq
        self._chats.setdefault(item.chat, deque()).append(item)
        platform = item.out.platform
        task = self._drains.get(platform)
        if self._stopping.is_set():
            return  # stopping: kept in the store for the next start
        if task is None or task.done():
            self._drains[platform] = asyncio.get_running_loop().create_task(
                self._drain(platform), name=f"outbox:{platform}"
            )

    def _head(self, platform: str) -> Held | None:
        heads = [items[0] for (p, _), items in self._chats.items() if p == platform and items]
        return min(heads, key=lambda h: h.seq) if heads else None

    def _pop(self, item: Held) -> None:
        items = self._chats.get(item.chat)
        if items and items[0] is item:
            items.popleft()
            if not items:
                del self._chats[item.chat]

    async def _drain(self, platform: str) -> None:
        ONE_TRY.set(True)  # this task's sends: one request each, spaced here
        while not self._stopping.is_set() and (item := self._head(platform)) is not None:
            expired = self.clock() > item.horizon  # expires at once, blocked or not
            wait = (
                0.0
                if expired
                else max(
                    self._blocked.get(platform, 0.0) - self.clock(),
                    self._paced.get(platform, 0.0) - time.monotonic(),
                )
            )
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), min(wait, 1.0))
                continue
            try:
                await (self._expire(item) if expired else self._try(item))
            except Exception as exc:  # the store failed: the item stays, tried later
                log.warning("outbox: %s item kept after a failure (%s)", platform, exc)
                self._failed(platform, exc)
                with contextlib.suppress(TimeoutError):  # an expiry waits too
                    pause = self.rules.backoff(self._failures.get(platform, 1))
                    await asyncio.wait_for(self._stopping.wait(), pause)

    async def _try(self, item: Held) -> None:
        platform = item.out.platform
        self._paced[platform] = time.monotonic() + self.rules.spacing(platform)
        careful = item.inbox_id is not None and not idempotent_replies(platform)
        if careful:  # a crash during the try leaves it unconfirmed (at most once)
            await self._mark(item.inbox_id, SENDING)
        try:
            if item.inbox_id is not None and item.chat in self._owed:
                await self._send_notice(item)  # the expiry notice goes first, once
            ref = await self._send(item.out)
            if ref is None:
                raise TransientError(f"no {platform} adapter is running")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._after_failure(item, exc, careful)
            return
        self._pop(item)
        self._blocked.pop(platform, None)
        if self._failures.pop(platform, None) is not None:
            self.failing_since.pop(platform, None)
            self._note_failing()
        self.metrics.outbox_delivered.inc(platform=platform)
        self.metrics.messages_out.inc(platform=platform)
        ids = list(ref.message_ids)
        if item.inbox_id is not None:
            await self._mark(item.inbox_id, SENT, json.dumps(ids))
        if item.send_id is not None:
            await self.db.send_finish(item.send_id, SEND_SENT, None, ids, self.clock())
        log.info("outbox: delivered a held %s to %s chat %s", _kind(item), *item.chat)

    async def _send_notice(self, item: Held) -> None:
        out = item.out
        notice = OutboundMessage(
            out.platform,
            out.chat_id,
            EXPIRY_NOTICE,
            thread_id=out.thread_id,
            session_id=out.session_id,
            session_key=out.session_key,
            notice=True,
        )
        await self._send(notice)  # a failure: the reply is held, the notice still owed
        self._owed.discard(item.chat)
        await self._save_owed()

    async def _after_failure(self, item: Held, exc: BaseException, careful: bool) -> None:
        platform = item.out.platform
        kind, _ = send_failure(exc)
        item.error = _one_line(exc)
        if kind == SEND_REFUSED:
            self._pop(item)
            self.metrics.outbox_refused.inc(platform=platform)
            log.warning(
                "outbox: %s refused the %s to chat %s for good: %s",
                platform,
                _kind(item),
                item.out.chat_id,
                item.error,
            )
            await self._end(item, REFUSED, f"refused: {item.error}")
            return
        self._failed(platform, exc)
        if careful:
            await self._mark(item.inbox_id, READY)  # the platform said no: not in the chat
        if item.send_id is not None:
            await self.db.send_finish(item.send_id, SEND_PENDING, item.error, (), self.clock())

    def _failed(self, platform: str, exc: BaseException) -> None:
        kind, seconds = send_failure(exc)
        if platform not in self._failures:  # it starts failing: `doctor` names it
            self.failing_since[platform] = time.time()
            self._note_failing()
        failures = self._failures[platform] = self._failures.get(platform, 0) + 1
        wait = seconds if kind == SEND_RETRY_AFTER else self.rules.backoff(failures)
        self._blocked[platform] = self.clock() + wait
        self.last_failure[platform] = (self.clock(), _one_line(exc))
        log.warning(
            "outbox: sending to %s failed (%s); held, next try in %.1fs",
            platform,
            _one_line(exc),
            wait,
        )

    async def _expire(self, item: Held) -> None:
        platform = item.out.platform
        self._pop(item)
        self.metrics.outbox_expired.inc(platform=platform)
        last = item.error or self.last_failure.get(platform, (0.0, ""))[1] or "none"
        reason = f"expired: not delivered in time (last error: {last})"
        log.warning("outbox: a held %s to %s chat %s %s", _kind(item), *item.chat, reason)
        await self._end(item, EXPIRED, reason)
        if item.inbox_id is not None and not item.out.notice:
            self._owed.add(item.chat)
            await self._save_owed()

    async def _end(self, item: Held, state: str, reason: str) -> None:
        if item.inbox_id is not None:
            await self._mark(item.inbox_id, state, reason)
        if item.send_id is not None:
            await self.db.send_finish(item.send_id, SEND_FAILED, reason, (), self.clock())

    async def _mark(self, inbox_id: int | None, state: str, ref: str | None = None) -> None:
        if inbox_id is not None:
            await self.db.mark_reply(inbox_id, state, ref)

    def _note_failing(self) -> None:
        """Store which platforms are failing (after this moment's changes), in the
        background: `doctor` reads it from the store."""
        self._failing_changed = True
        if self._noting is None or self._noting.done():
            self._noting = asyncio.get_running_loop().create_task(self._save_failing())

    async def _save_failing(self) -> None:
        await asyncio.sleep(0)  # the failure's own bookkeeping first
        while self._failing_changed:
            self._failing_changed = False
            failing = {
                p: {"since": since, "error": self.last_failure.get(p, (0.0, ""))[1]}
                for p, since in self.failing_since.items()
            }
            try:
                await self.db.set_meta(FAILING_META, json.dumps(failing) if failing else None)
            except Exception as exc:
                log.warning("outbox: the failing platforms could not be stored (%s)", exc)

    async def _save_owed(self) -> None:
        value = json.dumps(sorted(self._owed)) if self._owed else None
        try:
            await self.db.set_meta(EXPIRED_CHATS_META, value)
        except Exception as exc:  # kept in memory: told while this process runs
            log.warning("outbox: the chats owed a notice could not be stored (%s)", exc)

    def health(self) -> dict[str, Any]:
        """/health's `outbox`: held and expired per platform, and each failing platform's
        last error."""
        now = self.clock()
        failing = {
            p: {"since_seconds": round(now - when, 1), "error": err}
            for p, (when, err) in self.last_failure.items()
            if p in self._failures
        }
        expired = {str(k[0][1]): int(v) for k, v in self.metrics.outbox_expired.values.items() if k}
        return {"pending": self.pending(), "expired": expired, "failing": failing}


def _kind(item: Held) -> str:
    return "reply" if item.inbox_id is not None else "message"


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:300]
