"""Counts in sentences for people: "1 message", "2 messages", "1 entry", "3 entries"."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` and the noun, singular for exactly one; `nouns` for an irregular plural."""
    return f"{n} {noun if n == 1 else (nouns or noun + 's')}"
