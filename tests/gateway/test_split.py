"""Splitting long replies and retrying rate-limited sends."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.adapters.base import Backoff, RetryAfter, TransientError, call_with_retry
from gateway.adapters.kit.split import split_message, utf16_len
from gateway.errors import InvalidToken


def test_short_text_is_one_part() -> None:
    assert split_message("hello", 10) == ["hello"]


def test_prefers_paragraph_then_line_boundaries() -> None:
    text = "para one is here\n\npara two is here\nline three"
    parts = split_message(text, 20)
    assert parts[0] == "para one is here"
    assert all(len(p) <= 20 for p in parts)
    assert " ".join(" ".join(parts).split()) == " ".join(text.split())


def test_code_fences_stay_balanced_across_parts() -> None:
    code = "```python\n" + "\n".join(f"print({i})" for i in range(40)) + "\n```\nafter"
    parts = split_message(code, 80)
    assert len(parts) > 2
    for p in parts:
        assert p.count("```") % 2 == 0, p
        assert len(p) <= 80
    assert parts[1].startswith("```python")


def test_utf16_measure_counts_astral_characters_twice() -> None:
    assert utf16_len("🎉a") == 3
    parts = split_message("🎉" * 10, 8, utf16_len)
    assert all(utf16_len(p) <= 8 for p in parts) and "".join(parts) == "🎉" * 10


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=3000), st.integers(min_value=20, max_value=500))
def test_no_part_exceeds_the_limit_and_no_word_is_lost(text: str, limit: int) -> None:
    parts = split_message(text, limit)
    assert all(len(p) <= limit for p in parts)
    if "```" not in text:
        assert "".join(text.split()) == "".join("".join(parts).split())


async def test_retry_after_is_waited_out_and_the_call_repeated() -> None:
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RetryAfter(0.01)
        if len(calls) == 2:
            raise TransientError("reset")
        return "ok"

    assert await call_with_retry(flaky, backoff=Backoff(initial_s=0.01)) == "ok"
    assert len(calls) == 3


async def test_invalid_token_is_not_retried() -> None:
    calls = []

    async def bad() -> None:
        calls.append(1)
        raise InvalidToken("rejected")

    with pytest.raises(InvalidToken):
        await call_with_retry(bad)
    assert len(calls) == 1
