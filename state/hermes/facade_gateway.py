"""The Hermes facade's gateway sessions (peers, origins, expiry) and compression leases.

One part of `state.hermes.compat.SessionDB` (Hermes Agent's method names and semantics over
switchboard's store); every part runs its operations through `Facade` (direct.py).
"""

from __future__ import annotations

import sqlite3

from ..errors import StateError
from ..rows import Row
from . import hermes_gateway, locks
from .direct import Facade


class GatewayPart(Facade):
    """The Hermes facade's gateway sessions (peers, origins, expiry), compression leases, and the lineage's export and import."""

    def record_gateway_session_peer(
        self,
        session_id: str,
        *,
        source: str,
        user_id: str | None = None,
        session_key: str | None = None,
        chat_id: str | None = None,
        chat_type: str | None = None,
        thread_id: str | None = None,
        display_name: str | None = None,
        origin_json: str | None = None,
    ) -> None:
        peer = {
            "source": source,
            "user_id": user_id,
            "session_key": session_key,
            "chat_id": chat_id,
            "chat_type": chat_type,
            "thread_id": thread_id,
        }
        self._w(hermes_gateway.record_peer, session_id, peer, display_name, origin_json)

    def set_expiry_finalized(self, session_id: str, finalized: bool = True) -> None:
        self._set(
            session_id,
            "UPDATE sessions SET expiry_finalized = ? WHERE id = ?",
            (int(bool(finalized)),),
        )

    def find_latest_gateway_session_for_peer(
        self,
        *,
        source: str,
        user_id: str | None = None,
        session_key: str | None = None,
        chat_id: str | None = None,
        chat_type: str | None = None,
        thread_id: str | None = None,
    ) -> Row | None:
        return self._r(
            hermes_gateway.latest_for_peer,
            source,
            user_id,
            session_key,
            chat_id,
            chat_type,
            thread_id,
        )

    def list_gateway_sessions(
        self, *, platform: str | None = None, active_only: bool = True
    ) -> list[Row]:
        return self._r(hermes_gateway.list_gateway, platform, active_only)

    def find_session_by_origin(
        self,
        *,
        platform: str,
        chat_id: str,
        thread_id: str | None = None,
        user_id: str | None = None,
    ) -> str | None:
        return self._r(hermes_gateway.by_origin, platform, chat_id, thread_id, user_id)

    def try_acquire_compression_lock(
        self, session_id: str, holder: str, ttl_seconds: float = 300.0
    ) -> bool:
        try:
            return self._w(locks.try_acquire, session_id, holder, ttl_seconds)
        except (sqlite3.Error, StateError):
            return False

    def refresh_compression_lock(
        self, session_id: str, holder: str, ttl_seconds: float = 300.0
    ) -> bool:
        try:
            return self._w(locks.refresh, session_id, holder, ttl_seconds)
        except (sqlite3.Error, StateError):
            return False

    def release_compression_lock(self, session_id: str, holder: str) -> None:
        self._w(locks.release, session_id, holder)

    def get_compression_lock_holder(self, session_id: str) -> str | None:
        return self._r(locks.holder, session_id)
