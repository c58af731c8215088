"""A search hit's snippet: a window of its text around the first match, the query's terms
marked, matched as the index matches them (case and accents ignored)."""

from __future__ import annotations

import functools
import re
import unicodedata

from .. import query as q

MARK_OPEN, MARK_CLOSE = ">>>", "<<<"


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


@functools.lru_cache(maxsize=256)
def _patterns(marks: tuple[q.Term, ...]) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """The marked terms folded, longest first: a pattern over folded text, and one of the
    lower-case ASCII ones for ASCII text, matched ignoring ASCII case (which is what
    folding ASCII text does; no other term can match folded ASCII text)."""
    words = sorted(
        {_fold(t.text.strip())[0] for t in marks if t.text.strip()}, key=len, reverse=True
    )
    words = [w for w in words if w]
    if not words:
        return None, None
    full = re.compile("|".join(re.escape(w) for w in words))
    plain = [w for w in words if w.isascii() and w == w.lower()]
    fast = re.compile("|".join(re.escape(w) for w in plain), re.I | re.A) if plain else None
    return full, fast


def make_snippet(content: str | None, marks: list[q.Term], width: int = 120) -> str:
    """A window of `content` around the first match, matches wrapped in >>> <<<.
    Matching ignores case and accents, as the index does."""
    text = " ".join((content or "").split())
    if not text:
        return ""
    full, fast = _patterns(tuple(marks))
    spans: list[tuple[int, int]] = []
    if text.isascii():
        if fast is not None:
            spans = [m.span() for m in fast.finditer(text) if m.end() > m.start()]
    elif full is not None:
        folded, pos = _fold(text)
        for m in full.finditer(folded):
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
