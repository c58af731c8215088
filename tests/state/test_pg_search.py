"""What only the PostgreSQL store's search has to show: how many round trips to the server
a search takes (libpq's protocol trace of a real connection counts them)."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace

import psycopg
import pytest
from psycopg import pq

from state.pg import db, slices
from state.pg import search as pg_search
from state.pg.store import PgStore
from state.records import SearchHit
from state.sqlite.search import SearchRequest
from tests import pgserver


@pytest.fixture
async def schema_dsn(pg_dsn: str) -> AsyncIterator[str]:
    name = pgserver.fresh_schema(pg_dsn)
    try:
        yield pgserver.with_schema(pg_dsn, name)
    finally:
        pgserver.drop_schema(pg_dsn, name)


async def _traced(
    conn: psycopg.AsyncConnection, req: SearchRequest, totals: pg_search.Totals
) -> tuple[list[int], int]:
    """A search's hit ids and the statements it sent (a Sync each)."""
    hits, syncs = await _traced_hits(conn, req, totals)
    return [h["id"] for h in hits], syncs


async def _traced_hits(
    conn: psycopg.AsyncConnection, req: SearchRequest, totals: pg_search.Totals
) -> tuple[list[SearchHit], int]:
    """A search's hits and the statements it sent (a Sync each)."""
    with tempfile.TemporaryFile("w+") as fh:
        conn.pgconn.trace(fh.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            hits = await pg_search.search(conn, req, totals)
        finally:
            conn.pgconn.untrace()
        fh.seek(0)
        syncs = sum(1 for line in fh if line.split("\t")[:1] == ["F"] and "Sync" in line)
    return hits, syncs


async def test_a_search_on_a_small_store_is_two_round_trips_new_messages_included(
    schema_dsn: str,
) -> None:
    """Each index's window, its rows, the id range and what ranking counts come in one
    statement, the page's sessions, neighbours and snippet texts in another; messages
    written after a search are in the next one's first statement."""
    store = await PgStore.open(schema_dsn)
    try:
        for s in range(4):
            sid = await store.create_session(f"s{s}", "cli")
            for i in range(10):
                text = f"deploy the gateway {s}-{i}" if i % 3 == 0 else f"chat {s} {i} 北京天气"
                await store.append_message(sid, "user", text)
        req = SearchRequest(query="deploy gateway", limit=5)
        expected = [h["id"] for h in await store.search_messages("deploy gateway", limit=5)]
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            totals = pg_search.Totals()
            await pg_search.search(conn, req, totals)  # the id range and totals are learnt
            assert await _traced(conn, req, totals) == (expected, 2)
            newest = await store.append_message("s0", "user", "deploy the gateway again")
            ids, syncs = await _traced(conn, req, totals)
            assert ids[0] == newest and syncs == 2
            side = await _traced(conn, SearchRequest(query="北京", limit=5), totals)
            assert len(side[0]) == 5 and side[1] == 2
    finally:
        await store.close()


async def test_a_kept_term_count_gets_the_rows_written_since(
    schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a table whose totals are kept between searches, each term's document count is
    kept with the id it was counted up to, and the next search adds the rows written since
    in its first statement: the counts, and so the order, are those a fresh count gives
    (the 9 hits fit in the page: the search is that one statement)."""
    monkeypatch.setattr(slices, "EXACT_TOTALS_BELOW", 20)  # this table is a big one
    store = await PgStore.open(schema_dsn)
    try:
        sid = await store.create_session("s", "cli")
        for i in range(40):
            words = ["deploy"] * (i % 3 == 0) + ["gateway"] * (i % 4 == 0) + [f"note {i}"]
            await store.append_message(sid, "user", " ".join(words))
        req = SearchRequest(query="deploy gateway", limit=10)
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            kept = pg_search.Totals()
            await pg_search.search(conn, req, kept)
            await pg_search.search(conn, req, kept)  # the table's size is known: counts kept
            top = await db_value(conn, "SELECT MAX(id) FROM messages")
            assert kept.df_since("tsv", "'deploy'") == (14, top)
            for _ in range(5):
                await store.append_message(sid, "user", "deploy deploy gateway again")
            await store.append_message(sid, "user", "deploy only")
            ids, syncs = await _traced(conn, req, kept)
            top = await db_value(conn, "SELECT MAX(id) FROM messages")
            assert kept.df_since("tsv", "'deploy'") == (20, top)
            assert kept.df_since("tsv", "'gateway'") == (15, top)
            assert len(ids) == 9 and syncs == 1
            assert ids == [h["id"] for h in await pg_search.search(conn, req, pg_search.Totals())]
    finally:
        await store.close()


async def db_value(conn: psycopg.AsyncConnection, sql: str) -> int:
    cur = await conn.execute(sql)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_the_server_counts_one_word_terms_in_the_window_and_long_rows_bring_their_text(
    schema_dsn: str,
) -> None:
    """Ranking by one-word terms takes each window row's occurrences from the server (its
    vector's positions), so rows off the page never travel as text; a row of 256 tokens or
    more (a vector keeps 256 positions of a word) comes with its text and is counted there:
    300 occurrences outrank 280 in otherwise equal rows."""
    store = await PgStore.open(schema_dsn)
    try:
        ids = {}
        for i in range(12):  # each in a session of its own: no neighbours on the page
            sid = await store.create_session(f"s{i}", "cli")
            ids[f"mark{i}q"] = await store.append_message(sid, "user", f"alpha beta mark{i}q")
        sid = await store.create_session("long", "cli")
        many = await store.append_message(sid, "user", "alpha " * 300 + "beta")
        fewer = await store.append_message(sid, "user", "alpha " * 280 + "beta " + "pad " * 20)
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            totals = pg_search.Totals()
            every = await pg_search.search(conn, SearchRequest(query="alpha beta"), totals)
            order = [h["id"] for h in every]
            assert order.index(many) < order.index(fewer)
            with tempfile.TemporaryFile("w+") as fh:
                conn.pgconn.trace(fh.fileno())
                try:
                    page = await pg_search.search(
                        conn, SearchRequest(query="alpha beta", limit=1), totals
                    )
                finally:
                    conn.pgconn.untrace()
                fh.seek(0)
                trace = fh.read()
        off = [mark for mark, mid in ids.items() if mid != page[0]["id"]]
        assert len(off) == 11 and not [mark for mark in off if mark in trace]
    finally:
        await store.close()


async def test_a_search_whose_hits_fit_in_the_page_is_one_round_trip(schema_dsn: str) -> None:
    """When every index is read whole and its hits fit in the page, their neighbours,
    snippets and sessions come in the first statement: the hits are those the two-statement
    search gives (a smaller page), field for field."""
    store = await PgStore.open(schema_dsn)
    try:
        for s in range(3):
            sid = await store.create_session(f"s{s}", "cli", model=f"m{s}")
            for i in range(6):
                text = f"the rollout of canary {s}" if i == 2 else f"chat {s} {i} 北京天气"
                await store.append_message(sid, "user" if i % 2 else "assistant", text)
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            totals = pg_search.Totals()
            req = SearchRequest(query="rollout canary", limit=5)
            await pg_search.search(conn, req, totals)
            whole, syncs = await _traced_hits(conn, req, totals)
            assert len(whole) == 3 and syncs == 1
            for hit in whole:
                assert hit["context_before"] is not None and hit["context_after"] is not None
                assert "rollout" in hit["snippet"] and hit["model"] in ("m0", "m1", "m2")
            for n in (1, 2):  # more hits than the page holds: the page in a statement of its own
                req = SearchRequest(query="rollout canary", limit=n)
                ids, syncs = await _traced(conn, req, totals)
                assert syncs == 2
                assert await pg_search.search(conn, req, totals) == whole[:n]
    finally:
        await store.close()


async def test_a_search_of_whole_indexes_runs_on_generic_plans_whatever_its_first_words(
    schema_dsn: str,
) -> None:
    """Left to choose, PostgreSQL keeps custom plans for a statement whose first runs found
    rare words, planning it afresh at every bind; on the read pool a search of whole indexes
    runs on the generic plan from its first run (pg_prepared_statements counts them), and
    finds what it found before."""
    store = await PgStore.open(schema_dsn, readers=1)
    try:
        sid = await store.create_session("s", "cli")
        ids = [
            await store.append_message(sid, "user", f"note {i} about rare{i}x and rare{i}y")
            for i in range(240)
        ]
        await store._read(lambda conn: db.run(conn, "ANALYZE messages"))
        for i in range(0, 240, 20):
            hits = await store.search_messages(f"rare{i}x rare{i}y", limit=5)
            assert [h["id"] for h in hits] == [ids[i]]
        found = await store._read(
            lambda conn: db.tuples(
                conn,
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE '%w0 AS MATERIALIZED%'",
            )
        )
        assert len(found) == 1
        generic, custom = found[0]
        assert custom == 0 and generic >= 12 - 5  # prepared after its fifth run
    finally:
        await store.close()


async def test_a_side_index_search_learns_the_table_size_and_then_reuses_its_totals(
    schema_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of the CJK side index alone counts the table's totals with the side
    index's: on a big table the small side index's totals are then reused, and the next
    search counts neither (each count is a scan of the whole table)."""
    monkeypatch.setattr(slices, "EXACT_TOTALS_BELOW", 20)  # this table is a big one
    store = await PgStore.open(schema_dsn)
    try:
        sid = await store.create_session("s", "cli")
        for i in range(30):
            await store.append_message(sid, "user", f"北京天气 {i}" if i % 10 == 0 else f"note {i}")
        req = SearchRequest(query="北京", limit=5)
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            totals = pg_search.Totals()
            first = await pg_search.search(conn, req, totals)
            assert totals.known_rows(False) == 30 and totals.fresh(True) is not None
            with tempfile.TemporaryFile("w+") as fh:
                conn.pgconn.trace(fh.fileno())
                try:
                    again = await pg_search.search(conn, req, totals)
                finally:
                    conn.pgconn.untrace()
                fh.seek(0)
                trace = fh.read()
        assert [h["id"] for h in again] == [h["id"] for h in first] and len(first) == 3
        assert "SELECT COUNT(*), COALESCE(SUM(" not in trace
    finally:
        await store.close()


async def test_a_row_in_both_indexes_windows_is_one_hit_with_its_page_values(
    schema_dsn: str,
) -> None:
    """A tool call whose text holds the words in the main index and whose arguments hold
    them in the side one is in both windows: with the page's values in the first statement
    it is still each of its hits once, as the page's own statement gives them."""
    store = await PgStore.open(schema_dsn)
    try:
        sid = await store.create_session("s", "cli")
        await store.append_message(sid, "user", "run the deploy")
        await store.append_message(
            sid,
            "tool",
            "deploy finished",
            tool_name="shell",
            tool_calls=[{"arguments": "deploy now"}],
        )
        await store.append_message(sid, "assistant", "deploy done")
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            totals = pg_search.Totals()
            req = SearchRequest(query="deploy", roles=("tool",), limit=50)
            await pg_search.search(conn, req, totals)
            ids, syncs = await _traced(conn, req, totals)
            assert syncs == 1
            paged = await pg_search.search(conn, req, totals)
            # an offset keeps the page's values out of the first statement
            apart = await pg_search.search(conn, replace(req, offset=1, limit=49), totals)
        assert ids == [h["id"] for h in paged]
        assert paged[1:] == apart and paged[0]["context_before"] is not None
    finally:
        await store.close()
