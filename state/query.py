"""The search query language: a small tokenizer and parser that compile to FTS5.

Words (implicit AND), `"exact phrase"`, `OR`, `NOT`, `AND`, `prefix*` and parentheses are
syntax; everything else a person types is literal text. Every term reaches FTS5 as a quoted
string, so punctuation can never become FTS5 syntax. An operator that cannot act (a
dangling `OR`, a lone `NOT`) is read as the word it spells. A query with nothing
searchable, or only negative terms, raises QueryError with a reason.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from . import textindex
from .errors import QueryError

MAX_QUERY_CHARS = 20_000
MAX_TERMS = 2_000
_OPERATORS = {"OR", "AND", "NOT"}


@dataclass(frozen=True)
class Term:
    text: str
    phrase: bool = False
    prefix: bool = False

    @property
    def needs_aux(self) -> bool:
        return textindex.needs_aux(self.text)

    @property
    def searchable(self) -> bool:
        return any(ch.isalnum() for ch in self.text) or self.needs_aux


@dataclass(frozen=True)
class And:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Not:
    item: Node


Node = Term | And | Or | Not


@dataclass(frozen=True)
class _Tok:
    kind: str  # WORD, PHRASE, OP, LP, RP
    text: str
    prefix: bool = False


def tokenize(query: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(query)
    while i < n:
        ch = query[i]
        if ch.isspace():
            i += 1
            continue
        if ch == '"':
            end = query.find('"', i + 1)
            if end == -1:  # a lone quote is punctuation, not the start of a phrase
                i += 1
                continue
            body = query[i + 1 : end]
            prefix = end + 1 < n and query[end + 1] == "*"
            toks.append(_Tok("PHRASE", body, prefix))
            i = end + (2 if prefix else 1)
            continue
        if ch == "(":
            toks.append(_Tok("LP", ch))
            i += 1
            continue
        j = i
        while j < n and not query[j].isspace() and query[j] != '"':
            j += 1
        chunk = query[i:j]
        i = j
        closing = 0
        while chunk.endswith(")"):
            chunk = chunk[:-1]
            closing += 1
        if chunk:
            if chunk in _OPERATORS:
                toks.append(_Tok("OP", chunk))
            else:
                stripped = chunk.rstrip("*")
                prefix = stripped != chunk and bool(stripped)
                toks.append(_Tok("WORD", stripped if prefix else chunk, prefix))
        toks.extend(_Tok("RP", ")") for _ in range(closing))
    return toks


class _Parser:
    def __init__(self, toks: list[_Tok]) -> None:
        self.toks = toks
        self.pos = 0
        self.depth = 0

    def peek(self, k: int = 0) -> _Tok | None:
        i = self.pos + k
        return self.toks[i] if i < len(self.toks) else None

    def parse(self) -> Node | None:
        items = []
        while self.peek() is not None:
            node = self.or_expr()
            if node is not None:
                items.append(node)
            elif self.peek() is not None and self.peek().kind == "RP":  # type: ignore[union-attr]
                self.pos += 1  # an unmatched ')' is punctuation
        if not items:
            return None
        return items[0] if len(items) == 1 else And(tuple(items))

    def or_expr(self) -> Node | None:
        branches = [self.and_expr()]
        while (tok := self.peek()) is not None and tok.kind == "OP" and tok.text == "OR":
            nxt = self.peek(1)
            if nxt is None or nxt.kind == "RP" or (nxt.kind == "OP" and nxt.text == "OR"):
                break  # dangling OR: and_expr will read it as a word
            self.pos += 1
            branches.append(self.and_expr())
        real = [b for b in branches if b is not None]
        if not real:
            return None
        return real[0] if len(real) == 1 else Or(tuple(real))

    def and_expr(self) -> Node | None:
        items: list[Node] = []
        while (tok := self.peek()) is not None:
            if tok.kind == "RP":
                if self.depth > 0:
                    break
                self.pos += 1  # unmatched ')': punctuation
                continue
            if tok.kind == "OP" and tok.text == "OR" and items:
                nxt = self.peek(1)
                if (
                    nxt is not None
                    and nxt.kind != "RP"
                    and not (nxt.kind == "OP" and nxt.text == "OR")
                ):
                    break  # a real OR: let or_expr take it
            if tok.kind == "OP" and tok.text == "AND" and items:
                nxt = self.peek(1)
                if (
                    nxt is not None
                    and nxt.kind != "RP"
                    and not (nxt.kind == "OP" and nxt.text != "NOT")
                ):
                    self.pos += 1  # explicit AND is the implicit one
                    continue
            node = self.unary()
            if node is not None:
                items.append(node)
        if not items:
            return None
        return items[0] if len(items) == 1 else And(tuple(items))

    def unary(self) -> Node | None:
        tok = self.peek()
        assert tok is not None
        if tok.kind == "OP" and tok.text == "NOT":
            nxt = self.peek(1)
            if nxt is not None and nxt.kind in ("WORD", "PHRASE", "LP"):
                self.pos += 1
                inner = self.unary()
                return Not(inner) if inner is not None else None
        return self.primary()

    def primary(self) -> Node | None:
        tok = self.peek()
        assert tok is not None
        self.pos += 1
        if tok.kind == "LP":
            self.depth += 1
            inner = self.or_expr()
            self.depth -= 1
            if (close := self.peek()) is not None and close.kind == "RP":
                self.pos += 1
            return inner  # a missing ')' closes at the end of the query
        if tok.kind == "PHRASE":
            return Term(tok.text, phrase=True, prefix=tok.prefix)
        # WORD, or an operator that cannot act here: the word it spells
        return Term(tok.text, prefix=tok.prefix)


def _prune(node: Node | None) -> Node | None:
    """Drop terms with nothing searchable (pure punctuation) and empty groups."""
    if node is None:
        return None
    if isinstance(node, Term):
        return node if node.searchable else None
    if isinstance(node, Not):
        inner = _prune(node.item)
        return Not(inner) if inner is not None else None
    items = tuple(x for x in (_prune(i) for i in node.items) if x is not None)
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    return And(items) if isinstance(node, And) else Or(items)


def terms(node: Node | None) -> list[Term]:
    if node is None:
        return []
    if isinstance(node, Term):
        return [node]
    if isinstance(node, Not):
        return terms(node.item)
    return [t for i in node.items for t in terms(i)]


def positive_terms(node: Node | None) -> list[Term]:
    """Terms a hit contains (for highlighting): everything not under a NOT."""
    if node is None or isinstance(node, Not):
        return []
    if isinstance(node, Term):
        return [node]
    return [t for i in node.items for t in positive_terms(i)]


def parse(query: str) -> Node:
    """Parse a person's query. Raises QueryError when there is nothing to search for."""
    if len(query) > MAX_QUERY_CHARS:
        raise QueryError(
            f"the query is too long ({len(query)} characters, at most {MAX_QUERY_CHARS})"
        )
    # Control characters (NUL above all: FTS5 strings end there) are read as spaces.
    query = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in query)
    tree = _prune(_Parser(tokenize(query)).parse())
    if tree is None:
        raise QueryError("nothing to search for: the query has no letters, digits or emoji")
    found = terms(tree)
    if len(found) > MAX_TERMS:
        raise QueryError(f"the query has too many words ({len(found)}, at most {MAX_TERMS})")
    _check_positive(tree)
    return tree


def _check_positive(node: Node) -> None:
    if isinstance(node, Not):
        raise QueryError("a query needs at least one word to look for, not only NOT terms")
    if isinstance(node, Or):
        for item in node.items:
            _check_positive(item)
    if isinstance(node, And) and all(isinstance(i, Not) for i in node.items):
        raise QueryError("a query needs at least one word to look for, not only NOT terms")


def needs_aux(node: Node) -> bool:
    return any(t.needs_aux for t in terms(node))


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def to_fts(node: Node, *, segmented: bool) -> str:
    """FTS5 MATCH text. `segmented` compiles terms for the CJK/emoji side index."""
    if isinstance(node, Term):
        text = textindex.segment(node.text) if segmented else node.text
        return _quote(text) + (" *" if node.prefix else "")
    if isinstance(node, Not):  # only reached inside And (checked by parse)
        return to_fts(node.item, segmented=segmented)
    if isinstance(node, Or):
        return "(" + " OR ".join(to_fts(i, segmented=segmented) for i in node.items) + ")"
    pos = [i for i in node.items if not isinstance(i, Not)]
    neg = [i for i in node.items if isinstance(i, Not)]
    expr = "(" + " AND ".join(to_fts(i, segmented=segmented) for i in pos) + ")"
    for item in neg:
        expr = f"({expr} NOT ({to_fts(item.item, segmented=segmented)}))"
    return expr
