"""The history window an agent is given (gateway.agent.base.window)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.base import estimate_tokens, window


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    roles=st.lists(st.sampled_from(["user", "assistant", "tool"]), max_size=30),
    sizes=st.lists(st.integers(0, 400), min_size=30, max_size=30),
    budget=st.integers(0, 800),
)
def test_the_window_with_costs_given_is_the_window_without(
    roles: list[str], sizes: list[int], budget: int
) -> None:
    """The turn passes the token estimates it computed once; the window must not change
    (whole history fitting, cut at the budget, a leading tool result dropped)."""
    history = [{"role": r, "content": "x" * n} for r, n in zip(roles, sizes, strict=False)]
    costs = [estimate_tokens(m) for m in history]
    got = window(history, budget, costs)
    assert got == window(history, budget)
    assert not got or got[0]["role"] != "tool"
    assert got == history[len(history) - len(got) :]
