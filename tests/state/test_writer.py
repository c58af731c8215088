"""The single writer: group commit, isolation of failures, cancellation, backpressure,
and a second process writing to the same file."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from state import DatabaseBusy, SessionDB, SessionNotFound, WriterClosed, WriterConfig
from state.sqlite.backpressure import Room

ROOT = Path(__file__).resolve().parents[2]


async def test_many_concurrent_producers_all_commit_in_order_per_session(db: SessionDB) -> None:
    """200 producers appending concurrently lose nothing and keep per-producer order."""
    sids = [await db.create_session(source="api") for _ in range(20)]

    async def producer(n: int) -> list[int]:
        sid = sids[n % len(sids)]
        return [await db.append_message(sid, "user", f"p{n} m{i}") for i in range(10)]

    results = await asyncio.gather(*(producer(n) for n in range(200)))
    assert sum(len(r) for r in results) == 2000
    assert all(r == sorted(r) for r in results)
    assert await db.message_count() == 2000
    for sid in sids:
        row = await db.get_session(sid)
        assert row is not None and row["message_count"] == 100
        assert len(await db.get_messages(sid)) == 100
    assert db.writer.stats.batches < 2000  # commits were grouped


async def test_a_failing_operation_fails_only_its_caller(db: SessionDB) -> None:
    sid = await db.create_session(source="api")
    ok1 = db.append_message(sid, "user", "before")
    bad = db.append_message("no-such-session", "user", "lost?")
    ok2 = db.append_message(sid, "user", "after")
    results = await asyncio.gather(ok1, bad, ok2, return_exceptions=True)
    assert isinstance(results[1], SessionNotFound)
    assert isinstance(results[0], int) and isinstance(results[2], int)
    assert [m["content"] for m in await db.get_messages(sid)] == ["before", "after"]
    assert await db.message_count() == 2  # the failed op's insert was rolled back


async def test_a_cancelled_caller_does_not_break_the_writer(db: SessionDB) -> None:
    sid = await db.create_session(source="api")
    tasks = [asyncio.create_task(db.append_message(sid, "user", f"m{i}")) for i in range(50)]
    await asyncio.sleep(0)
    for t in tasks[::2]:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # The writer still works, and every queued append was committed: a queued operation
    # runs even when its caller stops waiting.
    await db.append_message(sid, "user", "after")
    contents = [m["content"] for m in await db.get_messages(sid)]
    assert contents[-1] == "after"
    assert set(contents[:-1]) == {f"m{i}" for i in range(50)}


async def test_producers_wait_when_the_queue_is_full(tmp_path: Path) -> None:
    """A tiny queue bounds memory: producers block in put() instead of piling up."""
    db = await SessionDB.open(tmp_path / "s.db", config=WriterConfig(queue_size=4, max_batch=2))
    try:
        sid = await db.create_session(source="api")
        tasks = [asyncio.create_task(db.append_message(sid, "user", str(i))) for i in range(100)]
        await asyncio.sleep(0)
        assert db.writer.queue_depth <= 4
        await asyncio.gather(*tasks)
        assert await db.message_count(sid) == 100
        assert max(db.writer.stats.batch_sizes) <= 2
    finally:
        await db.close()


async def test_queue_places_go_to_waiters_in_order_and_a_cancelled_one_is_passed_on() -> None:
    room = Room(1)
    await room.take()
    order: list[int] = []

    async def taker(n: int) -> None:
        await room.take()
        order.append(n)

    tasks = [asyncio.create_task(taker(n)) for n in range(3)]
    await asyncio.sleep(0)
    assert room.free == 0 and order == []
    room.give_back()  # the place goes to taker 0 ...
    tasks[0].cancel()  # ... which is cancelled before it runs: taker 1 gets it
    await asyncio.wait_for(asyncio.gather(*tasks[:2], return_exceptions=True), 5)
    assert order == [1] and tasks[0].cancelled() and not tasks[2].done()
    room.give_back()  # taker 1 done
    await asyncio.wait_for(tasks[2], 5)
    assert order == [1, 2]
    room.give_back()  # taker 2 done: the one place is free again, none lost or made
    assert room.free == 1
    await room.take()  # a newcomer with nobody waiting goes straight through
    assert room.free == 0


def _noop(conn: sqlite3.Connection, n: int) -> int:
    conn.execute("SELECT 1")
    return n


async def test_a_caller_writing_one_thing_at_a_time_never_waits_for_company(
    tmp_path: Path,
) -> None:
    db = await SessionDB.open(tmp_path / "s.db", config=WriterConfig(commit_linger_s=0.05))
    pauses: list[float] = []
    db.writer.pause = pauses.append
    try:
        for n in range(20):
            assert await db.writer.submit(_noop, n) == n
        assert pauses == []
        assert db.writer.stats.batch_sizes[-20:] == [1] * 20
    finally:
        await db.close()


async def test_writes_that_arrive_while_a_busy_writer_lingers_share_its_commit(
    tmp_path: Path,
) -> None:
    """Under load (the last batch left writes queued) the writer pauses before it takes
    the next batch; what arrives during the pause joins that batch's commit."""
    db = await SessionDB.open(tmp_path / "s.db", config=WriterConfig(commit_linger_s=0.05))
    loop = asyncio.get_running_loop()
    release, queued = threading.Event(), threading.Event()
    late: list[asyncio.Task[int]] = []
    pauses: list[float] = []

    started = threading.Event()

    def block(conn: sqlite3.Connection) -> int:
        started.set()
        release.wait(10)
        return 0

    def pause(seconds: float) -> None:  # on the writer thread, as the real sleep would be
        pauses.append(seconds)
        if len(pauses) > 1:  # the pause after the shared commit: the load is over
            return

        def submit_late() -> None:
            late.append(loop.create_task(db.writer.submit(_noop, 4)))
            loop.call_soon(queued.set)  # the task has queued its write by its first step

        loop.call_soon_threadsafe(submit_late)
        assert queued.wait(10)

    db.writer.pause = pause
    try:
        first = asyncio.create_task(db.writer.submit(block))
        assert await asyncio.to_thread(started.wait, 10)  # the writer is inside `block`
        queued_meanwhile = [asyncio.create_task(db.writer.submit(_noop, n)) for n in (2, 3)]
        await asyncio.sleep(0)
        before = db.writer.stats.batches
        release.set()
        assert await first == 0
        assert await asyncio.gather(*queued_meanwhile) == [2, 3]
        assert await late[0] == 4
        assert pauses[0] == 0.05
        assert db.writer.stats.batches - before == 2
        assert db.writer.stats.batch_sizes[-2:] == [1, 3]
    finally:
        await db.close()


async def test_a_session_another_program_deleted_takes_no_more_messages(tmp_path: Path) -> None:
    """The writer remembers the sessions it appended to; a deletion committed by another
    connection makes it forget them, so the next append finds the session gone."""
    db = await SessionDB.open(tmp_path / "s.db")
    try:
        sid = await db.create_session(source="api")
        await db.append_message(sid, "user", "one")
        other = sqlite3.connect(tmp_path / "s.db")
        with other:
            other.execute("DELETE FROM messages WHERE session_id = ?", (sid,))
            other.execute("DELETE FROM sessions WHERE id = ?", (sid,))
        other.close()
        with pytest.raises(SessionNotFound):
            await db.append_message(sid, "user", "two")
        assert await db.message_count() == 0
    finally:
        await db.close()


async def test_close_drains_queued_writes_then_refuses_new_ones(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "s.db")
    sid = await db.create_session(source="api")
    pending = [asyncio.create_task(db.append_message(sid, "user", str(i))) for i in range(300)]
    await asyncio.sleep(0)
    await db.close()
    assert all(t.done() and not t.exception() for t in pending)
    with pytest.raises(WriterClosed):
        await db.append_message(sid, "user", "late")
    reopened = await SessionDB.open(tmp_path / "s.db")
    try:
        assert await reopened.message_count(sid) == 300
    finally:
        await reopened.close()


async def test_reads_do_not_wait_behind_a_long_write(db: SessionDB) -> None:
    sid = await db.create_session(source="api")
    await db.append_message(sid, "user", "visible")
    gate = asyncio.Event()
    loop = asyncio.get_running_loop()
    import threading

    release = threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        loop.call_soon_threadsafe(gate.set)
        release.wait(120)  # held until the read below has answered

    slow_task = asyncio.create_task(db.writer.submit(slow))
    await asyncio.wait_for(gate.wait(), 5)
    # The writer is inside a transaction until the read answers: a read that waited behind
    # it would never answer (the deadline only turns that hang into a failure).
    msgs = await asyncio.wait_for(db.get_messages(sid), 60)
    assert [m["content"] for m in msgs] == ["visible"]
    release.set()
    await slow_task


def _hold_lock_script(path: Path, seconds: float) -> str:
    return textwrap.dedent(
        f"""
        import sqlite3, time, sys
        c = sqlite3.connect({str(path)!r}, isolation_level=None)
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO state_meta(key, value) VALUES ('other-process', 'yes')")
        print("locked", flush=True)
        time.sleep({seconds})
        c.execute("COMMIT")
        """
    )


async def test_writes_wait_out_another_process_holding_the_lock(tmp_path: Path) -> None:
    """'database is locked' never reaches the caller: the batch retries with backoff."""
    path = tmp_path / "s.db"
    db = await SessionDB.open(path, config=WriterConfig(busy_timeout_s=0.05, lock_budget_s=20))
    try:
        sid = await db.create_session(source="api")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _hold_lock_script(path, 1.0), stdout=asyncio.subprocess.PIPE
        )
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"locked"
        ids = await asyncio.gather(*(db.append_message(sid, "user", str(i)) for i in range(20)))
        assert len(ids) == 20
        assert await asyncio.wait_for(proc.wait(), 10) == 0
        assert db.writer.stats.busy_retries > 0
        assert await db.get_meta("other-process") == "yes"
    finally:
        await db.close()


@pytest.mark.parametrize("hold_s, budget_s, opens", [(1.0, 30.0, True), (60.0, 0.5, False)])
async def test_opening_waits_out_a_lock_held_elsewhere_then_says_busy(
    tmp_path: Path, hold_s: float, budget_s: float, opens: bool
) -> None:
    """Start-up migrates under a write lock: a lock held by another process is waited out
    (recognised by SQLite's BUSY code), and past the budget the error says what happened."""
    path = tmp_path / "s.db"
    await (await SessionDB.open(path)).close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _hold_lock_script(path, hold_s), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"locked"
        config = WriterConfig(busy_timeout_s=0.05, lock_budget_s=budget_s)
        if opens:
            db = await SessionDB.open(path, config=config)
            try:
                assert await db.get_meta("other-process") == "yes"
            finally:
                await db.close()
        else:
            with pytest.raises(DatabaseBusy, match="locked by another process during start-up"):
                await SessionDB.open(path, config=config)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def test_two_processes_writing_the_same_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    db = await SessionDB.open(path)
    try:
        sid = await db.create_session(source="api")
        other = textwrap.dedent(
            f"""
            from state.hermes.compat import SessionDB
            db = SessionDB({str(path)!r})
            for i in range(200):
                db.append_message({sid!r}, "assistant", f"other {{i}}")
            db.close()
            """
        )
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", other)
        mine = [db.append_message(sid, "user", f"mine {i}") for i in range(200)]
        await asyncio.gather(*mine)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        msgs = await db.get_messages(sid)
        assert len(msgs) == 400
        row = await db.get_session(sid)
        assert row is not None and row["message_count"] == 400
    finally:
        await db.close()


async def test_merged_appends_return_the_ids_the_rows_really_got(db: SessionDB) -> None:
    """Concurrent appends are merged into one executemany; each caller still gets its own ids."""
    sids = [await db.create_session(source="api") for _ in range(5)]
    await db.append_message(sids[0], "user", "x")
    # leave a gap at the top of the id sequence: AUTOINCREMENT must not reuse it
    m = await db.append_message(sids[0], "user", "to delete")
    await db.clear_messages(sids[0])
    calls = [
        db.append_messages(
            sids[i % 5],
            [{"role": "user", "content": f"c{i} a"}, {"role": "assistant", "content": f"c{i} b"}],
        )
        for i in range(100)
    ]
    results = await asyncio.gather(*calls)
    assert min(min(r) for r in results) > m
    for i, ids in enumerate(results):
        rows = await db.get_messages_around(sids[i % 5], ids[0], 0)
        assert rows[0]["content"] == f"c{i} a"
        rows = await db.get_messages_around(sids[i % 5], ids[1], 0)
        assert rows[0]["content"] == f"c{i} b"
    assert max(db.writer.stats.batch_sizes) > 1
    assert db.writer.stats.fallbacks == 0  # the merged path handled every batch


async def test_merged_appends_dedupe_and_count_tokens(db: SessionDB) -> None:
    """Within one merged batch: the second copy of a platform id stores nothing, tokens add up."""
    sid = await db.create_session(source="telegram", chat_id="c1")
    msg = {"role": "user", "content": "hi", "platform_message_id": "p1"}
    calls = [db.append_messages(sid, [msg], dedupe=("telegram", "c1")) for _ in range(3)]
    calls += [
        db.append_messages(
            sid, [{"role": "assistant", "content": "r"}], input_tokens=2, output_tokens=3
        )
        for _ in range(4)
    ]
    results = await asyncio.gather(*calls)
    assert sum(1 for r in results[:3] if r) == 1
    assert all(len(r) == 1 for r in results[3:])
    row = await db.require_session(sid)
    assert (row["message_count"], row["input_tokens"], row["output_tokens"]) == (5, 8, 12)
    assert await db.append_messages(sid, [msg], dedupe=("telegram", "c1")) == []
    assert db.writer.stats.fallbacks == 0


async def test_a_cancelled_read_frees_its_connection_for_the_next_caller(db: SessionDB) -> None:
    """Cancelling a slow read interrupts it; the pool keeps working with every connection."""
    import sqlite3 as _sqlite3

    def slow(conn: _sqlite3.Connection) -> int:
        # a recursive query that runs until interrupted
        return conn.execute(
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT COUNT(*) FROM n"
        ).fetchone()[0]

    task = asyncio.create_task(db._read(slow))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    sid = await db.create_session(source="api")
    # more reads than connections, all answered: the interrupted slot came back
    rows = await asyncio.wait_for(asyncio.gather(*(db.get_session(sid) for _ in range(10))), 5)
    assert all(r is not None for r in rows)


async def test_append_and_read_returns_the_history_of_its_own_transaction(db: SessionDB) -> None:
    """Merged or not, each caller gets its ids and the window ending with its own message;
    a duplicate stores nothing and gets no history."""
    a = await db.create_session(source="telegram", chat_id="ca")
    b = await db.create_session(source="telegram", chat_id="cb")
    await db.append_messages(
        a, [{"role": "user", "content": "old"}, {"role": "assistant", "content": "reply"}]
    )
    calls = [
        db.append_and_read(
            a,
            [{"role": "user", "content": "new a", "platform_message_id": "1"}],
            dedupe=("telegram", "ca"),
            last=2,
        ),
        db.append_and_read(
            b,
            [{"role": "user", "content": "new b", "platform_message_id": "1"}],
            dedupe=("telegram", "cb"),
            last=10,
        ),
        db.append_and_read(
            a,
            [{"role": "user", "content": "again", "platform_message_id": "1"}],
            dedupe=("telegram", "ca"),
            last=2,
        ),
    ]
    calls.append(db.append_and_read(a, [{"role": "user", "content": "later a"}], last=3))
    (ids_a, hist_a), (ids_b, hist_b), (ids_dup, hist_dup), (_, hist_later) = await asyncio.gather(
        *calls
    )
    assert max(db.writer.stats.batch_sizes) == 4  # all four merged into one batch
    # each history ends at its caller's own message, even with a later one in the batch
    assert len(ids_a) == 1 and [m["content"] for m in hist_a] == ["reply", "new a"]
    assert [m["content"] for m in hist_later] == ["reply", "new a", "later a"]
    assert len(ids_b) == 1 and hist_b == [{"role": "user", "content": "new b"}]
    assert (ids_dup, hist_dup) == ([], [])
    alone = await db.append_and_read(
        b, [{"role": "assistant", "content": "r", "tool_calls": [{"id": "x"}]}], last=None
    )
    assert [m["content"] for m in alone[1]] == ["new b", "r"] and alone[1][-1]["tool_calls"] == [
        {"id": "x"}
    ]
    assert db.writer.stats.fallbacks == 0


async def _write_until_checkpointed(path: Path, config: WriterConfig) -> tuple[int, int]:
    """Append continuously (no idle moment for the WAL to restart by itself) until 6,000
    messages are in and the background checkpointer has run 30 times (counted, not timed:
    a slow host writes the same amount); return (largest WAL size, restarts)."""
    db = await SessionDB.open(path, config=config)
    try:
        sids = [await db.create_session(source="api") for _ in range(50)]
        largest = 0
        stop = asyncio.Event()
        appended = 0

        async def producer(n: int) -> None:
            nonlocal appended
            i = 0
            while not stop.is_set():
                await db.append_message(sids[(n + i) % 50], "user", f"producer {n} line {i} " * 8)
                i += 1
                appended += 1

        tasks = [asyncio.create_task(producer(n)) for n in range(20)]
        deadline = asyncio.get_running_loop().time() + 120  # only a stalled writer fails
        while appended < 6_000 or db.writer.checkpoints < 30:
            assert asyncio.get_running_loop().time() < deadline, (appended, db.writer.checkpoints)
            await asyncio.sleep(0.01)
            largest = max(largest, (path.parent / (path.name + "-wal")).stat().st_size)
        stop.set()
        await asyncio.gather(*tasks)
        return largest, db.writer.wal_restarts
    finally:
        await db.close()


@pytest.mark.slow
async def test_the_wal_restarts_under_continuous_writes_without_sqlites_own_checkpoint(
    tmp_path: Path,
) -> None:
    """The background checkpointer copies frames back; the writer finishes between batches,
    so the WAL starts over long before SQLite's in-commit checkpoint (the safety net, here
    out of reach) would act. Without the hand-off the WAL grows with every write."""
    common = {
        "checkpoint_every_s": 0.02,
        "checkpoint_wal_bytes": 0,
        "writer_checkpoint_pages": 1_000_000,
    }
    bounded, restarts = await _write_until_checkpointed(
        tmp_path / "a.db", WriterConfig(restart_wal_frames=100, **common)
    )
    unbounded, no_restarts = await _write_until_checkpointed(
        tmp_path / "b.db", WriterConfig(restart_wal_frames=10**9, **common)
    )
    assert restarts > 0 and no_restarts == 0
    assert bounded < unbounded / 3, (bounded, unbounded)
    print(f"WAL at most {bounded} bytes with restarts, {unbounded} without")
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()


@pytest.mark.parametrize("merged", [False, True], ids=["one append", "merged appends"])
async def test_last_active_moves_with_one_second_resolution(db: SessionDB, merged: bool) -> None:
    """Counters follow every append; last_active moves only for a message at least a second
    newer than the stored value, and never backwards."""
    sid, other = [await db.create_session(source="api") for _ in range(2)]

    async def append(*timestamps: float) -> None:
        if not merged:
            for t in timestamps:
                await db.append_message(sid, "user", f"at {t}", timestamp=t)
            return
        # queued together (with another session's append alongside): one merged batch
        calls = [db.append_message(sid, "user", f"at {t}", timestamp=t) for t in timestamps]
        calls.append(db.append_message(other, "user", "x", timestamp=timestamps[0]))
        await asyncio.gather(*calls)

    async def state() -> tuple[float, int]:
        row = await db.require_session(sid)
        return row["last_active"], row["message_count"]

    t = (await db.require_session(sid))["started_at"] + 100  # well after creation
    await append(t)
    assert await state() == (t, 1)
    await append(t + 0.4, t + 0.9)
    assert await state() == (t, 3)
    await append(t + 1.2)
    assert await state() == (t + 1.2, 4)
    await append(t - 3600)  # an older message (an import) never moves it back
    assert await state() == (t + 1.2, 5)
    if merged:
        assert max(db.writer.stats.batch_sizes) > 1


def test_a_program_that_never_closes_the_store_still_exits(tmp_path: Path) -> None:
    """A script that crashes with the store open exits (with its error) instead of hanging
    at exit on the writer's thread; what it committed is in the file."""
    script = textwrap.dedent(
        f"""
        import asyncio
        from state import SessionDB

        async def main():
            db = await SessionDB.open({str(tmp_path / "s.db")!r})
            sid = await db.create_session(source="api", session_id="s1")
            await db.append_message(sid, "user", "kept")
            raise SystemExit(3)  # no close()

        asyncio.run(main())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 3, proc.stderr
    conn = sqlite3.connect(tmp_path / "s.db")
    try:
        assert conn.execute("SELECT content FROM messages").fetchall() == [("kept",)]
    finally:
        conn.close()
