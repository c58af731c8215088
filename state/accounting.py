"""Token and cost accounting rules both stores apply: the token kinds a session counts, the
SET clauses of a totals update (incremental adds, absolute sets), and the billing route a
call's per-model usage row is counted on. Pure functions; the SQL that runs them is each
backend's (state/sqlite/usage.py, state/pg/usage.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

# what the agent or its provider reported for a session: the actual cost when known
RECORDED_COST = "COALESCE(NULLIF(actual_cost_usd, 0), estimated_cost_usd, 0)"

TOKEN_KINDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
BILLING_ROUTE = ("billing_provider", "billing_base_url", "billing_mode")
COST_FACTS = ("cost_status", "cost_source", "pricing_version")


class TokenUsage(TypedDict, total=False):
    """What a caller of `update_token_counts` reports (every key optional): token counts
    (added, or set with `absolute`), costs, the model, the call count, the billing route
    and where the cost figure came from."""

    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    estimated_cost_usd: float | None
    actual_cost_usd: float | None
    absolute: bool
    model: str | None
    api_call_count: int
    billing_provider: str | None
    billing_base_url: str | None
    billing_mode: str | None
    cost_status: str | None
    cost_source: str | None
    pricing_version: str | None


class TokenUpdate(TypedDict):
    """A TokenUsage in the shape each backend's SQL takes (state/sqlite/usage.py's and
    state/pg/usage.py's `update_token_counts`, after the session id)."""

    counts: dict[str, int]
    model: str | None
    estimated_cost_usd: float | None
    actual_cost_usd: float | None
    api_call_count: int
    absolute: bool
    route: dict[str, Any]
    cost: dict[str, Any]


def token_update(usage: TokenUsage) -> TokenUpdate:
    """The one reading of a TokenUsage: absent counts are 0, absent route and cost facts
    None, an absent `absolute` is an increment."""
    given: Mapping[str, Any] = usage
    return {
        "counts": {k: given.get(k, 0) for k in TOKEN_KINDS},
        "model": usage.get("model"),
        "estimated_cost_usd": usage.get("estimated_cost_usd"),
        "actual_cost_usd": usage.get("actual_cost_usd"),
        "api_call_count": usage.get("api_call_count", 0),
        "absolute": usage.get("absolute", False),
        "route": {k: given.get(k) for k in BILLING_ROUTE},
        "cost": {k: given.get(k) for k in COST_FACTS},
    }


def totals_set(
    counts: Mapping[str, int],
    estimated_cost_usd: float | None,
    actual_cost_usd: float | None,
    api_call_count: int,
    absolute: bool,
    cost: Mapping[str, Any],
    mark: str,
) -> tuple[list[str], list[Any]]:
    """The SET clauses and parameters of a totals update (`mark`: the driver's placeholder,
    "?" or "%s"): incremental calls add (NULL counts as 0), absolute ones set."""
    sets: list[str] = []
    params: list[Any] = []
    for k in TOKEN_KINDS:
        sets.append(f"{k} = {mark}" if absolute else f"{k} = COALESCE({k}, 0) + {mark}")
        params.append(int(counts.get(k) or 0))
    money = ["api_call_count", "estimated_cost_usd"]
    if actual_cost_usd is not None:
        money.append("actual_cost_usd")
    for col in money:
        sets.append(f"{col} = {mark}" if absolute else f"{col} = COALESCE({col}, 0) + {mark}")
    params += [int(api_call_count or 0), float(estimated_cost_usd or 0.0)]
    if actual_cost_usd is not None:
        params.append(float(actual_cost_usd))
    for col in ("cost_status", "cost_source", "pricing_version"):
        if cost.get(col) is not None:
            sets.append(f"{col} = {mark}")
            params.append(cost[col])
    return sets, params


def usage_route(
    model: str | None, route: Mapping[str, Any], session: tuple[Any, ...] | None
) -> dict[str, Any]:
    """The route an incremental call's usage row is counted on: the call's own, else the
    session's (`session`: its model, billing provider, base URL, mode)."""
    srow = session or (None, None, None, None)
    return {
        "model": model or srow[0] or "unknown",
        "billing_provider": route.get("billing_provider") or srow[1],
        "billing_base_url": route.get("billing_base_url") or srow[2],
        "billing_mode": route.get("billing_mode") or srow[3],
    }
