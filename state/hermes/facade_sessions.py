"""The Hermes facade's sessions: create (an upsert), end/reopen, workspace, model and billing columns, usage, titles, the compression tip.

One part of `state.hermes.compat.SessionDB` (Hermes Agent's method names and semantics over
switchboard's store); every part runs its operations through `Facade` (direct.py).
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from ..accounting import token_update
from ..errors import AmbiguousSession, SessionNotFound, TitleError
from ..records import SessionRow
from ..rows import Row
from ..sqlite import sessions as sessions_mod
from ..sqlite import usage
from . import hermes_messages, hermes_sessions
from .direct import Facade


class SessionPart(Facade):
    """The Hermes facade's sessions."""

    def create_session(self, session_id: str, source: str, **kwargs: Any) -> str:
        """Create, or fill the still-empty metadata of an existing session (an upsert)."""
        fields = {k: v for k, v in kwargs.items() if v is not None}
        fields.update(id=session_id, source=source)
        return self._w(hermes_sessions.upsert, fields)

    def ensure_session(self, session_id: str, source: str = "unknown", **kwargs: Any) -> str:
        return self.create_session(session_id, source, **kwargs)

    def end_session(self, session_id: str, end_reason: str) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.end_session, session_id, end_reason, None)

    def reopen_session(self, session_id: str) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.reopen_session, session_id)

    def update_system_prompt(self, session_id: str, system_prompt: str | None) -> None:
        with contextlib.suppress(SessionNotFound):
            self._w(sessions_mod.update_system_prompt, session_id, system_prompt)

    def update_session_cwd(
        self,
        session_id: str,
        cwd: str,
        git_branch: str | None = None,
        git_repo_root: str | None = None,
    ) -> None:
        self._w(hermes_sessions.update_cwd, session_id, cwd, git_branch, git_repo_root)

    def distinct_session_cwds(self, include_archived: bool = False) -> list[Row]:
        return self._r(hermes_sessions.distinct_cwds, include_archived)

    def backfill_repo_roots(self, cwd_to_root: dict[str, str]) -> int:
        return self._w(hermes_sessions.backfill_repo_roots, cwd_to_root)

    def update_session_model(self, session_id: str, model: str) -> None:
        self._set(session_id, "UPDATE sessions SET model = ? WHERE id = ?", (model,))

    def update_session_billing_route(
        self,
        session_id: str,
        *,
        provider: str | None,
        base_url: str | None,
        billing_mode: str | None = None,
    ) -> None:
        """A provider switch: the route changes and the cached system prompt is dropped so
        the next turn rebuilds its header."""
        if billing_mode is None:
            self._set(
                session_id,
                "UPDATE sessions SET billing_provider = ?, billing_base_url = ?, "
                "system_prompt = NULL WHERE id = ?",
                (provider, base_url),
            )
        else:
            self._set(
                session_id,
                "UPDATE sessions SET billing_provider = ?, billing_base_url = ?, "
                "billing_mode = ?, system_prompt = NULL WHERE id = ?",
                (provider, base_url, billing_mode),
            )

    def update_session_meta(
        self, session_id: str, model_config_json: str, model: str | None = None
    ) -> None:
        if model is None:
            self._set(
                session_id,
                "UPDATE sessions SET model_config = ? WHERE id = ?",
                (model_config_json,),
            )
        else:
            self._set(
                session_id,
                "UPDATE sessions SET model_config = ?, model = ? WHERE id = ?",
                (model_config_json, model),
            )

    def record_auxiliary_usage(
        self,
        session_id: str,
        task: str,
        *,
        model: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
    ) -> None:
        counts = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_read_tokens": cache_read_tokens,
            "cache_write_tokens": cache_write_tokens,
            "reasoning_tokens": reasoning_tokens,
        }
        route = {
            "model": model,
            "billing_provider": billing_provider,
            "billing_base_url": billing_base_url,
        }
        self._w(usage.add_usage, session_id, task, route, counts, 1, estimated_cost_usd, None)

    def get_session(self, session_id: str) -> SessionRow | None:
        return self._run(self._db.get_session(session_id))

    def resolve_session_id(self, session_id_or_prefix: str) -> str | None:
        try:
            return self._run(self._db.resolve_session_id(session_id_or_prefix))
        except (SessionNotFound, AmbiguousSession):
            return None

    def update_token_counts(
        self,
        session_id: str,
        input_tokens: int = 0,
        output_tokens: int = 0,
        model: str | None = None,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        reasoning_tokens: int = 0,
        estimated_cost_usd: float | None = None,
        actual_cost_usd: float | None = None,
        cost_status: str | None = None,
        cost_source: str | None = None,
        pricing_version: str | None = None,
        billing_provider: str | None = None,
        billing_base_url: str | None = None,
        billing_mode: str | None = None,
        api_call_count: int = 0,
        absolute: bool = False,
    ) -> None:
        update = token_update(
            {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "model": model,
                "cache_read_tokens": cache_read_tokens,
                "cache_write_tokens": cache_write_tokens,
                "reasoning_tokens": reasoning_tokens,
                "estimated_cost_usd": estimated_cost_usd,
                "actual_cost_usd": actual_cost_usd,
                "cost_status": cost_status,
                "cost_source": cost_source,
                "pricing_version": pricing_version,
                "billing_provider": billing_provider,
                "billing_base_url": billing_base_url,
                "billing_mode": billing_mode,
                "api_call_count": api_call_count,
                "absolute": absolute,
            }
        )

        def write(conn: sqlite3.Connection) -> None:  # a session Hermes never created: made
            hermes_sessions.upsert(conn, {"id": session_id, "source": "unknown"})
            usage.update_token_counts(conn, session_id, **update)

        self._w(write)

    def set_auto_title_if_empty(self, session_id: str, title: str) -> bool:
        cleaned = self.sanitize_title(hermes_messages.scrub(title))
        if not cleaned:
            return False
        try:
            return self._w(hermes_sessions.set_auto_title_if_empty, session_id, cleaned)
        except TitleError as exc:
            raise ValueError(str(exc)) from exc

    def set_session_title(self, session_id: str, title: str | None) -> bool:
        title = hermes_messages.scrub(title)
        try:
            cleaned = self.sanitize_title(title)
            if cleaned is None:
                self._run(self._db.set_session_title(session_id, None))
            else:
                self._w(hermes_sessions.set_title_taking_from_ancestor, session_id, cleaned)
        except SessionNotFound:
            return False
        except TitleError as exc:
            raise ValueError(str(exc)) from exc
        return True

    def get_session_title(self, session_id: str) -> str | None:
        return self._run(self._db.get_session_title(session_id))

    def get_session_by_title(self, title: str) -> SessionRow | None:
        return self._run(self._db.get_session_by_title(title))

    def resolve_session_by_title(self, title: str) -> str | None:
        return self._run(self._db.resolve_session_by_title(title))

    def get_next_title_in_lineage(self, base_title: str) -> str:
        return self._run(self._db.get_next_title_in_lineage(base_title))

    def get_compression_tip(self, session_id: str) -> str:
        return self._run(self._db.get_compression_tip(session_id))

    def resolve_resume_session_id(self, session_id: str) -> str:
        return self._run(self._db.resolve_resume_session_id(session_id))
