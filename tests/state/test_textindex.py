"""The segmented index's text (state/textindex.py) is worked out through cached translation
tables: it must be what the rules say character by character, for any text."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state import ranking, textindex

# CJK, kana, Hangul, emoji, joiners, variation selectors, accents, ASCII
MIXED = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.sampled_from(list("東京タワー서울한🎉🍕\u200d\ufe0f\u00adéÉǅßa1 ,.") + ["\U00020001"]),
    ),
    max_size=80,
)


def _segment_by_hand(text: str) -> str:
    out = []
    for ch in text:
        cp = ord(ch)
        if any(lo <= cp <= hi for lo, hi in textindex._CJK_RANGES) and (
            unicodedata.category(ch)[0] in "LN"
        ):
            out.append(f" {ch} ")
        elif cp > 0x7F and unicodedata.category(ch) == "So":
            out.append(f" sym{cp:x} ")
        elif unicodedata.category(ch) == "Cf" or ch == "\ufe0f":
            out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


@pytest.mark.slow
def test_cjk_ranges_are_the_listed_ones_for_every_code_point() -> None:
    """The listed ranges' letters and digits; their symbols and punctuation are not."""
    for cp in range(0x110000):
        want = any(lo <= cp <= hi for lo, hi in textindex._CJK_RANGES) and (
            unicodedata.category(chr(cp))[0] in "LN"
        )
        assert textindex.is_cjk(chr(cp)) == want, hex(cp)
    assert not textindex.is_cjk("⺀") and textindex.is_symbol("⺀")  # a radical: So


@settings(max_examples=400, deadline=None)
@given(text=MIXED)
def test_segment_follows_the_rules_character_by_character(text: str) -> None:
    assert textindex.segment(text) == _segment_by_hand(text)
    assert textindex.segment(text) == _segment_by_hand(text)  # again, from the table


@settings(max_examples=400, deadline=None)
@given(text=MIXED)
def test_fold_drops_exactly_the_combining_marks(text: str) -> None:
    decomposed = unicodedata.normalize("NFD", text.lower())
    want = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    assert ranking.fold(text) == want
