"""What the dashboard changes, shared by pages and the JSON API: rename, delete, prune,
delete empty sessions. Live sessions (bound to a chat in the index) are never deleted."""

from __future__ import annotations

from typing import Any

from gateway.web.context import DashboardState as Dashboard
from state import SessionNotFound, StateError

TRANSCRIPT_PAGE = 200


class Refused(StateError):
    """An action the dashboard will not do; the message says why."""


LIVE_REFUSAL = "the session is live in a chat; start a new one there (/new) first"


async def session_detail(
    d: Dashboard, session_id: str, after_id: int | None = None, at: int | None = None
) -> dict[str, Any]:
    """Metadata, one page of the transcript (starting a little before `at` when given),
    and the lineage tree."""
    row = await d.db.get_session(session_id)
    if row is None:
        raise SessionNotFound(session_id)
    if at is not None and after_id is None:
        around = await d.db.get_messages_around(session_id, at, 10)
        after_id = max(0, int(around[0]["id"]) - 1) if around else None
    msgs = await d.db.get_messages(session_id, after_id=after_id, limit=TRANSCRIPT_PAGE + 1)
    more = len(msgs) > TRANSCRIPT_PAGE
    msgs = msgs[:TRANSCRIPT_PAGE]
    return {
        "session": dict(row) | {"live": d.is_live(session_id)},
        "messages": msgs,
        "next_after": int(msgs[-1]["id"]) if more and msgs else None,
        "from_start": not after_id,
        "lineage": await d.db.lineage_tree(session_id),
        # replies that did not reach the chat: message id -> their state and reason
        "undelivered": {
            mid: {"state": state, "reason": reason}
            for mid, (state, reason) in (await d.db.undelivered_replies(session_id)).items()
        },
    }


async def rename(d: Dashboard, session_id: str, title: str) -> str | None:
    """Set or (empty title) clear; raises SessionNotFound or a TitleError."""
    if await d.db.get_session(session_id) is None:
        raise SessionNotFound(session_id)
    return await d.db.set_session_title(session_id, title)


async def delete(d: Dashboard, session_id: str) -> None:
    if await d.db.get_session(session_id) is None:
        raise SessionNotFound(session_id)
    if d.is_live(session_id):
        raise Refused(LIVE_REFUSAL)
    await d.db.delete_session(session_id)


async def prune(
    d: Dashboard, older_than_days: float, source: str | None, dry_run: bool
) -> dict[str, Any]:
    if dry_run:
        found = await d.db.prune_candidates(older_than_days, source, limit=100_000)
        return {"would_prune": len(found)}
    n = await d.db.prune_sessions(older_than_days, source, protected=d.live_ids())
    return {"pruned": n}


async def delete_empty(d: Dashboard, dry_run: bool) -> dict[str, Any]:
    if dry_run:
        return {"empty": await d.db.count_empty_sessions()}
    return {"deleted": await d.db.delete_empty_sessions(protected=d.live_ids())}
