"""Full-text search on PostgreSQL with the SQLite store's semantics: the same query
language (state/query.py compiled to tsquery by state/pg/tsearch.py), the same split
between the main index and the segmented CJK/emoji side index, the same newest-window
evaluation and BM25 (state/ranking.py) blended with recency, the same snippets.

The newest-window walk is state/pg/slices.py's. A search is two statements when the
window's first slices hold it: every branch's first slice with its rows, the id range and
what ranking counts; then the page's sessions, neighbours and snippet texts. When every
index is read whole and its hits fit in the page, the page's come in the first statement.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, cast

from psycopg import AsyncConnection

from .. import query as q
from .. import ranking
from ..errors import QueryError
from ..filters import SessionFilter
from ..records import SearchHit
from ..sqlite.search import (
    FIRST_WINDOW,
    SORTS,
    WINDOW_GROWTH,
    WINDOW_PER_RESULT,
    blend_many,
)
from ..sqlite.searchreq import SearchRequest, filters, literal_where
from ..sqlite.snippets import CONTEXT_CHARS, make_snippet
from . import db, slices
from .dispatch import Dispatch
from .messages import from_pg
from .slices import (
    R_AUX_NTOK,
    R_CONTENT,
    R_ENC,
    R_ID,
    R_NTOK,
    R_PAGE,
    R_ROLE,
    R_SID,
    R_SIDE,
    R_TFS,
    R_TOOL_CALLS,
    R_TOOL_NAME,
    R_TS,
    Branch,
    Keep,
    Totals,
)
from .tsearch import (
    required_pairs,
    required_words,
    side_text,
    to_tsquery,
    token_pairs,
    whole_tokens,
)

__all__ = ["SearchOps", "Totals", "search"]


@functools.lru_cache(maxsize=256)
def _compiled(
    query: str, tools: bool
) -> tuple[q.Node, tuple[Branch, ...], tuple[tuple[ranking.Phrase, ...], ...]]:
    """A query's syntax tree, its branches and each branch's phrases (`tools`: tool rows
    are searched too), kept for the queries searched lately (pure functions of the text)."""
    tree = q.parse(query)
    branches = _branches(tree, tools)
    return tree, tuple(branches), tuple(tuple(br.phrases(tree)) for br in branches)


def _branches(tree: q.Node, tools: bool) -> list[Branch]:
    out = []
    if not q.needs_aux(tree):
        main = to_tsquery(tree, segmented=False)
        if main is not None:
            # no pair index on tsv (see state/pg/schema.py, migration 5)
            out.append(
                Branch(
                    False,
                    "tsv @@ %s::tsquery",
                    (main,),
                    " AND m.seg_tsv IS NULL",
                    words=tuple(required_words(tree, segmented=False)),
                )
            )
    seg = to_tsquery(tree, segmented=True)
    tool = to_tsquery(tree, segmented=False) if tools else None
    conds, params = [], []
    for col, tsq in (("seg_tsv", seg), ("tool_tsv", tool)):
        if tsq is not None:
            conds.append(f"{col} @@ %s::tsquery")
            params.append(tsq)
    if conds:
        literal, lparams = literal_where(
            tree, tools, mark="%s", like="ILIKE"
        )  # SQLite: LIKE ignores ASCII case
        # tool_tsv has no pair index: narrow by pairs only when seg_tsv is all there is
        pairs = tuple(required_pairs(tree, segmented=True)) if tool is None else ()
        out.append(
            Branch(
                True,
                "(" + " OR ".join(conds) + ")",
                tuple(params),
                literal,
                lparams,
                pairs=pairs,
                pairs_of="seg_tsv",
            )
        )
    return out


async def search(
    conn: AsyncConnection, req: SearchRequest, totals: Totals, now: float | None = None
) -> list[SearchHit]:
    if req.sort not in SORTS:
        raise QueryError(f"sort must be one of {', '.join(SORTS)}")
    tree, found_branches, found_phrases = _compiled(
        req.query, "tool" in req.roles or req.include_tools
    )
    where, fparams, scoped = filters(req, mark="%s")
    keep = Keep(" JOIN sessions s ON s.id = m.session_id" if scoped else "", where, tuple(fparams))
    branches = list(found_branches)
    if not branches:
        return []
    if totals.bounds is None:  # the first search: no id range to start the slices from
        found = (await db.tuples(conn, "SELECT MIN(id), MAX(id) FROM messages"))[0]
        if found[0] is None:
            return []
        totals.bounds = (int(found[0]), int(found[1]))
    relevance = req.sort == "relevance"
    limit, offset = max(1, req.limit), max(0, req.offset)
    need = limit + offset
    window = max(FIRST_WINDOW, need * WINDOW_PER_RESULT)
    phrases = [list(mine) for mine in found_phrases]
    if relevance:
        branches = [_counted(br, mine) for br, mine in zip(branches, phrases, strict=True)]
    counted: dict[tuple[str, bool], Any] = {}  # ("totals" | "dfs", side) -> what was counted
    while True:
        walks = [
            await slices.start(conn, br, window, req.sort == "oldest", totals) for br in branches
        ]
        ctes, extras, read = _counts(branches, phrases, totals) if relevance else ([], [], None)
        # walks of whole indexes take no other slice: when they keep no more rows than the
        # page holds, the page's columns come with them
        paged = offset == 0 and all(walk.whole for walk in walks)
        paging = slices.Page(PAGE_IN_FIRST, limit) if paged else None
        head = await slices.first(conn, walks, totals.bounds, keep, ctes, extras, paging)
        if head[0] is None or head[1] is None:
            totals.bounds = None
            return []
        id_range = totals.bounds = (int(head[0]), int(head[1]))
        if read is not None:
            counted = read(head[2:], id_range[1])
            read = None
        for walk in walks:
            await slices.finish(conn, walk, id_range, keep)
        rows = [r for walk in walks for r in walk.rows]
        exhausted = all(len(walk.ids) < window for walk in walks)
        if len(rows) >= (need if relevance else limit) or exhausted:
            break
        window *= WINDOW_GROWTH
    if relevance:
        now = time.time() if now is None else now
        rows = await _rank(conn, rows, branches, phrases, totals, now, id_range, counted)
    else:
        rows.sort(key=lambda r: (r[R_TS], r[R_ID]), reverse=req.sort == "newest")
    page = rows[offset : offset + limit]
    hits = [
        {"id": r[R_ID], "session_id": r[R_SID], "role": r[R_ROLE], "timestamp": r[R_TS]}
        for r in page
    ]
    await _finish_page(conn, hits, page, q.positive_terms(tree))
    return cast(list[SearchHit], hits)


def _counted(br: Branch, phrases: list[ranking.Phrase]) -> Branch:
    """The main index's branch with the server counting its terms in the window's rows,
    when every term is one whole word (slices.COUNTED_BELOW)."""
    if br.side or not phrases or any(len(p.tokens) > 1 or p.prefix for p in phrases):
        return br
    return replace(br, counted=tuple(p.match for p in phrases))


def _counts(
    branches: list[Branch], phrases: list[list[ranking.Phrase]], totals: Totals
) -> tuple[list[tuple[str, tuple[Any, ...]]], list[tuple[str, tuple[Any, ...]]], Any]:
    """What the first statement counts for ranking, each only when its slices keep what
    `_rank` will count it for (a count is evaluated only when its CASE reaches it): the
    totals of an index with hits when there are two hits or more and its cached ones need a
    recount, and the phrases' rows on a small store when IDF weights enter the scores (on a
    table whose totals are kept, a phrase counted lately gets the rows written since its
    count added: Totals.df_since). Returns the CTEs, the expressions and the reader of
    their values (given the table's highest id, read in the same statement)."""
    ctes: list[tuple[str, tuple[Any, ...]]] = []
    extras: list[tuple[str, tuple[Any, ...]]] = []
    slots: list[tuple[str, bool, int]] = []
    kept: list[tuple[str, str, int | None]] = []  # each counted phrase: column, match, base
    ns = [f"n{i}" for i in range(len(branches))]
    several = f"{' + '.join(ns)} >= 2"
    since: int | None = None
    for i, (br, mine) in enumerate(zip(branches, phrases, strict=True)):
        ranked = f"n{i} >= 1 AND {several}"
        if totals.fresh(br.side) is None:
            t = f"t{i}"
            ctes.append((f"{t} AS ({slices.totals_sql(br.side)})", ()))
            # counted whatever the hits when not counted lately: its size also says
            # whether a walk of it takes one slice (state/pg/slices.py)
            when = "TRUE" if totals.known_rows(br.side) is None else ranked
            for col in ("count", "coalesce"):
                extras.append((f"CASE WHEN {when} THEN (SELECT {col} FROM {t}) END", ()))
            slots.append(("totals", br.side, 2))
        known = totals.known_rows(br.side)
        if not mine or (known is not None and not ranking.exact_df(known)):
            continue
        if len(mine) > 1:
            when = ranked
        elif len(branches) > 1:
            when = " AND ".join(f"{n} >= 1" for n in ns)  # hits from both indexes
        else:
            continue
        for p in mine:
            base = totals.df_since(br.column, p.match)
            if base is None:
                count = f"SELECT COUNT(*) FROM messages WHERE {br.column} @@ %s::tsquery"
                extras.append((f"CASE WHEN {when} THEN ({count}) END", (p.match,)))
                kept.append((br.column, p.match, None))
                continue
            since = base[1] if since is None else min(since, base[1])
            count = f"SELECT COUNT(*) FROM late WHERE id > %s AND {br.column} @@ %s::tsquery"
            extras.append((f"CASE WHEN {when} THEN ({count}) END", (base[1], p.match)))
            kept.append((br.column, p.match, base[0]))
        slots.append(("dfs", br.side, len(mine)))
    if totals.known_rows(False) is None and not any(not br.side for br in branches):
        # a search of the side index alone counts the table's too: a small side index's
        # totals are reused while the table is big, which only the main index's say (a
        # count of the side index is a scan of the whole table as well)
        ctes.append((f"t AS ({slices.totals_sql(False)})", ()))
        for col in ("count", "coalesce"):
            extras.append((f"(SELECT {col} FROM t)", ()))
        slots.append(("totals", False, 2))
    if since is not None:
        # the rows written since the oldest kept count, read once for all (a range of the
        # primary key, which the planner takes for few rows with or without statistics)
        ctes.append(
            (
                "late AS MATERIALIZED (SELECT id, tsv, seg_tsv FROM messages "
                "WHERE id BETWEEN %s AND 9223372036854775807)",
                (since + 1,),
            )
        )

    def read(values: list[int | None], top: int) -> dict[tuple[str, bool], Any]:
        out: dict[tuple[str, bool], Any] = {}
        at = 0
        for kind, side, n in slots:
            got, values = values[:n], values[n:]
            if kind == "dfs":
                mine, at = kept[at : at + n], at + n
            if any(v is None for v in got):
                continue
            if kind == "totals":
                out[kind, side] = totals.put(side, int(cast(int, got[0])), int(cast(int, got[1])))
                continue
            dfs = []
            for (column, match, base), v in zip(mine, got, strict=True):
                df = int(cast(int, v)) + (base or 0)
                totals.put_df(column, match, df, top, base is not None)
                dfs.append(df)
            out[kind, side] = dfs
        return out

    return ctes, extras, read


async def _rank(
    conn: AsyncConnection,
    rows: list[tuple[Any, ...]],
    branches: list[Branch],
    all_phrases: list[list[ranking.Phrase]],
    totals: Totals,
    now: float,
    id_range: tuple[int, int],
    counted: dict[tuple[str, bool], Any],
) -> list[tuple[Any, ...]]:
    scores: dict[int, float] = {}
    if len(rows) < 2:  # nothing to order
        return rows

    def put(hits: list[tuple[Any, ...]], found: list[float]) -> None:
        blended = blend_many(found, [r[R_TS] for r in hits], now)
        scores.update(zip([r[R_ID] for r in hits], blended, strict=True))

    mixed = len({r[R_SIDE] for r in rows})
    for br, phrases in zip(branches, all_phrases, strict=True):
        mine = [r for r in rows if r[R_SIDE] == br.side]
        if not mine:
            continue
        indexed, avgdl = counted.get(("totals", br.side)) or await totals.get(conn, br.side)
        weights = [1.0] * len(phrases)
        if ranking.weighted(indexed, len(phrases), mixed):
            if ranking.exact_df(indexed):
                dfs = counted.get(("dfs", br.side)) or await _exact_dfs(conn, br.side, phrases)
            else:
                dfs = [
                    await _estimate_df(conn, br.side, p, indexed, id_range, totals) for p in phrases
                ]
            weights = [ranking.idf(indexed, df) for df in dfs]
        if br.counted:  # the server's counts, but for rows that came with their text
            read = [r for r in mine if r[R_CONTENT] is None and r[R_TFS] is not None]
            tfs = [[r[R_TFS][p] for r in read] for p in range(len(phrases))]
            found = ranking.bm25_counted(
                tfs, [r[R_NTOK] or 0 for r in read], weights, avgdl, [True] * len(read)
            )
            put(read, found)
            mine = [r for r in mine if r[R_CONTENT] is not None or r[R_TFS] is None]
        texts: list[str | None] = []
        lengths: list[int] = []
        for r in mine:
            stored = from_pg(r[R_CONTENT], r[R_ENC])
            if br.side:
                texts.append(side_text(stored, r[R_TOOL_NAME], r[R_TOOL_CALLS]))
                lengths.append(r[R_AUX_NTOK] or 0)
            else:
                texts.append(stored)
                lengths.append(r[R_NTOK] or 0)
        found = ranking.bm25_many(texts, lengths, phrases, weights, avgdl)
        put(mine, found)
    # by (score, id), the best first; rows of equal keys in the order they came
    keys = [(scores.get(r[R_ID], 0.0), r[R_ID]) for r in rows]
    return [rows[i] for i in sorted(range(len(rows)), key=keys.__getitem__, reverse=True)]


async def _exact_dfs(conn: AsyncConnection, side: bool, phrases: list[ranking.Phrase]) -> list[int]:
    """Each phrase's document frequency, counted (a small store: ranking.EXACT_DF_BELOW),
    in one statement."""
    column = "seg_tsv" if side else "tsv"
    counts = ", ".join(
        f"(SELECT COUNT(*) FROM messages WHERE {column} @@ %s::tsquery)" for _ in phrases
    )
    found = await db.tuples(conn, f"SELECT {counts}", tuple(p.match for p in phrases))
    return [int(n) for n in found[0]]


async def _estimate_df(
    conn: AsyncConnection,
    side: bool,
    phrase: ranking.Phrase,
    rows: int,
    id_range: tuple[int, int],
    totals: Totals,
) -> int:
    """ranking.estimate_df's figure: exact below DF_SAMPLE matches, else extrapolated from
    the DF_SAMPLE-th newest match. A word's is one walk back along the primary key; a
    phrase's is found as a window is (that walk would check every row holding its words)."""
    column = "seg_tsv" if side else "tsv"
    if len(phrase.tokens) > 1:
        if side:
            term = Branch(
                True,
                f"{column} @@ %s::tsquery",
                (phrase.match,),
                pairs=tuple(token_pairs(phrase.tokens, phrase.prefix)),
                pairs_of=column,
            )
        else:
            term = Branch(
                False,
                f"{column} @@ %s::tsquery",
                (phrase.match,),
                words=tuple(whole_tokens(phrase.tokens, phrase.prefix)),
            )
        walk = await slices.start(conn, term, ranking.DF_SAMPLE, False, totals)
        await slices.run(conn, walk, walk.first(id_range), None)
        await slices.finish(conn, walk, id_range, None)
        ids = walk.ids
        found = ids[-1] if len(ids) >= ranking.DF_SAMPLE else None
        if found is None:
            return len(ids)
    else:
        found = await db.value(
            conn,
            f"SELECT id FROM messages WHERE {column} @@ %s::tsquery ORDER BY id DESC LIMIT 1 OFFSET %s",
            (phrase.match, ranking.DF_SAMPLE - 1),
        )
        if found is None:
            return int(
                await db.value(
                    conn,
                    f"SELECT COUNT(*) FROM (SELECT 1 FROM messages WHERE {column} @@ %s::tsquery LIMIT %s) t",
                    (phrase.match, ranking.DF_SAMPLE),
                )
            )
    return ranking.extrapolate_df(rows, int(found), id_range)


# The page's columns for each hit (`hid`, `sid`) of `{hits}`: its neighbours in its
# session, its text for the snippet, its session's.
PAGE_FIELDS = (
    "b.id, b.role, b.content, b.content_enc, a.id, a.role, a.content, a.content_enc, "
    "o.content, o.content_enc, s.source, s.model, s.title, s.started_at"
)
PAGE_SQL = (
    "SELECT h.hid, {fields} FROM {hits} "
    "LEFT JOIN LATERAL (SELECT id, role, content, content_enc FROM messages "
    "WHERE session_id = h.sid AND id < h.hid ORDER BY id DESC LIMIT 1) b ON TRUE "
    "LEFT JOIN LATERAL (SELECT id, role, content, content_enc FROM messages "
    "WHERE session_id = h.sid AND id > h.hid ORDER BY id LIMIT 1) a ON TRUE "
    "LEFT JOIN messages o ON o.id = h.hid LEFT JOIN sessions s ON s.id = h.sid"
)
# in the first statement, one text array per row (a row off the page carries one NULL)
PAGE_IN_FIRST = PAGE_SQL.replace(
    "{fields}", "ARRAY[" + ", ".join(f"{f}::text" for f in PAGE_FIELDS.split(", ")) + "]"
)
# in a statement of its own, for the hits of the page
PAGE_ALONE = PAGE_SQL.format(
    fields=PAGE_FIELDS, hits="unnest(%s::bigint[], %s::text[]) AS h(hid, sid)"
)
_INTS, _FLOATS = (0, 3, 4, 7, 9), (13,)  # PAGE_FIELDS's bigint/smallint and float columns


def _page_values(texts: list[str | None]) -> tuple[Any, ...]:
    """PAGE_FIELDS's values from their texts (PostgreSQL writes a float's shortest exact
    text)."""
    out: list[Any] = list(texts)
    for i in _INTS:
        if out[i] is not None:
            out[i] = int(out[i])
    for i in _FLOATS:
        if out[i] is not None:
            out[i] = float(out[i])
    return (None, *out)


async def _finish_page(
    conn: AsyncConnection,
    hits: list[dict[str, Any]],
    rows: list[tuple[Any, ...]],
    marks: list[q.Term],
) -> None:
    """The page's sessions, each hit's neighbours in its session and its snippet: from the
    page's `rows` when the first statement brought them (every row on the page), else one
    statement."""
    if not hits:
        return
    by_hit: dict[int, tuple[Any, ...]]
    if all(r[R_PAGE] is not None for r in rows):
        by_hit = {r[R_ID]: _page_values(r[R_PAGE]) for r in rows}
    else:
        found = await db.tuples(  # rows by key: the same plan under either plan mode
            conn,
            PAGE_ALONE,
            ([h["id"] for h in hits], [h["session_id"] for h in hits]),
            plans=db.ANY_PLANS,
        )
        by_hit = {r[0]: r for r in found}
    for h in hits:
        r = by_hit[h["id"]]
        h.update(zip(("source", "model", "title", "started_at"), r[11:15], strict=True))
        for which, at in (("before", 1), ("after", 5)):
            if r[at] is None:
                h[f"context_{which}"] = None
                continue
            text = from_pg(r[at + 2], r[at + 3])
            h[f"context_{which}"] = {
                "id": r[at],
                "role": r[at + 1],
                "content": None if text is None else text[:CONTEXT_CHARS],
            }
        h["snippet"] = make_snippet(from_pg(r[9], r[10]) or "", marks)


class SearchOps(Dispatch):
    """PgStore's message search."""

    _totals: Totals  # the corpus figures ranking uses, kept between searches

    async def search_messages(
        self,
        query: str,
        *,
        sources: Iterable[str] = (),
        exclude_sources: Iterable[str] = (),
        roles: Iterable[str] = (),
        scope: SessionFilter | None = None,
        exclude_session_ids: Iterable[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
    ) -> list[SearchHit]:
        req = SearchRequest(
            query=query,
            sources=tuple(sources),
            exclude_sources=tuple(exclude_sources),
            roles=tuple(roles),
            scope=scope or SessionFilter(include_children=True),
            exclude_session_ids=tuple(exclude_session_ids),
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return await self._read(search, req, self._totals)
