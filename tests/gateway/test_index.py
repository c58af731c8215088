"""sessions.json: debounced atomic writes, rebuild from state.db, healing on start-up."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.index import IndexEntry, SessionIndex
from state import SessionDB


async def _until(condition: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for a background flush; the deadline only catches one that never comes."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _entry(sid: str) -> IndexEntry:
    now = time.time()
    return IndexEntry(sid, now, now, {"platform": "api", "chat_id": "1"}, None, "api", "dm")


async def test_a_burst_of_changes_costs_one_write(db: SessionDB, tmp_path: Path) -> None:
    index = SessionIndex(tmp_path / "sessions.json", db, flush_interval=0.2)
    await index.load()
    await index.flush()
    writes = index.writes
    for i in range(500):
        index.put(f"k{i}", _entry(f"s{i}"))
        index.touch(f"k{i}")
    await _until(lambda: index.writes > writes)
    await asyncio.sleep(0.5)  # more than two flush intervals: a second write would show
    assert index.writes == writes + 1
    data = json.loads((tmp_path / "sessions.json").read_text())
    assert len(data) == 500 and data["k7"]["session_id"] == "s7"
    assert data["k7"]["created_at"].endswith("Z")
    await index.close()


async def test_the_file_always_says_what_the_entries_say(db: SessionDB, tmp_path: Path) -> None:
    """Touched entries are re-encoded from cached pieces; any other change re-encodes them
    in full. Either way the file must equal the entries' own JSON."""
    path = tmp_path / "sessions.json"
    index = SessionIndex(path, db, flush_interval=60)
    await index.load()
    for i in range(6):
        index.put(f"k{i}", _entry(f"s{i}"))
    await index.flush()
    index.touch("k1", 2_000_000_000)
    index.touch("k2", 2_000_000_100)
    old = index.get("k3")
    assert old is not None
    index.put(
        "k3",
        IndexEntry(
            "switched",
            old.created_at,
            old.updated_at,
            {"platform": "api", "chat_id": "1", "chat_name": 'Ann "the" 🦊'},
            "Ann",
            "api",
            "group",
        ),
    )
    index.touch("k3", 2_000_000_200)
    index.remove("k4")
    await index.close()
    on_disk = json.loads(path.read_text())
    assert on_disk == {k: e.to_json() for k, e in index.items()}
    assert on_disk["k1"]["updated_at"] == "2033-05-18T03:33:20Z"
    assert on_disk["k3"]["session_id"] == "switched" and on_disk["k3"]["chat_type"] == "group"
    assert "k4" not in on_disk and len(on_disk) == 5


async def test_missing_or_corrupt_file_is_rebuilt_from_state_db(
    db: SessionDB, tmp_path: Path
) -> None:
    live = await db.create_session(
        source="telegram",
        session_key="agent:main:telegram:dm:1",
        chat_id="1",
        chat_type="dm",
        origin_json={"platform": "telegram", "chat_id": "1", "chat_name": "Ann"},
    )
    ended = await db.create_session(
        source="telegram", session_key="agent:main:telegram:dm:2", chat_id="2"
    )
    await db.end_session(ended, "session_reset")
    path = tmp_path / "sessions" / "sessions.json"
    for content in (None, b"{not json", b"[1, 2]"):
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(content)
        index = SessionIndex(path, db, 0.05)
        how = await index.load()
        assert how.startswith("rebuilt")
        assert [(k, e.session_id, e.display_name) for k, e in index.items()] == [
            ("agent:main:telegram:dm:1", live, "Ann")
        ]
        await index.close()
        assert json.loads(path.read_text())["agent:main:telegram:dm:1"]["session_id"] == live


async def test_entries_for_ended_sessions_are_healed_or_dropped(
    db: SessionDB, tmp_path: Path
) -> None:
    compressed = await db.create_session(source="api", session_key="k1")
    tip = await db.fork_session(compressed, "compression", end_reason="compression")
    reset = await db.create_session(source="api", session_key="k2")
    await db.end_session(reset, "idle")
    path = tmp_path / "sessions.json"
    path.write_text(
        json.dumps(
            {
                "k1": _entry(compressed).to_json(),
                "k2": _entry(reset).to_json(),
                "k3": _entry("gone").to_json(),
            }
        )
    )
    index = SessionIndex(path, db, 0.05)
    assert await index.load() == "loaded"
    assert {k: e.session_id for k, e in index.items()} == {"k1": tip}
    await index.close()


async def test_a_file_behind_state_db_adopts_the_newest_live_session_per_key(
    db: SessionDB, tmp_path: Path
) -> None:
    """After an unclean stop the file can miss sessions created since its last write."""
    old = await db.create_session(source="api", session_key="k1")
    keyless = await db.create_session(source="api")  # live, but no key: kept, not healed away
    still_live = await db.create_session(source="api", session_key="k5")
    path = tmp_path / "sessions.json"
    path.write_text(
        json.dumps(
            {
                "k1": _entry(old).to_json(),
                "k4": _entry(keyless).to_json(),
                "k5": _entry(still_live).to_json(),
            }
        )
    )
    newest_k5 = await db.create_session(source="api", session_key="k5")  # both live: newest wins
    await db.end_session(old, "session_reset")
    await db.create_session(source="api", session_key="k1")  # superseded by the next one
    newer = await db.create_session(source="api", session_key="k1")
    fresh = await db.create_session(
        source="telegram", session_key="k2", origin_json={"user_name": "Bo"}
    )
    await db.create_session(source="cli", session_key="agent:main:cli:dm:local")
    index = SessionIndex(path, db, 0.05)
    assert await index.load() == "loaded"
    assert {k: e.session_id for k, e in index.items()} == {
        "k1": newer,
        "k2": fresh,
        "k4": keyless,
        "k5": newest_k5,
    }
    got = index.get("k2")
    assert got is not None and got.display_name == "Bo" and got.platform == "telegram"
    await index.close()
    assert set(json.loads(path.read_text())) == {"k1", "k2", "k4", "k5"}


@pytest.mark.slow
def test_a_kill_during_writes_leaves_the_old_or_the_new_file(tmp_path: Path) -> None:
    """SIGKILL at random moments while the index rewrites a large file: never a torn file."""
    path = tmp_path / "sessions.json"
    script = textwrap.dedent(
        f"""
        import json, sys
        from pathlib import Path
        from gateway.index import write_atomic
        path = Path({str(path)!r})
        n = 0
        while True:
            n += 1
            payload = json.dumps({{"generation": n, "pad": "x" * 400_000}}).encode()
            write_atomic(path, payload)
            print(n, flush=True)
        """
    )
    seen = []
    for round_ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for _ in range(1 + round_ % 5):
            proc.stdout.readline()
        time.sleep(0.001 * (round_ % 7))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        data = json.loads(path.read_text())  # must parse: old or new, never a mix
        assert data["pad"] == "x" * 400_000
        seen.append(data["generation"])
    assert all(g >= 1 for g in seen)


async def test_a_malformed_entry_is_dropped_on_use_and_the_rest_kept(
    db: SessionDB, tmp_path: Path
) -> None:
    sid = await db.create_session(source="api", session_key="good")
    path = tmp_path / "sessions.json"
    bad = {"session_id": sid, "created_at": "not a date", "updated_at": "x"}
    path.write_text(json.dumps({"good": _entry(sid).to_json(), "bad": bad}))
    index = SessionIndex(path, db, 0.05)
    assert await index.load() == "loaded"
    assert index.get("good") is not None and index.get("good").session_id == sid
    assert index.get("bad") is None
    assert [k for k, _ in index.items()] == ["good"]
    await index.close()
    assert set(json.loads(path.read_text())) == {"good"}


async def test_incremental_flushes_write_the_same_file_as_a_full_one(
    db: SessionDB, tmp_path: Path
) -> None:
    """After load, changes, removals and touches, the file holds exactly the entries."""
    sids = [await db.create_session(source="api") for _ in range(30)]
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({f"k{i}": _entry(sids[i]).to_json() for i in range(20)}))
    index = SessionIndex(path, db, 0.05)
    await index.load()
    index.touch("k3", 1_000_000.0)
    index.remove("k4")
    index.put("k25", _entry(sids[25]))
    await index.flush()
    on_disk = json.loads(path.read_text())
    assert set(on_disk) == ({f"k{i}" for i in range(20)} - {"k4"}) | {"k25"}
    assert on_disk["k3"]["updated_at"] == "1970-01-12T13:46:40Z"
    index.put("k26", _entry(sids[26]))
    await index.flush()
    assert set(json.loads(path.read_text())) == set(on_disk) | {"k26"}
    assert {k: e.session_id for k, e in index.items()} == {
        k: v["session_id"] for k, v in json.loads(path.read_text()).items()
    }
    await index.close()


async def test_activity_is_written_lazily_but_never_lost_on_close(
    db: SessionDB, tmp_path: Path
) -> None:
    sid = await db.create_session(source="api")
    path = tmp_path / "sessions.json"
    index = SessionIndex(path, db, flush_interval=0.05, activity_interval=0.3)
    await index.load()
    index.put("k", _entry(sid))
    await index.flush()
    index.touch("k", 2_000_000.0)
    await index.flush()  # a structural flush does not wait for, or write, activity
    assert json.loads(path.read_text())["k"]["updated_at"] != "1970-01-24T03:33:20Z"
    await _until(  # once the activity interval has passed
        lambda: json.loads(path.read_text())["k"]["updated_at"] == "1970-01-24T03:33:20Z"
    )
    index.touch("k", 3_000_000.0)
    await index.close()
    assert json.loads(path.read_text())["k"]["updated_at"] == "1970-02-04T17:20:00Z"


async def test_a_stale_file_after_a_crash_adopts_the_sessions_state_db_has(
    db: SessionDB, tmp_path: Path
) -> None:
    """A session created after the last flush (then SIGKILL) is adopted, not duplicated."""
    old = await db.create_session(source="api", session_key="k1", chat_id="1")
    path = tmp_path / "sessions.json"
    path.write_text(json.dumps({"k1": _entry(old).to_json()}))
    newer = await db.fork_session(
        old, "reset", end_reason="session_reset"
    )  # the file never saw this
    unseen = await db.create_session(source="api", session_key="k2", chat_id="2")
    await db.create_session(
        source="cli", session_key="agent:main:cli:dm:me"
    )  # terminal: not routed
    index = SessionIndex(path, db, 0.05)
    assert await index.load() == "loaded"
    assert {k: e.session_id for k, e in index.items()} == {"k1": newer, "k2": unseen}
    await index.close()
