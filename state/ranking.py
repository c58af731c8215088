"""Okapi BM25 over the ranking window, computed here instead of by FTS5's bm25().

FTS5's bm25() starts every query by counting the rows that match each phrase, walking the
phrase's whole doclist: 90 ms for `"of the"` on a million messages, however few hits the
page needs. Search only ranks the newest few hundred matches anyway (see search.py), so this
module scores exactly those:

- term frequency comes from the candidates' own text, folded the way the index folds it
  (unicode61: case and accents) and matched token-wise (letters and digits make tokens);
- document length comes from the index's docsize record for the row, the average length
  and the row count from its averages record;
- document frequency, which only matters when a query has several terms or hits come from
  both indexes (otherwise one term's IDF multiplies every score alike), is counted exactly
  on an index of fewer than EXACT_DF_BELOW rows (a count walks the term's doclist: cheap
  there), and on a bigger one estimated from how far back the term's newest W matches
  reach: a term whose 200th newest match is 1% of the way back is in about 20,000 rows.
  Fewer than W matches are counted exactly. Below EXACT_DF_BELOW the score is exactly
  FTS5's bm25(), which the SQLite store then computes in C for the queries whose FTS5
  phrases are its terms (no NOT).

The formula and its constants are FTS5's: k1 = 1.2, b = 0.75, idf = ln((N - n + 0.5) /
(n + 0.5)) floored at 1e-6. Scores are positive here: higher is better.
"""

from __future__ import annotations

import math
import re
import sqlite3
import unicodedata
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from .textindex import PerChar

K1 = 1.2
B = 0.75
DF_SAMPLE = 200
# Index rows under which document frequency is exact. FTS5's bm25() counts every phrase's
# rows by walking its doclist: ~1 ms for two of the commonest words on 50,000 messages,
# where scoring the window here costs several (90 ms on a million: there, the estimate).
EXACT_DF_BELOW = 50_000
_TOKEN = re.compile(r"[^\W_]+")
_UNCOMBINED = PerChar(lambda ch: "" if unicodedata.combining(ch) else ch)  # accents dropped


def fold(text: str | None) -> str:
    """Lower case without accents, as unicode61 (remove_diacritics 1) compares tokens."""
    if not text:
        return ""
    if text.isascii():
        return text.lower()
    # canonical decomposition only (unicode61 does not expand ligatures such as "ǅ") and
    # lower(), not casefold() (it keeps "ß")
    return unicodedata.normalize("NFD", text.lower()).translate(_UNCOMBINED)


def fts_tokens(text: str | None) -> list[str]:
    """The tokens unicode61 makes of `text`."""
    return _TOKEN.findall(fold(text))


@dataclass(frozen=True)
class Phrase:
    """One positive query term as the index sees it: consecutive tokens, the last one a
    prefix when the term ends in `*`."""

    tokens: tuple[str, ...]
    prefix: bool
    match: str  # the FTS5 MATCH text for this term alone (for document frequency)
    _pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _joined: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # whole tokens, any run of separators between them, the last one open with a prefix
        body = r"[\W_]+".join(re.escape(t) for t in self.tokens)
        tail = r"[^\W_]*" if self.prefix else ""
        # (no look-behind: a pattern that starts with a literal is searched for fast; the
        # token boundary before a match is checked by hand)
        object.__setattr__(self, "_pattern", re.compile(rf"{body}{tail}(?![^\W_])"))
        # the same over many rows joined by NUL: no run of separators crosses a NUL
        between = r"(?:[^\w\x00]|_)+".join(re.escape(t) for t in self.tokens)
        object.__setattr__(self, "_joined", re.compile(rf"{between}{tail}(?![^\W_])"))

    def count_in(self, folded: str) -> int:
        """Occurrences in a text already passed through `fold`, as FTS5 counts a phrase's
        instances: one per token where the phrase starts, overlapping ones too ("a a"
        twice in "a a a")."""
        return sum(1 for _ in self._starts(self._pattern, folded))

    def count_each(self, joined: str, starts: Sequence[int], counts: list[int]) -> None:
        """Adds to counts[i] the occurrences in row i of `joined` (as `count_in` counts
        them): folded rows joined by NUL, row i starting at starts[i]."""
        for start in self._starts(self._joined, joined):
            counts[bisect_right(starts, start) - 1] += 1

    def _starts(self, pattern: re.Pattern[str], text: str) -> Iterator[int]:
        """Where each occurrence starts: a match that starts inside a token is not one, but
        a real start may lie within it; after a real one the next may start at the end of
        its first token (its end, for one token)."""
        first, search, at = len(self.tokens[0]), pattern.search, 0
        while (m := search(text, at)) is not None:
            start = m.start()
            if start == 0 or not text[start - 1].isalnum():
                yield start
                at = m.end() if len(self.tokens) == 1 else start + first
            else:
                at = start + 1


def index_totals(conn: sqlite3.Connection, table: str) -> tuple[int, float]:
    """(rows, average tokens per row over all columns) from the FTS5 averages record."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    return totals_of(row[0] if row else None)


def totals_of(block: bytes | None) -> tuple[int, float]:
    """(rows, average tokens per row) from an FTS5 averages record (`{table}_data` id 1)."""
    if not block:
        return 0, 1.0
    values = _varints(block)
    rows = values[0] if values else 0
    tokens = sum(values[1:])
    return rows, (tokens / rows if rows else 1.0) or 1.0


def column_totals(block: bytes | None) -> list[int]:
    """Tokens in each column over all rows, from an FTS5 averages record."""
    return _varints(block)[1:] if block else []


def _varints(buf: bytes) -> list[int]:
    values, i = [], 0
    while i < len(buf):
        value, i = _varint(buf, i)
        values.append(value)
    return values


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    """SQLite's variable-length integer (FTS5 uses the same encoding)."""
    value = 0
    for k in range(8):
        byte = buf[i + k]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, i + k + 1
    return (value << 8) | buf[i + 8], i + 9


def estimate_df(
    conn: sqlite3.Connection, table: str, match: str, rows: int, id_range: tuple[int, int]
) -> int:
    """How many rows of `table` match `match`: exact below DF_SAMPLE matches, otherwise
    extrapolated from how far back the DF_SAMPLE-th newest match lies."""
    n, low = conn.execute(*df_sample_sql(table, [match])).fetchone()
    return df_of_sample(n, low, rows, id_range)


def df_sample_sql(table: str, matches: Sequence[str]) -> tuple[str, list[object]]:
    """One statement answering, for each MATCH text in turn, how many of its newest
    DF_SAMPLE matches there are and the oldest of those rowids: one row (n, low, n, low...)."""
    walks = ", ".join(
        f"(SELECT COUNT(*), MIN(rid) FROM (SELECT rowid AS rid FROM {table} "
        f"WHERE {table} MATCH ? ORDER BY rowid DESC LIMIT {DF_SAMPLE}))"
        for _ in matches
    )
    return f"SELECT * FROM {walks}", list(matches)


def df_of_sample(n: int, low: int | None, rows: int, id_range: tuple[int, int]) -> int:
    """Document frequency from a term's newest DF_SAMPLE matches: all of them when fewer."""
    if n < DF_SAMPLE or low is None:
        return int(n)
    return extrapolate_df(rows, low, id_range)


def extrapolate_df(rows: int, found: int, id_range: tuple[int, int]) -> int:
    """Document frequency from the id of the DF_SAMPLE-th newest match: the share of the
    id range walked back to reach it says how common the term is."""
    low, high = id_range
    reach = (high - found + 1) / max(1, high - low + 1)  # the fraction of rows walked
    return max(DF_SAMPLE, min(rows, round(DF_SAMPLE / max(reach, 1e-9))))


def weighted(rows: int, phrases: int, branches: int) -> bool:
    """Whether IDF weights enter the scores: with several phrases, or hits from both
    indexes on a small store (scores of different indexes then meet exactly as bm25()
    has them); one phrase of one index scales every score alike."""
    return phrases > 1 or (branches > 1 and rows < EXACT_DF_BELOW)


def exact_df(rows: int) -> bool:
    """Whether document frequency is counted rather than estimated (see above)."""
    return rows < EXACT_DF_BELOW


def idf(rows: int, df: int) -> float:
    value = math.log((rows - df + 0.5) / (df + 0.5)) if rows else 0.0
    return value if value > 0 else 1e-6


def doc_length(docsize: bytes | None) -> int:
    """Tokens in a row, all columns, from its FTS5 docsize record (one varint per column)."""
    if not docsize:
        return 0
    if len(docsize) == 1:  # one column under 128 tokens: the common case
        return docsize[0]
    return sum(_varints(docsize))


def bm25(
    text: str | None,
    docsize: bytes | None,
    phrases: Sequence[Phrase],
    weights: Sequence[float],
    avgdl: float,
) -> float:
    """The score of one row: its text as stored, its docsize record."""
    return bm25_of_length(text, doc_length(docsize), phrases, weights, avgdl)


def bm25_of_length(
    text: str | None,
    length: int,
    phrases: Sequence[Phrase],
    weights: Sequence[float],
    avgdl: float,
) -> float:
    """The score of one row of `length` tokens (a store that counts tokens itself)."""
    return bm25_many([text], [length], phrases, weights, avgdl)[0]


def bm25_many(
    texts: Sequence[str | None],
    lengths: Sequence[int],
    phrases: Sequence[Phrase],
    weights: Sequence[float],
    avgdl: float,
) -> list[float]:
    """The scores of many rows, each of lengths[i] tokens: the rows are folded and joined
    by NUL (a NUL inside a row becomes a space, a separator either way), so each phrase is
    counted in one scan over them all."""
    folded = [fold(t).replace("\x00", " ") if t else "" for t in texts]
    starts = list(accumulate((len(f) + 1 for f in folded[:-1]), initial=0))
    joined = "\x00".join(folded)
    tfs = []
    for phrase in phrases:
        counts = [0] * len(folded)
        phrase.count_each(joined, starts, counts)
        tfs.append(counts)
    return bm25_counted(tfs, lengths, weights, avgdl, [bool(f) for f in folded])


def bm25_counted(
    tfs: Sequence[Sequence[int]],
    lengths: Sequence[int],
    weights: Sequence[float],
    avgdl: float,
    texts: Sequence[bool],
) -> list[float]:
    """The scores of rows whose phrases are counted: tfs[p][i], phrase p's occurrences in
    row i of lengths[i] tokens; a row without text (texts[i] false) scores 0.

    Phrase by phrase over all rows (each a list comprehension, no Python loop per row and
    phrase), with FTS5's order of operations so that scores agree to the bit: a row's score
    is 0.0 plus each phrase's term in phrase order, and a phrase the row lacks adds 0.0,
    which leaves a sum of non-negative terms as it is."""
    k1_1 = K1 + 1.0
    norms = [
        K1 * (1 - B + B * length / avgdl) if text else 1.0
        for length, text in zip(lengths, texts, strict=True)
    ]
    scores = [0.0] * len(norms)
    for counts, weight in zip(tfs, weights, strict=True):
        scores = [
            score + weight * ((tf * k1_1) / (tf + norm)) if tf else score
            for score, tf, norm in zip(scores, counts, norms, strict=True)
        ]
    return [score if text else 0.0 for score, text in zip(scores, texts, strict=True)]
