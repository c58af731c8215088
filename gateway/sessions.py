"""Moving a chat between sessions: reset (/new, automatic resets), switch (/resume),
branch, compress, and bind (handoff). Each keeps state.db and the index in step:
the old session gets its end reason, the chat's key points at the new one."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.agent.base import Agent, ChatMessage, estimate_tokens
from gateway.errors import NothingToCompress
from gateway.index import IndexEntry, RouteIndex
from gateway.session_keys import SessionKey, SessionSource
from state import ChildKind, EndReason, SessionNotFound, Store, TitleError

log = logging.getLogger("gateway.sessions")
AUTO_FAILURES_KEPT = 10_000  # sessions remembered as failed, so each is logged once


@dataclass(frozen=True)
class CompressionSettings:
    keep_last: int = 6  # messages kept verbatim after the summary
    auto_share: float = 0.8  # compress automatically past this share of the context


class SessionManager:
    def __init__(
        self,
        db: Store,
        index: RouteIndex,
        agent: Agent,
        *,
        model: str | None = None,
        system_prompt: str | None = None,
        compression: CompressionSettings | None = None,
        context_tokens: int = 128_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db = db
        self.index = index
        self.agent = agent
        self.model = model
        self.system_prompt = system_prompt
        self.compression = compression or CompressionSettings()
        self.context_tokens = context_tokens
        self.clock = clock
        self._auto_failed: dict[str, None] = {}  # sessions whose automatic compression failed

    def _entry(self, session_id: str, source: SessionSource) -> IndexEntry:
        now = self.clock()
        return IndexEntry(
            session_id=session_id,
            created_at=now,
            updated_at=now,
            origin=source.as_dict(),
            display_name=source.chat_name or source.user_name,
            platform=source.platform,
            chat_type=source.chat_type,
        )

    async def adopt(self, key: SessionKey) -> IndexEntry | None:
        """The live session state.db holds for a key the index lacks (another process wrote
        it: `import --from-hermes`, `sessions import`), indexed as start-up would adopt it;
        None when there is none."""
        row = await self.db.live_session_for_key(key.format())
        if row is None:
            return None
        origin = json.loads(row["origin_json"]) if row["origin_json"] else {}
        entry = IndexEntry(
            session_id=row["id"],
            created_at=row["started_at"],
            updated_at=row["last_active"] or row["started_at"],
            origin=origin,
            display_name=origin.get("chat_name") or origin.get("user_name"),
            platform=row["source"],
            chat_type=row["chat_type"] or "dm",
        )
        self.index.put(key.format(), entry)
        log.info("session_key=%s adopted its live session %s from state.db", key, row["id"])
        return entry

    async def create(
        self,
        key: SessionKey,
        source: SessionSource,
        *,
        parent: str | None = None,
        child_kind: str | None = None,
    ) -> IndexEntry:
        sid = await self.db.create_session(
            source=source.platform,
            user_id=source.user_id,
            model=self.model,
            system_prompt=self.system_prompt,
            parent_session_id=parent,
            child_kind=child_kind,
            started_at=self.clock(),
            session_key=key.format(),
            chat_id=source.chat_id,
            chat_type=source.chat_type,
            thread_id=source.thread_id,
            origin_json=json.dumps(source.as_dict(), ensure_ascii=False),
        )
        entry = self._entry(sid, source)
        self.index.put(key.format(), entry)
        return entry

    async def reset(
        self, key: SessionKey, source: SessionSource, reason: EndReason, title: str | None = None
    ) -> tuple[IndexEntry, TitleError | None]:
        """A fresh child session (kind `reset`); the old one ends with `reason`.
        Returns the new entry and, if the title was refused, why (the reset still happened)."""
        current = self.index.get(key.format())
        entry = None
        if current is not None:
            try:
                sid = await self.db.fork_session(
                    current.session_id, ChildKind.RESET, end_reason=reason
                )
                entry = self._entry(sid, source)
                self.index.put(key.format(), entry)
            except SessionNotFound as exc:
                if exc.ref != current.session_id:
                    raise
                log.warning("session %s was deleted; the reset starts a fresh one", exc.ref)
        if entry is None:  # no session yet, or it was deleted under the daemon
            entry = await self.create(key, source)
        problem = None
        if title:
            try:
                await self.db.set_session_title(entry.session_id, title)
            except TitleError as exc:
                problem = exc
        return entry, problem

    async def switch(self, key: SessionKey, source: SessionSource, target: str) -> IndexEntry:
        """Point the chat at an existing session: the old one ends `session_switch`, the
        target is reopened. No new session is created."""
        current = self.index.get(key.format())
        if current is not None and current.session_id != target:
            await self.db.end_session(current.session_id, EndReason.SESSION_SWITCH)
        await self.db.reopen_session(target)
        entry = self._entry(target, source)
        self.index.put(key.format(), entry)
        return entry

    async def bind(self, key: SessionKey, source: SessionSource, session_id: str) -> IndexEntry:
        """Handoff: this key now continues `session_id` (the session keeps its id)."""
        return await self.switch(key, source, session_id)

    async def branch(self, key: SessionKey, source: SessionSource, title: str | None) -> IndexEntry:
        current = self.index.get(key.format())
        if current is None:
            raise SessionNotFound(key.format())
        sid = await self.db.fork_session(
            current.session_id,
            ChildKind.BRANCH,
            copy_messages=True,
            end_reason=EndReason.BRANCHED,
            title=title or None,
        )
        entry = self._entry(sid, source)
        self.index.put(key.format(), entry)
        return entry

    async def compress(
        self, key: SessionKey, source: SessionSource, focus: str | None = None
    ) -> tuple[IndexEntry, int]:
        """Summarise the older part into a continuation child that starts with the summary
        and keeps the last messages verbatim. If anything fails before the fork commits,
        the session is left exactly as it was. Returns the new entry and how many messages
        were summarised."""
        current = self.index.get(key.format())
        if current is None:
            raise SessionNotFound(key.format())
        rows = await self.db.get_messages(current.session_id)
        keep = self.compression.keep_last
        if len(rows) <= keep + 1:
            raise NothingToCompress(
                f"the session has {len(rows)} message(s) and the last {keep} stay verbatim, "
                "so nothing older is left to summarise"
            )
        cut = len(rows) - keep
        while cut < len(rows) and rows[cut]["role"] == "tool":  # never orphan a tool result
            cut += 1
        older, recent = rows[:cut], rows[cut:]
        summary = await self.agent.summarize(_as_chat(older), focus)
        seed: list[dict[str, object]] = [
            {"role": "system", "content": f"[Summary of {len(older)} earlier messages]\n{summary}"}
        ]
        for m in recent:
            seed.append(
                {
                    k: m[k]
                    for k in (
                        "role",
                        "content",
                        "tool_calls",
                        "tool_call_id",
                        "tool_name",
                        "timestamp",
                        "reasoning",
                        "platform_message_id",
                    )
                    if m.get(k) is not None
                }
            )
        sid = await self.db.fork_session(
            current.session_id,
            ChildKind.COMPRESSION,
            seed_messages=seed,
            end_reason=EndReason.COMPRESSION,
        )
        entry = self._entry(sid, source)
        self.index.put(key.format(), entry)
        return entry, len(older)

    async def compress_automatically(self, key: SessionKey, source: SessionSource) -> bool:
        """The compression a turn asks for when its history passes `auto_share` of the
        context. It never raises: a failure leaves the session as it was and the next
        turn tries again. The reason is logged once per session, not on every turn (a
        session of a few huge messages stays too short to summarise turn after turn)."""
        k = key.format()
        current = self.index.get(k)
        sid = current.session_id if current is not None else k
        try:
            await self.compress(key, source)
        except Exception as exc:  # the session is untouched; the next turn retries
            reason = str(exc) or type(exc).__name__
            if sid in self._auto_failed:
                log.debug("automatic compression failed again for session_key=%s: %s", k, reason)
                return False
            if len(self._auto_failed) >= AUTO_FAILURES_KEPT:
                del self._auto_failed[next(iter(self._auto_failed))]
            self._auto_failed[sid] = None
            level = logging.INFO if isinstance(exc, NothingToCompress) else logging.WARNING
            log.log(
                level,
                "automatic compression of session %s (session_key=%s) not done: %s; "
                "later turns of this session retry without logging it again",
                sid,
                k,
                reason,
                exc_info=not isinstance(exc, NothingToCompress),
            )
            return False
        self._auto_failed.pop(sid, None)
        log.info("session_key=%s compressed automatically", k)
        return True

    def needs_compression(self, history: list[ChatMessage], tokens: int | None = None) -> bool:
        """`tokens`: the history's estimate, when the caller has it already."""
        used = sum(estimate_tokens(m) for m in history) if tokens is None else tokens
        return used > self.compression.auto_share * self.context_tokens


def _as_chat(rows: Sequence[Mapping[str, object]]) -> list[ChatMessage]:
    return [{"role": r["role"], "content": r.get("content")} for r in rows]
