"""Splitting a long reply into the pieces a platform takes: under its limit (in characters,
or UTF-16 units where the platform counts those), at the best break (a paragraph, a line, a
sentence, a word), never inside a code fence without closing it and opening it again."""

from __future__ import annotations

from collections.abc import Callable


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def split_message(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    """Split `text` into parts of at most `limit` (as `measure` counts), preferring paragraph
    then line then word boundaries; a code fence open at a cut is closed and reopened."""
    if measure(text) <= limit:
        return [text]
    parts: list[str] = []
    rest = text
    fence: str | None = None  # the opening fence line carried into the next part
    while rest:
        prefix = f"{fence}\n" if fence else ""
        budget = limit - measure(prefix) - (4 if fence or "```" in rest else 0)
        if measure(prefix + rest) <= limit:
            parts.append(prefix + rest)
            break
        cut = _best_cut(rest, max(1, budget), measure)
        chunk, rest = rest[:cut], rest[cut:]
        body = prefix + chunk.rstrip("\n")
        fence = _open_fence(body, fence)
        if fence:
            body += "\n```"
        parts.append(body)
        rest = rest.lstrip("\n") if not fence else rest.lstrip("\n")
    return [p for p in parts if p.strip()] or [text[:limit]]


def _best_cut(text: str, budget: int, measure: Callable[[str], int]) -> int:
    # largest prefix that fits
    lo, hi = 1, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if measure(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    fit = lo
    window = text[:fit]
    for sep in ("\n\n", "\n", " "):
        pos = window.rfind(sep)
        if pos > fit // 3:
            return pos + len(sep)
    return fit


def _open_fence(body: str, carried: str | None) -> str | None:
    """The fence line still open at the end of `body` (given one carried in), else None."""
    open_line = carried
    for line in body.split("\n")[1 if carried else 0 :]:
        stripped = line.strip()
        if stripped.startswith("```"):
            open_line = None if open_line else stripped
    return open_line
