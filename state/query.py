"""The search query language: a small tokenizer and parser that compile to FTS5.

Words (implicit AND), `"exact phrase"`, `OR`, `NOT`, `AND`, `prefix*` and parentheses are
syntax; everything else a person types is literal text. Every term reaches FTS5 as a quoted
string, so punctuation can never become FTS5 syntax. An operator that cannot act (at
either end of the query or of a group, or doubled) is dropped, as web search boxes do;
a query of nothing but operators searches for the words they spell. A query with nothing
searchable, or only negative terms, raises QueryError with a reason.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from . import textindex
from .errors import QueryError

MAX_QUERY_CHARS = 20_000
MAX_TERMS = 2_000
MAX_NESTING = 100  # parentheses; the parser and compiler recurse once per level
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


def _drop_dangling(toks: list[_Tok]) -> list[_Tok]:
    """Drop the operators that cannot act, as web search boxes do.

    A `)` with no `(` before it is punctuation. `AND`/`OR` need an operand on both sides
    (a word, a phrase or a group; on the right also a `NOT`); `NOT` needs one after it. So
    an operator at either end of the query or of a group goes, and a run of operators keeps
    only its last (`a AND OR b` is `a OR b`, `NOT NOT b` is `NOT b`). Linear: one pass from
    the right settles every right side, one from the left every left side.
    """
    depth = 0
    balanced: list[_Tok] = []
    for tok in toks:
        if tok.kind == "RP":
            if depth == 0:
                continue
            depth -= 1
        elif tok.kind == "LP":
            depth += 1
            if depth > MAX_NESTING:
                raise QueryError(f"the query nests parentheses too deeply (at most {MAX_NESTING})")
        balanced.append(tok)
    keep = [True] * len(balanced)
    nxt: _Tok | None = None  # the nearest kept token to the right
    for i in range(len(balanced) - 1, -1, -1):
        tok = balanced[i]
        if tok.kind == "OP":
            operand = nxt is not None and nxt.kind in ("WORD", "PHRASE", "LP")
            if tok.text != "NOT" and nxt is not None and nxt.kind == "OP" and nxt.text == "NOT":
                operand = True  # `a AND NOT b`
            if not operand:
                keep[i] = False
                continue
        nxt = tok
    out: list[_Tok] = []
    for tok, kept in zip(balanced, keep, strict=True):
        if not kept:
            continue
        if tok.kind == "OP" and tok.text != "NOT":
            if not out or out[-1].kind not in ("WORD", "PHRASE", "RP"):
                continue  # nothing on its left
        out.append(tok)
    return out


class _Parser:
    """Recursive descent over tokens in which every operator has its operands:
    `or := and (OR and)*`, `and := unary ([AND] unary)*`, `unary := NOT unary | primary`."""

    def __init__(self, toks: list[_Tok]) -> None:
        self.toks = toks
        self.pos = 0

    def peek(self) -> _Tok | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def _is_op(self, name: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "OP" and tok.text == name

    def parse(self) -> Node | None:
        items = []
        while (tok := self.peek()) is not None:
            if tok.kind == "RP":  # unmatched ones are gone already; never loop on one
                self.pos += 1
                continue
            node = self.or_expr()
            if node is not None:
                items.append(node)
        if not items:
            return None
        return items[0] if len(items) == 1 else And(tuple(items))

    def or_expr(self) -> Node | None:
        branches = [self.and_expr()]
        while self._is_op("OR"):
            self.pos += 1
            branches.append(self.and_expr())
        real = [b for b in branches if b is not None]
        if not real:
            return None
        return real[0] if len(real) == 1 else Or(tuple(real))

    def and_expr(self) -> Node | None:
        items: list[Node] = []
        while (tok := self.peek()) is not None and tok.kind != "RP" and not self._is_op("OR"):
            if self._is_op("AND"):
                self.pos += 1  # the explicit AND is the implicit one
                continue
            node = self.unary()
            if node is not None:
                items.append(node)
        if not items:
            return None
        return items[0] if len(items) == 1 else And(tuple(items))

    def unary(self) -> Node | None:
        if self._is_op("NOT"):
            self.pos += 1
            inner = self.unary()
            return Not(inner) if inner is not None else None
        return self.primary()

    def primary(self) -> Node | None:
        tok = self.peek()
        assert tok is not None
        self.pos += 1
        if tok.kind == "LP":
            inner = self.or_expr()
            if (close := self.peek()) is not None and close.kind == "RP":
                self.pos += 1
            return inner  # a missing ')' closes at the end of the query
        return Term(tok.text, phrase=tok.kind == "PHRASE", prefix=tok.prefix)


def _prune(node: Node | None) -> Node | None:
    """Drop terms with nothing searchable (pure punctuation) and empty groups."""
    if node is None:
        return None
    if isinstance(node, Term):
        return node if node.searchable else None
    if isinstance(node, Not):
        inner = _prune(node.item)
        return Not(inner) if inner is not None else None
    kind = type(node)
    items: tuple[Node, ...] = ()
    for item in (_prune(i) for i in node.items):
        if isinstance(item, kind):  # a group of the same operator: its items join this one's
            items += item.items
        elif item is not None:
            items += (item,)
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
    toks = tokenize(query)
    tree = _prune(_Parser(_drop_dangling(toks)).parse())
    if tree is None:  # only operators (and punctuation): search for the words they spell
        words = [_Tok("WORD", t.text) if t.kind == "OP" else t for t in toks]
        tree = _prune(_Parser(_drop_dangling(words)).parse())
    if tree is None:
        raise QueryError("nothing to search for: the query has no letters, digits or emoji")
    found = terms(tree)
    if len(found) > MAX_TERMS:
        raise QueryError(f"the query has too many words ({len(found)}, at most {MAX_TERMS})")
    _check_positive(tree)
    return tree


def _check_positive(node: Node) -> None:
    """Every part of the query that must match has a word of its own to look for: a NOT
    stands only beside one in an AND (`a NOT b`, and `a (NOT b)`, whose group joins the AND
    around it), never alone, in an OR (`a OR NOT b`) or with only NOTs beside it; what a
    NOT excludes is checked the same way."""
    if isinstance(node, Term):
        return
    if isinstance(node, Not) or (
        isinstance(node, And) and all(isinstance(i, Not) for i in node.items)
    ):
        raise QueryError("a query needs at least one word to look for, not only NOT terms")
    for item in node.items:
        # beside the others of an AND, a NOT's own item; anywhere else, itself
        _check_positive(item.item if isinstance(item, Not) and isinstance(node, And) else item)


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
