"""The StrEnum vocabulary: its members are the strings state.db, sessions.json,
the config file and /health always held, so every stored value and every JSON body stays
byte for byte the same."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gateway.index import SessionIndex
from gateway.reset.policy import ResetPolicy
from gateway.session_keys import CHAT_TYPES, SessionSource
from gateway.vocab import AdapterState, ChatType, ResetMode
from state import ChildKind, EndReason, SessionDB

from .conftest import RouterRig, group


def test_the_values_are_the_strings_already_stored_and_configured() -> None:
    # rows written by earlier versions (and Hermes) carry exactly these strings
    assert [*ChildKind] == ["compression", "branch", "reset", "delegate"]
    assert [*EndReason] == [
        "user_exit",
        "compression",
        "branched",
        "session_switch",
        "session_reset",
        "idle",
        "daily",
    ]
    assert [*ResetMode] == ["none", "idle", "daily", "both"]
    assert CHAT_TYPES == ("dm", "group", "channel", "thread")
    assert [*AdapterState] == ["stopped", "running", "retrying", "failed"]


def test_members_encode_as_their_plain_strings() -> None:
    source = SessionSource("telegram", "-100", "group", "7")
    assert source.chat_type is ChatType.GROUP  # a plain string is taken as the member
    plain = {"chat_type": "group", "state": "running", "reason": "idle"}
    enums = {"chat_type": source.chat_type, "state": AdapterState.RUNNING, "reason": EndReason.IDLE}
    assert json.dumps(enums) == json.dumps(plain)
    assert f"{ChildKind.BRANCH}/{ResetMode.BOTH}" == "branch/both"
    assert ResetPolicy("daily").mode is ResetMode.DAILY  # config hands over a str
    with pytest.raises(ValueError, match="chat_type must be one of dm, group, channel, thread"):
        SessionSource("telegram", "1", "room")
    with pytest.raises(ValueError):
        ResetPolicy("weekly")


async def test_state_db_stores_the_plain_text(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        parent = await db.create_session(source="telegram")
        child = await db.fork_session(parent, ChildKind.RESET, end_reason=EndReason.IDLE)
    finally:
        await db.close()
    conn = sqlite3.connect(tmp_path / "state.db")
    try:
        rows = dict(
            conn.execute(
                "SELECT id, typeof(child_kind) || ':' || coalesce(child_kind, '') || '/' || "
                "typeof(end_reason) || ':' || coalesce(end_reason, '') FROM sessions"
            ).fetchall()
        )
    finally:
        conn.close()
    assert rows == {parent: "null:/text:idle", child: "text:reset/null:"}


async def test_sessions_json_round_trips_the_chat_type(rig: RouterRig) -> None:
    await rig.router.handle(group("hello", user="5", chat="-100"))
    await rig.outbox.wait(1)
    await rig.router.drain(5)
    await rig.index.flush()
    path = rig.index.path
    on_disk = json.loads(path.read_text())
    [(key, raw)] = on_disk.items()
    assert raw["chat_type"] == "group" and raw["origin"]["chat_type"] == "group"
    again = SessionIndex(path, rig.db)
    await again.load()
    entry, before = again.get(key), rig.index.get(key)
    assert entry is not None and before is not None
    assert entry.to_json() == before.to_json()
    assert SessionSource.from_dict(entry.origin).chat_type is ChatType.GROUP
    await again.close()
