"""Who may see which session from a chat. A title or an id is a handle, not authority.

A chat owns the sessions of its own key: same platform and chat, same thread (or none),
and the same user where sessions are per user; in a shared room or thread everyone shares.
A session that never came from a chat (no session key) is not reachable from one. Admins
may reach across chats when they ask for it explicitly. `scope` states the same rule as a
`SessionFilter`, so listings, searches and resolution apply it inside SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.session_keys import SessionKey
from state import ChildKind, SessionFilter

CHAT_LISTED_KINDS: tuple[str, ...] = (
    ChildKind.BRANCH,
    ChildKind.RESET,
)  # a chat lists sessions it started with /new too


def scope(key: SessionKey, *, include_children: bool = True) -> SessionFilter:
    return SessionFilter(
        child_kinds=CHAT_LISTED_KINDS,
        source=key.platform,
        chat_id=key.chat_id,
        thread_id=key.thread_id,
        thread_exact=True,
        user_id=key.user_id,
        include_children=include_children,
        routed_only=True,
    )


def admin_scope(include_children: bool = True) -> SessionFilter:
    return SessionFilter(
        include_children=include_children, routed_only=True, child_kinds=CHAT_LISTED_KINDS
    )


def may_access(row: Mapping[str, Any], key: SessionKey, *, admin_override: bool = False) -> bool:
    """The rule as a predicate over a session row (what `scope` expresses in SQL)."""
    if not row.get("session_key"):
        return False
    if admin_override:
        return True
    if row.get("source") != key.platform or row.get("chat_id") != key.chat_id:
        return False
    if row.get("thread_id") != key.thread_id:
        return False
    return key.user_id is None or row.get("user_id") == key.user_id
