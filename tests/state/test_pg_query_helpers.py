"""The store's PostgreSQL query helpers (state.pg.db) on a real server.

Statements longer than psycopg keeps parsed (PARSED_EVERY_RUN) run as raw queries, their
placeholders numbered once: each helper gives the same answers for them as for the same
statement short enough for psycopg's own conversion, with named and positional parameters,
a name used twice, `%%`, array parameters and text that looks like placeholders.

Rows sent as one JSON parameter (`json_rows`) come back from `rowset` exactly as sent:
text of every kind, floats to the last bit, integers past 2**53, booleans and NULLs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from state.pg import db
from state.pg.db import LoopConnection

# a comment long enough to take a statement past PARSED_EVERY_RUN; it changes no answer
PADDING = "/* " + "x" * db.PARSED_EVERY_RUN + " */ "

NAMED = (
    "SELECT %(a)s::text AS a, %(b)s::bigint + %(b)s::bigint AS twice, "
    "'100%%' AS percent, '%%(a)s and %%s' AS literal, "
    "cardinality(%(list)s::text[]) AS n, (%(list)s::text[])[2] AS second"
)
POSITIONAL = "SELECT %s::text AS a, %s::bigint * 3 AS thrice, '50%%' AS percent"


async def _answers(conn: psycopg.AsyncConnection[Any], pad: str) -> list[Any]:
    named = {"a": "caf\u00e9 %(b)s \u202e", "b": 21, "list": ["x", "y\u0301", None]}
    out: list[Any] = []
    out.append(await db.rows(conn, pad + NAMED, named))
    out.append(await db.row(conn, pad + NAMED, named))
    out.append(await db.tuples(conn, pad + POSITIONAL, ("<b>", 7)))
    out.append(await db.tuples(conn, pad + POSITIONAL, ["<b>", 7], prepare=False, binary=True))
    out.append(await db.value(conn, pad + POSITIONAL, ("v", 1)))
    await db.run(conn, "CREATE TEMP TABLE IF NOT EXISTS t_long (k text, v bigint)")
    out.append(
        await db.run(
            conn,
            pad + "INSERT INTO t_long SELECT k, %(v)s FROM unnest(%(ks)s::text[]) AS u(k)",
            {"v": 5, "ks": ["p", "q", "r"]},
        )
    )
    out.append(await db.tuples(conn, "SELECT k, v FROM t_long ORDER BY k"))
    await db.run(conn, "DROP TABLE t_long")
    return out


def test_long_statements_answer_as_short_ones_through_every_helper(pg_dsn: str) -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        conn = await LoopConnection.connect(pg_dsn, autocommit=True)
        db.binary_lists(conn)
        try:
            long = await _answers(conn, PADDING)
            long_again = await _answers(conn, PADDING)  # a prepared statement by now
            short = await _answers(conn, "")
        finally:
            await conn.close()
        assert long == long_again
        return long, short

    long, short = asyncio.run(scenario())
    assert long == short
    named_rows = long[0]
    assert named_rows == [
        {
            "a": "caf\u00e9 %(b)s \u202e",
            "twice": 42,
            "percent": "100%",
            "literal": "%(a)s and %s",
            "n": 3,
            "second": "y\u0301",
        }
    ]
    assert long[1] == named_rows[0]
    assert long[2] == long[3] == [("<b>", 21, "50%")]
    assert long[4] == "v"
    assert long[5] == 3
    assert long[6] == [("p", 5), ("q", 5), ("r", 5)]


def test_a_long_statement_numbers_each_name_once() -> None:
    query, order = db.numbered(PADDING + NAMED)
    assert order == ("a", "b", "list")
    assert query.endswith(
        b"SELECT $1::text AS a, $2::bigint + $2::bigint AS twice, "
        b"'100%' AS percent, '%(a)s and %s' AS literal, "
        b"cardinality($3::text[]) AS n, ($3::text[])[2] AS second"
    )
    assert db.numbered(PADDING + POSITIONAL)[1] == 2


def test_a_long_statement_with_wrong_parameters_is_refused_before_it_is_sent() -> None:
    with pytest.raises(KeyError):
        db._raw(PADDING + NAMED, {"a": "only one"})
    with pytest.raises(TypeError, match="takes 2 parameters, 1 given"):
        db._raw(PADDING + POSITIONAL, ("one",))
    with pytest.raises(ValueError, match="mixes"):
        db.numbered(PADDING + "SELECT %s, %(a)s")
    with pytest.raises(ValueError, match="unsupported placeholder"):
        db.numbered(PADDING + "SELECT %(a)b")
    raw = db._raw(PADDING + NAMED, {"list": [], "b": 2, "a": "x"})
    assert raw is not None and raw[1] == ["x", 2, []]
    assert db._raw(NAMED, {"a": 1}) is None  # short: psycopg's own conversion
    assert db._raw(PADDING + "SELECT 1", None) is None  # no parameters: nothing to convert


ODD_TEXT = [
    "<b>bold</b> & <script>x</script>",
    "\u202eevil\u202c \u200f rtl",
    "quotes \" and \\ backslash \\\" and 'single'",
    "line\nbreak\ttab\r\u2028sep",
    "emoji \U0001f389 and CJK \u6771\u4eac and combining e\u0301",
    '{"json": [1, 2]} and {} and [] and %s %(x)s $1',
    "",
    "\ufffd replacement and \uffff noncharacter",
]


def test_rows_sent_as_json_come_back_exactly(pg_dsn: str) -> None:
    floats = [1765000000.123456, 0.1 + 0.2, -0.0, 1e-300, 1.7976931348623157e308, 5e-324]
    rows = [
        (i, text, floats[i % len(floats)], 2**62 + i, i % 2 == 0, None)
        for i, text in enumerate(ODD_TEXT)
    ]
    types = ("bigint", "text", "double precision", "bigint", "boolean", "text")
    sql = (
        f"SELECT * FROM {db.rowset('%s', types, ordinality=True)} "
        "AS u(i, t, f, big, b, nothing, n) ORDER BY n"
    )

    async def scenario() -> list[tuple[Any, ...]]:
        conn = await LoopConnection.connect(pg_dsn, autocommit=True)
        try:
            return await db.tuples(conn, sql, (db.json_rows(iter(rows)),))
        finally:
            await conn.close()

    got = asyncio.run(scenario())
    assert got == [(*r, n) for n, r in enumerate(rows, start=1)]
    # to the last bit, except the sign of a zero (jsonb keeps numbers as numeric, which has
    # no negative zero; no column the store sends takes one)
    assert [r[2].hex() for r in got] == [abs(r[2]).hex() if r[2] == 0 else r[2].hex() for r in rows]


def test_a_rowset_is_planned_as_a_few_rows_not_a_hundred(pg_dsn: str) -> None:
    """The writer's generic plans probe keys for a rowset's rows: the planner counts on 10
    rows, as for an array parameter (jsonb_array_elements alone: 100)."""
    sql = f"SELECT * FROM {db.rowset('$1', ('bigint', 'text'))} AS u(a, b)"

    async def scenario() -> str:
        conn = await LoopConnection.connect(pg_dsn, autocommit=True)
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE few(text) AS {sql}")
            cur = await conn.execute("EXPLAIN EXECUTE few('[[1, \"a\"]]')")
            return "\n".join(r[0] for r in await cur.fetchall())
        finally:
            await conn.close()

    plan = asyncio.run(scenario())
    assert "Function Scan on unnest x" in plan and "rows=10 " in plan, plan


def test_values_json_cannot_carry_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError):
        db.json_rows([(float("nan"),)])
    with pytest.raises(TypeError):
        db.json_rows([(b"bytes",)])
