"""Full-text search over every message: query -> FTS5 on the right index -> ranked hits
with snippets and their neighbouring messages.

Each message's content is searched in exactly one index: the segmented side index when it
holds CJK or emoji (`messages_aux.seg_text`), otherwise the main `sb_messages_fts`. Tool names
and call arguments are searched when the role filter asks for `tool`. Relevance is BM25
(state/ranking.py) damped by age, so a fresh session is not drowned by a pile of old,
similar messages.
"""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .. import query as q
from .. import ranking
from ..errors import QueryError
from ..records import SearchHit
from ..textindex import segment
from . import listing, sidewords, snippets
from .dispatch import Dispatch
from .readers import heavy
from .schema import FTS_TABLE
from .searchreq import EVERY_SESSION, filters, literal_where
from .searchreq import SearchRequest as SearchRequest

SORTS = ("relevance", "newest", "oldest")
RECENCY_HALF_LIFE_DAYS = 30.0
HALF_LIFE_S = RECENCY_HALF_LIFE_DAYS * 86400


def _order(sort: str, of: str = "") -> str:
    way = "DESC" if sort == "newest" else "ASC"
    return f"{of}timestamp {way}, {of}id {way}"


def blend(score: float, timestamp: float, now: float) -> float:
    """Dividing by (1 + age/half-life) pulls old hits down, so between two equally relevant
    hits the newer one wins."""
    return score / (1.0 + max(0.0, now - timestamp) / HALF_LIFE_S)


def blend_many(scores: list[float], timestamps: list[float], now: float) -> list[float]:
    """blend() of many hits at once, to the bit (max(0.0, age) written out: the age if it
    is above 0.0, else 0.0)."""
    return [
        score / (1.0 + (age if (age := now - ts) > 0.0 else 0.0) / HALF_LIFE_S)
        for score, ts in zip(scores, timestamps, strict=True)
    ]


_HIT_COLUMNS = "m.id AS id, m.session_id AS session_id, m.role AS role, m.timestamp AS timestamp"
FIRST_WINDOW = 500
WINDOW_PER_RESULT = 25
WINDOW_GROWTH = 4
NARROW_EXTRA = 10  # bm25()'s best 2 * page + this many meet their messages first
# Scoring more candidates than this in Python (ranking.py, about a millisecond) is work for
# a reader thread, not for the event loop's (readers.heavy)
INLINE_SCORED = 500


@dataclass(frozen=True)
class _Branch:
    table: str  # sb_messages_fts or messages_aux_fts
    match: str
    extra_where: str = ""
    extra_params: tuple[str, ...] = ()
    # the side index with tools: the seg_text and tool_text halves of `match`
    seg_match: str = ""
    tool_match: str = ""

    @property
    def aux(self) -> bool:
        return self.table == "messages_aux_fts"

    @property
    def body(self) -> str:
        """The text this branch's index holds for a hit and its docsize record, for scoring."""
        size = f"(SELECT sz FROM {self.table}_docsize WHERE id = m.id)"
        if self.aux:
            return (
                "(SELECT COALESCE(a.seg_text, '') || ' ' || COALESCE(a.tool_text, '') "
                f"FROM messages_aux a WHERE a.message_id = m.id) AS body, {size} AS size"
            )
        return f"m.content AS body, {size} AS size"

    def phrases(self, tree: q.Node) -> list[ranking.Phrase]:
        out = []
        for term in q.positive_terms(tree):
            text = segment(term.text) if self.aux else term.text
            tokens = tuple(ranking.fts_tokens(text))
            if tokens:
                match = q.to_fts(term, segmented=self.aux)
                out.append(
                    ranking.Phrase(
                        tokens, term.prefix, "{seg_text} : " + match if self.aux else match
                    )
                )
        return out


def _branches(tree: q.Node, roles: Sequence[str], include_tools: bool = False) -> list[_Branch]:
    """Each message's content lives in exactly one index: the segmented side index when it
    holds CJK/emoji, otherwise the main one; tool text is in the side index."""
    out = []
    if not q.needs_aux(tree):
        out.append(
            _Branch(
                FTS_TABLE,
                q.to_fts(tree, segmented=False),
                " AND NOT EXISTS (SELECT 1 FROM messages_aux a WHERE a.message_id = m.id AND a.seg_text IS NOT NULL)",
            )
        )
    seg = aux = "{seg_text} : " + q.to_fts(tree, segmented=True)
    tools = "tool" in roles or include_tools
    tool = f"{{tool_text}} : {q.to_fts(tree, segmented=False)}" if tools else ""
    if tools:
        aux = f"({seg}) OR ({tool})"
    literal, params = literal_where(tree, tools)
    out.append(_Branch("messages_aux_fts", aux, literal, params, seg, tool))
    return out


_BLOCKS = (
    f"SELECT (SELECT block FROM {FTS_TABLE}_data WHERE id = 1), "
    "(SELECT block FROM messages_aux_fts_data WHERE id = 1)"
)
# What a plan depends on in the indexes' averages records: the side index's columns hold
# any token (seg_text, tool_text), FTS5's bm25() may rank the main one. The last search's
# finding is each search's guess, checked against the records its own statement reads
# (the same snapshot): a wrong guess runs the statement again.
_Indexes = tuple[bool, bool, bool]
_last: list[_Indexes] = [(True, True, True)]


def _indexes(main: bytes | None, side: bytes | None) -> _Indexes:
    rows, seg, tool = _totals(main, side)
    return seg, tool, _c_bm25(rows)


@functools.lru_cache(maxsize=16)
def _totals(main: bytes | None, side: bytes | None) -> tuple[int, bool, bool]:
    seg, tool = (ranking.column_totals(side) + [0, 0])[:2]
    return ranking.totals_of(main)[0], bool(seg), bool(tool)


def _live(branches: tuple[_Planned, ...], seg: bool, tool: bool) -> tuple[_Planned, ...]:
    """The branches that can match. A column of the side index that holds no token at
    all (no message with CJK/emoji, or none with tool calls: its averages record says so)
    is left out of the MATCH, which FTS5 would otherwise look up term by term in every
    segment."""
    out = []
    for br, phrases in branches:
        if br.aux and (not seg or (br.tool_match and not tool)):
            if not seg and not (br.tool_match and tool):
                continue  # nothing in the side index can match
            match = br.tool_match if not seg else br.seg_match
            br = dataclasses.replace(br, match=match)
        out.append((br, phrases))
    return tuple(out)


_Planned = tuple[_Branch, list[ranking.Phrase]]


@functools.lru_cache(maxsize=256)
def _plan(
    query: str, roles: tuple[str, ...], include_tools: bool
) -> tuple[tuple[_Planned, ...], tuple[str, ...], bool, bool, frozenset[str] | None]:
    """What a query asks of the indexes (a pure function of its text, so repeated and
    paged searches parse once): each branch with its ranking phrases, the terms snippets
    mark, and whether FTS5's own bm25() scores the main index's hits: when it gives
    ranking.py's score there (its phrases are exactly the query's terms: no NOT, whose
    phrases bm25() counts too, and every term makes tokens) and its document counts are
    worth their walk (several phrases need them; a lone phrase of several words would be
    checked word position by word position in every row holding its words, for an IDF
    that scales every score alike); whether a term is a prefix; last, the plain words
    every hit holds (sidewords.required). The terms come folded, as snippets compare them."""
    tree = q.parse(query)
    branches = tuple((br, br.phrases(tree)) for br in _branches(tree, roles, include_tools))
    terms = q.terms(tree)
    phrases = branches[0][1]
    native = (
        len(q.positive_terms(tree)) == len(terms)
        and all(ranking.fts_tokens(t.text) for t in terms)
        and (len(phrases) > 1 or (len(phrases) == 1 and len(phrases[0].tokens) == 1))
        # a term given twice is one phrase to bm25()'s IDF but two to the Python scoring
        and len({(p.tokens, p.prefix) for p in phrases}) == len(phrases)
        and not _and_under_or(tree)
    )
    words = snippets.folded_words(q.positive_terms(tree))
    return branches, words, native, any(t.prefix for t in terms), sidewords.required(tree)


def _and_under_or(node: q.Node, under_or: bool = False) -> bool:
    """Whether an AND lies under an OR (`a b OR c`). bm25() counts a phrase's instances in
    a row only when FTS5's walk has its node on that row, and an AND under an OR is left
    wherever its own walk stopped when the row matched through the OR's other side: a row
    holding `a` but not `b` may then count `a` or not. Anywhere else a phrase in the row is
    on it, so bm25() counts what ranking.py counts in the text."""
    if isinstance(node, q.Term):
        return False
    if isinstance(node, q.Not):
        return _and_under_or(node.item, under_or)
    if isinstance(node, q.And) and under_or:
        return True
    return any(_and_under_or(i, under_or or isinstance(node, q.Or)) for i in node.items)


def search(
    conn: sqlite3.Connection,
    req: SearchRequest,
    now: float | None = None,
    neighbours: bool = False,
    path: str | None = None,
) -> list[SearchHit]:
    """Ranked hits for one page.

    Ranking looks at the newest N matches of each index (rowid order is arrival order, and
    FTS5 walks it without scoring everything), N starting at 500 and growing fourfold until
    the page fills or the matches run out. So cost follows the page, not the number of
    matches, and relevance is judged among recent matches first. One statement takes each
    index's window, its size and the candidates in it; one more adds the page's sessions,
    snippets and neighbours (`neighbours`: also the hit's tool name and its neighbours'
    whole content under `_near`, for the Hermes-shaped answer). With the database file's
    `path`, a search for words the side index lacks leaves it out (sidewords.py)."""
    if req.sort not in SORTS:
        raise QueryError(f"sort must be one of {', '.join(SORTS)}")
    planned, words, native, prefixed, needed = _plan(req.query, tuple(req.roles), req.include_tools)
    side = sidewords.known(path) if needed is not None else None
    if prefixed:
        heavy(conn)  # FTS5 gathers a prefix's terms in one call, which no handler stops
    relevance = req.sort == "relevance"
    limit, offset = max(1, req.limit), max(0, req.offset)
    at = time.time() if now is None else now
    guess = _last[0]
    while True:
        branches = _live(planned, guess[0], guess[1])
        skipped = None
        if side is not None and len(branches) > 1 and needed and not needed <= side.words:
            aux = branches[-1][0]
            if aux.match == aux.seg_match:  # no tool text asked for: the side index goes
                branches, skipped = branches[:-1], side.state
        if not branches:  # nothing can match, if the guess holds
            found_out = _indexes(*conn.execute(_BLOCKS).fetchone())
            if found_out == guess:
                return []
        else:
            # FTS5's bm25() ranks the main index's window when it equals ranking.py's score
            c_rank = relevance and native and not branches[0][0].aux and guess[2]
            rows, names, head = _candidates(
                conn, req, branches, c_rank, filters(req), at, skipped is not None
            )
            found_out = _indexes(head[-3], head[-2])
            if skipped is not None and (head[-2], head[len(branches)]) != skipped:
                assert path is not None
                sidewords.forget(path)  # the side index changed: look it up
                side = None
                continue
            if found_out == guess:
                if path and needed and side is None and len(branches) > 1:
                    sidewords.read_later(path, head[-2])
                break
        guess = _last[0] = found_out
    if relevance:
        blocks = [head[-2] if br.aux else head[-3] for br, _ in branches]
        rows = _rank(conn, rows, names, branches, blocks, at)
        rows = rows[offset : offset + limit]
    hits = [{"id": r[0], "session_id": r[1], "role": r[2], "timestamp": r[3]} for r in rows]
    snippets.add_page(conn, hits, words, neighbours)
    return cast(list[SearchHit], hits)


def _candidates(
    conn: sqlite3.Connection,
    req: SearchRequest,
    branches: tuple[_Planned, ...],
    c_rank: bool,
    where_params_scoped: tuple[str, list[object], bool],
    at: float,
    side_state: bool = False,
) -> tuple[list[tuple[Any, ...]], list[str], tuple[Any, ...]]:
    """The candidates from each index's window (see `search`), their column names, and the
    head: each window's size, (`side_state`) the side index's structure record, the two
    averages records, the best bm25 left out."""
    where, fparams, scoped = where_params_scoped
    relevance = req.sort == "relevance"
    limit, offset = max(1, req.limit), max(0, req.offset)
    need = limit + offset
    window = max(FIRST_WINDOW, need * WINDOW_PER_RESULT)
    nb = len(branches)
    # bm25() and a message's age give its score: first only the NARROW best by bm25 alone
    # meet their messages (the age only lowers a score), which settles the page when the
    # worst score on it still beats the best bm25 left out; else the whole window
    narrow = c_rank
    while True:
        cut = NARROW_EXTRA + 2 * need if narrow else 0
        sql, names = _window_sql(
            tuple(br for br, _ in branches),
            c_rank,
            cut,
            window,
            need,
            req.sort,
            where,
            scoped,
            side_state,
        )
        lone = _lone(relevance, c_rank, nb)
        params: list[object] = [] if lone else [br.match for br, _ in branches]
        for i, (br, _) in enumerate(branches):
            if c_rank and i == 0:
                params.append(at)
            params += [*fparams, *br.extra_params]
        if lone:  # its MATCH where its rows are read, after the filters
            params.append(branches[0][0].match)
        if not relevance:
            params += [limit, offset]
        try:
            found = conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            # Every term is quoted, so this means FTS5 refused something we did not
            # foresee; report it as a query problem, never as an SQL error.
            if "fts5" in str(exc) or "syntax" in str(exc) or "malformed MATCH" in str(exc):
                raise QueryError(f"the query could not be run: {exc}") from exc
            raise
        w = nb + 3 + side_state  # the head's width
        if lone:  # the head is the row without a candidate; the window's size, its rows
            head: tuple[Any, ...] = next(r for r in found if r[w + 7] is None)[:w]
            head = (len(found) - 1, *head[1:])
            rows = [r[w:] for r in found if r[w] is not None and r[w + 8]]
        else:
            head = next(r for r in found if r[0] is not None)[:w]
            rows = [r[w:] for r in found if r[w] is not None]
        if narrow and head[-1] is not None:
            narrow = False
            # bm25() is negative, so -sc and its age-damped score are positive, the
            # latter never above the former: a page whose worst beats the best left out
            # is the page of the whole window
            scored = [r[6] for r in rows if r[7] == FTS_TABLE]
            if len(scored) < need or min(scored) <= head[-1]:
                continue
        # relevance: enough candidates for the page; otherwise the page itself is full
        if len(rows) >= (need if relevance else limit) or all(n < window for n in head[:nb]):
            return rows, names, head
        window *= WINDOW_GROWTH


@functools.lru_cache(maxsize=512)
def _window_sql(
    branches: tuple[_Branch, ...],
    c_rank: bool,
    cut: int,
    window: int,
    need: int,
    sort: str,
    where: str,
    scoped: bool,
    side_state: bool = False,
) -> tuple[str, list[str]]:
    """The statement of `_candidates` and its candidates' column names. Parameters: each
    branch's MATCH, then per branch (the time, for the bm25() one) the filters' and its
    own, then (not by relevance) LIMIT and OFFSET."""
    relevance = sort == "relevance"
    direction = "ASC" if sort == "oldest" else "DESC"
    # Candidates meet sessions only when the scope filters on them.
    join = " JOIN sessions s ON s.id = m.session_id" if scoped else ""
    ctes: list[str] = []
    parts: list[str] = []
    if _lone(relevance, c_rank, len(branches)):
        # one window no bm25() scores, read where its rows are, each with its message and
        # whether the filters keep it (its size is its rows' count: no table of it)
        br = branches[0]
        counts = "NULL, "
        if side_state:
            counts += "(SELECT block FROM messages_aux_fts_data WHERE id = 10), "
        part = (
            f"SELECT {_HIT_COLUMNS}, {br.body}, NULL AS score, '{br.table}' AS fts, "
            f"({where}{br.extra_where}) AS ok FROM (SELECT rowid AS rid FROM {br.table} "
            f"WHERE {br.table} MATCH ? ORDER BY rowid {direction} LIMIT {int(window)}) f "
            f"LEFT JOIN messages m ON m.id = f.rid{' LEFT' + join if join else ''}"
        )
        head = counts + _BLOCKS.removeprefix("SELECT ") + ", NULL"
        sql = (
            f"SELECT {head}, {_nulls(len(_NAMES) + 1)} UNION ALL "
            f"SELECT {_nulls(side_state + 4)}, * FROM ({part})"
        )
        return sql, [*_NAMES, "ok"]
    for i, br in enumerate(branches):
        native_i = c_rank and i == 0
        body = br.body if relevance and not native_i else "NULL AS body, NULL AS size"
        score = ", bm25(" + br.table + ") AS sc" if native_i else ""
        ctes.append(
            f"w{i} AS MATERIALIZED (SELECT rowid AS rid{score} FROM {br.table} "
            f"WHERE {br.table} MATCH ? ORDER BY rowid {direction} LIMIT {int(window)})"
        )
        if native_i and cut:  # the best cut + 1 by bm25, sorted once: the cut and the next
            ctes.append(f"n{i} AS MATERIALIZED (SELECT * FROM w{i} ORDER BY sc LIMIT {cut + 1})")
        # (LEFT JOIN: for an inner join of the window the planner builds a Bloom filter
        # over every message first, 20 ms on 100,000 of them; an index row without its
        # message, which triggers never leave, would come as a NULL id, dropped below)
        # the best `cut`: those better than the best left out (aggregates of n, no sort)
        source = (
            f"(SELECT * FROM n{i} WHERE (SELECT COUNT(*) FROM n{i}) <= {cut} "
            f"OR sc < (SELECT max(sc) FROM n{i}))"
            if native_i and cut
            else f"w{i}"
        )
        part = (
            f"SELECT {_HIT_COLUMNS}, {body}, "
            + (
                f"-f.sc / (1.0 + max(0.0, ? - m.timestamp) / {HALF_LIFE_S!r}) AS score"
                if native_i
                else "NULL AS score"
            )
            + f", '{br.table}' AS fts FROM {source} f "
            f"LEFT JOIN messages m ON m.id = f.rid{join} WHERE {where}{br.extra_where}"
        )
        if native_i:  # the best `need` of this index: no other can rank above them
            part = f"SELECT * FROM ({part} ORDER BY score DESC, id DESC LIMIT {need})"
        parts.append(part)
    union = " UNION ALL ".join(parts)
    if not relevance:  # the page itself, in its order
        union = f"SELECT * FROM ({union}) ORDER BY {_order(sort)} LIMIT ? OFFSET ?"
    # one row of each window's size, both averages records and the best bm25 left out,
    # joined to every candidate (or to none: NULLs)
    counts = "".join(f"(SELECT COUNT(*) FROM w{i}), " for i in range(len(branches)))
    if side_state:  # the side index's structure record, when its words stood in for it
        counts += "(SELECT block FROM messages_aux_fts_data WHERE id = 10), "
    counts += _BLOCKS.removeprefix("SELECT ")
    counts += (
        f", (SELECT CASE WHEN COUNT(*) > {cut} THEN -max(sc) END FROM n0)" if cut else ", NULL"
    )
    if relevance:  # the head a row of its own before the candidates (in any order)
        width = len(branches) + side_state + 3
        sql = (
            f"WITH {', '.join(ctes)} SELECT {counts}, {_nulls(len(_NAMES))} UNION ALL "
            f"SELECT {_nulls(width)}, * FROM ({union})"
        )
    else:  # the page in its order, each row with the head
        sql = (
            f"WITH {', '.join(ctes)} SELECT c.*, p.* FROM (SELECT {counts}) c "
            f"LEFT JOIN ({union}) p ON 1 ORDER BY {_order(sort, 'p.')}"
        )
    return sql, _NAMES


# the candidates' columns; a hit is the first four
_NAMES = ["id", "session_id", "role", "timestamp", "body", "size", "score", "fts"]


def _lone(relevance: bool, c_rank: bool, branches: int) -> bool:
    """Whether the statement reads one window that bm25() does not score, by relevance
    (a CJK query, a phrase): read where its rows are, with no table of its own."""
    return relevance and branches == 1 and not c_rank


def _nulls(n: int) -> str:
    return ", ".join(["NULL"] * n)


def _c_bm25(indexed: int) -> bool:
    """Whether the main index is small enough for FTS5's bm25() (ranking.EXACT_DF_BELOW)."""
    return ranking.exact_df(indexed)


def _rank(
    conn: sqlite3.Connection,
    rows: list[tuple[Any, ...]],
    names: list[str],
    branches: Sequence[_Planned],
    blocks: Sequence[bytes | None],
    now: float,
) -> list[tuple[Any, ...]]:
    """BM25 (ranking.py) of each candidate against its own index, blended with recency;
    best first, newer first among equals. Rows FTS5's bm25() scored come scored.
    (Tuples: only the page becomes dicts.)"""
    if len(rows) < 2:  # nothing to order
        return rows
    col = {name: i for i, name in enumerate(names)}
    i_fts, i_body, i_size, i_ts, i_id, i_sc = (
        col["fts"],
        col["body"],
        col["size"],
        col["timestamp"],
        col["id"],
        col["score"],
    )
    scores: dict[int, float] = {}
    mixed = len({r[i_fts] for r in rows})
    for (br, phrases), block in zip(branches, blocks, strict=True):
        mine = [r for r in rows if r[i_fts] == br.table]
        if not mine:
            continue
        if mine[0][i_sc] is not None:  # FTS5's bm25(), blended in the statement
            for r in mine:
                scores[r[i_id]] = r[i_sc]
            continue
        if len(mine) > INLINE_SCORED:
            heavy(conn)
        indexed, avgdl = ranking.totals_of(block)
        weights = [1.0] * len(phrases)
        if ranking.weighted(indexed, len(phrases), mixed):
            weights = [ranking.idf(indexed, df) for df in _dfs(conn, br, phrases, indexed)]
        lengths = [ranking.doc_length(r[i_size]) for r in mine]
        found = ranking.bm25_many([r[i_body] for r in mine], lengths, phrases, weights, avgdl)
        for r, score in zip(mine, found, strict=True):
            scores[r[i_id]] = blend(score, r[i_ts], now)
    return sorted(rows, key=lambda r: (scores.get(r[i_id], 0.0), r[i_id]), reverse=True)


def _dfs(
    conn: sqlite3.Connection, br: _Branch, phrases: list[ranking.Phrase], indexed: int
) -> list[int]:
    """Each phrase's document frequency in the branch's index: counted on a small index,
    else estimated from its newest matches (ranking.py), in one statement."""
    matches = [p.match for p in phrases]
    if ranking.exact_df(indexed):
        walks = ", ".join(
            f"(SELECT COUNT(*) FROM {br.table} WHERE {br.table} MATCH ?)" for _ in matches
        )
        return list(conn.execute(f"SELECT {walks}", matches).fetchone())
    # the id range: two subqueries (SQLite answers MIN or MAX alone from the index, both
    # at once by a scan)
    table, key = ("messages_aux", "message_id") if br.aux else ("messages", "id")
    sql, params = ranking.df_sample_sql(br.table, matches)
    sample = conn.execute(
        f"SELECT (SELECT MIN({key}) FROM {table}), (SELECT MAX({key}) FROM {table}), "
        + sql.removeprefix("SELECT "),
        params,
    ).fetchone()
    low, high = sample[0], sample[1]
    return [
        ranking.df_of_sample(sample[2 + 2 * i], sample[3 + 2 * i], indexed, (low, high))
        for i in range(len(matches))
    ]


class SearchOps(Dispatch):
    """SessionDB's message search."""

    async def search_messages(
        self,
        query: str,
        *,
        sources: Iterable[str] = (),
        exclude_sources: Iterable[str] = (),
        roles: Iterable[str] = (),
        scope: listing.SessionFilter | None = None,
        exclude_session_ids: Iterable[str] = (),
        sort: str = "relevance",
        limit: int = 20,
        offset: int = 0,
    ) -> list[SearchHit]:
        """Search every message (see state.sqlite.search); raises QueryError for unusable queries."""
        req = SearchRequest(
            query=query,
            sources=tuple(sources),
            exclude_sources=tuple(exclude_sources),
            roles=tuple(roles),
            scope=scope or EVERY_SESSION,
            exclude_session_ids=tuple(exclude_session_ids),
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return await self._read_short(search, req, None, False, str(self.path))
