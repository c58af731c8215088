"""The newest-window walk of PostgreSQL search (state/pg/search.py), in few statements.

The window is the newest N matches of each index. Asking PostgreSQL for `ORDER BY id DESC
LIMIT N` of a GIN match lets the planner walk the primary key backwards through every
row, so the window is taken from slices of ids: the newest 4N ids first, then each next
slice where the matches' density so far says the rest of the window lies, none read
twice. GIN keeps no positions: a phrase's candidates are the rows holding its words (its
rarest word's, by the planner's statistics), checked on the rows of one slice.

Each slice's statement also reads the rows of its matches that pass the search's filters
(each one-word term's occurrences in place of the text when ranking needs no more:
Branch.counted), and the first statement of a search reads every branch's first slice at once, with the
table's id range and, when the ranking will want them, the indexes' totals and the
phrases' document counts. Its first slice is bounded by the id range the previous search
found and left open at the far end, so rows written since are in it; the id range read in
the same statement places the slices after it. A small index (the side index of a store
with little CJK text, a store of a few thousand messages), or a query whose matches all hold
a word that few rows hold, is read whole in one slice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from .. import query as q
from .. import ranking
from ..textindex import segment
from . import db
from .tsearch import lexeme_query, term_query

SPAN_GROWTH = 4  # the first slice of ids: this many times the window
SLICE_MARGIN = 1.25  # later slices: the ids the density so far predicts, times this
FIRST_FLOOR = 0.125  # and at least this share of the ids walked, doubling per slice
# An index of at most this many first slices' ids is read in one slice. On 15,000 messages
# (bench/hermes_search_bench.py) one slice took less of the server's CPU and the client's
# than the walk for every query kind, two common words included (7.3 against 8.3 ms).
WHOLE_SPANS = 8
RARE_SHARE = 0.05  # a phrase's candidates come from its rarest word when in fewer rows
TOTALS_TTL_S = 30.0  # how long index totals (rows, average length) are reused on a big store
SHARES_TTL_S = 300.0  # how long the planner's word statistics are reused
EXACT_TOTALS_BELOW = 10_000  # table rows under which totals are recounted for every search
# On a bigger table a term's document count is kept for TOTALS_TTL_S with the id it was
# counted up to, and later searches add the rows written since (a count of a common word
# visits most of the table's pages; the rows since, a few); past this many ids since, the
# term is counted again.
DF_SINCE_MAX = 2_000
DF_KEPT = 4_096  # terms whose counts are kept

BODY = "m.content, m.content_enc, m.tool_name, m.tool_calls, m.ntok, m.aux_ntok"
# a slice's columns: the window's id, then its row's (NULL when the filters leave it out),
# then the terms' counts in it when the server counts them (Branch.counted)
ROW_COLUMNS = (
    ("wid", "id", "session_id", "role", "timestamp")
    + tuple(c.removeprefix("m.") for c in BODY.split(", "))
    + ("tfs",)
)
# A vector keeps at most 256 positions of a word: in a row of fewer tokens the count of a
# word's positions is its count in the text. ts_rank_cd with every weight 1 is that count
# for a one-word query (each occurrence is a cover of one word, worth 1).
COUNTED_BELOW = 256
FIRST_COLUMNS = ("_walk", *ROW_COLUMNS, "_head")  # the first statement's
# A kept row of a walk (Walk.rows) is a tuple, read by these positions: ROW_COLUMNS's
# values, then whether it is the side index's, then its page's texts (None unless the
# first statement brought them). A dict per row cost 0.8 µs, 0.4 ms of a 500-row window.
(
    R_WID,
    R_ID,
    R_SID,
    R_ROLE,
    R_TS,
    R_CONTENT,
    R_ENC,
    R_TOOL_NAME,
    R_TOOL_CALLS,
    R_NTOK,
    R_AUX_NTOK,
    R_TFS,
    R_SIDE,
    R_PAGE,
) = range(len(ROW_COLUMNS) + 2)


@dataclass(frozen=True)
class Branch:
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
    # One-word tsqueries whose occurrences the server counts in each row of the window (the
    # main index, ranking's terms all single words): such a row comes without its text
    # unless it holds COUNTED_BELOW tokens or more.
    counted: tuple[str, ...] = ()

    @property
    def phrase(self) -> bool:
        """Whether the match holds a phrase (GIN only knows which rows hold its words)."""
        return any("<->" in p for p in self.params)

    @property
    def column(self) -> str:
        """The vector ranking counts a phrase's rows in."""
        return "seg_tsv" if self.side else "tsv"

    def phrases(self, tree: q.Node) -> list[ranking.Phrase]:
        out = []
        for term in q.positive_terms(tree):
            tokens = tuple(ranking.fts_tokens(segment(term.text) if self.side else term.text))
            match = term_query(term, segmented=self.side)
            if tokens and match is not None:
                out.append(ranking.Phrase(tokens, term.prefix, match))
        return out


class Totals:
    """Rows and average length of each index, for BM25: recounted per search on a small
    table, reused for TOTALS_TTL_S on a big one or a big index (a count is a scan of the
    table). On a big table also each term's document count with the id it was counted up
    to (df_since). Also the share of rows holding each common word of the main index, from
    the planner's statistics, and the id range the last search found."""

    def __init__(self) -> None:
        self._cache: dict[bool, tuple[float, int, float]] = {}
        self._shares: tuple[float, dict[str, float]] | None = None
        self._dfs: dict[tuple[str, str], tuple[float, int, int]] = {}
        self.bounds: tuple[int, int] | None = None

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

    def fresh(self, side: bool) -> tuple[int, float] | None:
        """The index's totals when they need no recount."""
        hit, table = self._cache.get(side), self._cache.get(False)
        if hit is None or time.monotonic() - hit[0] >= TOTALS_TTL_S:
            return None
        if hit[1] >= EXACT_TOTALS_BELOW or (table is not None and table[1] >= EXACT_TOTALS_BELOW):
            return hit[1], hit[2]
        return None

    def known_rows(self, side: bool) -> int | None:
        """The index's rows when counted within TOTALS_TTL_S, recount or not (a figure for
        planning a walk, not for ranking)."""
        hit = self._cache.get(side)
        return None if hit is None or time.monotonic() - hit[0] >= TOTALS_TTL_S else hit[1]

    def df_since(self, column: str, match: str) -> tuple[int, int] | None:
        """A term's document count and the id it was counted up to, when the table is big
        enough for counts to be kept (as its totals are) and few rows are newer."""
        table = self._cache.get(False)
        hit = self._dfs.get((column, match))
        if table is None or table[1] < EXACT_TOTALS_BELOW or hit is None:
            return None
        if time.monotonic() - hit[0] >= TOTALS_TTL_S or (
            self.bounds is not None and self.bounds[1] - hit[2] > DF_SINCE_MAX
        ):
            return None
        return hit[1], hit[2]

    def put_df(self, column: str, match: str, count: int, upto: int, since: bool) -> None:
        """A term's count up to id `upto`; `since`: added to a kept one, whose time stays
        (rows deleted or committed late below its id are seen when it expires)."""
        key, table = (column, match), self._cache.get(False)
        if table is None or table[1] < EXACT_TOTALS_BELOW:
            return
        hit = self._dfs.get(key)
        if since and hit is not None:
            self._dfs[key] = (hit[0], count, upto)
            return
        if len(self._dfs) >= DF_KEPT:
            self._dfs.clear()
        self._dfs[key] = (time.monotonic(), count, upto)

    def put(self, side: bool, rows: int, length: int) -> tuple[int, float]:
        avg = (length / rows if rows else 1.0) or 1.0
        self._cache[side] = (time.monotonic(), rows, avg)
        return rows, avg

    async def get(self, conn: AsyncConnection, side: bool) -> tuple[int, float]:
        hit = self.fresh(side)
        if hit is not None:
            return hit
        found = (await db.tuples(conn, totals_sql(side)))[0]
        return self.put(side, int(found[0]), int(found[1]))


def totals_sql(side: bool) -> str:
    """The index's rows and their tokens, in one scan."""
    col = "aux_ntok" if side else "ntok"
    return f"SELECT COUNT(*), COALESCE(SUM({col}), 0) FROM messages WHERE {col} IS NOT NULL"


@dataclass
class Walk:
    """One branch's window, slice by slice. Descending, `edge` is the lowest id covered so
    far; ascending, the highest."""

    br: Branch
    window: int
    ascending: bool
    cond: str
    cparams: tuple[Any, ...]
    fenced: bool
    shares: bool  # the planner has statistics (statements are then left unprepared)
    whole: bool = False  # the index is small: one slice without bounds
    ids: list[int] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)  # R_* positions
    edge: int = 0
    walked: int = 0  # ids of the table's range covered so far
    span: int = 0
    floor: float = FIRST_FLOOR

    def first(self, guess: tuple[int, int]) -> tuple[str, tuple[Any, ...]]:
        """The first slice's id condition: from the guessed end of the range, open beyond it."""
        self.span = self.window * SPAN_GROWTH
        if self.whole:
            return "", ()
        if self.ascending:
            self.edge = guess[0] + self.span - 1
            return "id <= %s", (self.edge,)
        self.edge = guess[1] - self.span + 1
        return "id >= %s", (self.edge,)

    def advance(self, bounds: tuple[int, int]) -> tuple[str, tuple[Any, ...]] | None:
        """After a slice: the next one's id condition, or None when the window is complete."""
        low, high = bounds
        walked = (self.edge - low + 1) if self.ascending else (high - self.edge + 1)
        self.walked = max(0, min(walked, high - low + 1))
        if self.whole or len(self.ids) >= self.window or self.walked > high - low:
            return None
        if not self.walked:  # the guess was past the range: start again from its end
            self.edge = low - 1 if self.ascending else high + 1
            span = self.window * SPAN_GROWTH
        elif not self.ids:
            span = self.walked * self.window
        else:
            # where the density so far says the rest lies, with a margin (and at least a
            # share of the walk so far that doubles each time, so a density that falls
            # off further back still takes few slices)
            span = max(
                math.ceil(
                    (self.window - len(self.ids)) * self.walked * SLICE_MARGIN / len(self.ids)
                ),
                math.ceil(self.walked * self.floor),
            )
            self.floor *= 2
        if self.ascending:
            first, self.edge = self.edge + 1, self.edge + span
            return "id BETWEEN %s AND %s", (first, self.edge)
        last, self.edge = self.edge - 1, self.edge - span
        return "id BETWEEN %s AND %s", (self.edge, last)

    def slice_sql(self, rng: str, rparams: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
        """The ids of the slice's matches, newest (oldest) first, at most the window's rest."""
        br, order, limit = self.br, "ASC" if self.ascending else "DESC", self.window - len(self.ids)
        within = f" AND {rng}" if rng else ""
        if br.pairs and self.walked:
            # The phrase check reads each candidate's vector, and GIN alone offers every row
            # holding the words anywhere: take the candidates from the pair index instead.
            holds = ", ".join("hashtext(%s)" for _ in br.pairs)
            return (
                f"SELECT id FROM (SELECT id, {br.pairs_of} FROM messages WHERE sb_pairs({br.pairs_of}) "
                f"@> ARRAY[{holds}]{within} OFFSET 0) m WHERE {br.cond} ORDER BY id {order} LIMIT %s",
                (*br.pairs, *rparams, *br.params, limit),
            )
        if self.fenced or self.whole:
            # With `ORDER BY id LIMIT n` the planner walks the primary key and checks every
            # row of the slice, thinking it will stop early: it takes a phrase to match as
            # many rows as hold its words. Fenced (OFFSET 0) and unordered, the slice's
            # candidates come from the word index when they are few.
            return (
                f"SELECT id FROM (SELECT id FROM messages WHERE {self.cond}{within} OFFSET 0) m "
                f"ORDER BY id {order} LIMIT %s",
                (*self.cparams, *rparams, limit),
            )
        return (
            f"SELECT id FROM messages WHERE {br.cond}{within} ORDER BY id {order} LIMIT %s",
            (*br.params, *rparams, limit),
        )

    def take(self, found: list[tuple[Any, ...]], keys: tuple[str, ...] = ROW_COLUMNS) -> None:
        """A slice's answer, its columns named by `keys` (ROW_COLUMNS in order, `_page` and
        others around them): the window's ids, and the rows the filters keep (R_*)."""
        at = keys.index("wid")
        end = at + len(ROW_COLUMNS)
        page = keys.index("_page") if "_page" in keys else -1
        side, kept = self.br.side, at + 1
        self.ids.extend([r[at] for r in found])
        # the column after the window's id is NULL in a row the filters drop
        held = [r for r in found if len(r) > kept and r[kept] is not None]
        if page >= 0:
            self.rows.extend([(*r[at:end], side, r[page]) for r in held])
        else:
            self.rows.extend([(*r[at:end], side, None) for r in held])


async def start(
    conn: AsyncConnection, br: Branch, window: int, ascending: bool, totals: Totals
) -> Walk:
    """A branch's walk, its slices not yet read."""
    cond, cparams = br.cond, br.params
    # Before the table's first ANALYZE the planner takes any match for one row, and its
    # custom plans bound a slice by reading every candidate in the table: phrases are then
    # not fenced and statements are left to psycopg's preparing (see `run`).
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
    # One slice of the whole index when it is small, or when a word every match holds is
    # in no more rows than a first slice spans (by the planner's statistics: a word not
    # among the commonest is rarer than the least common of them)
    span, rows = window * SPAN_GROWTH, totals.known_rows(br.side)
    whole = rows is not None and rows <= span * WHOLE_SPANS
    if not whole and rows is not None and shares and br.words:
        floor = min(shares.values())
        whole = min(shares.get(w, floor) for w in br.words) * rows <= span
    return Walk(br, window, ascending, cond, cparams, fenced, bool(shares), whole)


@dataclass(frozen=True)
class Keep:
    """Which rows of a window a search keeps: its filters, over `m` (and `s` when joined)."""

    join: str
    where: str
    params: tuple[Any, ...]


def with_rows(
    walk: Walk, sql: str, params: tuple[Any, ...], keep: Keep | None
) -> tuple[str, tuple[Any, ...]]:
    """A slice's statement with its rows (ROW_COLUMNS); without `keep`, its ids alone."""
    if keep is None:
        return sql, params
    rows = f"(messages m{keep.join})" if keep.join else "messages m"
    body, counted = BODY, walk.br.counted
    if counted:
        tfs = ", ".join("ts_rank_cd('{1,1,1,1}', m.tsv, %s::tsquery)::int" for _ in counted)
        body = BODY.replace(
            "m.content,", f"CASE WHEN m.ntok >= {COUNTED_BELOW} THEN m.content END,"
        )
        body += f", ARRAY[{tfs}]"
    else:
        body += ", NULL::int[]"
    return (
        f"SELECT w.id AS wid, m.id AS mid, m.session_id, m.role, m.timestamp, {body} "
        f"FROM ({sql}) w LEFT JOIN {rows} ON m.id = w.id "
        f"AND {keep.where}{walk.br.extra_where}",
        (*counted, *params, *keep.params, *walk.br.extra_params),
    )


async def run(
    conn: AsyncConnection, walk: Walk, rng: tuple[str, tuple[Any, ...]], keep: Keep | None
) -> None:
    """One slice after the first statement."""
    sql, params = with_rows(walk, *walk.slice_sql(*rng), keep)
    # Not prepared: psycopg prepares a statement after five runs, and PostgreSQL's
    # generic plan then serves every slice alike (rating `id BETWEEN` as a few rows, it
    # walked all 1M ids back for a slice with no match: 400-1,000 ms word searches).
    # Without statistics that generic plan is the better one (the primary key bounds
    # the slice), so there it is prepared and runs under it from its first run.
    found = await db.tuples(
        conn,
        sql,
        params,
        prepare=False if walk.shares else None,
        binary=keep is not None,
        plans=None if walk.shares else db.GENERIC_PLANS,
    )
    walk.take(found)


async def finish(
    conn: AsyncConnection, walk: Walk, bounds: tuple[int, int], keep: Keep | None
) -> None:
    """The rest of a walk whose first slice is read."""
    while (rng := walk.advance(bounds)) is not None:
        await run(conn, walk, rng, keep)


@dataclass(frozen=True)
class Page:
    """What the first statement adds to each kept row when they are all on the page: `sql`
    selects `hid` and one value for the rows `{hits}` names (`hid`, `sid`), and is run only
    when the walks keep at most `limit` rows."""

    sql: str
    limit: int


async def first(
    conn: AsyncConnection,
    walks: list[Walk],
    guess: tuple[int, int],
    keep: Keep,
    ctes: list[tuple[str, tuple[Any, ...]]],
    extras: list[tuple[str, tuple[Any, ...]]],
    page: Page | None = None,
) -> list[int | None]:
    """Every walk's first slice with its rows, in one statement; returns the table's id
    range (None, None when it is empty) and the `extras`: scalar expressions that may name
    `n0`, `n1`... (the rows each walk's slice keeps) and the `ctes`. With `page` (for walks
    of whole indexes, which take no other slice), each kept row also comes with the page's
    value when the walks keep at most `page.limit` rows (`_page` in the row's dict: None
    when they keep more)."""
    parts = ["b AS (SELECT MIN(id) AS lo, MAX(id) AS hi FROM messages)"]
    params: list[Any] = []
    for cte, p in ctes:
        parts.append(cte)
        params += p
    selects = []
    for i, walk in enumerate(walks):
        sql, p = with_rows(walk, *walk.slice_sql(*walk.first(guess)), keep)
        parts.append(f"w{i} AS MATERIALIZED ({sql})")
        params += p
        selects.append(f"SELECT {i}, w{i}.*, NULL::bigint[]{{pg}} FROM w{i}{{join}}")
    counts = ", ".join(f"(SELECT COUNT(mid) FROM w{i}) AS n{i}" for i in range(len(walks)))
    # materialized: the extras name n0, n1... many times, each a subquery of its own else
    parts.append(f"n AS MATERIALIZED (SELECT {counts})")
    keys, tail = FIRST_COLUMNS, ""
    if page is not None:
        # a row in two indexes' windows (a tool call's text in the main one, its arguments
        # in the side one) takes its page's values once
        hits = " UNION ".join(
            f"SELECT mid, session_id FROM w{i} WHERE mid IS NOT NULL" for i in range(len(walks))
        )
        kept = " + ".join(f"n{i}" for i in range(len(walks)))
        parts.append(
            f"pg(hid, page) AS MATERIALIZED ({page.sql.format(hits=f'({hits}) AS h(hid, sid)')} "
            f"WHERE (SELECT {kept} FROM n) <= %s)"
        )
        params.append(page.limit)
        keys = (*FIRST_COLUMNS, "_page")
        selects = [
            sel.format(pg=", pg.page", join=f" LEFT JOIN pg ON pg.hid = w{i}.mid")
            for i, sel in enumerate(selects)
        ]
        tail = ", NULL"
    else:
        selects = [sel.format(pg="", join="") for sel in selects]
    for _, p in extras:
        params += p
    head = ", ".join(["b.lo", "b.hi", *(e for e, _ in extras)])
    nulls = ", ".join("NULL" for _ in ROW_COLUMNS)
    selects.append(f"SELECT -1, {nulls}, ARRAY[{head}]::bigint[]{tail} FROM b, n")
    sql = "WITH " + ", ".join(parts) + " " + " UNION ALL ".join(selects)
    # Slices bounded by ids are not prepared (see `run`); a statement of whole indexes
    # has no id bound, and its generic plan is the custom one (each index's matches from
    # its GIN index, their rows by primary key): it is prepared as any other and runs
    # under generic plans, so PostgreSQL skips its parsing and planning. Left to choose
    # (plan_cache_mode = auto), PostgreSQL keeps custom plans for a statement whose first
    # five runs found rare words (their plans priced below the generic plan's guess of
    # 0.5% of the rows): each run then planned afresh at its bind, about 1 ms of the
    # server's CPU on 15,000 messages against 0.25 ms for the whole search on the generic
    # plan (two rarer words, bench/hermes_search_bench.py's corpus).
    prepare = False if any(w.shares and not w.whole for w in walks) else None
    plans = db.GENERIC_PLANS if prepare is None else None
    found = await db.tuples(conn, sql, params, prepare=prepare, binary=True, plans=plans)
    out: list[int | None] = []
    each: list[list[tuple[Any, ...]]] = [[] for _ in walks]
    at = keys.index("_head")
    for r in found:
        if r[0] < 0:
            out = list(r[at])
        else:
            each[r[0]].append(r)
    for walk, mine in zip(walks, each, strict=True):
        walk.take(mine, keys)
    return out
