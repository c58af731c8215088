"""Text search values for PostgreSQL, written from switchboard's own tokens.

PostgreSQL's parser would read `user@host` as one token and has no CJK segmentation, so
the store never lets it tokenise: `tsvector` literals (with positions, for phrases) come
from state/ranking.py's `fts_tokens` (the index's folding) over the same texts the SQLite
indexes hold (content; the segmented CJK/emoji copy; tool names and arguments), and
`tsquery` literals are compiled from state/query.py's syntax tree. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import query as q
from ..content import content_text
from ..ranking import fts_tokens
from ..textindex import aux_row, segment

MAX_POSITION = 16383  # PostgreSQL clamps larger positions to this one
MAX_LEXEME_BYTES = 2047  # longer words are refused by tsvector input
MAX_VECTOR_BYTES = 900_000  # tsvector values stop at 1 MB; stay below with room to spare


def _quote(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _fits(token: str) -> bool:
    return len(token.encode()) <= MAX_LEXEME_BYTES


def tsvector_literal(tokens: list[str]) -> str | None:
    """`'tok':1,4 'other':2`: every token with its positions; None for no tokens. Words too
    long for PostgreSQL are left out, and a text past the size limit keeps its beginning."""
    positions: dict[str, list[int]] = {}
    size = 0
    for i, tok in enumerate(tokens, start=1):
        if not _fits(tok):
            continue
        have = positions.get(tok)
        if have is None:
            size += len(tok.encode()) + 8
            if size > MAX_VECTOR_BYTES:
                break
            positions[tok] = have = []
        if i <= MAX_POSITION or not have or have[-1] < MAX_POSITION:
            have.append(min(i, MAX_POSITION))
            size += 2
    if not positions:
        return None
    return " ".join(f"{_quote(t)}:{','.join(map(str, p))}" for t, p in positions.items())


@dataclass(frozen=True)
class IndexedText:
    """What one message contributes to the search columns."""

    tsv: str | None  # content tokens (every message: the main index holds all of them)
    ntok: int
    seg_tsv: str | None  # the segmented copy, only for content with CJK/emoji
    tool_tsv: str | None  # tool name and call arguments
    aux_ntok: int | None  # tokens of the side index (segmented + tool), None if no side row


def index_text(stored: str | None, tool_name: str | None, tool_calls: str | None) -> IndexedText:
    """`stored` is the content as the SQLite store keeps it (state/content.py)."""
    tokens = fts_tokens(stored)
    aux = aux_row(content_text(stored), tool_name, tool_calls)
    if aux is None:
        return IndexedText(tsvector_literal(tokens), len(tokens), None, None, None)
    seg = fts_tokens(aux[0]) if aux[0] is not None else []
    tool = fts_tokens(aux[1]) if aux[1] is not None else []
    return IndexedText(
        tsvector_literal(tokens),
        len(tokens),
        tsvector_literal(seg) if aux[0] is not None else None,
        tsvector_literal(tool) if aux[1] is not None else None,
        len(seg) + len(tool),
    )


def side_text(stored: str | None, tool_name: str | None, tool_calls: str | None) -> str:
    """The side index's text for scoring: segmented content and tool text, as SQLite
    joins them."""
    aux = aux_row(content_text(stored), tool_name, tool_calls)
    if aux is None:
        return " "
    return f"{aux[0] or ''} {aux[1] or ''}"


def term_query(term: q.Term, *, segmented: bool) -> str | None:
    """One term as a phrase of tokens (`'a' <-> 'b':*`); None when it has no token this
    index could hold, which matches nothing (as FTS5's empty phrase)."""
    tokens = fts_tokens(segment(term.text) if segmented else term.text)
    if not tokens or not all(_fits(t) for t in tokens):
        return None
    parts = [_quote(t) for t in tokens]
    if term.prefix:
        parts[-1] += ":*"
    return parts[0] if len(parts) == 1 else "(" + " <-> ".join(parts) + ")"


def to_tsquery(node: q.Node, *, segmented: bool) -> str | None:
    """The query tree as a tsquery literal, with FTS5's meaning: AND with a term that
    matches nothing matches nothing, OR drops it, NOT of it removes nothing. None when the
    whole query matches nothing in this index."""
    if isinstance(node, q.Term):
        return term_query(node, segmented=segmented)
    if isinstance(node, q.Not):  # only inside And (checked by query.parse)
        return to_tsquery(node.item, segmented=segmented)
    if isinstance(node, q.Or):
        got = [x for x in (to_tsquery(i, segmented=segmented) for i in node.items) if x]
        return None if not got else got[0] if len(got) == 1 else "(" + " | ".join(got) + ")"
    parts: list[str] = []
    for item in node.items:
        if isinstance(item, q.Not):
            inner = to_tsquery(item.item, segmented=segmented)
            if inner is not None:
                parts.append(f"!{inner}")
            continue
        part = to_tsquery(item, segmented=segmented)
        if part is None:
            return None
        parts.append(part)
    return "(" + " & ".join(parts) + ")"


def required_pairs(node: q.Node, *, segmented: bool) -> list[str]:
    """Adjacent token pairs (`'a b'`, as the `sb_pairs` index of state/pg/schema.py joins
    them) that every row matching `to_tsquery(node)` holds: those of the phrases the query
    ANDs together. A phrase's last pair is left out when it ends in a prefix; OR and NOT
    require nothing. Empty when the query has no such pair."""
    return _required(node, segmented, token_pairs)


def required_words(node: q.Node, *, segmented: bool) -> list[str]:
    """Tokens every row matching `to_tsquery(node)` holds: those of the terms the query
    ANDs together, but for a prefix term's last one."""
    return _required(node, segmented, whole_tokens)


def token_pairs(tokens: Sequence[str], prefix: bool) -> list[str]:
    """A phrase's adjacent pairs, as `sb_pairs` joins them; not the one ending in a prefix."""
    found = [f"{a} {b}" for a, b in zip(tokens, tokens[1:], strict=False)]
    return found[:-1] if prefix else found


def whole_tokens(tokens: Sequence[str], prefix: bool) -> list[str]:
    """A phrase's tokens but a prefix."""
    return list(tokens[:-1] if prefix else tokens)


def _required(
    node: q.Node, segmented: bool, pieces: Callable[[Sequence[str], bool], list[str]]
) -> list[str]:
    if isinstance(node, q.Term):
        return pieces(fts_tokens(segment(node.text) if segmented else node.text), node.prefix)
    if isinstance(node, q.And):
        out: list[str] = []
        for item in node.items:
            if not isinstance(item, q.Not):
                out.extend(p for p in _required(item, segmented, pieces) if p not in out)
        return out
    return []


def lexeme_query(token: str) -> str:
    """One token as a tsquery literal."""
    return _quote(token)
