"""`state.compat.SessionDB`: a synchronous class with the method names and semantics of
Hermes Agent's documented SessionDB, as a thin wrapper over the async core.

It runs the async store on a private event loop in a background thread, so a program
written against the synchronous API (scripts, notebooks, tools) can use switchboard's
state.db directly. Title problems raise ValueError, as in that API.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from . import store
from .errors import AmbiguousSession, SessionNotFound, TitleError
from .errors import DatabaseError as StateDatabaseError
from .rows import Row
from .titles import MAX_TITLE_LENGTH, clean_title

T = TypeVar("T")
DEFAULT_DB_PATH = (
    Path(os.environ.get("SWITCHBOARD_HOME", "~/.switchboard")).expanduser() / "state.db"
)


class OpenError(sqlite3.DatabaseError):
    """The file cannot be opened as a state.db (a sqlite3.Error, as Hermes callers expect)."""


class SessionDB:
    def __init__(self, db_path: str | os.PathLike[str] | None = None) -> None:
        self.db_path = Path(db_path) if db_path is not None else DEFAULT_DB_PATH
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="state-compat", daemon=True
        )
        self._thread.start()
        try:
            self._db = self._run(store.SessionDB.open(self.db_path))
        except StateDatabaseError as exc:
            self._stop_loop()
            # Hermes's callers catch sqlite3.Error around SessionDB() and degrade.
            raise OpenError(str(exc)) from exc
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self._db.close())
        self._stop_loop()

    def __enter__(self) -> SessionDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sessions ---
    def create_session(self, session_id: str, source: str, model: str | None = None,
                       model_config: dict[str, Any] | None = None, system_prompt: str | None = None,
                       user_id: str | None = None, parent_session_id: str | None = None,
                       **routing: Any) -> str:  # fmt: skip
        return self._run(self._db.create_session(
            session_id, source, model=model, model_config=model_config, system_prompt=system_prompt,
            user_id=user_id, parent_session_id=parent_session_id, **routing))  # fmt: skip

    def ensure_session(
        self, session_id: str, source: str = "cli", model: str | None = None, **kw: Any
    ) -> str:
        self._run(self._db.ensure_session(session_id, source, model=model, **kw))
        return session_id

    def end_session(self, session_id: str, end_reason: str) -> None:
        self._run(self._db.end_session(session_id, end_reason))

    def reopen_session(self, session_id: str) -> None:
        self._run(self._db.reopen_session(session_id))

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        self._run(self._db.update_system_prompt(session_id, system_prompt))

    def get_session(self, session_id: str) -> Row | None:
        return self._run(self._db.get_session(session_id))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        try:
            return self._run(self._db.resolve_session_id(session_id_or_prefix))
        except (SessionNotFound, AmbiguousSession):
            return None

    def update_token_counts(self, session_id: str, input_tokens: int = 0, output_tokens: int = 0,
                            model: str | None = None, cache_read_tokens: int = 0,
                            cache_write_tokens: int = 0, reasoning_tokens: int = 0,
                            estimated_cost_usd: float | None = None,
                            actual_cost_usd: float | None = None, absolute: bool = False) -> None:  # fmt: skip
        self._run(self._db.update_token_counts(
            session_id, input_tokens=input_tokens, output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens, cache_write_tokens=cache_write_tokens,
            reasoning_tokens=reasoning_tokens, estimated_cost_usd=estimated_cost_usd,
            actual_cost_usd=actual_cost_usd, absolute=absolute))  # fmt: skip
        if model:
            self._run(self._db.update_session(session_id, model=model))

    # --- titles ---
    @staticmethod
    def sanitize_title(title: str | None) -> str | None:
        if not title:
            return None
        cleaned = clean_title(title)
        if not cleaned:
            return None
        if len(cleaned) > MAX_TITLE_LENGTH:
            raise ValueError(f"Title too long ({len(cleaned)} chars, max {MAX_TITLE_LENGTH})")
        return cleaned

    def set_session_title(self, session_id: str, title: str | None) -> bool:
        try:
            self._run(self._db.set_session_title(session_id, title))
        except SessionNotFound:
            return False
        except TitleError as exc:
            raise ValueError(str(exc)) from exc
        return True

    def get_session_title(self, session_id: str) -> str | None:
        return self._run(self._db.get_session_title(session_id))

    def get_session_by_title(self, title: str) -> Row | None:
        return self._run(self._db.get_session_by_title(title))

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._run(self._db.resolve_session_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._run(self._db.get_next_title_in_lineage(base_title))

    # --- lineage ---
    def get_compression_tip(self, session_id: str) -> str:
        return self._run(self._db.get_compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        return self._run(self._db.resolve_resume_session_id(session_id))

    # --- listing and search ---
    def list_sessions_rich(self, source: str | None = None, exclude_sources: list[str] | None = None,
                           limit: int = 20, offset: int = 0,
                           include_children: bool = False) -> list[Row]:  # fmt: skip
        return self._run(self._db.list_sessions(
            source, exclude_sources=exclude_sources or (), limit=limit, offset=offset,
            include_children=include_children))  # fmt: skip

    def search_sessions(
        self, source: str | None = None, limit: int = 20, offset: int = 0
    ) -> list[Row]:
        """Hermes Agent's name for listing sessions by start time (all of them, children
        included), optionally of one source."""
        return self._run(self._db.sessions_by_start(source, limit, offset))

    def search_messages(self, query: str, source_filter: list[str] | None = None,
                        exclude_sources: list[str] | None = None,
                        role_filter: list[str] | None = None, limit: int = 20,
                        offset: int = 0) -> list[Row]:  # fmt: skip
        return self._run(self._db.search_messages(
            query, sources=source_filter or (), exclude_sources=exclude_sources or (),
            roles=role_filter or (), limit=limit, offset=offset))  # fmt: skip

    # --- messages ---
    def append_message(
        self, session_id: str, role: str, content: str | None = None, **fields: Any
    ) -> int:
        return self._run(self._db.append_message(session_id, role, content, **fields))

    def get_messages(self, session_id: str) -> list[Row]:
        return self._run(self._db.get_messages(session_id))

    def get_messages_as_conversation(
        self, session_id: str, include_ancestors: bool = False
    ) -> list[dict[str, Any]]:
        return self._run(
            self._db.get_messages_as_conversation(session_id, include_ancestors=include_ancestors)
        )

    def clear_messages(self, session_id: str) -> None:
        self._run(self._db.clear_messages(session_id))

    def session_count(self, source: str | None = None) -> int:
        return self._run(self._db.session_count(source))

    def message_count(self, session_id: str | None = None) -> int:
        return self._run(self._db.message_count(session_id))

    # --- export, delete, prune, meta ---
    def export_session(self, session_id: str) -> Row | None:
        try:
            rec = self._run(self._db.export_session(session_id))
        except SessionNotFound:
            return None
        return {**rec["session"], "messages": rec["messages"]}

    def export_all(self, source: str | None = None) -> list[Row]:
        async def collect() -> list[Row]:
            return [
                {**r["session"], "messages": r["messages"]}
                async for r in self._db.export_all(source)
            ]

        return self._run(collect())

    def delete_session(self, session_id: str) -> bool:
        try:
            self._run(self._db.delete_session(session_id))
        except SessionNotFound:
            return False
        return True

    def prune_sessions(self, older_than_days: int = 90, source: str | None = None) -> int:
        return self._run(self._db.prune_sessions(older_than_days, source))

    def get_meta(self, key: str) -> str | None:
        return self._run(self._db.get_meta(key))

    def set_meta(self, key: str, value: str) -> None:
        self._run(self._db.set_meta(key, value))

    def vacuum(self) -> None:
        self._run(self._db.vacuum())

    def maybe_auto_prune_and_vacuum(self, retention_days: int = 90, min_interval_hours: int = 24,
                                    vacuum: bool = True) -> dict[str, Any]:  # fmt: skip
        return self._run(
            self._db.maybe_auto_prune_and_vacuum(retention_days, min_interval_hours, vacuum)
        )
