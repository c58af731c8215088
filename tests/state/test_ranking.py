"""Relevance: the BM25 that search computes over its ranking window (state/ranking.py)
agrees with the index it scores against, and ranks the way BM25 should."""

from __future__ import annotations

import math
import random
import sqlite3
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from state import SessionDB, Store, ranking

# Letters with and without accents, digits, punctuation, underscores, several kinds of space.
TEXT = st.text(
    alphabet=st.sampled_from(list("abcXYZ019éÉèüÜñçßø_-.,:;'\"/@#()[]*+ \t\n\u00a0") + ["ǅ", "Å"]),
    max_size=60,
)


@pytest.fixture(scope="module")
def fts() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(body)")  # unicode61, as state.db uses
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, instance)")
    return conn


@settings(max_examples=300, deadline=None)
@given(text=TEXT)
def test_tokens_are_the_ones_the_index_makes(fts: sqlite3.Connection, text: str) -> None:
    fts.execute("DELETE FROM t")
    fts.execute("INSERT INTO t(rowid, body) VALUES (1, ?)", (text,))
    indexed = [r[0] for r in fts.execute("SELECT term FROM v ORDER BY offset")]
    assert ranking.fts_tokens(text) == indexed


@settings(max_examples=200, deadline=None)
@given(text=TEXT, start=st.integers(0, 5), length=st.integers(1, 3), prefix=st.booleans())
# a match inside a token ("0:0" from the second character of "00") hid the real one after it
@example(text="00:0:0", start=1, length=2, prefix=False)
@example(text="a a a", start=0, length=2, prefix=False)
def test_phrase_counts_agree_with_fts5(
    fts: sqlite3.Connection, text: str, start: int, length: int, prefix: bool
) -> None:
    """Whether a phrase (or prefix phrase) taken from the text occurs agrees with FTS5's
    MATCH, and the count equals the token-wise count."""
    tokens = ranking.fts_tokens(text)
    want = tuple(tokens[start : start + length])
    if not want:
        return
    if prefix:
        want = (*want[:-1], want[-1][: max(1, len(want[-1]) // 2)])
    fts.execute("DELETE FROM t")
    fts.execute("INSERT INTO t(rowid, body) VALUES (1, ?)", (text,))
    match = '"' + " ".join(want) + '"' + (" *" if prefix else "")
    matched = fts.execute("SELECT COUNT(*) FROM t WHERE t MATCH ?", (match,)).fetchone()[0]
    phrase = ranking.Phrase(want, prefix, match)
    count = phrase.count_in(ranking.fold(text))
    assert (count > 0) == bool(matched)
    by_tokens = sum(
        1
        for i in range(len(tokens) - len(want) + 1)
        if tokens[i : i + len(want) - 1] == list(want[:-1])
        and (
            tokens[i + len(want) - 1].startswith(want[-1])
            if prefix
            else tokens[i + len(want) - 1] == want[-1]
        )
    )
    # every start counts, overlapping ones too ("a a" twice in "a a a"), as in FTS5's bm25()
    assert count == by_tokens


def test_document_length_and_totals_come_from_the_index(fts: sqlite3.Connection) -> None:
    fts.execute("DELETE FROM t")
    fts.executemany(
        "INSERT INTO t(rowid, body) VALUES (?, ?)", [(1, "one two three"), (2, "four, five!")]
    )
    fts.commit()  # FTS5 writes its averages record when the transaction ends
    sizes = dict(fts.execute("SELECT id, sz FROM t_docsize"))
    assert ranking.doc_length(sizes[1]) == 3 and ranking.doc_length(sizes[2]) == 2
    assert ranking.index_totals(fts, "t") == (2, 2.5)


async def test_more_occurrences_in_a_shorter_message_rank_first(store: Store) -> None:
    now = time.time()
    sid = await store.create_session(source="api")
    texts = {
        "once": "the deploy went fine and then we talked about lunch plans for the week",
        "twice": "deploy failed, deploy again",
        "long once": "deploy " + " ".join(f"filler{i}" for i in range(60)),
    }
    ids = {}
    for name, text in texts.items():  # same timestamp: only relevance decides
        ids[await store.append_message(sid, "user", text, timestamp=now)] = name
    hits = await store.search_messages("deploy")
    assert [ids[h["id"]] for h in hits] == ["twice", "once", "long once"]


async def test_a_rare_term_outweighs_a_common_one(store: Store) -> None:
    """With two terms, the one in fewer messages weighs more: two zebras (a rare word) beat
    three statuses (a word in every message); without IDF the statuses would win."""
    now = time.time()
    sid = await store.create_session(source="api")
    for i in range(300):
        await store.append_message(sid, "user", f"status update number {i}", timestamp=now - 10)
    common = await store.append_message(sid, "user", "status status status zebra", timestamp=now)
    rare = await store.append_message(sid, "user", "status zebra zebra quokka", timestamp=now)
    hits = await store.search_messages("status OR zebra", limit=2)
    assert [h["id"] for h in hits] == [rare, common]


async def test_document_frequency_is_exact_when_small_and_close_when_large(
    db: SessionDB,
) -> None:
    sid = await db.create_session(source="api")
    rows = [
        {"role": "user", "content": f"row {i}" + (" needle" if i % 4 == 0 else "")}
        for i in range(3000)
    ]
    for i in range(0, len(rows), 500):
        await db.append_messages(sid, rows[i : i + 500])
    for i in range(7):
        await db.append_message(sid, "user", f"rare marker {i}")

    def estimate(conn: sqlite3.Connection, match: str) -> int:
        n, _avg = ranking.index_totals(conn, "sb_messages_fts")
        low, high = conn.execute(
            "SELECT (SELECT MIN(id) FROM messages), (SELECT MAX(id) FROM messages)"
        ).fetchone()
        return ranking.estimate_df(conn, "sb_messages_fts", match, n, (low, high))

    assert await db._read(estimate, "marker") == 7
    got = await db._read(estimate, "needle")
    assert abs(got - 750) / 750 < 0.1, got  # every 4th of 3,000 rows
    assert ranking.idf(3007, 7) > ranking.idf(3007, got) > 0
    assert math.isclose(ranking.idf(10, 10), 1e-6)


async def test_fts5_bm25_and_this_module_rank_alike(
    db: SessionDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a small index search ranks the main index's window with FTS5's own bm25(); the
    scores here, with counted document frequencies, must order every hit the same way
    (PostgreSQL only has these). Many equal timestamps: ties must fall alike too."""
    from state.sqlite import search

    rnd = random.Random(9)
    words = ["alpha", "beta", "gamma", "delta", "café", "cafe", "the", "x"] + [
        f"w{i}" for i in range(30)
    ]
    sid = await db.create_session(source="api")
    now = time.time()
    rows = [
        {
            "role": "user",
            "timestamp": now - rnd.choice([0, 0, 0, 3600, 86400 * rnd.randint(1, 90)]),
            "content": " ".join(rnd.choices(words, k=rnd.randint(1, 30))),
        }
        for _ in range(900)
    ]
    for i in range(0, len(rows), 100):
        await db.append_messages(sid, rows[i : i + 100])
    queries = [
        "alpha",
        "alpha beta",
        "alpha OR beta",
        "alpha OR beta OR w3",
        '"alpha beta"',
        "alph*",
        "cafe the",
        "alpha alpha",
        "(alpha OR gamma) delta",
        "w1 OR w2 OR w3 OR the",
    ]
    native = {q: [h["id"] for h in await db.search_messages(q, limit=300)] for q in queries}
    calls = []
    original = search._c_bm25
    monkeypatch.setattr(search, "_c_bm25", lambda rows: calls.append(original(rows)) and False)
    for q in queries:
        ours = [h["id"] for h in await db.search_messages(q, limit=300)]
        assert ours == native[q] and len(ours) > 5, q
    assert calls and all(calls)  # the index was small: bm25() ranked the first pass
