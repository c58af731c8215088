"""Creating and reading sessions, the part both stores share: a session created under a
generated id unless one is given (a given id that exists raises SessionExists), created
only when missing (`ensure_session`), its fields checked and shaped by
`columns.session_fields`; a session required (SessionNotFound) and its title.

Each backend's `SessionOps` (state/sqlite/sessions.py, state/pg/sessions.py) supplies the
inserts and the read in its own SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .columns import session_fields
from .errors import SessionNotFound
from .records import SessionRow


class Creation:
    """create_session, ensure_session, require_session and get_session_title over a
    backend's steps (`_insert`, `_insert_new`, `_insert_if_missing`, `get_session`)."""

    async def _insert(self, fields: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _insert_new(self, fields: dict[str, Any], cli: bool) -> str:
        raise NotImplementedError

    async def _insert_if_missing(self, fields: dict[str, Any]) -> bool:
        raise NotImplementedError

    async def get_session(self, session_id: str) -> SessionRow | None:
        raise NotImplementedError

    async def create_session(
        self,
        session_id: str | None = None,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        title: str | None = None,
        started_at: float | None = None,
        **routing: Any,
    ) -> str:
        """Create a session (under a generated id unless one is given; a given id that
        exists raises SessionExists). Routing columns go in `routing`."""
        fields = session_fields(
            session_id or "",
            source,
            model,
            model_config,
            system_prompt,
            user_id,
            parent_session_id,
            child_kind,
            title,
            started_at,
            routing,
        )
        if not session_id:
            return await self._insert_new(fields, source == "cli")
        await self._insert(fields)
        return session_id

    async def ensure_session(
        self,
        session_id: str,
        source: str = "cli",
        *,
        model: str | None = None,
        model_config: Mapping[str, Any] | str | None = None,
        system_prompt: str | None = None,
        user_id: str | None = None,
        parent_session_id: str | None = None,
        child_kind: str | None = None,
        **routing: Any,
    ) -> bool:
        """Create the session unless it exists. Returns True when it was created."""
        fields = session_fields(
            session_id,
            source,
            model,
            model_config,
            system_prompt,
            user_id,
            parent_session_id,
            child_kind,
            None,
            None,
            routing,
        )
        return await self._insert_if_missing(fields)

    async def require_session(self, session_id: str) -> SessionRow:
        row = await self.get_session(session_id)
        if row is None:
            raise SessionNotFound(session_id)
        return row

    async def get_session_title(self, session_id: str) -> str | None:
        row = await self.get_session(session_id)
        return None if row is None else row.get("title")
