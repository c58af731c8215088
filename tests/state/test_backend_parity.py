"""Random search queries over one corpus stored in both backends must find the same rows,
in the same order, with the same snippets: the PostgreSQL search (tsvector/tsquery written
from switchboard's own tokens) keeps the SQLite store's query language, CJK/emoji side
index, tool search, filters and ranking."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from state import QueryError, SessionFilter, Store, open_store
from state.pg.slices import RARE_SHARE
from tests import pgserver

WORDS = [
    "deploy",
    "deployment",
    "deployed",
    "prod",
    "outage",
    "db",
    "red",
    "alert",
    "the",
    "and",
    "café",
    "cafe",
    "crème",
    "brûlée",
    "服务",
    "服务端",
    "東京",
    "タワー",
    "서울",
    "🎉",
    "🍕",
    "P2.2",
    "user@host",
    "a/b",
    "C++",
    "50%",
    "it's",
    "hello",
    "world",
    "NOT",
    "OR",
    "x",
    "100%完成",
    "修改youer",
    "TODO:",
    "#42",
    "gateway/run.py",
    "Straße",
    "ǅemal",
]
SEPARATORS = [" ", " ", " ", ", ", ". ", "\n", " - "]
QUERY_PARTS = st.one_of(
    st.sampled_from(WORDS),
    st.sampled_from(
        [
            "AND",
            "OR",
            "NOT",
            "(",
            ")",
            '"',
            "*",
            "dep*",
            "服*",
            '"red alert"',
            '"hello world"',
            "caf*",
            "🎉 party",
            "-x",
        ]
    ),
)
T0 = 1_700_000_000.0


def _corpus() -> list[dict[str, Any]]:
    rnd = random.Random(18)
    sessions = []
    for s in range(12):
        msgs = []
        for m in range(6):
            words = rnd.choices(WORDS, k=rnd.randint(1, 10))
            text = "".join(w + rnd.choice(SEPARATORS) for w in words).strip()
            if m % 5 == 4:
                msgs.append(
                    {
                        "role": "tool",
                        "content": text,
                        "tool_name": rnd.choice(["shell", "db_query"]),
                        "tool_calls": [{"arguments": rnd.choice(WORDS)}],
                        "timestamp": T0 + s * 600 + m,
                    }
                )
            else:
                msgs.append(
                    {
                        "role": ("user", "assistant")[m % 2],
                        "content": text,
                        "timestamp": T0 + s * 600 + m,
                    }
                )
        sessions.append(
            {
                "source": ("telegram", "slack", "api")[s % 3],
                "title": f"s{s}",
                "chat_id": str(s % 4),
                "messages": msgs,
            }
        )
    return sessions


async def _seed(store: Store, corpus: list[dict[str, Any]]) -> None:
    for i, sess in enumerate(corpus):
        sid = await store.create_session(
            source=sess["source"],
            title=sess["title"],
            chat_id=sess["chat_id"],
            started_at=T0 + i * 600,
        )
        for msg in sess["messages"]:
            await store.append_messages(sid, [msg])


@pytest.fixture(scope="module")
def both(pg_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    schema = pgserver.fresh_schema(pg_dsn)
    home = tmp_path_factory.mktemp("parity")
    corpus = _corpus()
    lite = loop.run_until_complete(open_store({"backend": "sqlite"}, home))
    pg = loop.run_until_complete(
        open_store({"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, home)
    )
    try:
        for store in (lite, pg):
            loop.run_until_complete(_seed(store, corpus))
        yield loop, lite, pg
    finally:
        loop.run_until_complete(lite.close())
        loop.run_until_complete(pg.close())
        loop.close()
        pgserver.drop_schema(pg_dsn, schema)


def _outcome(loop: asyncio.AbstractEventLoop, store: Store, query: str, **kw: Any) -> object:
    try:
        hits = loop.run_until_complete(store.search_messages(query, limit=500, **kw))
    except QueryError:
        return "QueryError"
    return [
        (
            h["id"],
            h["role"],
            h["title"],
            h["source"],
            h["timestamp"],
            h["snippet"],
            (h["context_before"] or {}).get("id"),
            (h["context_after"] or {}).get("id"),
        )
        for h in hits
    ]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parts=st.lists(QUERY_PARTS, min_size=1, max_size=6),
    sep=st.sampled_from([" ", " ", ""]),
    sort=st.sampled_from(["relevance", "newest", "oldest"]),
    roles=st.sampled_from([(), ("tool",), ("user", "assistant")]),
    source=st.sampled_from([None, "telegram", "slack"]),
)
# an AND under an OR: FTS5's bm25() would count `deploy` in some rows holding it and not in
# others, so the SQLite store scores such a query in Python, as the PostgreSQL store does
@example(
    parts=["deploy", "deployment", "OR", "dep*"], sep=" ", sort="relevance", roles=(), source=None
)
def test_random_queries_find_the_same_rows_on_both_backends(
    both: Any, parts: list[str], sep: str, sort: str, roles: tuple[str, ...], source: str | None
) -> None:
    loop, lite, pg = both
    query = sep.join(parts)
    scope = SessionFilter(include_children=True, source=source)
    want = _outcome(loop, lite, query, sort=sort, roles=roles, scope=scope)
    got = _outcome(loop, pg, query, sort=sort, roles=roles, scope=scope)
    assert got == want, query


def test_the_corpus_is_searchable_at_all(both: Any) -> None:
    """The property above is only worth something if queries find rows: a few that must."""
    loop, lite, pg = both
    for query in ("deploy", "服务", "🎉", "cafe", "P2.2", "dep*"):
        found = _outcome(loop, pg, query)
        assert isinstance(found, list) and found, query
        assert found == _outcome(loop, lite, query)


@pytest.mark.slow
async def test_ranking_windows_agree_when_matches_outnumber_the_window(
    pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """1,300 matches: the ranking looks at the newest 500 first and widens as the page
    needs; both stores must pick the same window and rank it the same way."""
    schema = pgserver.fresh_schema(pg_dsn)
    lite = await open_store({"backend": "sqlite"}, tmp_path_factory.mktemp("window"))
    pg = await open_store({"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, ".")
    try:
        rnd = random.Random(5)
        for store in (lite, pg):
            sids = [
                await store.create_session(source=("telegram", "slack")[i % 2], started_at=T0)
                for i in range(10)
            ]
            for chunk in range(26):
                batch = [
                    {
                        "role": "user",
                        "timestamp": T0 + chunk * 50 + k,
                        "content": " ".join(
                            rnd.choices(
                                ["alpha"] * 6 + ["beta"] * 3 + ["gamma", "the"] + WORDS,
                                k=rnd.randint(3, 30),
                            )
                        ),
                    }
                    for k in range(50)
                ]
                await store.append_messages(sids[chunk % 10], batch)
            rnd = random.Random(5)  # the same corpus for the second store
        for query, kw in (
            ("alpha", {}),
            ("alpha beta", {}),
            ("gamma", {"offset": 200}),
            ("alpha", {"sources": ["slack"], "offset": 100}),
            ("beta", {"sort": "oldest", "offset": 250}),
        ):
            want = [(h["id"], h["snippet"]) for h in await lite.search_messages(query, **kw)]
            got = [(h["id"], h["snippet"]) for h in await pg.search_messages(query, **kw)]
            assert got == want and len(want) == 20, (query, kw)
        tail = [h["id"] for h in await pg.search_messages("alpha", limit=100, offset=1000)]
        assert tail and tail == [
            h["id"] for h in await lite.search_messages("alpha", limit=100, offset=1000)
        ]
    finally:
        await lite.close()
        await pg.close()
        pgserver.drop_schema(pg_dsn, schema)


@pytest.mark.slow
async def test_phrases_past_the_first_probe_agree(
    pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """6,000 messages, phrases rare among them: PostgreSQL looks past its first slice of
    ids through the index of adjacent token pairs, which must find exactly the rows the
    phrase check (and SQLite) finds, not the rows that merely hold the words apart. Before
    the table's first ANALYZE and after it (phrase slices are then fenced from the
    planner's primary-key walk)."""
    schema = pgserver.fresh_schema(pg_dsn)
    lite = await open_store({"backend": "sqlite"}, tmp_path_factory.mktemp("pairs"))
    pg = await open_store({"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, ".")
    vocab = [
        "red",
        "alert",
        "the",
        "server",
        "fix",
        "東京",
        "タワー",
        "服务端",
        "🎉",
        "party",
        "hello",
        "world",
        "user@host",
        "x",
    ]
    dsn = pgserver.with_schema(pg_dsn, schema)
    with psycopg.connect(dsn, autocommit=True) as conn:  # no ANALYZE but the test's own
        conn.execute("ALTER TABLE messages SET (autovacuum_enabled = off)")
    try:
        for store in (lite, pg):
            rnd = random.Random(7)  # the same corpus for both stores
            sids = [
                await store.create_session(source=("telegram", "slack")[i % 2], started_at=T0)
                for i in range(6)
            ]
            for chunk in range(60):
                batch = [
                    {
                        "role": ("user", "assistant")[k % 2],
                        "timestamp": T0 + chunk * 100 + k,
                        "content": " ".join(rnd.choices(vocab, k=rnd.randint(1, 5))),
                    }
                    for k in range(100)
                ]
                await store.append_messages(sids[chunk % 6], batch)
        queries = [
            '"red alert"',
            '"alert red"',
            '"the server" fix',
            '"fix the server"',
            "東京タワー",
            "服务端",
            '"hello world" NOT party',
            '"red alert" OR "the server"',
            "user@ho*",
            "🎉 party",
            '"user host"',
        ]
        for analyzed in (False, True):
            if analyzed:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("ANALYZE messages")
                await pg.close()
                pg = await open_store({"backend": "postgres", "dsn": dsn}, ".")  # fresh caches
            for query in queries:
                for kw in ({}, {"sort": "oldest"}, {"sort": "newest", "offset": 5}):
                    want = [
                        (h["id"], h["snippet"])
                        for h in await lite.search_messages(query, limit=20, **kw)
                    ]
                    got = [
                        (h["id"], h["snippet"])
                        for h in await pg.search_messages(query, limit=20, **kw)
                    ]
                    assert got == want and (want or kw), (query, kw, analyzed)  # page 1 finds rows
    finally:
        await lite.close()
        await pg.close()
        pgserver.drop_schema(pg_dsn, schema)


@pytest.mark.slow
async def test_phrases_found_through_their_rarest_word_agree(
    pg_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """After ANALYZE, a phrase's candidates on PostgreSQL come from its rarest word (when
    the statistics put it in few rows) and the phrase is checked on them: the rows found
    must be exactly SQLite's, whichever word is the rare one, in every sort and slice."""
    schema = pgserver.fresh_schema(pg_dsn)
    lite = await open_store({"backend": "sqlite"}, tmp_path_factory.mktemp("rare"))
    pg = await open_store({"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, ".")
    common = ["the", "of", "red", "alert", "fix", "and", "to"]
    try:
        for store in (lite, pg):
            rnd = random.Random(11)  # the same corpus for both stores
            sids = [
                await store.create_session(source=("telegram", "slack")[i % 2], started_at=T0)
                for i in range(6)
            ]
            for chunk in range(50):
                batch = []
                for k in range(100):
                    words = rnd.choices(common, k=rnd.randint(3, 12))
                    if rnd.random() < 0.04:  # "server" in about 4% of the rows, anywhere
                        at = rnd.randrange(len(words) + 1)
                        words[at:at] = ["the", "server"] if rnd.random() < 0.5 else ["server"]
                    batch.append(
                        {
                            "role": ("user", "assistant")[k % 2],
                            "content": " ".join(words),
                            "timestamp": T0 + chunk * 100 + k,
                        }
                    )
                await store.append_messages(sids[chunk % 6], batch)
        with psycopg.connect(pgserver.with_schema(pg_dsn, schema), autocommit=True) as conn:
            conn.execute("ANALYZE messages")
            found = conn.execute(
                "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats "
                "WHERE schemaname = %s AND tablename = 'messages' AND attname = 'tsv'",
                (schema,),
            ).fetchone()
        shares = dict(zip(found[0], found[1], strict=False)) if found else {}
        assert shares.get("the", 0) > 0.5 and shares.get("server", 0) < RARE_SHARE  # the path taken
        queries = [
            '"the server"',
            '"server the"',
            '"fix the server"',
            '"the server" alert',
            '"red alert" server',
            '"the server" NOT fix',
            '"the serv"*',
            '"of the"',
        ]
        for query in queries:
            for kw in ({}, {"sort": "oldest"}, {"sort": "newest", "offset": 30}, {"limit": 40}):
                want = [(h["id"], h["snippet"]) for h in await lite.search_messages(query, **kw)]
                got = [(h["id"], h["snippet"]) for h in await pg.search_messages(query, **kw)]
                assert got == want and (want or "offset" in kw), (query, kw)
    finally:
        await lite.close()
        await pg.close()
        pgserver.drop_schema(pg_dsn, schema)


def test_a_term_given_twice_ranks_alike_on_both_backends(both: Any) -> None:
    """A query naming a term twice (Hypothesis found `deploy OR deploy deployment`) ranks the
    same rows in the same order on both backends."""
    loop, lite, pg = both
    for query in ("deploy OR deploy deployment", "deploy deploy", "Cafe OR café", "DEPLOY deploy"):
        want = _outcome(loop, lite, query, sort="relevance")
        assert want and _outcome(loop, pg, query, sort="relevance") == want, query
