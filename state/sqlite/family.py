"""A session's whole lineage as one tree: the root it grew from and every descendant
(compression continuations, branches, resets, delegates), for drawing."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ..rows import Row
from .lineage import ancestors, descendants

TREE_COLUMNS = (
    "id",
    "title",
    "source",
    "parent_session_id",
    "child_kind",
    "started_at",
    "ended_at",
    "end_reason",
    "message_count",
    "handoff_state",
    "handoff_platform",
)


def _node(row: Mapping[str, Any]) -> Row:
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
    return build_tree(root_row, descendants(conn, root_row["id"])[:limit])


def build_tree(root_row: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> Row:
    """The nested tree from its root row and every descendant row (pure: both stores)."""
    root = _node(root_row)
    nodes = {root["id"]: root}
    for row in rows:
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
