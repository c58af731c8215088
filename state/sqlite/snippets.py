"""A search page's finish: each hit's session columns, neighbours and snippet (a window of
its text around the first match, the query's terms marked, matched as the index matches
them: case and accents ignored)."""

from __future__ import annotations

import functools
import sqlite3
import unicodedata
from typing import Any

from .. import query as q
from ..rows import Row

MARK_OPEN, MARK_CLOSE = ">>>", "<<<"
CONTEXT_CHARS = 200
_SESSION_COLUMNS = ("source", "model", "title", "started_at")  # added for the page only


def _fold_char(ch: str) -> str:
    return "".join(
        f for f in unicodedata.normalize("NFKD", ch.casefold()) if not unicodedata.combining(f)
    )


# each character met (up to _KEPT of them): what it folds to (for str.translate), those
# that fold to other than exactly one character (then positions shift), and those that
# fold as str.lower() lowers them (a text of only these is folded by lower(), in C: CJK
# text has no case, and a translation table looks each character up)
_FOLDED: dict[int, str] = {}
_SEEN: set[str] = set()
_UNEVEN: set[str] = set()
_LOWERED: set[str] = set()
_KEPT = 20_000
_FINAL_SIGMA = "\u03a3"  # str.lower() lowers it by its place in a word


def _fold(text: str) -> tuple[str, list[int] | None]:
    """Lower-case, accent-free text plus, for each folded char, its index in `text` (None:
    the same index, every char folding to one)."""
    if text.isascii():
        return text.lower(), None
    chars = set(text)
    kept = True
    for ch in chars - _SEEN:
        if len(_FOLDED) >= _KEPT:
            kept = False
            break
        folded = _fold_char(ch)
        if len(folded) != 1:
            _UNEVEN.add(ch)
        elif folded == ch.lower() and ch != _FINAL_SIGMA:
            _LOWERED.add(ch)
        _FOLDED[ord(ch)] = folded
        _SEEN.add(ch)
    if kept and chars <= _LOWERED:
        return text.lower(), None
    if kept and chars.isdisjoint(_UNEVEN):
        return text.translate(_FOLDED), None
    out: list[str] = []
    pos: list[int] = []
    for i, ch in enumerate(text):
        for f in _FOLDED.get(ord(ch)) or _fold_char(ch):
            out.append(f)
            pos.append(i)
    return "".join(out), pos


@functools.lru_cache(maxsize=256)
def _words(marks: tuple[q.Term, ...]) -> tuple[str, ...]:
    """The marked terms folded, longest first."""
    words = {_fold(t.text.strip())[0] for t in marks if t.text.strip()}
    return tuple(sorted((w for w in words if w), key=len, reverse=True))


def _matches(folded: str, words: tuple[str, ...], width: int) -> list[tuple[int, int]]:
    """Where the words occur in `folded`, as a regular expression of them, longest first,
    would find them (leftmost; at one place the longest; never overlapping), up to the
    end of the snippet's window."""
    out: list[tuple[int, int]] = []
    at = {w: folded.find(w) for w in words}
    i, stop = 0, len(folded)
    while True:
        first, word = -1, ""
        for w in words:
            a = at[w]
            if 0 <= a < i:
                a = at[w] = folded.find(w, i)
            if a >= 0 and (first < 0 or a < first):
                first, word = a, w
        if first < 0 or first >= stop:
            return out
        if not out:
            stop = max(0, first - width // 3) + width
        out.append((first, first + len(word)))
        i = first + len(word)


def make_snippet(content: str | None, marks: list[q.Term], width: int = 120) -> str:
    """A window of `content` around the first match, matches wrapped in >>> <<<.
    Matching ignores case and accents, as the index does."""
    return _snippet(content, _words(tuple(marks)), width)


def _snippet(content: str | None, words: tuple[str, ...], width: int = 120) -> str:
    """make_snippet with the marked terms folded (`_words`)."""
    text = content or ""
    # whitespace runs become one space: a text without any (every whitespace character
    # but the space is unprintable) is left as it is, not split into words and joined
    if not (text.isprintable() and "  " not in text and text[:1] != " " and text[-1:] != " "):
        text = " ".join(text.split())
    if not text:
        return ""
    spans: list[tuple[int, int]] = []
    if words:
        folded, pos = _fold(text)
        if pos is None:
            return _marked(text, folded, words, width)
        for a, b in _matches(folded, words, len(folded)):
            spans.append((pos[a], pos[b - 1] + 1))
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


def _marked(text: str, folded: str, words: tuple[str, ...], width: int) -> str:
    """`_snippet` of a text whose folded form has its positions: the matches `_matches`
    finds, marked as they are found, up to the end of the window."""
    first, word = -1, ""
    at: dict[str, int] = {}
    for w in words:
        a = at[w] = folded.find(w)
        if a >= 0 and (first < 0 or a < first):
            first, word = a, w
    n = len(text)
    if first < 0:
        return text[:width] + ("…" if width < n else "")
    start = max(0, first - width // 3)
    end = min(n, start + width)
    out = ["…", text[start:first]] if start else [text[:first]]
    a, b = first, first + len(word)
    while True:
        out += (MARK_OPEN, text[a:b], MARK_CLOSE)
        cursor = b
        a = -1
        for w in words:  # the next match: leftmost, at one place the longest
            x = at[w]
            if 0 <= x < b:
                x = at[w] = folded.find(w, b)
            if x >= 0 and (a < 0 or x < a):
                a, word = x, w
        b = a + len(word)
        if a < 0 or b > end:  # none left, or one the window cuts: no more marks
            break
        out.append(text[cursor:a])
    out.append(text[cursor:end])
    if end < n:
        out.append("…")
    return "".join(out)


def folded_words(marks: list[q.Term]) -> tuple[str, ...]:
    """The terms a page's snippets mark, folded (`add_page`'s `words`)."""
    return _words(tuple(marks))


def add_page(
    conn: sqlite3.Connection, hits: list[Row], words: tuple[str, ...], neighbours: bool
) -> None:
    """Each hit's session columns, snippet and neighbours in one statement for the page;
    `words` are the marked terms folded (`folded_words`)."""
    if not hits:
        return
    params: list[object] = [x for h in hits for x in (h["id"], h["session_id"])]
    rows = conn.execute(_page_sql(len(hits), neighbours), params).fetchall()
    by_hit = {r[0]: r for r in rows}
    for h in hits:
        r = by_hit[h["id"]]
        h["source"], h["model"], h["title"], h["started_at"] = r[1], r[2], r[3], r[4]
        h["snippet"] = _snippet(r[5], words)
        if neighbours:  # the hit's tool name; whole contents, decoded by the caller
            near = [(r[8], r[9])] if r[7] is not None else []
            near.append((h["role"], r[5]))
            near += [(r[11], r[12])] if r[10] is not None else []
            h["_near"] = (r[6], near)
        h["context_before"] = (
            None if r[7] is None else {"id": r[7], "role": r[8], "content": _cut(r[9], neighbours)}
        )
        h["context_after"] = (
            None
            if r[10] is None
            else {"id": r[10], "role": r[11], "content": _cut(r[12], neighbours)}
        )


@functools.lru_cache(maxsize=128)
def _page_sql(hits: int, neighbours: bool) -> str:
    values = ", ".join("(?, ?)" for _ in range(hits))
    before_sql = "p.content" if neighbours else f"substr(p.content, 1, {CONTEXT_CHARS})"
    after_sql = before_sql.replace("p.", "n.")
    return (
        f"WITH hits(hid, sid) AS (VALUES {values}) "
        f"SELECT hid, {', '.join('s.' + c for c in _SESSION_COLUMNS)}, o.content, o.tool_name, "
        f"p.id, p.role, {before_sql}, n.id, n.role, {after_sql} FROM hits "
        "LEFT JOIN sessions s ON s.id = sid LEFT JOIN messages o ON o.id = hid "
        "LEFT JOIN messages p ON p.id = "
        "(SELECT MAX(id) FROM messages WHERE session_id = sid AND id < hid) "
        "LEFT JOIN messages n ON n.id = "
        "(SELECT MIN(id) FROM messages WHERE session_id = sid AND id > hid)"
    )


def _cut(content: Any, whole: bool) -> Any:
    """A neighbour's content as the native answer has it: its first CONTEXT_CHARS."""
    return content[:CONTEXT_CHARS] if whole and isinstance(content, str) else content
