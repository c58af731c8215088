"""How text is prepared for the search indexes.

The main index (`sb_messages_fts`, unicode61) sees message content as it is. unicode61 keeps a
run of CJK characters glued to Latin letters as one token and drops emoji entirely, so
messages that contain such characters get a second, segmented copy in `messages_aux`:
every CJK character becomes its own token and every symbol (emoji) a stable word, so a
phrase query over those tokens finds any substring. English-only messages never pay for it.
"""

from __future__ import annotations

import unicodedata

_CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK radicals
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x3130, 0x318F),  # Hangul compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xAC00, 0xD7AF),  # Hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0x20000, 0x3134F),  # CJK extensions B..G
)
SYMBOL_PREFIX = "sym"


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    if cp < 0x1100:
        return False
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_symbol(ch: str) -> bool:
    """Emoji and other pictographs: dropped by unicode61, indexed as words here."""
    return ord(ch) > 0x7F and unicodedata.category(ch) == "So"


def needs_aux(text: str | None) -> bool:
    """True when unicode61 alone would miss part of this text."""
    if not text or text.isascii():
        return False
    return any(is_cjk(ch) or is_symbol(ch) for ch in text)


def symbol_token(ch: str) -> str:
    return f"{SYMBOL_PREFIX}{ord(ch):x}"


def segment(text: str) -> str:
    """Text for the segmented index: CJK one token per character, symbols as words."""
    out: list[str] = []
    for ch in text:
        if is_cjk(ch):
            out.append(f" {ch} ")
        elif is_symbol(ch):
            out.append(f" {symbol_token(ch)} ")
        elif unicodedata.category(ch) == "Cf" or ch == "\ufe0f":
            out.append(" ")  # joiners and variation selectors carry no searchable meaning
        else:
            out.append(ch)
    return "".join(out)


def tool_text(tool_name: str | None, tool_calls_json: str | None) -> str | None:
    """What a `tool` role search looks at: the tool's name and its call arguments."""
    parts = [p for p in (tool_name, tool_calls_json) if p]
    return " ".join(parts) if parts else None
