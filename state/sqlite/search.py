"""Full-text search over every message: query -> FTS5 on the right index -> ranked hits
with snippets and their neighbouring messages.

Each message's content is searched in exactly one index: the segmented side index when it
holds CJK or emoji (`messages_aux.seg_text`), otherwise the main `sb_messages_fts`. Tool names
and call arguments are searched when the role filter asks for `tool`. Relevance is BM25
(state/ranking.py) damped by age, so a fresh session is not drowned by a pile of old,
similar messages.
"""

from __future__ import annotations

import re
import sqlite3
import time
import unicodedata
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
from .schema import FTS_TABLE

SORTS = ("relevance", "newest", "oldest")
CONTEXT_CHARS = 200
RECENCY_HALF_LIFE_DAYS = 30.0
MARK_OPEN, MARK_CLOSE = ">>>", "<<<"


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


def _order(sort: str) -> str:
    return "timestamp DESC, id DESC" if sort == "newest" else "timestamp ASC, id ASC"


def blend(score: float, timestamp: float, now: float) -> float:
    """Dividing by (1 + age/half-life) pulls old hits down, so between two equally relevant
    hits the newer one wins."""
    return score / (1.0 + max(0.0, now - timestamp) / (RECENCY_HALF_LIFE_DAYS * 86400))


_HIT_COLUMNS = "m.id AS id, m.session_id AS session_id, m.role AS role, m.timestamp AS timestamp"
_SESSION_COLUMNS = ("source", "model", "title", "started_at")  # added for the page only
FIRST_WINDOW = 500
WINDOW_PER_RESULT = 25
WINDOW_GROWTH = 4


@dataclass(frozen=True)
class _Branch:
    table: str  # sb_messages_fts or messages_aux_fts
    match: str
    extra_where: str = ""
    extra_params: tuple[str, ...] = ()

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
    aux = "{seg_text} : " + q.to_fts(tree, segmented=True)
    tools = "tool" in roles or include_tools
    if tools:
        aux = f"({aux}) OR ({{tool_text}} : {q.to_fts(tree, segmented=False)})"
    literal, params = literal_where(tree, tools)
    out.append(_Branch("messages_aux_fts", aux, literal, params))
    return out


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
    conn: sqlite3.Connection, req: SearchRequest, now: float | None = None
) -> list[SearchHit]:
    """Ranked hits for one page.

    Ranking looks at the newest N matches of each index (rowid order is arrival order, and
    FTS5 walks it without scoring everything), N starting at 500 and growing fourfold until
    the page fills or the matches run out. So cost follows the page, not the number of
    matches, and relevance is judged among recent matches first."""
    if req.sort not in SORTS:
        raise QueryError(f"sort must be one of {', '.join(SORTS)}")
    tree = q.parse(req.query)
    where, fparams, scoped = filters(req)
    # Candidates meet sessions only when the scope filters on them.
    join = " JOIN sessions s ON s.id = m.session_id" if scoped else ""
    branches = _branches(tree, req.roles, req.include_tools)
    relevance = req.sort == "relevance"
    need = max(1, req.limit) + max(0, req.offset)
    direction = "ASC" if req.sort == "oldest" else "DESC"
    window = max(FIRST_WINDOW, need * WINDOW_PER_RESULT)
    while True:
        parts, params = [], []
        for br in branches:
            body = br.body if relevance else "NULL AS body, NULL AS size"
            parts.append(
                f"SELECT {_HIT_COLUMNS}, {body}, '{br.table}' AS fts FROM ("
                f"SELECT rowid AS rid FROM {br.table} "
                f"WHERE {br.table} MATCH ? ORDER BY rowid {direction} LIMIT ?) f "
                f"JOIN messages m ON m.id = f.rid{join} WHERE {where}{br.extra_where}"
            )
            params += [br.match, window, *fparams, *br.extra_params]
        union = " UNION ALL ".join(parts)
        try:
            if relevance:  # every candidate in the window; ranked below
                cur = conn.execute(union, params)
            else:
                cur = conn.execute(
                    f"SELECT * FROM ({union}) ORDER BY {_order(req.sort)} LIMIT ? OFFSET ?",
                    (*params, max(1, req.limit), max(0, req.offset)),
                )
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
            # relevance: enough candidates for the page; otherwise the page itself is full
            if len(rows) >= (need if relevance else max(1, req.limit)) or _all_fewer_than(
                conn, branches, window
            ):
                break
        except sqlite3.OperationalError as exc:
            # Every term is quoted, so this means FTS5 refused something we did not
            # foresee; report it as a query problem, never as an SQL error.
            if "fts5" in str(exc) or "syntax" in str(exc) or "malformed MATCH" in str(exc):
                raise QueryError(f"the query could not be run: {exc}") from exc
            raise
        window *= WINDOW_GROWTH
    if relevance:
        rows = _rank(conn, rows, names, tree, branches, time.time() if now is None else now)
        rows = rows[max(0, req.offset) : max(0, req.offset) + max(1, req.limit)]
    hits = [dict(zip(names, row, strict=True)) for row in rows]
    _add_sessions(conn, hits)
    _add_context(conn, hits, q.positive_terms(tree))
    for h in hits:
        for key in ("fts", "body", "size"):
            h.pop(key, None)
    return cast(list[SearchHit], hits)


def _rank(
    conn: sqlite3.Connection,
    rows: list[tuple[Any, ...]],
    names: list[str],
    tree: q.Node,
    branches: list[_Branch],
    now: float,
) -> list[tuple[Any, ...]]:
    """BM25 (ranking.py) of each candidate against its own index, blended with recency;
    best first, newer first among equals. (Tuples: only the page becomes dicts.)"""
    col = {name: i for i, name in enumerate(names)}
    i_fts, i_body, i_size, i_ts, i_id = (
        col["fts"],
        col["body"],
        col["size"],
        col["timestamp"],
        col["id"],
    )
    if len(rows) < 2:  # nothing to order
        return rows
    scores: dict[int, float] = {}
    for br in branches:
        mine = [r for r in rows if r[i_fts] == br.table]
        if not mine:
            continue
        phrases = br.phrases(tree)
        # the index's totals and, for IDF, the id range: one statement (two subqueries for
        # the range: SQLite answers MIN or MAX alone from the index, both at once by a scan)
        table, key = ("messages_aux", "message_id") if br.aux else ("messages", "id")
        block, low, high = conn.execute(
            f"SELECT (SELECT block FROM {br.table}_data WHERE id = 1), "
            f"(SELECT MIN({key}) FROM {table}), (SELECT MAX({key}) FROM {table})"
        ).fetchone()
        indexed, avgdl = ranking.totals_of(block)
        weights = [1.0] * len(phrases)
        if len(phrases) > 1:  # a single term's IDF scales every score alike
            sample = conn.execute(
                *ranking.df_sample_sql(br.table, [p.match for p in phrases])
            ).fetchone()
            weights = [
                ranking.idf(
                    indexed,
                    ranking.df_of_sample(sample[2 * i], sample[2 * i + 1], indexed, (low, high)),
                )
                for i in range(len(phrases))
            ]
        lengths = [ranking.doc_length(r[i_size]) for r in mine]
        found = ranking.bm25_many([r[i_body] for r in mine], lengths, phrases, weights, avgdl)
        for r, score in zip(mine, found, strict=True):
            scores[r[i_id]] = blend(score, r[i_ts], now)
    return sorted(rows, key=lambda r: (scores.get(r[i_id], 0.0), r[i_id]), reverse=True)


def _add_sessions(conn: sqlite3.Connection, hits: list[Row]) -> None:
    """Each hit's session columns, in one query for the page."""
    wanted = sorted({h["session_id"] for h in hits})
    if not wanted:
        return
    rows = conn.execute(
        f"SELECT id, {', '.join(_SESSION_COLUMNS)} FROM sessions "
        f"WHERE id IN ({', '.join('?' for _ in wanted)})",
        wanted,
    ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    for h in hits:
        h.update(zip(_SESSION_COLUMNS, by_id.get(h["session_id"], (None,) * 4), strict=True))


def _all_fewer_than(conn: sqlite3.Connection, branches: list[_Branch], window: int) -> bool:
    """Whether every branch's index has fewer than `window` matches (the window saw them
    all): one statement for all branches."""
    counts = ", ".join(
        f"(SELECT COUNT(*) FROM (SELECT rowid FROM {br.table} WHERE {br.table} MATCH ? "
        "ORDER BY rowid DESC LIMIT ?))"
        for br in branches
    )
    found = conn.execute(
        f"SELECT {counts}", [x for br in branches for x in (br.match, window)]
    ).fetchone()
    return all(n < window for n in found)


def _add_context(conn: sqlite3.Connection, hits: list[Row], marks: list[q.Term]) -> None:
    """Fill content-derived fields for a page of hits with two queries in total."""
    if not hits:
        return
    values = ", ".join("(?, ?)" for _ in hits)
    params: list[object] = [x for h in hits for x in (h["id"], h["session_id"])]
    rows = conn.execute(
        f"WITH hits(hid, sid) AS (VALUES {values}) "
        "SELECT hid, 'before', p.id, p.role, substr(p.content, 1, ?) FROM hits "
        "JOIN messages p ON p.id = (SELECT MAX(id) FROM messages WHERE session_id = sid AND id < hid) "
        "UNION ALL SELECT hid, 'after', p.id, p.role, substr(p.content, 1, ?) FROM hits "
        "JOIN messages p ON p.id = (SELECT MIN(id) FROM messages WHERE session_id = sid AND id > hid) "
        "UNION ALL SELECT hid, 'self', p.id, p.role, p.content FROM hits "
        "JOIN messages p ON p.id = hid",
        (*params, CONTEXT_CHARS, CONTEXT_CHARS),
    ).fetchall()
    by_hit: dict[int, dict[str, object]] = {}
    for hid, which, mid, role, content in rows:
        by_hit.setdefault(hid, {})[which] = (mid, role, content)
    for h in hits:
        ctx = by_hit.get(h["id"], {})
        for which in ("before", "after"):
            found = ctx.get(which)
            h[f"context_{which}"] = (
                {"id": found[0], "role": found[1], "content": found[2]} if found else None  # type: ignore[index]
            )
        own = ctx.get("self")
        h["snippet"] = make_snippet(own[2] if own else "", marks)  # type: ignore[index]


def _fold(text: str) -> tuple[str, list[int]]:
    """Lower-case, accent-free text plus, for each folded char, its index in `text`."""
    if text.isascii():
        return text.lower(), list(range(len(text)))
    out: list[str] = []
    pos: list[int] = []
    for i, ch in enumerate(text):
        for f in unicodedata.normalize("NFKD", ch.casefold()):
            if not unicodedata.combining(f):
                out.append(f)
                pos.append(i)
    return "".join(out), pos


def make_snippet(content: str | None, marks: list[q.Term], width: int = 120) -> str:
    """A window of `content` around the first match, matches wrapped in >>> <<<.
    Matching ignores case and accents, as the index does."""
    text = " ".join((content or "").split())
    if not text:
        return ""
    folded, pos = _fold(text)
    words = sorted(
        {_fold(t.text.strip())[0] for t in marks if t.text.strip()}, key=len, reverse=True
    )
    spans: list[tuple[int, int]] = []
    if words:
        pattern = re.compile("|".join(re.escape(w) for w in words if w))
        for m in pattern.finditer(folded):
            if m.end() > m.start():
                spans.append((pos[m.start()], pos[m.end() - 1] + 1))
    start = 0 if not spans else max(0, spans[0][0] - width // 3)
    end = min(len(text), start + width)
    out, cursor = [], start
    for a, b in spans:
        if a < cursor or b > end:
            continue
        out.append(text[cursor:a] + MARK_OPEN + text[a:b] + MARK_CLOSE)
        cursor = b
    out.append(text[cursor:end])
    return ("…" if start > 0 else "") + "".join(out) + ("…" if end < len(text) else "")


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
        return await self._read(search, req)
