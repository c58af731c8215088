"""The agent's session_search tool: discover, scroll, browse, scoping and bad arguments, on
every store backend (the contract suite's `store` fixture: SQLite and PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from gateway.agent.tools.session_search import Caller, session_search
from state import SessionFilter, Store
from tests.state.conftest import backend, open_test_store, pg_dsn, store  # noqa: F401


@pytest.fixture
def db(store: Store) -> Store:  # noqa: F811
    return store


async def _chat(
    db: Store, user: str, title: str, lines: list[str], source: str = "telegram"
) -> str:
    sid = await db.create_session(source=source, user_id=user, chat_id="c1", title=title)
    await db.append_messages(
        sid,
        [
            {"role": "user" if i % 2 == 0 else "assistant", "content": text}
            for i, text in enumerate(lines)
        ],
    )
    return sid


def _alice() -> SessionFilter:
    return SessionFilter(source="telegram", chat_id="c1", user_id="alice", include_children=True)


async def test_discover_dedupes_by_lineage_and_excludes_the_current_lineage(db: Store) -> None:
    lines = [f"line {i}" for i in range(30)]
    lines[15] = "we talked about the kraken migration"
    old = await _chat(db, "alice", "kraken", lines)
    cont = await db.fork_session(
        old,
        "compression",
        seed_messages=[{"role": "user", "content": "kraken migration continued"}],
        end_reason="compression",
    )
    other = await _chat(db, "alice", "other", ["kraken again", "yes"])
    current = await _chat(db, "alice", "now", ["kraken in the current chat", "ok"])
    out = json.loads(
        await session_search(db, Caller(_alice(), current), {"query": "kraken", "limit": 10})
    )
    assert out["success"] is True
    ids = [r["session_id"] for r in out["results"]]
    assert current not in ids
    assert len(ids) == 2 and other in ids and (old in ids) != (cont in ids)  # one per lineage
    if old in ids:
        res = next(r for r in out["results"] if r["session_id"] == old)
        assert [m["content"] for m in res["bookend_start"]] == ["line 0", "line 1", "line 2"]
        assert [m["content"] for m in res["bookend_end"]] == ["line 27", "line 28", "line 29"]
        assert len(res["messages"]) == 11 and [m for m in res["messages"] if m.get("hit")][0][
            "content"
        ].startswith("we talked")
        assert res["messages_before"] == 10 and res["messages_after"] == 9
        assert ">>>kraken<<<" in res["snippet"]


async def test_discover_truncates_long_messages(db: Store) -> None:
    await _chat(db, "alice", "long", ["needle " + "x" * 2000, "ok"])
    out = json.loads(await session_search(db, Caller(_alice()), {"query": "needle"}))
    content = out["results"][0]["messages"][0]["content"]
    assert content.endswith("chars]") and len(content) < 600


async def test_no_leak_across_users(db: Store) -> None:
    await _chat(db, "bob", "bob secret", ["bob's confidential plan", "ok"])
    bob_sid = (await db.list_sessions(user_id="bob"))[0]["id"]
    out = json.loads(await session_search(db, Caller(_alice()), {"query": "confidential"}))
    assert out == {"success": True, "query": "confidential", "count": 0, "results": []}
    scroll = json.loads(
        await session_search(db, Caller(_alice()), {"session_id": bob_sid, "around_message_id": 1})
    )
    assert scroll == {"success": False, "error": "session not found"}
    browse = json.loads(await session_search(db, Caller(_alice())))
    assert all(s["session_id"] != bob_sid for s in browse["sessions"])


async def test_scroll_repeats_the_edge_message(db: Store) -> None:
    sid = await _chat(db, "alice", "scroll", [f"m{i}" for i in range(40)])
    msgs = await db.get_messages(sid)
    first = json.loads(
        await session_search(
            db,
            Caller(_alice()),
            {"session_id": sid, "around_message_id": msgs[10]["id"], "window": 5},
        )
    )
    assert [m["content"] for m in first["messages"]] == [f"m{i}" for i in range(5, 16)]
    nxt = json.loads(
        await session_search(
            db,
            Caller(_alice()),
            {"session_id": sid, "around_message_id": first["last_message_id"], "window": 5},
        )
    )
    assert nxt["messages"][5]["content"] == "m15" and nxt["messages"][5]["hit"] is True


async def test_browse_lists_recent_sessions(db: Store) -> None:
    a = await _chat(db, "alice", "first", ["hello there"])
    b = await _chat(db, "alice", "second", ["again"])
    out = json.loads(await session_search(db, Caller(_alice(), b)))
    assert [s["session_id"] for s in out["sessions"]] == [b, a]
    assert out["sessions"][0]["current"] is True and out["sessions"][1]["preview"] == "hello there"


@pytest.mark.parametrize(
    "args, phrase",
    [
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": "3"}, "limit"),
        ({"query": "x", "roles": ["god"]}, "roles"),
        ({"query": "***"}, "nothing to search"),
        ({"query": "x", "sort": "up"}, "sort"),
        ({"session_id": "nope", "around_message_id": 1}, "not found"),
        ({"around_message_id": 1}, "session_id"),
        ({"session_id": "x", "around_message_id": "1"}, "integer"),
        ({"bogus": 1}, "unexpected"),
        ({"query": 42}, "string"),
    ],
)
async def test_bad_arguments_give_an_error_object(db: Store, args: dict, phrase: str) -> None:
    out = json.loads(await session_search(db, Caller(_alice()), args))
    assert out["success"] is False and phrase in out["error"]
