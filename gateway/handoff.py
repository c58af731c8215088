"""Handoff: a terminal session continues in a chat thread.

The terminal marks its session `pending` for a platform (state.db is the only channel
between the two processes). The daemon's watcher claims it atomically, opens a thread on
that platform's home channel (`/sethome` in a chat, else `platforms.<p>.home_channel`
from the config), sends a confirmation with a summary,
then binds the thread's session key (built by the same builder as organic messages) to the
terminal's session id and marks it `completed`. Any failure before the bind leaves the
terminal session untouched and marks the handoff `failed` with the reason. A `running`
handoff left by a crashed daemon is failed after a timeout, never stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.adapters import adapter_class
from gateway.adapters.base import Adapter, HomeIds
from gateway.errors import NoHomeChannel
from gateway.messages import OutboundMessage, ThreadRef
from gateway.services import Services
from gateway.session_keys import SessionSource, as_chat_type, build_key
from gateway.vocab import ChatType
from state import Store, StoreUnavailable

log = logging.getLogger("gateway.handoff")
HOME_KEY = "home_channel.{}"


def configured_home(platform: str, value: str | int | None) -> dict[str, Any] | None:
    """`platforms.<p>.home_channel` ("chat_id" or "chat_id:thread_id", or as the adapter's
    optional `split_home` reads it) in /sethome's shape; the platform's adapter says
    whether the id is a DM or a group."""
    if value is None or str(value).strip() == "":
        return None
    cls = adapter_class(platform)
    if issubclass(cls, HomeIds):  # an adapter whose ids hold ":" says how to split
        chat_id, thread_id = cls.split_home(str(value).strip())
    else:
        chat_id, _, thread_id = str(value).strip().partition(":")
    return {
        "chat_id": chat_id,
        "thread_id": thread_id or None,
        "chat_type": cls.home_chat_type(chat_id),
    }


async def home_channel(
    db: Store, platform: str, configured: str | int | None = None
) -> dict[str, Any] | None:
    """Where handoffs to `platform` go: the chat that sent /sethome, else the config's
    home_channel, else None."""
    raw = await db.get_meta(HOME_KEY.format(platform))
    try:
        home = json.loads(raw) if raw else None
    except ValueError:
        home = None
    if isinstance(home, dict) and home.get("chat_id"):
        return home
    return configured_home(platform, configured)


def thread_source(
    platform: str, home: Mapping[str, Any], thread: ThreadRef | None
) -> SessionSource:
    """Where the handed-off session now lives, as an inbound message there will look (in a
    new thread, the platform's adapter says how its threads are addressed)."""
    if thread is None:  # threads not possible there: the home channel itself
        return SessionSource(
            platform,
            str(home["chat_id"]),
            as_chat_type(home.get("chat_type") or ChatType.GROUP),
            thread_id=home.get("thread_id"),
        )
    return adapter_class(platform).thread_source(thread)


class HandoffWatcher:
    def __init__(
        self,
        services: Services,
        adapters: Mapping[str, Adapter],
        *,
        poll_s: float = 1.0,
        stale_after_s: float = 180.0,
        configured_homes: Mapping[str, str | int | None] | None = None,
    ) -> None:
        self.services = services
        self.db = services.db
        self.configured_homes = dict(configured_homes or {})
        self.adapters = {p: a for p, a in adapters.items() if p != "api"}
        self.poll_s = poll_s
        self.stale_after_s = stale_after_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.adapters:
            self._task = asyncio.create_task(self._loop(), name="gateway.handoff")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        away = False  # the store is unavailable: said once, then once when it is back
        while True:
            try:
                await self.run_once()
            except StoreUnavailable as exc:
                if not away:
                    log.warning(
                        "handoff watcher: the store is unavailable (%s); trying again every %g s",
                        exc,
                        self.poll_s,
                    )
                away = True
            except Exception:
                log.exception("handoff watcher pass failed")
            else:
                if away:
                    log.info("handoff watcher: the store is back")
                away = False
            await asyncio.sleep(self.poll_s)

    async def run_once(self) -> bool:
        """One pass: fail stale handoffs, claim and run at most one. True if one ran."""
        for sid in await self.db.fail_stale_handoffs(self.stale_after_s):
            log.warning(
                "handoff of session %s was left running by a stopped gateway; marked failed", sid
            )
        claim = await self.db.claim_handoff(self.adapters)
        if claim is None:
            return False
        await self._run(claim["id"], claim["platform"])
        return True

    async def _run(self, sid: str, platform: str) -> None:
        try:
            home = await home_channel(self.db, platform, self.configured_homes.get(platform))
            if home is None:
                raise NoHomeChannel(platform)
            row = await self.db.require_session(sid)
            title = row.get("title")
            adapter = self.adapters[platform]
            thread = await adapter.create_thread(
                str(home["chat_id"]), title or "Continued from the terminal"
            )
            source = thread_source(platform, home, thread)
            settings = self.services.settings
            key = build_key(source, settings.keys)
            history = await self.db.get_messages_as_conversation(
                sid, last=settings.history_messages
            )
            summary = await self.services.agent.summarize(history, None)
            text = f"Continuing here from the terminal{f' ({title})' if title else ''}.\n{summary}"
            await adapter.send(
                OutboundMessage(
                    platform,
                    source.chat_id,
                    text,
                    thread_id=source.thread_id,
                    session_id=sid,
                    session_key=key.format(),
                )
            )
            async with self.services.coordinator.session_lock(key.format()):
                await self.services.sessions.bind(key, source, sid)
                await self.db.update_session(
                    sid,
                    source=platform,
                    session_key=key.format(),
                    chat_id=source.chat_id,
                    chat_type=source.chat_type,
                    thread_id=source.thread_id,
                    origin_json=source.as_dict(),
                )
                await self.db.append_messages(sid, [{"role": "assistant", "content": text}])
            await self.db.finish_handoff(sid, "completed", expect="running")
            self.services.metrics.handoffs.inc(outcome="completed")
            log.info("session %s handed off to %s (session_key=%s)", sid, platform, key.format())
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            log.error("handoff of session %s to %s failed: %s", sid, platform, reason)
            self.services.metrics.handoffs.inc(outcome="failed")
            await self.db.finish_handoff(sid, "failed", reason[:300], expect="running")


async def handoff_from_terminal(
    db: Store,
    session_id: str,
    platform: str,
    *,
    enabled: bool,
    configured_home: str | int | None = None,
    claim_timeout_s: float = 60.0,
    finish_timeout_s: float = 180.0,
    heartbeat: Callable[[str], None] = lambda _line: None,
    poll_s: float = 0.25,
) -> tuple[bool, str]:
    """The terminal's side: request, wait for a claim, wait for the result."""
    if not enabled:
        return False, f"{platform} is not enabled in the config (platforms.{platform}.enabled)"
    if await home_channel(db, platform, configured_home) is None:
        return (
            False,
            f"{platform} has no home channel yet: send /sethome in the {platform} chat (or thread) that should receive handoffs,"
            f" or set platforms.{platform}.home_channel in the config",
        )
    if not await db.request_handoff(session_id, platform):
        return False, "a handoff of this session is already in flight"
    deadline = time.monotonic() + claim_timeout_s
    while (state := (await db.require_session(session_id)).get("handoff_state")) == "pending":
        if time.monotonic() > deadline:
            if await db.finish_handoff(session_id, None, None, expect="pending"):
                return (
                    False,
                    f"the gateway is not running (nobody took the handoff in {claim_timeout_s:g} s); the session stays here",
                )
            break  # claimed at the last moment
        await asyncio.sleep(poll_s)
    deadline = time.monotonic() + finish_timeout_s
    last_beat = time.monotonic()
    while True:
        row = await db.require_session(session_id)
        state = row.get("handoff_state")
        if state == "completed":
            return True, f"continued on {platform}"
        if state == "failed":
            return False, f"the handoff failed: {row.get('handoff_error')}"
        if time.monotonic() > deadline:
            return False, "the gateway took the handoff but did not finish it in time"
        if time.monotonic() - last_beat >= 2:
            heartbeat("… waiting for the gateway")
            last_beat = time.monotonic()
        await asyncio.sleep(poll_s)
