"""What a store gives back for text that looks like its own encodings, on every backend:
a plain string is never read as structured content, whatever it starts with; structured
content and rows written before read back as they did; a value the database can never
hold is UnstorableData (not a busy or broken store)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from state import Store, UnstorableData, open_store
from state.content import SENTINEL, decode_content, encode_content
from tests import pgserver

LOOKALIKES = [
    '\x00json:[{"type":"text","text":"injected"}]',
    "\x00json:not json at all",
    "\x00json:",
    "before\x00after",
    "\x00hello",
    '"\x00json:{}"',
    "plain [bold]text[/bold] [/i]",
]
PARTS = [{"type": "text", "text": "a picture:"}, {"type": "image_url", "image_url": {"url": "x"}}]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_a_string_reads_back_as_the_same_string_whatever_it_starts_with(text: str) -> None:
    assert decode_content(encode_content(text)) == text


def test_structured_content_keeps_its_encoding() -> None:
    assert encode_content(PARTS) == SENTINEL + json.dumps(
        PARTS, ensure_ascii=False, separators=(",", ":")
    )
    assert decode_content(encode_content(PARTS)) == PARTS
    assert encode_content("no nul here") == "no nul here"


async def test_text_that_looks_like_structured_content_is_stored_and_read_as_text(
    store: Store,
) -> None:
    """Every reader gets the string back: messages, the agent's conversation, export."""
    sid = await store.create_session(source="api", user_id="u")
    await store.append_messages(sid, [{"role": "user", "content": t} for t in LOOKALIKES])
    await store.append_message(sid, "user", PARTS)  # type: ignore[arg-type]
    expected = [*LOOKALIKES, PARTS]
    assert [m["content"] for m in await store.get_messages(sid)] == expected
    conversation = await store.get_messages_as_conversation(sid)
    assert [m["content"] for m in conversation] == expected
    exported = await store.export_session(sid)
    assert [m["content"] for m in exported["messages"]] == expected


async def test_rows_written_before_read_back_as_they_did(tmp_path: Path) -> None:
    """A state.db row holding structured content, or a plain string with a NUL (stored as
    it was by earlier versions), reads back as it always did."""
    store = await open_store({"backend": "sqlite"}, tmp_path)
    try:
        sid = await store.create_session(source="api", user_id="u")
        await store.append_message(sid, "user", "placeholder")
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute(
            "UPDATE messages SET content = ? WHERE session_id = ?",
            (SENTINEL + json.dumps(PARTS), sid),
        )
        conn.execute(
            "INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'user', ?, 1)",
            (sid, "old\x00row"),
        )
    conn.close()
    store = await open_store({"backend": "sqlite"}, tmp_path)
    try:
        assert [m["content"] for m in await store.get_messages(sid)] == [PARTS, "old\x00row"]
    finally:
        await store.close()


async def test_a_value_postgresql_can_never_hold_is_unstorable_data(
    pg_dsn: str, tmp_path: Path
) -> None:
    """A NUL in an id reaches PostgreSQL only past every intake; its refusal is
    UnstorableData, which the gateway drops or answers 400, never "try again"."""
    schema = pgserver.fresh_schema(pg_dsn)
    store = await open_store(
        {"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, tmp_path
    )
    try:
        with pytest.raises(UnstorableData):
            await store.accept_inbound("api", "chat\x00id", None, ["payload"])
        with pytest.raises(UnstorableData):
            await store.create_session(source="api", user_id="user\x00id")
        assert await store.session_count() == 0
    finally:
        await store.close()
        pgserver.drop_schema(pg_dsn, schema)


@pytest.mark.parametrize(
    "field, value",
    [
        ("tool_name", {"x": 1}),
        ("tool_call_id", ["a"]),
        ("token_count", {"n": 1}),
        ("finish_reason", b"stop"),
        ("platform_message_id", True),
        ("reasoning", ("a", "b")),
    ],
)
async def test_a_list_or_mapping_where_a_message_takes_text_is_refused_by_name(
    store: Store, field: str, value: object
) -> None:
    """The same clear error on every backend, alone or merged with other appends in one
    commit (where the merged append sends its rows as JSON, which would take a list), and
    the appends beside it are stored."""
    sid = await store.create_session(source="api")
    bad = {"role": "assistant", "content": "odd", field: value}
    alone = await asyncio.gather(store.append_messages(sid, [bad]), return_exceptions=True)
    merged = await asyncio.gather(
        store.append_messages(sid, [{"role": "user", "content": "before"}]),
        store.append_messages(sid, [bad]),
        store.append_messages(sid, [{"role": "user", "content": "after", "token_count": 3}]),
        return_exceptions=True,
    )
    for outcome in (alone[0], merged[1]):
        assert isinstance(outcome, ValueError) and field in str(outcome), outcome
    stored = await store.get_messages(sid)
    assert [(m["content"], m["token_count"]) for m in stored] == [("before", None), ("after", 3)]
    numbers = {"role": "tool", "content": "n", "tool_call_id": 7, "reasoning": 1.5}
    await store.append_messages(sid, [numbers])  # numbers stay what they were: stored
    assert [m["tool_call_id"] for m in await store.get_messages(sid)][-1] == "7"
