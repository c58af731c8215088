"""The Hermes facade's messages: append, read, conversations with their lineage, replace, counts.

One part of `state.hermes.compat.SessionDB` (Hermes Agent's method names and semantics over
switchboard's store); every part runs its operations through `Facade` (direct.py).
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..rows import Row
from . import hermes_messages, hermes_sessions
from .direct import Facade


class MessagePart(Facade):
    """The Hermes facade's messages."""

    def append_message(
        self,
        session_id: str,
        role: str,
        content: Any = None,
        tool_name: str | None = None,
        tool_calls: Any = None,
        tool_call_id: str | None = None,
        token_count: int | None = None,
        finish_reason: str | None = None,
        reasoning: str | None = None,
        reasoning_content: str | None = None,
        reasoning_details: Any = None,
        codex_reasoning_items: Any = None,
        codex_message_items: Any = None,
        platform_message_id: str | None = None,
        observed: bool = False,
        effect_disposition: str | None = None,
        timestamp: Any = None,
        api_content: str | None = None,
    ) -> int:
        msg = {
            "role": role,
            "content": content,
            "tool_name": tool_name,
            "tool_calls": tool_calls,
            "tool_call_id": tool_call_id,
            "token_count": token_count,
            "finish_reason": finish_reason,
            "reasoning": reasoning,
            "reasoning_content": reasoning_content,
            "reasoning_details": reasoning_details,
            "codex_reasoning_items": codex_reasoning_items,
            "codex_message_items": codex_message_items,
            "platform_message_id": platform_message_id,
            "observed": observed,
            "effect_disposition": effect_disposition,
            "timestamp": timestamp,
            "api_content": api_content,
        }
        return self._w(hermes_messages.append, session_id, msg)

    def get_messages(
        self,
        session_id: str,
        include_inactive: bool = False,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Row]:
        return self._r(hermes_messages.read, session_id, include_inactive, limit, offset)

    def get_messages_as_conversation(
        self,
        session_id: str,
        include_ancestors: bool = False,
        include_inactive: bool = False,
        repair_alternation: bool = False,
    ) -> list[dict[str, Any]]:
        def read(conn: sqlite3.Connection) -> list[Row]:
            ids = hermes_messages.lineage(conn, session_id) if include_ancestors else [session_id]
            return hermes_messages.conversation_rows(conn, ids, include_inactive)

        return hermes_messages.to_conversation(
            self._r(read), dedupe_replays=include_ancestors, repair_alternation=repair_alternation
        )

    def _lineage_rows(self, session_id: str) -> tuple[list[str], list[Row]]:
        def read(conn: sqlite3.Connection) -> tuple[list[str], list[Row]]:
            ids = hermes_messages.lineage(conn, session_id)
            return ids, hermes_messages.conversation_rows(conn, ids)

        return self._r(read)

    def get_resume_conversations(
        self, session_id: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(model history: this session's rows, repaired; display history: the lineage's
        rows with replayed prompts removed) from one read."""
        _ids, rows = self._lineage_rows(session_id)
        own = [r for r in rows if r["session_id"] == session_id]
        model = hermes_messages.to_conversation(own, dedupe_replays=False, repair_alternation=True)
        display = hermes_messages.to_conversation(
            rows, dedupe_replays=True, repair_alternation=False
        )
        return model, display

    def get_ancestor_display_prefix(self, session_id: str) -> list[dict[str, Any]]:
        ids, rows = self._lineage_rows(session_id)
        if len(ids) <= 1:
            return []
        ancestors = [r for r in rows if r["session_id"] != session_id]
        return hermes_messages.to_conversation(
            ancestors, dedupe_replays=True, repair_alternation=False
        )

    def get_conversation_root(self, session_id: str) -> str:
        return self._r(hermes_messages.lineage, session_id)[0]

    def replace_messages(
        self, session_id: str, messages: list[dict[str, Any]], active_only: bool = False
    ) -> None:
        self._w(hermes_messages.replace, session_id, messages, active_only)

    def set_latest_user_api_content(self, session_id: str, content: Any, api_content: str) -> int:
        return self._w(
            hermes_messages.set_latest_user_api_content, session_id, content, api_content
        )

    def has_archived_messages(self, session_id: str) -> bool:
        return self._r(
            lambda c: (
                c.execute(
                    "SELECT 1 FROM messages WHERE session_id = ? AND active = 0 LIMIT 1",
                    (session_id,),
                ).fetchone()
                is not None
            )
        )

    def clear_messages(self, session_id: str) -> None:
        self._run(self._db.clear_messages(session_id))

    def session_count(
        self,
        source: str | None = None,
        cwd_prefix: str | None = None,
        min_message_count: int | None = None,
        include_archived: bool = False,
        archived_only: bool = False,
        exclude_children: bool = False,
        exclude_sources: list[str] | None = None,
    ) -> int:
        sql = "SELECT COUNT(*) FROM sessions WHERE 1"
        params: list[Any] = []
        if source:
            sql += " AND source = ?"
            params.append(source)
        if exclude_sources:
            sql += f" AND source NOT IN ({', '.join('?' for _ in exclude_sources)})"
            params += list(exclude_sources)
        clause, values = hermes_sessions.cwd_prefix_clause(cwd_prefix)
        sql += clause
        params += values
        if min_message_count is not None:
            sql += " AND COALESCE(message_count, 0) >= ?"
            params.append(min_message_count)
        if archived_only:
            sql += " AND COALESCE(archived, 0) = 1"
        elif not include_archived:
            sql += " AND COALESCE(archived, 0) = 0"
        if exclude_children:
            sql += " AND parent_session_id IS NULL"
        return int(self._r(lambda c: c.execute(sql, params).fetchone()[0]))

    def message_count(self, session_id: str | None = None) -> int:
        return self._run(self._db.message_count(session_id))
