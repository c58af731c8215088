"""What a cluster run must leave behind, checked against the database and the fakes.

Each check returns the problems it found (empty: it holds), so a test can report all of
them at once. The promises: every 2xx-acknowledged message stored once and
answered; no reply twice (HTTP API with an Idempotency-Key and Slack exactly once; Telegram
at most once, its gaps being exactly replies left unconfirmed); replies and stored messages
in the order each chat sent them; at most one live session per key.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from typing import Any

import psycopg

from tests.cluster.harness import Cluster
from tests.cluster.workload import Workload, parse_text


def stored(conn: psycopg.Connection[Any]) -> tuple[Counter[str], Counter[str]]:
    """(user texts, assistant texts) with how often each is stored."""
    users: Counter[str] = Counter()
    replies: Counter[str] = Counter()
    for role, content in conn.execute(
        "SELECT role, content FROM messages WHERE role IN ('user', 'assistant')"
    ):
        (users if role == "user" else replies)[str(content)] += 1
    return users, replies


def open_work(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Inbox rows whose turn has not ended, and replies not yet handed to the platform."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE state IN ('received', 'started')), "
        "count(*) FILTER (WHERE reply_state = 'ready') FROM inbox"
    ).fetchone()
    assert row is not None
    return {"open_turns": int(row[0]), "ready_replies": int(row[1])}


def unconfirmed(conn: psycopg.Connection[Any], platform: str) -> set[str]:
    """The user texts whose reply was left `sending` (maybe sent, never confirmed; a
    restart marks those `unconfirmed` and counts them in /health)."""
    return {
        str(r[0])
        for r in conn.execute(
            "SELECT m.content FROM inbox i JOIN messages m ON m.id = i.message_id "
            "WHERE i.platform = %s AND i.reply_state IN ('sending', 'unconfirmed')",
            (platform,),
        )
    }


async def drained(
    conn: psycopg.Connection[Any], work: Workload, timeout: float = 60.0
) -> str | None:
    """Wait until no turn is open, no reply waits to be sent and every acknowledged
    webhook message's reply reached its fake or was left unconfirmed. None when it did,
    else what was still waiting."""
    deadline = time.monotonic() + timeout
    left = ""
    while time.monotonic() < deadline:
        work.replies.update()
        pending = open_work(conn)
        gaps = {
            s.text for s in work.acked if s.platform != "api" and not work.replies.count[s.text]
        }
        gaps -= unconfirmed(conn, "telegram")
        if not any(pending.values()) and not gaps:
            return None
        left = f"{pending}, unanswered webhook messages: {sorted(gaps)[:8]}"
        await asyncio.sleep(0.2)
    return left


async def check_finished(cluster: Cluster, work: Workload) -> list[str]:
    """Wait for a finished run to drain, then every promise over it, no lease left on a
    key with open turns and no traceback in any replica's log: the problems (if it did not
    drain, that, with the inbox rows of its unanswered webhook messages)."""
    with cluster.connect() as conn:
        left = await drained(conn, work)
        if left is None:
            problems = check_run(conn, work) + leftover_leases(conn)
        else:
            gaps = [
                s.text for s in work.acked if s.platform != "api" and not work.replies.count[s.text]
            ]
            problems = [f"not drained: {left}; their inbox rows: {explain(conn, gaps)}"]
    return problems + cluster.tracebacks()


def check_run(conn: psycopg.Connection[Any], work: Workload) -> list[str]:
    """Every promise over a finished, drained run."""
    problems: list[str] = []
    users, answers = stored(conn)
    work.replies.update()
    acked = work.acked
    lost = [s.text for s in acked if users[s.text] == 0]
    if lost:
        problems.append(f"{len(lost)} acknowledged message(s) not stored: {lost[:8]}")
    twice = sorted(t for t, n in users.items() if n > 1 and parse_text(t))
    if twice:
        problems.append(f"{len(twice)} message(s) stored more than once: {twice[:8]}")
    doubled = sorted(t for t, n in answers.items() if n > 1 and parse_text(t))
    if doubled:
        problems.append(f"{len(doubled)} repl(ies) stored more than once: {doubled[:8]}")
    unanswered = [s.text for s in acked if answers[f"echo: {s.text}"] == 0]
    if unanswered:
        problems.append(
            f"{len(unanswered)} acknowledged message(s) never answered in the store: "
            f"{unanswered[:8]}"
        )
    for s in acked:
        if s.platform == "api":
            wrong = [r for r in s.api_replies if r.get("reply") != f"echo: {s.text}"]
            if wrong:
                problems.append(f"API {s.text}: answered {wrong[:2]}")
    sent = work.replies.count
    slack_wrong = [
        (s.text, sent[s.text]) for s in acked if s.platform == "slack" and sent[s.text] != 1
    ]
    if slack_wrong:
        problems.append(f"Slack replies not exactly once (text, times): {slack_wrong[:8]}")
    tg = [s for s in acked if s.platform == "telegram"]
    tg_twice = [s.text for s in tg if sent[s.text] > 1]
    if tg_twice:
        problems.append(f"Telegram replies sent twice: {tg_twice[:8]}")
    gaps = {s.text for s in tg if sent[s.text] == 0}
    left = unconfirmed(conn, "telegram")
    if not gaps <= left:
        problems.append(
            f"Telegram replies missing but not left unconfirmed: {sorted(gaps - left)[:8]}"
        )
    problems += check_order(conn, work)
    problems += check_live_sessions(conn)
    return problems


def check_order(conn: psycopg.Connection[Any], work: Workload) -> list[str]:
    """Per chat, replies (as the fakes got them) and stored messages (by id) go up in i."""
    problems = []
    for chat, seq in work.replies.order.items():
        first = [i for n, i in enumerate(seq) if i not in seq[:n]]
        if first != sorted(first):
            problems.append(f"replies out of order in {chat}: {first}")
    per_session: dict[str, list[int]] = defaultdict(list)
    for sid, content in conn.execute(
        "SELECT session_id, content FROM messages WHERE role = 'user' ORDER BY id"
    ):
        parsed = parse_text(str(content))
        if parsed is not None:
            per_session[str(sid)].append(parsed[2])
    for sid, seq in per_session.items():
        if seq != sorted(seq):
            problems.append(f"stored out of order in session {sid}: {seq}")
    return problems


def check_live_sessions(conn: psycopg.Connection[Any]) -> list[str]:
    doubled = conn.execute(
        "SELECT session_key, count(*) FROM sessions WHERE ended_at IS NULL "
        "AND session_key IS NOT NULL GROUP BY session_key HAVING count(*) > 1"
    ).fetchall()
    return [f"keys with two live sessions: {doubled}"] if doubled else []


def leftover_leases(conn: psycopg.Connection[Any]) -> list[str]:
    """After a drain no key is leased to a replica that is gone (when the table exists)."""
    if conn.execute("SELECT to_regclass('session_routes')").fetchone() == (None,):
        return []
    cols = {
        r[0]
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'session_routes'"
        )
    }
    if "lease_owner" not in cols:
        return []
    rows = conn.execute(
        "SELECT r.session_key, r.lease_owner FROM session_routes r "
        "WHERE r.lease_owner IS NOT NULL AND EXISTS (SELECT 1 FROM inbox i "
        "JOIN sessions s ON s.id = i.session_id WHERE s.session_key = r.session_key "
        "AND i.state IN ('received', 'started'))"
    ).fetchall()
    return [f"keys leased with open turns after the drain: {rows[:8]}"] if rows else []


def explain(conn: psycopg.Connection[Any], texts: list[str]) -> list[tuple[Any, ...]]:
    """The inbox rows of workload texts, for a failure message."""
    out: list[tuple[Any, ...]] = []
    for text in texts[:8]:
        out += conn.execute(
            "SELECT i.platform, i.chat_id, i.platform_message_id, i.state, i.reason, "
            "i.reply_state, i.reply_ref FROM inbox i WHERE i.payload LIKE %s",
            (f'%"{text}"%',),
        ).fetchall()
    return out
