"""A session's whole lineage as one tree: the root it grew from and every descendant
(compression continuations, branches, resets, delegates), for drawing."""

from __future__ import annotations

import sqlite3

from .lineage import ancestors, descendants
from .rows import Row

TREE_COLUMNS = (
    "id", "title", "source", "parent_session_id", "child_kind", "started_at", "ended_at",
    "end_reason", "message_count", "handoff_state", "handoff_platform",
)  # fmt: skip


def _node(row: Row) -> Row:
    return {k: row.get(k) for k in TREE_COLUMNS} | {"children": []}


def lineage_tree(conn: sqlite3.Connection, session_id: str, limit: int = 2000) -> Row | None:
    """The tree holding `session_id` (nested `children`), or None if the session is gone.
    A child without `child_kind` (written by another program) is a compression child
    when its parent ended for compression; otherwise its kind shows as None."""
    cur = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,))
    found = cur.fetchone()
    if found is None:
        return None
    up = ancestors(conn, session_id)
    root_row = up[-1] if up else {d[0]: v for d, v in zip(cur.description, found, strict=True)}
    root = _node(root_row)
    nodes = {root["id"]: root}
    for row in descendants(conn, root["id"])[:limit]:
        node = _node(row)
        nodes[node["id"]] = node
    for node in list(nodes.values()):
        parent = nodes.get(node["parent_session_id"]) if node is not root else None
        if parent is None:
            continue
        if node["child_kind"] is None and parent["end_reason"] == "compression":
            node["child_kind"] = "compression"
        parent["children"].append(node)
    for node in nodes.values():
        node["children"].sort(key=lambda n: (n["started_at"] or 0, n["id"]))
    return root
