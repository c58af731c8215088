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
from dataclasses import dataclass, field
from typing import Any, cast

from .. import query as q
from .. import ranking
from ..errors import QueryError
from ..records import SearchHit
from ..rows import Row
from ..textindex import is_cjk, is_symbol, segment
from . import listing
from .dispatch import Dispatch
from .listing import SessionFilter
from .readers import heavy
from .schema import FTS_TABLE
from .snippets import MARK_CLOSE as MARK_CLOSE
from .snippets import MARK_OPEN as MARK_OPEN
from .snippets import make_snippet

SORTS = ("relevance", "newest", "oldest")
CONTEXT_CHARS = 200
RECENCY_HALF_LIFE_DAYS = 30.0
HALF_LIFE_S = RECENCY_HALF_LIFE_DAYS * 86400


@dataclass(frozen=True)
class SearchRequest:
    query: str
    sources: Sequence[str] = ()
    exclude_sources: Sequence[str] = ()
    roles: Sequence[str] = ()
    scope: SessionFilter = field(default_factory=lambda: SessionFilter(include_children=True))
    exclude_session_ids: Sequence[str] = ()
    sort: str = "relevance"
    limit: int = 20
    offset: int = 0
    # Match tool names and arguments whatever the role filter (Hermes's default).
    include_tools: bool = False
    # Rewound rows (active=0, not compacted) were taken back by the user: hidden unless asked.
    include_inactive: bool = False


def filters(req: SearchRequest, mark: str = "?") -> tuple[str, list[object], bool]:
    """(WHERE text over `m` and `s`, its parameters, whether it filters on sessions);
    `mark` is the placeholder (`%s` for PostgreSQL)."""
    scope = SessionFilter(
        source=req.scope.source,
        sources=tuple(req.scope.sources) + tuple(req.sources),
        exclude_sources=tuple(req.scope.exclude_sources) + tuple(req.exclude_sources),
        user_id=req.scope.user_id,
        chat_id=req.scope.chat_id,
        thread_id=req.scope.thread_id,
        include_children=True,
        include_archived=True,
        thread_exact=req.scope.thread_exact,
        routed_only=req.scope.routed_only,
    )
    where, params = scope.where("s", mark)
    scoped = where not in ("1", "TRUE")  # what SessionFilter.where says for no clause
    if req.roles:
        where += f" AND m.role IN ({', '.join(mark for _ in req.roles)})"
        params += list(req.roles)
    if not req.include_inactive:
        where += " AND NOT (COALESCE(m.active, 1) = 0 AND COALESCE(m.compacted, 0) = 0)"
    if req.exclude_session_ids:
        where += f" AND m.session_id NOT IN ({', '.join(mark for _ in req.exclude_session_ids)})"
        params += list(req.exclude_session_ids)
    return where, params, scoped


def _order(sort: str, of: str = "") -> str:
    way = "DESC" if sort == "newest" else "ASC"
    return f"{of}timestamp {way}, {of}id {way}"


def blend(score: float, timestamp: float, now: float) -> float:
    """Dividing by (1 + age/half-life) pulls old hits down, so between two equally relevant
    hits the newer one wins."""
    return score / (1.0 + max(0.0, now - timestamp) / HALF_LIFE_S)


_HIT_COLUMNS = "m.id AS id, m.session_id AS session_id, m.role AS role, m.timestamp AS timestamp"
_SESSION_COLUMNS = ("source", "model", "title", "started_at")  # added for the page only
FIRST_WINDOW = 500
WINDOW_PER_RESULT = 25
WINDOW_GROWTH = 4
NARROW_EXTRA = 10  # bm25()'s best 2 * page + this many meet their messages first
# Scoring more candidates than this in Python (ranking.py) is work for a reader thread, not
# for the event loop's (readers.heavy)
INLINE_SCORED = 100


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


def _live(
    conn: sqlite3.Connection, branches: tuple[_Planned, ...]
) -> tuple[tuple[_Planned, ...], int]:
    """The branches that can match, and the main index's rows. A column of the side index
    that holds no token at all (no message with CJK/emoji, or none with tool calls: its
    averages record says so) is left out of the MATCH, which FTS5 would otherwise look up
    term by term in every segment."""
    main, side = conn.execute(
        f"SELECT (SELECT block FROM {FTS_TABLE}_data WHERE id = 1), "
        "(SELECT block FROM messages_aux_fts_data WHERE id = 1)"
    ).fetchone()
    rows = ranking.totals_of(main)[0]
    seg, tool = (ranking.column_totals(side) + [0, 0])[:2]
    out = []
    for br, phrases in branches:
        if br.aux and (not seg or (br.tool_match and not tool)):
            if not seg and not (br.tool_match and tool):
                continue  # nothing in the side index can match
            match = br.tool_match if not seg else br.seg_match
            br = dataclasses.replace(br, match=match)
        out.append((br, phrases))
    return tuple(out), rows


_Planned = tuple[_Branch, list[ranking.Phrase]]


@functools.lru_cache(maxsize=256)
def _plan(
    query: str, roles: tuple[str, ...], include_tools: bool
) -> tuple[tuple[_Planned, ...], list[q.Term], bool]:
    """What a query asks of the indexes (a pure function of its text, so repeated and
    paged searches parse once): each branch with its ranking phrases, the terms snippets
    mark, and whether FTS5's own bm25() scores the main index's hits: when it gives
    ranking.py's score there (its phrases are exactly the query's terms: no NOT, whose
    phrases bm25() counts too, and every term makes tokens) and its document counts are
    worth their walk (several phrases need them; a lone phrase of several words would be
    checked word position by word position in every row holding its words, for an IDF
    that scales every score alike)."""
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
    )
    return branches, q.positive_terms(tree), native


def _like(piece: str) -> str:
    return "%" + piece.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def literal_where(
    tree: q.Node, tools: bool, mark: str = "?", like: str = "LIKE"
) -> tuple[str, tuple[str, ...]]:
    """The segmented index drops punctuation (`100%完成` finds `100完成`), so a CJK/emoji
    term that holds any must also appear literally: a LIKE with `%`, `_` escaped. Only
    terms every hit must contain (the query's top-level AND) are checked."""
    items = tree.items if isinstance(tree, q.And) else (tree,)
    clauses: list[str] = []
    params: list[str] = []
    cols = ("m.content", "m.tool_name", "m.tool_calls") if tools else ("m.content",)
    for term in items:
        if not isinstance(term, q.Term) or not term.needs_aux:
            continue
        for piece in term.text.split():
            if all(ch.isalnum() or is_cjk(ch) or is_symbol(ch) for ch in piece):
                continue
            ors = " OR ".join(f"{c} {like} {mark} ESCAPE '\\'" for c in cols)
            clauses.append(f" AND ({ors})")
            params += [_like(piece)] * len(cols)
    return "".join(clauses), tuple(params)


def search(
    conn: sqlite3.Connection,
    req: SearchRequest,
    now: float | None = None,
    neighbours: bool = False,
) -> list[SearchHit]:
    """Ranked hits for one page.

    Ranking looks at the newest N matches of each index (rowid order is arrival order, and
    FTS5 walks it without scoring everything), N starting at 500 and growing fourfold until
    the page fills or the matches run out. So cost follows the page, not the number of
    matches, and relevance is judged among recent matches first. One statement takes each
    index's window, its size and the candidates in it; one more adds the page's sessions,
    snippets and neighbours (`neighbours`: also the hit's tool name and its neighbours'
    whole content under `_near`, for the Hermes-shaped answer)."""
    if req.sort not in SORTS:
        raise QueryError(f"sort must be one of {', '.join(SORTS)}")
    branches, marks, native = _plan(req.query, tuple(req.roles), req.include_tools)
    where, fparams, scoped = filters(req)
    # Candidates meet sessions only when the scope filters on them.
    join = " JOIN sessions s ON s.id = m.session_id" if scoped else ""
    relevance = req.sort == "relevance"
    limit, offset = max(1, req.limit), max(0, req.offset)
    need = limit + offset
    direction = "ASC" if req.sort == "oldest" else "DESC"
    window = max(FIRST_WINDOW, need * WINDOW_PER_RESULT)
    branches, indexed = _live(conn, branches)
    if not branches:
        return []
    nb = len(branches)
    # FTS5's bm25() ranks the main index's window when it equals ranking.py's score there
    c_rank = relevance and native and not branches[0][0].aux and _c_bm25(indexed)
    at = time.time() if now is None else now
    # bm25() and a message's age give its score: first only the NARROW best by bm25 alone
    # meet their messages (the age only lowers a score), which settles the page when the
    # worst score on it still beats the best bm25 left out; else the whole window
    narrow = c_rank
    while True:
        ctes: list[str] = []
        parts: list[str] = []
        params: list[object] = []
        inner: list[object] = []
        cut = NARROW_EXTRA + 2 * need if narrow else 0
        for i, (br, _) in enumerate(branches):
            native_i = c_rank and i == 0
            body = br.body if relevance and not native_i else "NULL AS body, NULL AS size"
            score = ", bm25(" + br.table + ") AS sc" if native_i else ""
            ctes.append(
                f"w{i} AS MATERIALIZED (SELECT rowid AS rid{score} FROM {br.table} "
                f"WHERE {br.table} MATCH ? ORDER BY rowid {direction} LIMIT {int(window)})"
            )
            # (LEFT JOIN: for an inner join of the window the planner builds a Bloom filter
            # over every message first, 20 ms on 100,000 of them; an index row without its
            # message, which triggers never leave, would come as a NULL id, dropped below)
            params.append(br.match)
            source = (
                f"(SELECT * FROM w{i} ORDER BY sc LIMIT {cut})" if native_i and cut else f"w{i}"
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
                inner.append(at)
            parts.append(part)
            inner += [*fparams, *br.extra_params]
        union = " UNION ALL ".join(parts)
        if not relevance:  # the page itself, in its order
            union = f"SELECT * FROM ({union}) ORDER BY {_order(req.sort)} LIMIT ? OFFSET ?"
            inner += [limit, offset]
        # one row of each window's size and index totals, and the best bm25 left out,
        # joined to every candidate (or to none: NULLs)
        counts = ", ".join(
            f"(SELECT COUNT(*) FROM w{i}), (SELECT block FROM {br.table}_data WHERE id = 1)"
            for i, (br, _) in enumerate(branches)
        )
        counts += f", (SELECT -sc FROM w0 ORDER BY sc LIMIT 1 OFFSET {cut})" if cut else ", NULL"
        sql = (
            f"WITH {', '.join(ctes)} SELECT c.*, p.* FROM (SELECT {counts}) c "
            f"LEFT JOIN ({union}) p ON 1"
            + ("" if relevance else f" ORDER BY {_order(req.sort, 'p.')}")
        )
        w = 2 * nb + 1  # the head's width
        try:
            cur = conn.execute(sql, params + inner)
            names = [d[0] for d in cur.description][w:]
            found = cur.fetchall()
        except sqlite3.OperationalError as exc:
            # Every term is quoted, so this means FTS5 refused something we did not
            # foresee; report it as a query problem, never as an SQL error.
            if "fts5" in str(exc) or "syntax" in str(exc) or "malformed MATCH" in str(exc):
                raise QueryError(f"the query could not be run: {exc}") from exc
            raise
        head: tuple[Any, ...] = found[0][:w] if found else (0, None) * nb + (None,)
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
        if len(rows) >= (need if relevance else limit) or all(n < window for n in head[0:-1:2]):
            break
        window *= WINDOW_GROWTH
    if relevance:
        rows = _rank(conn, rows, names, branches, head[1:-1:2], at)
        rows = rows[offset : offset + limit]
    hits = [dict(zip(names, row, strict=True)) for row in rows]
    _add_page(conn, hits, marks, neighbours)
    for h in hits:
        for key in ("fts", "body", "size", "score"):
            h.pop(key, None)
    return cast(list[SearchHit], hits)


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
    col = {name: i for i, name in enumerate(names)}
    i_fts, i_body, i_size, i_ts, i_id, i_sc = (
        col["fts"],
        col["body"],
        col["size"],
        col["timestamp"],
        col["id"],
        col["score"],
    )
    if len(rows) < 2:  # nothing to order
        return rows
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


def _add_page(
    conn: sqlite3.Connection, hits: list[Row], marks: list[q.Term], neighbours: bool
) -> None:
    """Each hit's session columns, snippet and neighbours in one statement for the page."""
    if not hits:
        return
    values = ", ".join("(?, ?)" for _ in hits)
    params: list[object] = [x for h in hits for x in (h["id"], h["session_id"])]
    before_sql = "p.content" if neighbours else f"substr(p.content, 1, {CONTEXT_CHARS})"
    after_sql = before_sql.replace("p.", "n.")
    rows = conn.execute(
        f"WITH hits(hid, sid) AS (VALUES {values}) "
        f"SELECT hid, {', '.join('s.' + c for c in _SESSION_COLUMNS)}, o.content, o.tool_name, "
        f"p.id, p.role, {before_sql}, n.id, n.role, {after_sql} FROM hits "
        "LEFT JOIN sessions s ON s.id = sid LEFT JOIN messages o ON o.id = hid "
        "LEFT JOIN messages p ON p.id = "
        "(SELECT MAX(id) FROM messages WHERE session_id = sid AND id < hid) "
        "LEFT JOIN messages n ON n.id = "
        "(SELECT MIN(id) FROM messages WHERE session_id = sid AND id > hid)",
        params,
    ).fetchall()
    by_hit = {r[0]: r for r in rows}
    for h in hits:
        r = by_hit[h["id"]]
        h.update(zip(_SESSION_COLUMNS, r[1:5], strict=True))
        h["snippet"] = make_snippet(r[5] or "", marks)
        if neighbours:  # the hit's tool name; whole contents, decoded by the caller
            near = [(r[8], r[9])] if r[7] is not None else []
            near.append((h["role"], r[5]))
            near += [(r[11], r[12])] if r[10] is not None else []
            h["_near"] = (r[6], near)
        before, after_ = (
            None
            if r[i] is None
            else {"id": r[i], "role": r[i + 1], "content": _cut(r[i + 2], neighbours)}
            for i in (7, 10)
        )
        h["context_before"], h["context_after"] = before, after_


def _cut(content: Any, whole: bool) -> Any:
    """A neighbour's content as the native answer has it: its first CONTEXT_CHARS."""
    return content[:CONTEXT_CHARS] if whole and isinstance(content, str) else content


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
            scope=scope or listing.SessionFilter(include_children=True),
            exclude_session_ids=tuple(exclude_session_ids),
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return await self._read_short(search, req)
