"""Full-text search on PostgreSQL with the SQLite store's semantics: the same query
language (state/query.py compiled to tsquery by state/pg/tsearch.py), the same split
between the main index and the segmented CJK/emoji side index, the same newest-window
evaluation and BM25 (state/ranking.py) blended with recency, the same snippets.

The window is the newest N matches of each index. Asking PostgreSQL for `ORDER BY id DESC
LIMIT N` of a GIN match lets the planner walk the primary key backwards through every
row, so the window is taken from slices of ids: the newest 4N ids first, then each next
slice where the matches' density so far says the rest of the window lies, none read
twice. GIN keeps no positions: a phrase's candidates are the rows holding its words (its
rarest word's, by the planner's statistics), checked on the rows of one slice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from psycopg import AsyncConnection

from .. import query as q
from .. import ranking
from ..errors import QueryError
from ..filters import SessionFilter
from ..records import SearchHit
from ..sqlite import search as sqlite_search
from ..sqlite.search import (
    CONTEXT_CHARS,
    FIRST_WINDOW,
    SORTS,
    WINDOW_GROWTH,
    WINDOW_PER_RESULT,
    SearchRequest,
    blend,
    filters,
    literal_where,
    make_snippet,
)
from ..textindex import segment
from . import db
from .dispatch import Dispatch
from .messages import from_pg
from .tsearch import (
    lexeme_query,
    required_pairs,
    required_words,
    side_text,
    term_query,
    to_tsquery,
    token_pairs,
    whole_tokens,
)

SPAN_GROWTH = 4  # the first slice of ids: this many times the window
SLICE_MARGIN = 1.25  # later slices: the ids the density so far predicts, times this
FIRST_FLOOR = 0.125  # and at least this share of the ids walked, doubling per slice
RARE_SHARE = 0.05  # a phrase's candidates come from its rarest word when in fewer rows
TOTALS_TTL_S = 30.0  # how long index totals (rows, average length) are reused on a big store
SHARES_TTL_S = 300.0  # how long the planner's word statistics are reused
EXACT_TOTALS_BELOW = 10_000  # rows under which totals are recounted for every search


@dataclass(frozen=True)
class _Branch:
    side: bool  # the segmented side index (seg_tsv/tool_tsv) rather than the main tsv
    cond: str  # over messages, unqualified
    params: tuple[Any, ...]
    extra_where: str = ""
    extra_params: tuple[Any, ...] = ()
    # Adjacent token pairs every match holds, and the vector whose `sb_pairs` index has
    # them (state/pg/schema.py): empty when the query has no phrase to narrow by.
    pairs: tuple[str, ...] = ()
    pairs_of: str = ""
    words: tuple[str, ...] = ()  # tokens every match of the main index holds

    @property
    def phrase(self) -> bool:
        """Whether the match holds a phrase (GIN only knows which rows hold its words)."""
        return any("<->" in p for p in self.params)

    def phrases(self, tree: q.Node) -> list[ranking.Phrase]:
        out = []
        for term in q.positive_terms(tree):
            tokens = tuple(ranking.fts_tokens(segment(term.text) if self.side else term.text))
            match = term_query(term, segmented=self.side)
            if tokens and match is not None:
                out.append(ranking.Phrase(tokens, term.prefix, match))
        return out


def _branches(tree: q.Node, req: SearchRequest) -> list[_Branch]:
    out = []
    if not q.needs_aux(tree):
        main = to_tsquery(tree, segmented=False)
        if main is not None:
            # no pair index on tsv (see state/pg/schema.py, migration 5)
            out.append(
                _Branch(
                    False,
                    "tsv @@ %s::tsquery",
                    (main,),
                    " AND m.seg_tsv IS NULL",
                    words=tuple(required_words(tree, segmented=False)),
                )
            )
    tools = "tool" in req.roles or req.include_tools
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
            _Branch(
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


class Totals:
    """Rows and average length of each index, for BM25: recounted per search on a small
    store, reused for TOTALS_TTL_S on a big one (a count is a scan). Also the share of rows
    holding each common word of the main index, from the planner's statistics."""

    def __init__(self) -> None:
        self._cache: dict[bool, tuple[float, int, float]] = {}
        self._shares: tuple[float, dict[str, float]] | None = None

    async def shares(self, conn: AsyncConnection) -> dict[str, float]:
        """Word -> share of rows for the words ANALYZE found most common in `tsv` (the
        rest are rarer than all of them); empty before the first ANALYZE."""
        if self._shares is not None:
            ttl = SHARES_TTL_S if self._shares[1] else TOTALS_TTL_S  # soon after an ANALYZE
            if time.monotonic() - self._shares[0] < ttl:
                return self._shares[1]
        found = await db.tuples(
            conn,
            "SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs FROM pg_stats s "
            "JOIN pg_class c ON c.relname = s.tablename JOIN pg_namespace n ON n.oid = c.relnamespace "
            "AND n.nspname = s.schemaname WHERE c.oid = 'messages'::regclass AND s.attname = 'tsv'",
        )
        words, freqs = found[0] if found and found[0][0] is not None else ([], [])
        self._shares = (time.monotonic(), dict(zip(words, freqs, strict=False)))
        return self._shares[1]

    async def get(self, conn: AsyncConnection, side: bool) -> tuple[int, float]:
        hit = self._cache.get(side)
        if (
            hit is not None
            and hit[1] >= EXACT_TOTALS_BELOW
            and time.monotonic() - hit[0] < TOTALS_TTL_S
        ):
            return hit[1], hit[2]
        col = "aux_ntok" if side else "ntok"
        found = (
            await db.tuples(
                conn,
                f"SELECT COUNT(*), COALESCE(SUM({col}), 0) FROM messages WHERE {col} IS NOT NULL",
            )
        )[0]
        rows = int(found[0])
        avg = (int(found[1]) / rows if rows else 1.0) or 1.0
        self._cache[side] = (time.monotonic(), rows, avg)
        return rows, avg


async def _window(
    conn: AsyncConnection,
    br: _Branch,
    window: int,
    ascending: bool,
    bounds: tuple[int, int],
    totals: Totals,
) -> list[int]:
    """The ids of the newest (oldest) `window` matches of a branch, taken slice by slice of
    the id range: each slice starts where the one before ended, so no row is read twice."""
    low, high = bounds
    order = "ASC" if ascending else "DESC"
    ids: list[int] = []
    span, floor = window * SPAN_GROWTH, FIRST_FLOOR
    walked = 0  # ids covered so far
    cond, cparams = br.cond, br.params
    # Before the table's first ANALYZE the planner takes any match for one row, and its
    # custom plans bound a slice by reading every candidate in the table: phrases are then
    # not fenced and statements are left to psycopg's preparing (see below).
    shares = await totals.shares(conn)
    fenced = bool(shares) and br.phrase
    if fenced and br.words:
        # GIN answers a phrase with the rows holding all its words, walking every word's
        # list: the rarest word's rows alone are nearly the same rows for less (the phrase
        # is then checked as a plain function, which no index takes).
        rarest = min(br.words, key=lambda w: shares.get(w, 0.0))
        if shares.get(rarest, 0.0) < RARE_SHARE:
            cond = "tsv @@ %s::tsquery AND ts_match_vq(tsv, %s::tsquery)"
            cparams = (lexeme_query(rarest), *br.params)
    while True:
        first, last = (
            (low + walked, low + walked + span - 1)
            if ascending
            else (high - walked - span + 1, high - walked)
        )
        limit = window - len(ids)
        if br.pairs and walked:
            # The phrase check reads each candidate's vector, and GIN alone offers every row
            # holding the words anywhere: take the candidates from the pair index instead.
            holds = ", ".join("hashtext(%s)" for _ in br.pairs)
            sql = (
                f"SELECT id FROM (SELECT id, {br.pairs_of} FROM messages WHERE sb_pairs({br.pairs_of}) "
                f"@> ARRAY[{holds}] AND id BETWEEN %s AND %s OFFSET 0) m WHERE {br.cond} "
                f"ORDER BY id {order} LIMIT %s"
            )
            params: tuple[Any, ...] = (*br.pairs, first, last, *br.params, limit)
        elif fenced:
            # With `ORDER BY id LIMIT n` the planner walks the primary key and checks every
            # row of the slice, thinking it will stop early: it takes a phrase to match as
            # many rows as hold its words. Fenced (OFFSET 0) and unordered, the slice's
            # candidates come from the word index when they are few.
            sql = (
                f"SELECT id FROM (SELECT id FROM messages WHERE {cond} AND id BETWEEN %s AND %s "
                f"OFFSET 0) m ORDER BY id {order} LIMIT %s"
            )
            params = (*cparams, first, last, limit)
        else:
            sql = (
                f"SELECT id FROM messages WHERE {br.cond} AND id BETWEEN %s AND %s "
                f"ORDER BY id {order} LIMIT %s"
            )
            params = (*br.params, first, last, limit)
        # Not prepared: psycopg prepares a statement after five runs, and PostgreSQL's
        # generic plan then serves every slice alike (rating `id BETWEEN` as a few rows, it
        # walked all 1M ids back for a slice with no match: 400-1,000 ms word searches).
        # Without statistics that generic plan is the better one (the primary key bounds
        # the slice), so there psycopg prepares as it does everywhere else.
        found = await db.tuples(conn, sql, params, prepare=False if shares else None)
        ids.extend(int(r[0]) for r in found)
        walked += span
        if len(ids) >= window or walked > high - low:
            return ids
        # the next slice: where the density so far says the rest lies, with a margin (and
        # at least a share of the walk so far that doubles each time, so a density that
        # falls off further back still takes few slices); with no match yet, all of it
        span = (
            walked * window
            if not ids
            else max(
                math.ceil((window - len(ids)) * walked * SLICE_MARGIN / len(ids)),
                math.ceil(walked * floor),
            )
        )
        floor *= 2


async def search(
    conn: AsyncConnection, req: SearchRequest, totals: Totals, now: float | None = None
) -> list[SearchHit]:
    if req.sort not in SORTS:
        raise QueryError(f"sort must be one of {', '.join(SORTS)}")
    tree = q.parse(req.query)
    where, fparams, scoped = filters(req, mark="%s")
    join = " JOIN sessions s ON s.id = m.session_id" if scoped else ""
    branches = _branches(tree, req)
    bounds = (await db.tuples(conn, "SELECT MIN(id), MAX(id) FROM messages"))[0]
    if not branches or bounds[0] is None:
        return []
    id_range = (int(bounds[0]), int(bounds[1]))
    relevance = req.sort == "relevance"
    limit, offset = max(1, req.limit), max(0, req.offset)
    need = limit + offset
    window = max(FIRST_WINDOW, need * WINDOW_PER_RESULT)
    body = "m.content, m.content_enc, m.tool_name, m.tool_calls, m.ntok, m.aux_ntok"
    while True:
        rows: list[dict[str, Any]] = []
        exhausted = True
        for br in branches:
            ids = await _window(conn, br, window, req.sort == "oldest", id_range, totals)
            exhausted &= len(ids) < window
            if not ids:
                continue
            found = await db.rows(
                conn,
                f"SELECT m.id, m.session_id, m.role, m.timestamp, {body} FROM messages m{join} "
                f"WHERE m.id = ANY(%s) AND {where}{br.extra_where}",
                (ids, *fparams, *br.extra_params),
            )
            for r in found:
                r["_side"] = br.side
            rows.extend(found)
        if len(rows) >= (need if relevance else limit) or exhausted:
            break
        window *= WINDOW_GROWTH
    if relevance:
        now = time.time() if now is None else now
        rows = await _rank(conn, rows, tree, branches, totals, now, id_range)
    else:
        rows.sort(key=lambda r: (r["timestamp"], r["id"]), reverse=req.sort == "newest")
    page = rows[offset : offset + limit]
    hits = [{k: r[k] for k in ("id", "session_id", "role", "timestamp")} for r in page]
    await _add_sessions(conn, hits)
    await _add_context(conn, hits, q.positive_terms(tree))
    return cast(list[SearchHit], hits)


async def _rank(
    conn: AsyncConnection,
    rows: list[dict[str, Any]],
    tree: q.Node,
    branches: list[_Branch],
    totals: Totals,
    now: float,
    id_range: tuple[int, int],
) -> list[dict[str, Any]]:
    scores: dict[int, float] = {}
    if len(rows) < 2:  # nothing to order
        return rows
    mixed = len({r["_side"] for r in rows})
    for br in branches:
        mine = [r for r in rows if r["_side"] == br.side]
        if not mine:
            continue
        phrases = br.phrases(tree)
        indexed, avgdl = await totals.get(conn, br.side)
        weights = [1.0] * len(phrases)
        if ranking.weighted(indexed, len(phrases), mixed):
            if ranking.exact_df(indexed):
                dfs = await _exact_dfs(conn, br.side, phrases)
            else:
                dfs = [
                    await _estimate_df(conn, br.side, p, indexed, id_range, totals) for p in phrases
                ]
            weights = [ranking.idf(indexed, df) for df in dfs]
        texts: list[str | None] = []
        lengths: list[int] = []
        for r in mine:
            stored = from_pg(r["content"], r["content_enc"])
            if br.side:
                texts.append(side_text(stored, r["tool_name"], r["tool_calls"]))
                lengths.append(r["aux_ntok"] or 0)
            else:
                texts.append(stored)
                lengths.append(r["ntok"] or 0)
        found = ranking.bm25_many(texts, lengths, phrases, weights, avgdl)
        for r, score in zip(mine, found, strict=True):
            scores[r["id"]] = blend(score, r["timestamp"], now)
    return sorted(rows, key=lambda r: (scores.get(r["id"], 0.0), r["id"]), reverse=True)


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
            term = _Branch(
                True,
                f"{column} @@ %s::tsquery",
                (phrase.match,),
                pairs=tuple(token_pairs(phrase.tokens, phrase.prefix)),
                pairs_of=column,
            )
        else:
            term = _Branch(
                False,
                f"{column} @@ %s::tsquery",
                (phrase.match,),
                words=tuple(whole_tokens(phrase.tokens, phrase.prefix)),
            )
        ids = await _window(conn, term, ranking.DF_SAMPLE, False, id_range, totals)
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


async def _add_sessions(conn: AsyncConnection, hits: list[dict[str, Any]]) -> None:
    wanted = sorted({h["session_id"] for h in hits})
    if not wanted:
        return
    found = await db.rows(
        conn,
        "SELECT id, source, model, title, started_at FROM sessions WHERE id = ANY(%s)",
        (wanted,),
    )
    by_id = {r.pop("id"): r for r in found}
    for h in hits:
        h.update(
            by_id.get(h["session_id"], dict.fromkeys(("source", "model", "title", "started_at")))
        )


async def _add_context(
    conn: AsyncConnection, hits: list[dict[str, Any]], marks: list[q.Term]
) -> None:
    if not hits:
        return
    found = await db.tuples(
        conn,
        "SELECT h.hid, b.id, b.role, b.content, b.content_enc, a.id, a.role, a.content, "
        "a.content_enc, o.content, o.content_enc "
        "FROM unnest(%s::bigint[], %s::text[]) AS h(hid, sid) "
        "LEFT JOIN LATERAL (SELECT id, role, content, content_enc FROM messages "
        "WHERE session_id = h.sid AND id < h.hid ORDER BY id DESC LIMIT 1) b ON TRUE "
        "LEFT JOIN LATERAL (SELECT id, role, content, content_enc FROM messages "
        "WHERE session_id = h.sid AND id > h.hid ORDER BY id LIMIT 1) a ON TRUE "
        "LEFT JOIN messages o ON o.id = h.hid",
        ([h["id"] for h in hits], [h["session_id"] for h in hits]),
    )
    by_hit = {r[0]: r for r in found}
    for h in hits:
        r = by_hit[h["id"]]
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
        req = sqlite_search.SearchRequest(
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
