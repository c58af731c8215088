"""Reset policies as pure functions of (entry, now, live jobs): no clock, no I/O.

`idle`: reset when the last activity is more than idle_minutes ago. `daily`: reset when the
last activity is before the most recent at_hour boundary in the policy's timezone (DST
aware: a boundary at a local time that does not exist that day falls an hour later in
wall-clock terms, as APScheduler's cron does). `both`: whichever threshold passed first.
A session with a live job (a turn or a background job) is never reset, and neither is an
empty one (no messages since it began): resetting it would only chain empty sessions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from gateway.vocab import ResetMode
from gateway.wording import plural
from state import EndReason


@dataclass(frozen=True)
class ResetPolicy:
    mode: ResetMode = ResetMode.NONE
    idle_minutes: int = 1440
    at_hour: int = 4
    timezone: str = "UTC"
    notify: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", ResetMode(self.mode))  # config gives a plain str

    def describe(self) -> str:
        if self.mode == ResetMode.NONE:
            return "none (sessions are never reset automatically)"
        parts = []
        if self.mode.idle:
            parts.append(f"after {plural(self.idle_minutes, 'minute')} idle")
        if self.mode.daily:
            parts.append(f"daily at {self.at_hour:02d}:00 {self.timezone}")
        return " or ".join(parts)


@dataclass(frozen=True)
class PolicySet:
    """The default policy with overrides; precedence: platform > chat type > default."""

    default: ResetPolicy = field(default_factory=ResetPolicy)
    by_platform: Mapping[str, ResetPolicy] = field(default_factory=dict)
    by_chat_type: Mapping[str, ResetPolicy] = field(default_factory=dict)

    def for_chat(self, platform: str, chat_type: str) -> ResetPolicy:
        if platform in self.by_platform:
            return self.by_platform[platform]
        if chat_type in self.by_chat_type:
            return self.by_chat_type[chat_type]
        return self.default

    def all(self) -> list[ResetPolicy]:
        return [self.default, *self.by_platform.values(), *self.by_chat_type.values()]


@dataclass(frozen=True)
class ResetDecision:
    reason: EndReason | None  # IDLE, DAILY or None
    blocked_by_jobs: bool = False
    due_at: float | None = None  # when the policy would (or did) fire for this activity


def last_boundary(now: datetime, at_hour: int, tz: str) -> datetime:
    """The most recent `at_hour`:00 local time in `tz` at or before `now` (aware, UTC)."""
    zone = ZoneInfo(tz)
    local = now.astimezone(zone)
    for back in range(0, 3):
        day = local.date() - timedelta(days=back)
        candidate = datetime(day.year, day.month, day.day, at_hour, tzinfo=zone)
        # normalise through UTC: a non-existent local time lands an hour later
        utc = candidate.astimezone(UTC)
        if utc <= now.astimezone(UTC):
            return utc
    raise AssertionError("unreachable: a boundary exists within three days")


def next_boundary(after: datetime, at_hour: int, tz: str) -> datetime:
    """The first `at_hour`:00 local boundary strictly after `after`."""
    zone = ZoneInfo(tz)
    local = after.astimezone(zone)
    for ahead in range(0, 3):
        day = local.date() + timedelta(days=ahead)
        candidate = datetime(day.year, day.month, day.day, at_hour, tzinfo=zone).astimezone(UTC)
        if candidate > after.astimezone(UTC):
            return candidate
    raise AssertionError("unreachable: a boundary exists within three days")


def decide(
    last_activity: float,
    now: float,
    live_jobs: bool,
    policy: ResetPolicy,
    *,
    empty: bool = False,
) -> ResetDecision:
    """Should the session whose last user/agent activity was at `last_activity` be reset at
    `now`? Times are Unix epochs; the decision names the reason that passed first. `empty`:
    the session has no messages, so it is never reset (and has no next reset)."""
    if policy.mode == ResetMode.NONE or empty:
        return ResetDecision(None)
    due: list[tuple[float, EndReason]] = []
    if policy.mode.idle:
        due.append((last_activity + policy.idle_minutes * 60, EndReason.IDLE))
    if policy.mode.daily:
        activity = datetime.fromtimestamp(last_activity, UTC)
        boundary = next_boundary(activity, policy.at_hour, policy.timezone)
        due.append((boundary.timestamp(), EndReason.DAILY))
    when, reason = min(due)
    # idle: strictly more than idle_minutes; daily: once the boundary is reached
    fired = now > when if reason == EndReason.IDLE else now >= when
    if not fired:
        return ResetDecision(None, due_at=when)
    if live_jobs:
        return ResetDecision(None, blocked_by_jobs=True, due_at=when)
    return ResetDecision(reason, due_at=when)


def merge(base: ResetPolicy, override: Mapping[str, Any]) -> ResetPolicy:
    """An override (validated by the config's schema) inherits every key it does not set."""
    return replace(base, **override)
