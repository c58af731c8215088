"""Running the agent: a turn for a chat message, background jobs (/background) and the
automatic title after a session's first exchange.

A turn puts the user's message (already committed to the inbox by the router) into its
session before the agent runs, stores the reply with the inbox row `answered`, answers the chat, then titles or compresses the session if due. Locking
and deciding what a message is are the router's job; this module only runs the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway import access, faults
from gateway.adapters import idempotent_replies, replies_in_request
from gateway.agent.base import AgentReply, ChatMessage, TurnContext, estimate_tokens, window
from gateway.agent.tools.session_search import Caller, session_search
from gateway.index import IndexEntry
from gateway.messages import (
    LATE_SEND_S,
    SEND_BY,
    InboundMessage,
    OutboxRef,
    SentRef,
    SetOutLate,
    TokenUsage,
)
from gateway.services import Services
from gateway.session_keys import SessionKey
from gateway.topology.base import LOCAL_LEASE, TurnLease
from state import ANSWERED, LeaseLost, StateError

T = TypeVar("T")
log = logging.getLogger("gateway.router")  # the name operators already filter turn logs by

APOLOGY = "Sorry, something went wrong while answering. Your message was saved; please try again."
TURN_JOB = "turn"  # the live-job name of a running turn
# Replicas: a reply whose commit and send are further apart than this asks whether the
# key's lease still holds before it goes (see may_send)
RECHECK_AFTER_S = LATE_SEND_S


@dataclass
class TurnProgress:
    """How far one message got: whether it was stored (and where), or why it was dropped."""

    inbox_id: int = 0
    lease: TurnLease = LOCAL_LEASE  # the key's lock or lease the turn runs under
    stored: bool = False
    session_id: str | None = None
    dropped: str | None = None


async def agent_turn(
    services: Services,
    msg: InboundMessage,
    key: SessionKey,
    entry: IndexEntry,
    started: float,
    turn: TurnProgress,
    begun: tuple[int, list[dict[str, Any]]] | None = None,
) -> None:
    """One agent turn; the caller holds the session lock. `begun`: the user's message is
    stored already (the router's fast path): its id and the history."""
    s = services
    settings = s.settings
    src = msg.source
    k = key.format()
    sid = entry.session_id
    if begun is None:
        # The inbox row (committed before the platform was acknowledged) is the restart-
        # proof dedupe; this write puts the message in its session, once, and reads the
        # history.
        begun = await s.db.begin_turn(
            turn.inbox_id,
            sid,
            user_message(msg, key),
            last=settings.history_messages,
            fence=turn.lease.fence,
        )
    _mid, history = begun
    turn.stored, turn.session_id = True, sid
    faults.point("mid_agent")
    s.signals.started(msg)
    s.index.touch(k, s.clock())
    s.coordinator.job_started(sid, TURN_JOB)
    try:
        budget = (
            settings.context_tokens - settings.reply_tokens - len(settings.system_prompt or "") // 4
        )
        ctx = TurnContext(
            session_id=sid,
            session_key=k,
            platform=src.platform,
            system_prompt=settings.system_prompt,
            run_tool=_tool_runner(s, key, sid),
        )
        costs = [estimate_tokens(m) for m in history]  # once: the window and compression
        try:
            reply: AgentReply = await s.deadlines.run(
                s.agent.respond(window(history, max(256, budget), costs), ctx),
                settings.turn_timeout_s,
            )
        except Exception as exc:
            s.metrics.last_error = f"agent: {type(exc).__name__}: {exc}"
            s.metrics.turns.inc(outcome="agent_error")
            log.error(
                "agent failed for session_key=%s platform=%s: %s",
                k,
                src.platform,
                exc,
                exc_info=not isinstance(exc, (StateError, asyncio.TimeoutError)),
            )
            await s.replies.reply(msg, sid, APOLOGY, key, error="agent")
            await s.db.finish_inbound(
                turn.inbox_id, ANSWERED, "agent_error", fence=turn.lease.fence
            )
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
        answer: ChatMessage = {"role": "assistant", "content": reply.text}
        after = [*history, answer]
        compress = s.sessions.needs_compression(after, sum(costs) + estimate_tokens(answer))
        # the reply goes to the outbox with the turn's end: 'ready' is sent again after a
        # crash (at least once; exactly once where the platform dedupes on the reply's
        # key), 'sending' never (at most once: the send may have happened); a reply that
        # is its request's response is 'sent' (a repeat of the request reads it back)
        in_request = replies_in_request(src.platform)
        if in_request:
            reply_state = "sent"
        elif settings.resend_unconfirmed or idempotent_replies(src.platform):
            reply_state = "ready"
        else:
            reply_state = "sending"
        s.index.touch(k, s.clock())
        # replicas: such a reply cannot overtake another of its chat, so its commit also
        # frees the key's lease when nothing after the send needs it: the chat's next
        # message, wherever it lands, finds the key free
        lease = turn.lease
        hand_back = lease.hand_back if in_request and not compress else None
        committing = time.monotonic()
        await s.db.end_turn(
            turn.inbox_id,
            sid,
            stored,
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            reply_state=reply_state,
            fence=lease.fence,
            release=hand_back.plan() if hand_back is not None else None,
        )
        if hand_back is not None:
            hand_back.done()
            lease.freed = True  # freed on purpose: nothing to ask before the send
        faults.point("after_reply_commit")
        await may_send(turn, committing)
        s.metrics.turns.inc(outcome="ok")
        usage = TokenUsage(reply.input_tokens, reply.output_tokens, reply.tokens_estimated)
        ref = await send_checked(
            turn,
            lambda since, again: s.replies.reply(
                msg,
                sid,
                reply.text,
                key,
                dedupe_key=reply_key(turn.inbox_id),
                since=since,
                resend=again,
                usage=usage,
                inbox_id=turn.inbox_id,
            ),
        )
        faults.point("after_send_before_mark")
        if not in_request and not isinstance(ref, OutboxRef):  # held or refused: the outbox's
            mark_reply_soon(s, turn.inbox_id, ref)
        if s.settings.auto_title and _first_exchange(after):
            s.tasks.start(auto_title(s, sid, after), f"title:{sid}")
        if compress:
            await s.sessions.compress_automatically(key, src)
        s.metrics.turn_latency.observe(s.clock() - started)
        log.debug(
            "turn session_key=%s platform=%s latency=%.3fs", k, src.platform, s.clock() - started
        )
    finally:
        s.coordinator.job_finished(sid, TURN_JOB)


async def may_send(turn: TurnProgress, since: float) -> None:
    """Replicas: raise LeaseLost, withholding the reply, when the key's lease was taken
    over after the reply's fenced commit (`since`: time.monotonic() before it). Only a
    process that stood still in between (a stalled VM, SIGSTOP) can meet that, and a
    takeover needs its connection gone first, so the lease is read again only when the
    gap exceeds RECHECK_AFTER_S: a turn pays for it only then. The new holder has the
    reply among a dead runner's unsent ones and sends it, in the chat's order ('ready'),
    or leaves it unconfirmed ('sending': at most once); sent here after the holder moved
    on, it would land after newer replies."""
    lease = turn.lease
    if lease.fence is None or not lease.asks:
        return
    if time.monotonic() - since > RECHECK_AFTER_S and not await lease.holds():
        raise LeaseLost(lease.fence.session_key, lease.fence.epoch)


async def send_checked(turn: TurnProgress, send: Callable[[float | None, bool], Awaitable[T]]) -> T:
    """Send a turn's reply: `send(since, again)`, where `since` is when the lease was last
    known to hold (replicas; else None) and `again` tells a send after a stop. Replicas set
    SEND_BY to that time + LATE_SEND_S, so a request that would leave later (the process
    stood still after may_send, inside the send) stops before it is written (SetOutLate);
    the lease is then read again: moved, the reply is withheld (LeaseLost, as may_send:
    the new holder has it); still held, it is sent again as a resend (an adapter that can
    look for the reply's parts in the chat skips those that went)."""
    again = False
    lease = turn.lease
    fence = lease.fence
    while True:
        checked = time.monotonic()
        if fence is None or not lease.asks:  # one daemon, or the lease freed on purpose
            return await send(checked if fence is not None else None, again)
        limit = SEND_BY.set(checked + LATE_SEND_S)
        try:
            return await send(checked, again)
        except SetOutLate:
            log.warning(
                "session_key=%s: inbox row %d's reply set out late; asking whether "
                "the lease still holds",
                fence.session_key,
                turn.inbox_id,
            )
        finally:
            SEND_BY.reset(limit)
        if not await lease.holds():
            raise LeaseLost(fence.session_key, fence.epoch)
        again = True


def user_message(msg: InboundMessage, key: SessionKey) -> dict[str, Any]:
    """The user's message as its session stores it (in a shared session, with the
    speaker's name in front)."""
    text = msg.text
    if key.shared:
        src = msg.source
        text = f"[{src.user_name or src.user_id or 'someone'}] {text}"
    return {"role": "user", "content": text, "platform_message_id": msg.platform_message_id}


def reply_key(inbox_id: int) -> str:
    """The dedupe key every send of one inbox row's reply carries."""
    return f"sb-{inbox_id}"


def ids_json(ids: Sequence[str]) -> str:
    """The platform's message ids as a JSON list; plain ids (the usual digits) without
    the json module's per-call set-up, once per reply."""
    if all(i.isascii() and i.isalnum() for i in ids):
        return "[" + ",".join(f'"{i}"' for i in ids) + "]"
    return json.dumps(list(ids))


def reply_fate(ref: SentRef | None) -> tuple[str, str | None]:
    """The outbox row's end: 'sent' with the platform's ids, or 'failed' (not sent again)."""
    return ("sent", ids_json(ref.message_ids)) if ref is not None else ("failed", None)


def mark_reply_soon(services: Services, inbox_id: int, ref: SentRef | None) -> None:
    """`mark_reply` without waiting for it: the next message of the chat does not wait,
    and no task is made per turn for it."""
    try:
        services.db.mark_reply_soon(inbox_id, *reply_fate(ref))
    except Exception as exc:  # closed under us: the row stays unconfirmed
        log.warning("inbox row %d: the reply's fate could not be stored (%s)", inbox_id, exc)


async def mark_reply(services: Services, inbox_id: int, ref: SentRef | None) -> None:
    """`mark_reply_soon`, waited for (recovery's resends, one at a time)."""
    try:
        await services.db.mark_reply(inbox_id, *reply_fate(ref))
    except Exception as exc:  # the row stays unconfirmed: counted at the next start
        log.warning("inbox row %d: the reply's fate could not be stored (%s)", inbox_id, exc)


def _first_exchange(history: list[ChatMessage]) -> bool:
    """Exactly one user message and one reply (tool messages aside): the session's first
    turn. Counted from the oldest, stopping at the third (a long history costs nothing)."""
    seen = 0
    for m in history:
        if m.get("role") in ("user", "assistant"):
            seen += 1
            if seen > 2:
                return False
    return seen == 2


async def auto_title(services: Services, sid: str, history: list[dict[str, Any]]) -> None:
    """After the first exchange, in the background: never blocks the reply, never
    overwrites a title the user set."""
    try:
        title = await services.agent.suggest_title(history)
        if await services.db.set_title_if_unset(sid, title):
            log.debug("session %s titled automatically", sid)
    except Exception as exc:
        log.warning("automatic title for session %s failed: %s", sid, exc)


def start_background(
    services: Services, key: SessionKey, msg: InboundMessage, sid: str, prompt: str
) -> str:
    """Run `prompt` against the session's history as a live job; the result is stored and
    posted to the chat when done. Returns the job's name."""
    job = services.coordinator.new_job_id()
    services.coordinator.job_started(sid, job)
    # the turn that announces the job: its answer goes out before the job's result
    turn = asyncio.current_task()
    announcing = turn if turn in services.tasks else None
    services.tasks.start(
        _background(services, key, msg, sid, prompt, job, announcing), f"background:{job}"
    )
    return job


async def _background(
    services: Services,
    key: SessionKey,
    msg: InboundMessage,
    sid: str,
    prompt: str,
    job: str,
    announcing: asyncio.Task[None] | None = None,
) -> None:
    s = services
    try:
        history = await s.db.get_messages_as_conversation(sid, last=s.settings.history_messages)
        history.append({"role": "user", "content": prompt})
        ctx = TurnContext(
            sid,
            key.format(),
            msg.source.platform,
            s.settings.system_prompt,
            _tool_runner(s, key, sid),
        )
        reply = await s.deadlines.run(
            s.agent.respond(window(history, s.settings.context_tokens // 2), ctx),
            s.settings.turn_timeout_s,
        )
        await s.db.append_messages(
            sid,
            [
                {"role": "user", "content": f"[background {job}] {prompt}"},
                {"role": "assistant", "content": reply.text},
            ],
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
        )
        text = f"Background job {job} finished:\n{reply.text}"
    except Exception as exc:
        log.error("background job %s failed for session %s: %s", job, sid, exc)
        text = f"Background job {job} failed; nothing was changed."
    finally:
        s.coordinator.job_finished(sid, job)
    if announcing is not None:
        # the result never overtakes the answer that announced the job (an HTTP request's
        # answer is its response: the result then comes after it, as a follow-up)
        await asyncio.wait({announcing})
    await s.replies.reply(msg, sid, text, key)


def _tool_runner(
    services: Services, key: SessionKey, sid: str
) -> Callable[[str, dict[str, Any]], Awaitable[str]]:
    async def run(name: str, args: dict[str, Any]) -> str:
        if name != "session_search":
            return json.dumps({"success": False, "error": f"unknown tool {name!r}"})
        # the sessions this chat may see (gateway.access)
        return await session_search(services.db, Caller(access.scope(key), sid), args)

    return run
