"""The router: every inbound message goes authorize -> dedupe -> key -> index entry ->
command or agent turn -> reply.

Turns are serialised per session key (a second message arriving mid-turn waits its turn,
in arrival order) and run concurrently across keys. The user's message is stored before
the agent runs, so an agent failure loses nothing: the chat gets a short apology.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway import access, session_commands
from gateway.agent.base import Agent, AgentReply, TurnContext, window
from gateway.agent.tools.session_search import Caller, session_search
from gateway.commands import CommandContext, CommandRegistry, builtin_commands, parse_command
from gateway.coordinator import Coordinator, LocalCoordinator
from gateway.deadlines import Deadlines
from gateway.index import IndexEntry, SessionIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.metrics import Metrics
from gateway.session_keys import KeySettings, SessionKey, SessionSource, build_key
from gateway.sessions import SessionManager

if TYPE_CHECKING:
    from gateway.reset import Resetter
from state import SessionDB, SessionFilter, StateError

log = logging.getLogger("gateway.router")

APOLOGY = "Sorry, something went wrong while answering. Your message was saved; please try again."
STORAGE_APOLOGY = (
    "Sorry, I could not store your message just now; please send it again in a moment."
)
REFUSAL = "Sorry, you are not authorised to use this bot."
BUSY = "Sorry, the gateway is shutting down; please send that again in a minute."

Sender = Callable[[OutboundMessage], Awaitable[SentRef | None]]


@dataclass(frozen=True)
class AccessRules:
    """Who may talk to the agent on one platform."""

    allow_all: bool = False
    allowed: frozenset[str] = frozenset()
    admins: frozenset[str] = frozenset()

    def allows(self, user_id: str | None) -> bool:
        if self.allow_all:
            return True
        return user_id is not None and (user_id in self.allowed or user_id in self.admins)


@dataclass
class RouterSettings:
    keys: KeySettings = field(default_factory=KeySettings)
    access: Mapping[str, AccessRules] = field(default_factory=dict)
    unknown_dm: str = "refuse"
    system_prompt: str | None = None
    history_messages: int = 200
    context_tokens: int = 128_000
    reply_tokens: int = 4_096
    turn_timeout_s: float = 300.0


class Router:
    def __init__(
        self,
        db: SessionDB,
        index: SessionIndex,
        agent: Agent,
        send: Sender,
        settings: RouterSettings | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        *,
        coordinator: Coordinator | None = None,
    ) -> None:
        self.db = db
        self.index = index
        self.agent = agent
        self.send = send
        self.settings = settings or RouterSettings()
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.commands: CommandRegistry = builtin_commands()
        session_commands.register(self.commands)
        self.sessions = SessionManager(
            db, index, agent, model=agent.model, system_prompt=self.settings.system_prompt,
            context_tokens=self.settings.context_tokens, clock=clock,
        )  # fmt: skip
        self.coordinator = coordinator or LocalCoordinator()
        self.resetter: Resetter | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._deadlines = Deadlines()  # the agent's time limit, on every turn
        self._refused: set[tuple[str, str]] = set()
        self._accepting = True
        self.last_error: str | None = None

    # --- intake --------------------------------------------------------------------------

    async def handle(self, msg: InboundMessage) -> None:
        """Called by adapters. Decides quickly, then runs the turn as a tracked task."""
        src = msg.source
        self.metrics.messages_in.inc(platform=src.platform)
        if not self._accepting:
            self.metrics.dropped.inc(reason="shutting_down")
            await self._reply(msg, None, BUSY)
            return
        if not self._authorised(msg):
            return
        if not msg.mentioned:
            self.metrics.dropped.inc(reason="not_addressed")
            return
        if msg.platform_message_id is not None:
            seen_key = (src.platform, src.chat_id, msg.platform_message_id)
            if self.coordinator.seen(seen_key):
                self.metrics.dropped.inc(reason="duplicate")
                return
            self.coordinator.remember(seen_key)
        task = asyncio.create_task(self._process(msg), name=f"turn:{src.platform}:{src.chat_id}")
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    def _authorised(self, msg: InboundMessage) -> bool:
        src = msg.source
        rules = self.settings.access.get(src.platform)
        if rules is None or rules.allows(src.user_id):
            return True
        self.metrics.dropped.inc(reason="unauthorised")
        log.info("unauthorised user %s on %s (%s)", src.user_id, src.platform, src.chat_type)
        if src.chat_type == "dm" and self.settings.unknown_dm == "refuse":
            marker = (src.platform, src.user_id or src.chat_id)
            if marker not in self._refused:  # one refusal per user, not one per message
                self._refused.add(marker)
                task = asyncio.create_task(self._reply(msg, None, REFUSAL), name="refusal")
                self._inflight.add(task)
                task.add_done_callback(self._inflight.discard)
        return False

    # --- per-session work ----------------------------------------------------------------

    def key_for(self, msg: InboundMessage) -> SessionKey:
        return build_key(msg.source, self.settings.keys)

    def session_lock(self, k: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self.coordinator.session_lock(k)

    async def _process(self, msg: InboundMessage) -> None:
        started = self.clock()
        key = self.key_for(msg)
        k = key.format()
        try:
            async with self.coordinator.session_lock(k):
                await self._process_locked(msg, key, started)
        except Exception as exc:  # nothing may escape into the event loop
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.metrics.errors.inc(kind="turn")
            log.exception("turn failed for session_key=%s platform=%s", k, msg.source.platform)
            storage = isinstance(exc, StateError)
            await self._reply(
                msg,
                None,
                STORAGE_APOLOGY if storage else APOLOGY,
                error="storage" if storage else "agent",
            )

    async def _process_locked(self, msg: InboundMessage, key: SessionKey, started: float) -> None:
        entry = await self.entry_for(key, msg)
        if self.resetter is not None:
            entry = await self.resetter.check(key.format(), entry)
            notice = self.resetter.take_notice(key.format())
            if notice:
                await self._reply(msg, entry.session_id, notice, key)
        parsed = parse_command(msg.text)
        if parsed is not None:
            name, args = parsed
            command = self.commands.get(name)
            if command is None:
                text = f"Unknown command /{name}. Send /help for the list."
            else:
                text = await command.handler(CommandContext(self, msg, key, entry.session_id, args))
            await self._reply(msg, entry.session_id, text, key)
            return
        await self._agent_turn(msg, key, entry, started)

    async def entry_for(self, key: SessionKey, msg: InboundMessage) -> IndexEntry:
        """The index entry for this key, creating the session on first contact."""
        k = key.format()
        entry = self.index.get(k)
        if entry is not None:
            return entry
        return await self.sessions.create(key, msg.source)

    async def _agent_turn(
        self, msg: InboundMessage, key: SessionKey, entry: IndexEntry, started: float
    ) -> None:
        src = msg.source
        k = key.format()
        sid = entry.session_id
        text = msg.text
        if key.shared:
            text = f"[{src.user_name or src.user_id or 'someone'}] {text}"
        # Storing the message is also the restart-proof dedupe: a platform id already
        # stored for this chat stores nothing and the turn ends here.
        stored_ids, history = await self.db.append_and_read(
            sid, [{"role": "user", "content": text, "platform_message_id": msg.platform_message_id}],
            dedupe=(src.platform, src.chat_id) if msg.platform_message_id is not None else None,
            last=self.settings.history_messages,
        )  # fmt: skip
        if not stored_ids:
            self.metrics.dropped.inc(reason="duplicate")
            log.debug(
                "duplicate %s/%s ignored (already stored)", src.platform, msg.platform_message_id
            )
            return
        self.index.touch(k, self.clock())
        self.coordinator.job_started(sid, "turn")
        try:
            budget = (
                self.settings.context_tokens
                - self.settings.reply_tokens
                - len(self.settings.system_prompt or "") // 4
            )
            ctx = TurnContext(
                session_id=sid, session_key=k, platform=src.platform,
                system_prompt=self.settings.system_prompt, run_tool=self._tool_runner(key, msg, sid),
            )  # fmt: skip
            try:
                reply: AgentReply = await self._deadlines.run(
                    self.agent.respond(window(history, max(256, budget)), ctx),
                    self.settings.turn_timeout_s,
                )
            except Exception as exc:
                self.last_error = f"agent: {type(exc).__name__}: {exc}"
                self.metrics.turns.inc(outcome="agent_error")
                log.error(
                    "agent failed for session_key=%s platform=%s: %s",
                    k,
                    src.platform,
                    exc,
                    exc_info=not isinstance(exc, (StateError, asyncio.TimeoutError)),
                )
                await self._reply(msg, sid, APOLOGY, key, error="agent")
                return
            stored = [
                {
                    k2: v
                    for k2, v in m.items()
                    if k2 in ("role", "content", "tool_calls", "tool_call_id")
                }
                | ({"tool_name": m["name"]} if m.get("role") == "tool" and m.get("name") else {})
                for m in reply.tool_messages
            ]
            stored.append({"role": "assistant", "content": reply.text})
            await self.db.append_messages(
                sid, stored, input_tokens=reply.input_tokens, output_tokens=reply.output_tokens
            )
            self.index.touch(k, self.clock())
            self.metrics.turns.inc(outcome="ok")
            await self._reply(msg, sid, reply.text, key)
            after = [*history, {"role": "assistant", "content": reply.text}]
            if sum(1 for m in after if m.get("role") in ("user", "assistant")) == 2:
                self._track(self._auto_title(sid, after), f"title:{sid}")
            if self.sessions.needs_compression(after):
                try:
                    await self.sessions.compress(key, src)
                    log.info("session_key=%s compressed automatically", k)
                except Exception as exc:  # the session is untouched; the next turn retries
                    log.warning("automatic compression failed for session_key=%s: %s", k, exc)
            self.metrics.turn_latency.observe(self.clock() - started)
            log.debug(
                "turn session_key=%s platform=%s latency=%.3fs",
                k,
                src.platform,
                self.clock() - started,
            )
        finally:
            self.coordinator.job_finished(sid, "turn")

    def _track(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return task

    async def _auto_title(self, sid: str, history: list[dict[str, Any]]) -> None:
        """After the first exchange, in the background: never blocks the reply, never
        overwrites a title the user set."""
        try:
            title = await self.agent.suggest_title(history)
            if await self.db.set_title_if_unset(sid, title):
                log.debug("session %s titled automatically", sid)
        except Exception as exc:
            log.warning("automatic title for session %s failed: %s", sid, exc)

    def start_background(self, key: SessionKey, msg: InboundMessage, sid: str, prompt: str) -> str:
        job = self.coordinator.new_job_id()
        self.coordinator.job_started(sid, job)
        self._track(self._background(key, msg, sid, prompt, job), f"background:{job}")
        return job

    async def _background(
        self, key: SessionKey, msg: InboundMessage, sid: str, prompt: str, job: str
    ) -> None:
        try:
            history = await self.db.get_messages_as_conversation(
                sid, last=self.settings.history_messages
            )
            history.append({"role": "user", "content": prompt})
            ctx = TurnContext(sid, key.format(), msg.source.platform, self.settings.system_prompt,
                              self._tool_runner(key, msg, sid))  # fmt: skip
            reply = await self._deadlines.run(
                self.agent.respond(window(history, self.settings.context_tokens // 2), ctx),
                self.settings.turn_timeout_s,
            )
            await self.db.append_messages(
                sid, [{"role": "user", "content": f"[background {job}] {prompt}"},
                      {"role": "assistant", "content": reply.text}],
                input_tokens=reply.input_tokens, output_tokens=reply.output_tokens,
            )  # fmt: skip
            text = f"Background job {job} finished:\n{reply.text}"
        except Exception as exc:
            log.error("background job %s failed for session %s: %s", job, sid, exc)
            text = f"Background job {job} failed; nothing was changed."
        finally:
            self.coordinator.job_finished(sid, job)
        await self._reply(msg, sid, text, key)

    # --- per-chat listings (/resume N after /resume, /sessions or /search) ---------------

    def remember_listing(self, key: SessionKey, ids: list[str]) -> None:
        self.coordinator.remember_listing(key.format(), ids)

    def listing(self, key: SessionKey) -> list[str] | None:
        return self.coordinator.listing(key.format())

    def forget_listing(self, key: SessionKey) -> None:
        self.coordinator.forget_listing(key.format())

    def is_admin(self, source: SessionSource) -> bool:
        rules = self.settings.access.get(source.platform)
        return bool(rules and source.user_id is not None and source.user_id in rules.admins)

    def _tool_runner(
        self, key: SessionKey, msg: InboundMessage, sid: str
    ) -> Callable[[str, dict[str, Any]], Awaitable[str]]:
        async def run(name: str, args: dict[str, Any]) -> str:
            if name != "session_search":
                return json.dumps({"success": False, "error": f"unknown tool {name!r}"})
            return await session_search(self.db, Caller(self.scope_for(key, msg), sid), args)

        return run

    def scope_for(self, key: SessionKey, msg: InboundMessage) -> SessionFilter:
        """The sessions this chat may see (gateway.access)."""
        return access.scope(key)

    async def _reply(
        self,
        msg: InboundMessage,
        session_id: str | None,
        text: str,
        key: SessionKey | None = None,
        error: str | None = None,
    ) -> None:
        src = msg.source
        out = OutboundMessage(
            platform=src.platform, chat_id=src.chat_id, text=text, thread_id=src.thread_id,
            reply_to=msg.platform_message_id, session_id=session_id,
            session_key=key.format() if key else None, error=error,
        )  # fmt: skip
        try:
            await self.send(out)
            self.metrics.messages_out.inc(platform=src.platform)
        except Exception as exc:
            self.last_error = f"send: {type(exc).__name__}: {exc}"
            self.metrics.errors.inc(kind="send")
            log.error("sending to %s chat %s failed: %s", src.platform, src.chat_id, exc)

    # --- state for other parts -----------------------------------------------------------

    def live_jobs(self, session_id: str) -> list[str]:
        return self.coordinator.live_jobs(session_id)

    def busy_session_ids(self) -> set[str]:
        return self.coordinator.busy_session_ids()

    def describe_reset(self, key: SessionKey) -> str:
        if self.resetter is None:
            return "none (sessions are never reset automatically)"
        return self.resetter.describe(key.format())

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    # --- shutdown ------------------------------------------------------------------------

    def stop_intake(self) -> None:
        self._accepting = False

    async def drain(self, budget_s: float) -> int:
        """Let in-flight turns finish within the budget, then cancel the rest.
        Returns how many were cancelled."""
        pending = set(self._inflight)
        if not pending:
            return 0
        done, still = await asyncio.wait(pending, timeout=budget_s)
        for task in still:
            task.cancel()
        if still:
            await asyncio.gather(*still, return_exceptions=True)
            log.warning("cancelled %d turn(s) still running after %.1fs", len(still), budget_s)
        return len(still)
