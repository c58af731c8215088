"""Search through `state.hermes.compat` on the cases Hermes callers rely on: punctuation in a CJK
query is literal, and rewound messages are hidden unless `include_inactive` asks for them."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from state.hermes.compat import SessionDB


def test_a_percent_sign_in_a_short_cjk_query_is_literal(tmp_path: Path) -> None:
    db = SessionDB(tmp_path / "state.db")
    try:
        for sid, text in (
            ("s1", "达成100%完成率"),
            ("s2", "达成100完成率是目标"),
            ("s3", "字段a_b名"),
            ("s4", "字段axb名"),
        ):
            db.create_session(sid, "cli")
            db.append_message(sid, "user", text)
        assert [h["session_id"] for h in db.search_messages("100%完成")] == ["s1"]
        assert [h["session_id"] for h in db.search_messages("a_b名")] == ["s3"]
        # without punctuation the segmented match still finds every spelling
        assert {h["session_id"] for h in db.search_messages("完成率")} == {"s1", "s2"}
    finally:
        db.close()


def test_rewound_messages_are_found_only_with_include_inactive(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = SessionDB(path)
    try:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "keep this walrus")
        rewound = db.append_message("s1", "user", "rewound walrus")
        compacted = db.append_message("s1", "user", "compacted walrus")
    finally:
        db.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE messages SET active = 0, compacted = 0 WHERE id = ?", (rewound,))
    conn.execute("UPDATE messages SET active = 0, compacted = 1 WHERE id = ?", (compacted,))
    conn.commit()
    conn.close()
    db = SessionDB(path)
    try:
        default = {h["id"] for h in db.search_messages("walrus")}
        everything = {h["id"] for h in db.search_messages("walrus", include_inactive=True)}
        assert rewound not in default and compacted in default and len(default) == 2
        assert everything == default | {rewound}
    finally:
        db.close()
