"""Reset policies: decide() with a fake clock, apply() on the index, the lazy reset on the
next message, the pre-reset hook, notices, and one smoke test with the real scheduler."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from gateway.pipeline import Router
from gateway.reset import Resetter
from gateway.reset.policy import PolicySet, ResetPolicy, decide, last_boundary, next_boundary
from gateway.reset.scheduler import ResetScheduler

from .conftest import RouterRig, dm, group


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


IDLE = ResetPolicy("idle", idle_minutes=60)
DAILY_UTC = ResetPolicy("daily", at_hour=4)
BERLIN = ResetPolicy("daily", at_hour=2, timezone="Europe/Berlin")
NEW_YORK = ResetPolicy("daily", at_hour=1, timezone="America/New_York")
BOTH = ResetPolicy("both", idle_minutes=600, at_hour=4)


@pytest.mark.parametrize(
    "policy, last, now, live, reason",
    [
        (ResetPolicy("none"), ts(2026, 1, 1), ts(2027, 1, 1), False, None),
        (IDLE, ts(2026, 1, 1, 12), ts(2026, 1, 1, 12, 59, 59), False, None),
        (IDLE, ts(2026, 1, 1, 12), ts(2026, 1, 1, 13), False, None),  # exactly 60 min: not more
        (IDLE, ts(2026, 1, 1, 12), ts(2026, 1, 1, 13, 0, 1), False, "idle"),
        (IDLE, ts(2026, 1, 1, 12), ts(2026, 1, 2), True, None),  # a live job holds it
        (DAILY_UTC, ts(2026, 1, 1, 3, 59), ts(2026, 1, 1, 4), False, "daily"),
        (DAILY_UTC, ts(2026, 1, 1, 4), ts(2026, 1, 2, 3, 59), False, None),
        (DAILY_UTC, ts(2026, 1, 1, 4), ts(2026, 1, 2, 4), False, "daily"),
        # Berlin spring forward (2026-03-29): 02:00 local does not exist; the boundary is
        # 01:00 UTC (03:00 CEST). Winter boundary is 01:00 UTC too, summer 00:00 UTC.
        (BERLIN, ts(2026, 3, 29, 0, 59), ts(2026, 3, 29, 0, 59, 59), False, None),
        (BERLIN, ts(2026, 3, 29, 0, 59), ts(2026, 3, 29, 1), False, "daily"),
        (BERLIN, ts(2026, 3, 29, 1), ts(2026, 3, 30, 0), False, "daily"),
        (BERLIN, ts(2026, 3, 29, 1), ts(2026, 3, 29, 23, 59), False, None),
        # New York fall back (2026-11-01): 01:00 local happens twice; the first (05:00 UTC) counts
        (NEW_YORK, ts(2026, 11, 1, 4, 59), ts(2026, 11, 1, 5), False, "daily"),
        (NEW_YORK, ts(2026, 11, 1, 5), ts(2026, 11, 1, 6), False, None),
        (NEW_YORK, ts(2026, 11, 1, 5), ts(2026, 11, 2, 6), False, "daily"),
        (BOTH, ts(2026, 1, 1, 3), ts(2026, 1, 1, 4), False, "daily"),  # daily came first
        (BOTH, ts(2026, 1, 1, 5), ts(2026, 1, 1, 15, 1), False, "idle"),  # idle came first
        (BOTH, ts(2026, 1, 1, 5), ts(2026, 1, 2, 4), True, None),
    ],
)
def test_decide(
    policy: ResetPolicy, last: float, now: float, live: bool, reason: str | None
) -> None:
    decision = decide(last, now, live, policy)
    assert decision.reason == reason
    if live and policy.mode != "none":
        assert decision.blocked_by_jobs


@pytest.mark.parametrize("policy", [IDLE, DAILY_UTC, BERLIN, BOTH])
def test_an_empty_session_is_never_due(policy: ResetPolicy) -> None:
    # long past every threshold, an empty session is still not reset
    last, now = ts(2026, 1, 1, 12), ts(2026, 3, 1, 12)
    assert decide(last, now, False, policy).reason is not None
    decision = decide(last, now, False, policy, empty=True)
    assert decision.reason is None and decision.due_at is None and not decision.blocked_by_jobs


def test_boundaries_across_dst() -> None:
    assert last_boundary(datetime(2026, 3, 29, 12, tzinfo=UTC), 2, "Europe/Berlin") == datetime(
        2026, 3, 29, 1, tzinfo=UTC
    )
    assert last_boundary(datetime(2026, 3, 30, 12, tzinfo=UTC), 2, "Europe/Berlin") == datetime(
        2026, 3, 30, 0, tzinfo=UTC
    )
    assert next_boundary(datetime(2026, 10, 31, 12, tzinfo=UTC), 1, "America/New_York") == datetime(
        2026, 11, 1, 5, tzinfo=UTC
    )
    assert next_boundary(datetime(2026, 11, 1, 5, tzinfo=UTC), 1, "America/New_York") == datetime(
        2026, 11, 2, 6, tzinfo=UTC
    )


def test_override_precedence_platform_then_chat_type_then_default() -> None:
    ps = PolicySet(
        default=ResetPolicy("none"),
        by_platform={"telegram": ResetPolicy("idle")},
        by_chat_type={"group": ResetPolicy("daily"), "dm": ResetPolicy("both")},
    )
    assert ps.for_chat("telegram", "group").mode == "idle"
    assert ps.for_chat("discord", "group").mode == "daily"
    assert ps.for_chat("discord", "dm").mode == "both"
    assert ps.for_chat("discord", "channel").mode == "none"


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _say(rig: RouterRig, msg) -> list[str]:  # noqa: ANN001
    n = len(rig.outbox.sent)
    await rig.router.handle(msg)
    await rig.router.drain(5)
    return [m.text for m in rig.outbox.sent[n:]]


def _arm(rig: RouterRig, policy: ResetPolicy, clock: Clock, hook=None) -> Resetter:  # noqa: ANN001
    rig.router = Router(
        rig.db,
        rig.index,
        rig.agent,
        rig.outbox.send,
        clock=clock,
        resetter=lambda services: Resetter(
            services, PolicySet(default=policy), **({"hook": hook} if hook else {})
        ),
    )
    assert rig.router.resetter is not None
    return rig.router.resetter


async def test_apply_resets_idle_sessions_once(rig: RouterRig) -> None:
    clock = Clock(ts(2026, 5, 1, 12))
    resetter = _arm(rig, IDLE, clock)
    await _say(rig, dm("hello", chat="1"))
    await _say(rig, dm("hello", chat="2"))
    old1 = rig.index.get("agent:main:telegram:dm:1").session_id  # type: ignore[union-attr]
    clock.now += 30 * 60
    await _say(rig, dm("still here", chat="2"))
    clock.now += 31 * 60  # chat 1: 61 min idle; chat 2: 31 min
    assert await resetter.apply() == 1
    assert await resetter.apply() == 0  # idempotent: a doubled fire does nothing
    new1 = rig.index.get("agent:main:telegram:dm:1").session_id  # type: ignore[union-attr]
    assert new1 != old1
    old_row = await rig.db.require_session(old1)
    assert old_row["end_reason"] == "idle"
    new_row = await rig.db.require_session(new1)
    assert (new_row["parent_session_id"], new_row["child_kind"]) == (old1, "reset")
    # the chat hears about it with its next message, once
    replies = await _say(rig, dm("back again", chat="1"))
    assert replies[0].startswith(
        "A new session was started after a period of inactivity. Send /resume "
    )
    title = (await rig.db.require_session(old1))["title"]  # auto-titled after its first exchange
    assert f"/resume {title} to go back" in replies[0] and replies[1] == "echo: back again"
    assert await _say(rig, dm("and again", chat="1")) == ["echo: and again"]


async def test_the_next_message_resets_lazily_even_without_a_sweep(rig: RouterRig) -> None:
    clock = Clock(ts(2026, 5, 1, 3, 30))
    _arm(rig, DAILY_UTC, clock)
    await _say(rig, dm("/title before dawn"))
    await _say(rig, dm("night owl"))
    old = rig.index.get("agent:main:telegram:dm:42").session_id  # type: ignore[union-attr]
    clock.now = ts(2026, 5, 1, 4, 0, 1)
    replies = await _say(rig, dm("good morning"))
    assert replies == [
        "A new session was started for the daily reset. Send /resume before dawn to go back.",
        "echo: good morning",
    ]
    new = rig.index.get("agent:main:telegram:dm:42").session_id  # type: ignore[union-attr]
    assert new != old and (await rig.db.require_session(old))["end_reason"] == "daily"
    assert [m["content"] for m in await rig.db.get_messages(new)] == [
        "good morning",
        "echo: good morning",
    ]


async def test_no_notice_when_the_old_session_was_empty_and_none_when_not_wanted(
    rig: RouterRig,
) -> None:
    clock = Clock(ts(2026, 5, 1, 12))
    _arm(rig, ResetPolicy("idle", idle_minutes=1, notify=False), clock)
    await _say(rig, dm("hello"))
    clock.now += 120
    assert await _say(rig, dm("hello again")) == ["echo: hello again"]
    _arm(rig, IDLE, clock)
    await _say(rig, group("/status", user="5"))  # a session with no messages
    empty = rig.index.get("agent:main:telegram:group:-100:5").session_id  # type: ignore[union-attr]
    clock.now += 2 * 3600
    assert await _say(rig, group("hi", user="5")) == ["echo: hi"]  # no reset, no notice
    row = await rig.db.require_session(empty)  # an empty session is kept, not reset
    assert row["end_reason"] is None and row["message_count"] == 2
    assert rig.index.get("agent:main:telegram:group:-100:5").session_id == empty  # type: ignore[union-attr]


async def test_a_session_with_a_live_background_job_is_not_reset(rig: RouterRig) -> None:
    clock = Clock(ts(2026, 5, 1, 12))
    resetter = _arm(rig, IDLE, clock)
    rig.agent.delay_on = {"long job": 0.5}
    await _say(rig, dm("hi"))
    await rig.router.handle(dm("/background long job"))
    await rig.outbox.wait(2)
    sid = rig.index.get("agent:main:telegram:dm:42").session_id  # type: ignore[union-attr]
    clock.now += 2 * 3600
    assert resetter.decide(rig.index.get("agent:main:telegram:dm:42"), clock.now).blocked_by_jobs  # type: ignore[arg-type]
    assert await resetter.apply() == 0
    assert "held by a live job" in rig.router.describe_reset(rig.router.key_for(dm("x")))
    await rig.router.drain(5)  # the job finishes
    assert await resetter.apply() == 1
    assert rig.index.get("agent:main:telegram:dm:42").session_id != sid  # type: ignore[union-attr]


async def test_the_pre_reset_hook_runs_first_and_a_slow_or_failing_one_does_not_block(
    rig: RouterRig,
) -> None:
    clock = Clock(ts(2026, 5, 1, 12))
    order: list[str] = []

    async def hook(session_id: str, reason: str) -> None:
        row = await rig.db.require_session(session_id)
        order.append(f"hook:{reason}:{'live' if row['ended_at'] is None else 'ended'}")
        await asyncio.sleep(600)  # far longer than its budget

    resetter = _arm(rig, IDLE, clock, hook)
    resetter.hook_timeout_s = 0.1
    await _say(rig, dm("hi"))
    clock.now += 2 * 3600
    assert await asyncio.wait_for(resetter.apply(), 60) == 1  # not the hook's 600 s
    assert order == ["hook:idle:live"]  # it saw the session before it ended

    async def broken(session_id: str, reason: str) -> None:
        raise RuntimeError("hook exploded")

    resetter.hook = broken
    await _say(rig, dm("again"))
    clock.now += 2 * 3600
    assert await resetter.apply() == 1


async def test_status_describes_the_policy_and_next_reset(rig: RouterRig) -> None:
    clock = Clock(ts(2026, 5, 1, 12))
    _arm(rig, BOTH, clock)
    await _say(rig, dm("hi"))
    status = (await _say(rig, dm("/status")))[0]
    assert (
        "Reset policy: after 600 minutes idle or daily at 04:00 UTC; next reset at 2026-05-01 22:00 UTC"
        in status
    )


async def _lineage_of(rig: RouterRig, key: str) -> list[str]:
    sid = rig.index.get(key).session_id  # type: ignore[union-attr]
    return [r["id"] for r in await rig.db.get_ancestors(sid)] + [sid]


@pytest.mark.parametrize(
    "policy, step", [(ResetPolicy("idle", idle_minutes=1), 61), (DAILY_UTC, 86_400)]
)
async def test_an_idle_chat_is_reset_once_not_every_sweep(
    rig: RouterRig, policy: ResetPolicy, step: float
) -> None:
    # the real scheduler sweeps, the clock moves a period per sweep;
    # one reset (to an empty child), then that empty child is never reset again
    clock = Clock(ts(2026, 5, 1, 12))
    resetter = _arm(rig, policy, clock)
    await _say(rig, dm("hello"))
    await _say(rig, group("/status", user="5"))  # a session that never had a message
    quiet = rig.index.get("agent:main:telegram:group:-100:5").session_id  # type: ignore[union-attr]
    sweeps = asyncio.Event()
    done = 0

    async def sweep() -> None:
        nonlocal done
        clock.now += step
        await resetter.apply()
        done += 1
        if done >= 11:
            sweeps.set()

    sched = ResetScheduler(sweep, sweep_seconds=0.05)
    sched.start()
    try:
        await asyncio.wait_for(sweeps.wait(), 30)
    finally:
        await sched.stop(5)
    assert resetter.resets == 1
    lineage = await _lineage_of(rig, "agent:main:telegram:dm:42")
    assert len(lineage) == 2
    assert (await rig.db.require_session(lineage[1]))["end_reason"] is None
    assert rig.index.get("agent:main:telegram:group:-100:5").session_id == quiet  # type: ignore[union-attr]
    assert await rig.db.session_count() == 3
    # the empty child is used by the next message, which then makes it resettable again
    replies = await _say(rig, dm("back"))
    assert replies[0].startswith("A new session was started") and replies[1] == "echo: back"
    assert await _lineage_of(rig, "agent:main:telegram:dm:42") == lineage
    clock.now += step + 1
    assert await resetter.apply() == 1
    assert len(await _lineage_of(rig, "agent:main:telegram:dm:42")) == 3


async def test_a_session_remembered_as_empty_is_asked_again_on_the_next_message(
    rig: RouterRig,
) -> None:
    # a background job stores messages without a turn touching the index entry
    clock = Clock(ts(2026, 5, 1, 12))
    resetter = _arm(rig, IDLE, clock)
    await _say(rig, dm("/status"))
    sid = rig.index.get("agent:main:telegram:dm:42").session_id  # type: ignore[union-attr]
    clock.now += 2 * 3600
    assert await resetter.apply() == 0  # empty: remembered, not reset
    await _say(rig, dm("/background think"))
    await rig.router.drain(5)  # the job itself
    assert rig.outbox.sent[-1].text.startswith("Background job bg1 finished")
    clock.now += 2 * 3600
    assert await resetter.apply() == 0  # the sweep trusts what it remembered ...
    replies = await _say(rig, dm("hello"))  # ... the message's own check asks state.db
    assert replies[0].startswith("A new session was started") and replies[-1] == "echo: hello"
    assert (await rig.db.require_session(sid))["end_reason"] == "idle"


async def test_the_real_scheduler_sweeps_on_its_interval() -> None:
    runs: list[float] = []
    three = asyncio.Event()

    async def sweep() -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) == 3:
            three.set()

    sched = ResetScheduler(sweep, sweep_seconds=0.2, daily=[(4, "UTC")])
    sched.start()
    await asyncio.wait_for(three.wait(), 60)  # counted, not timed: only a stall fails
    await sched.stop(10)
    assert len(runs) >= 3  # it sweeps again and again on its own
    count = len(runs)
    await asyncio.sleep(0.6)  # three intervals: a scheduler still running would sweep
    assert len(runs) == count  # stopped means stopped


async def test_stop_waits_for_a_running_sweep_instead_of_cancelling_it() -> None:
    finished: list[bool] = []
    started = asyncio.Event()

    async def slow() -> None:
        started.set()
        await asyncio.sleep(0.3)
        finished.append(True)

    sched = ResetScheduler(slow, sweep_seconds=0.1)
    sched.start()
    await asyncio.wait_for(started.wait(), 60)
    await sched.stop(30)
    assert finished == [True]


async def test_auto_prune_runs_at_start_up_when_enabled(tmp_path) -> None:  # noqa: ANN001
    import time as _time

    from gateway.app import Gateway
    from gateway.config import load_config
    from state import SessionDB

    home = tmp_path / "home"
    db = await SessionDB.open(home / "state.db")
    old = await db.create_session(source="api", started_at=_time.time() - 200 * 86400)
    await db.end_session(old, "idle")
    await db.close()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\nsessions:\n  auto_prune:\n    enabled: true\n    retention_days: 90\n"
    )
    gw = Gateway(config=load_config(cfg, {}), home=home)
    await gw.start()
    try:
        assert gw.db is not None
        # The run stamps state_meta before it prunes, so wait for the deletion itself.
        deadline = asyncio.get_running_loop().time() + 60
        while await gw.db.get_session(old) is not None:
            assert asyncio.get_running_loop().time() < deadline, "auto-prune never ran"
            await asyncio.sleep(0.02)
        assert await gw.db.get_meta("switchboard.auto_prune.last_run")
    finally:
        await gw.stop()


async def test_a_restart_before_the_next_message_keeps_the_reset_notice(rig: RouterRig) -> None:
    """One daemon keeps a pending notice in memory: a restart (a new router on the same
    state.db and sessions.json) restores it from the reset's own rows, once it is owed."""
    clock = Clock(ts(2026, 5, 1, 12))
    resetter = _arm(rig, IDLE, clock)
    await _say(rig, dm("/title long talk", chat="1"))
    await _say(rig, dm("hello", chat="1"))
    await _say(rig, dm("hello", chat="2"))
    clock.now += 61 * 60
    assert await resetter.apply() == 2
    told = await _say(rig, dm("back", chat="2"))  # chat 2 is told before the restart
    assert told[0].startswith("A new session was started") and told[1] == "echo: back"
    restarted = _arm(rig, IDLE, clock)  # a new coordinator: nothing pending in memory
    assert await restarted.restore_notices() == 1  # chat 1 only: chat 2's child has messages
    assert await _say(rig, dm("back", chat="1")) == [
        "A new session was started after a period of inactivity. Send /resume long talk to go back.",
        "echo: back",
    ]
    again = _arm(rig, IDLE, clock)
    assert await again.restore_notices() == 0
    assert await _say(rig, dm("more", chat="1")) == ["echo: more"]
