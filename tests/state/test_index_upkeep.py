"""What keeps a search cheap on SQLite: the indexes' segments merged while nobody writes
(the daemon's writer when idle, the Hermes facade at close), short reads on the event loop's
thread with long ones moved to a reader thread, and the ranking's narrowed first look."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest

from state import SessionDB, WriterConfig
from state.hermes.compat import SessionDB as HermesSessionDB
from state.sqlite import compaction, readers
from state.sqlite import search as sqlite_search
from state.sqlite.schema import FTS_TABLE

LONG_READ = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 2000000) "
    "SELECT COUNT(*) FROM c"
)


def _segments(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return compaction.segments(conn, FTS_TABLE)


async def _fragmented(path: Path, n: int) -> int:
    """A file whose index was written one message per transaction, never merged while
    idle; returns how many segments its main index holds."""
    db = await SessionDB.open(path, config=WriterConfig(merge_idle_s=None))
    sid = await db.create_session(source="api", session_id="s1")
    for i in range(n):
        await db.append_message(sid, "user", f"note w{i}x about the harbour")
    await db.close()
    return _segments(path)


async def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60  # a safety net against a hang, not a measurement
    while not done():
        assert time.monotonic() < deadline, "the condition never came true"
        await asyncio.sleep(0.01)


async def test_an_idle_writer_merges_the_index_into_fewer_segments_losing_no_row(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    before = await _fragmented(path, 300)
    assert before >= 6
    db = await SessionDB.open(path, config=WriterConfig(merge_idle_s=0.01))
    try:
        await _until(lambda: not db.writer.merge_pending)
        assert db.writer.merge_steps > 0
        assert _segments(path) < before
        assert len(await db.search_messages("harbour", limit=1000)) == 300
        for i in range(0, 300, 13):
            assert [h["snippet"] for h in await db.search_messages(f"w{i}x")] == [
                f"note >>>w{i}x<<< about the harbour"
            ]
        assert await db.check_search_index() == []
        # a write makes merging due again; the next idle moment finds it compact
        await db.append_message("s1", "user", "one more note about the harbour")
        await _until(lambda: not db.writer.merge_pending)
        assert len(await db.search_messages("harbour", limit=1000)) == 301
    finally:
        await db.close()


async def test_a_write_arriving_during_the_merge_goes_before_the_rest_of_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    before = await _fragmented(path, 300)
    # A merge step writes index blocks: a trigger holds the first one until told to go on.
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(
            f"CREATE TRIGGER hold AFTER INSERT ON {FTS_TABLE}_data BEGIN SELECT hold(); END"
        )
        conn.commit()
    entered, go_on = threading.Event(), threading.Event()

    def hold() -> int:
        if not entered.is_set():
            entered.set()
            assert go_on.wait(60)
        return 0

    db = await SessionDB.open(path, config=WriterConfig(merge_idle_s=3600))
    writer = db.writer
    try:
        await writer.submit(lambda c: c.create_function("hold", 0, hold))
        writer.config = dataclasses.replace(writer.config, merge_idle_s=0.0)
        await writer.submit(lambda c: None)  # the next idle moment merges at once
        assert await asyncio.to_thread(entered.wait, 60)  # inside the first merge step
        # what the writer had left to do when this write's turn came
        state = asyncio.ensure_future(
            writer.submit(lambda c: (writer.merge_pending, writer.merge_steps))
        )
        await _until(lambda: writer.queue_depth == 1)
        go_on.set()
        pending, steps = await state
        assert pending and steps == 1  # the write went first, after the step under way
        await _until(lambda: not writer.merge_pending)
        assert writer.merge_steps > steps  # and merging went on after it
        assert _segments(path) < before
        assert len(await db.search_messages("harbour", limit=1000)) == 300
    finally:
        go_on.set()
        await db.close()


async def test_merging_waits_while_another_program_holds_the_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    before = await _fragmented(path, 100)
    db = await SessionDB.open(path, config=WriterConfig(merge_idle_s=3600))
    writer = db.writer
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        writer.config = dataclasses.replace(writer.config, merge_idle_s=0.01)
        await writer.exclusive(lambda c: None)  # (takes no lock) the next idle moment merges
        await asyncio.sleep(0.3)
        assert writer.merge_steps == 0 and writer.merge_pending
        other.execute("COMMIT")
        await _until(lambda: not writer.merge_pending)
        assert writer.merge_steps > 0
        assert _segments(path) < before
    finally:
        other.close()
        await db.close()


def test_the_hermes_facade_merges_the_index_at_close(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    db = HermesSessionDB(path)
    db.create_session("s1", "cli")
    for i in range(300):
        db.append_message("s1", "user", f"note w{i}x about the harbour")
    before = _segments(path)
    db.close()
    assert _segments(path) < before
    again = HermesSessionDB(path)
    try:
        assert len(again.search_messages("harbour", limit=500)) == 300
        assert again.search_messages("w77x")[0]["snippet"] == "note >>>w77x<<< about the harbour"
    finally:
        again.close()


async def test_a_short_read_runs_on_the_loop_thread_and_a_long_one_on_a_reader(
    db: SessionDB,
) -> None:
    loop_thread = threading.get_ident()
    pool = db._readers

    def where(conn: sqlite3.Connection) -> int:
        return threading.get_ident()

    def long_read(conn: sqlite3.Connection) -> tuple[int, int]:
        return conn.execute(LONG_READ).fetchone()[0], threading.get_ident()

    def swallowing(conn: sqlite3.Connection) -> tuple[int, int]:
        try:
            return long_read(conn)
        except sqlite3.OperationalError:  # an answer cut short must not count
            return -1, threading.get_ident()

    def heavy(conn: sqlite3.Connection) -> int:
        readers.heavy(conn)
        return threading.get_ident()

    assert await pool.run_short(where) == loop_thread
    for fn in (long_read, swallowing):
        count, thread = await pool.run_short(fn)
        assert count == 2000000 and thread != loop_thread
    assert await pool.run_short(heavy) != loop_thread
    assert await pool.run_short(where) == loop_thread  # the loop's connection still serves


async def test_a_read_stopped_at_the_budget_leaves_the_loop_a_fresh_connection(
    db: SessionDB,
) -> None:
    """A connection with a statement SQLite stopped midway runs later reads slower, so the
    loop's connection is replaced after such a stop; a read that finishes, or one that says
    it is heavy (no statement stopped), keeps it."""
    loop_thread = threading.get_ident()

    def which(conn: sqlite3.Connection) -> tuple[sqlite3.Connection, int]:
        return conn, threading.get_ident()

    def heavy(conn: sqlite3.Connection) -> int:
        readers.heavy(conn)
        return threading.get_ident()

    def long_read(conn: sqlite3.Connection) -> int:
        return int(conn.execute(LONG_READ).fetchone()[0])

    first, thread = await db._readers.run_short(which)
    assert thread == loop_thread
    assert (await db._readers.run_short(which))[0] is first  # kept between reads
    assert await db._readers.run_short(heavy) != loop_thread
    assert (await db._readers.run_short(which))[0] is first  # moved, not stopped: kept
    assert await db._readers.run_short(long_read) == 2000000  # stopped, then on a reader
    again, thread = await db._readers.run_short(which)
    assert thread == loop_thread and again is not first
    assert again.execute("SELECT count(*) FROM sessions").fetchone() == (0,)  # it serves


async def test_a_read_too_long_for_the_loop_once_goes_to_a_reader_at_once(db: SessionDB) -> None:
    threads: list[int] = []

    def long_read(conn: sqlite3.Connection, upto: int) -> int:
        threads.append(threading.get_ident())
        return int(conn.execute(LONG_READ.replace("2000000", str(upto))).fetchone()[0])

    assert await db._readers.run_short(long_read, 2000000) == 2000000
    assert len(threads) == 2 and threads[0] == threading.get_ident() != threads[1]
    threads.clear()
    assert await db._readers.run_short(long_read, 2000000) == 2000000
    assert len(threads) == 1 and threads[0] != threading.get_ident()
    threads.clear()
    assert await db._readers.run_short(long_read, 10) == 10  # other arguments: on the loop
    assert threads == [threading.get_ident()]


async def test_a_search_cut_short_on_the_loop_answers_the_same_from_a_reader(
    db: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await db.create_session(source="api")
    for i in range(60):
        await db.append_message(sid, "user", f"the harbour crane {i} lifts a harbour box")
    expected = await db.search_messages("harbour crane", limit=10)
    monkeypatch.setattr(readers, "INLINE_BUDGET_S", -1.0)  # every statement outlasts it
    assert await db.search_messages("harbour crane", limit=10) == expected


async def test_the_narrowed_first_look_ranks_as_the_whole_window(
    db: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The best by bm25() alone are old here, so age decides the page beyond them."""
    sid = await db.create_session(source="api")
    now = time.time()
    for i in range(120):
        old = i % 3 == 0
        text = "kiwi kiwi kiwi mango" if old else f"kiwi mango note {i} " + "filler " * (i % 7)
        await db.append_message(sid, "user", text, timestamp=now - (400 * 86400 if old else i))
    for query, limit in (("kiwi mango", 20), ("kiwi mango", 5), ("kiwi", 30)):
        narrowed = await db.search_messages(query, limit=limit)
        monkeypatch.setattr(sqlite_search, "NARROW_EXTRA", 10_000)  # the whole window at once
        whole = await db.search_messages(query, limit=limit)
        monkeypatch.undo()
        assert [h["id"] for h in narrowed] == [h["id"] for h in whole]
        assert len(narrowed) == limit
