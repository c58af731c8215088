"""Deadlines: one timer enforcing the time limits of many concurrent turns."""

from __future__ import annotations

import asyncio

import pytest

from gateway.deadlines import Deadlines
from gateway.messages import InboundMessage
from gateway.pipeline import APOLOGY
from gateway.session_keys import SessionSource
from tests.gateway.conftest import RouterRig


async def test_only_the_awaits_that_overrun_get_timeout_error() -> None:
    deadlines = Deadlines()

    async def finishes(seconds: float) -> str:
        return await deadlines.run(asyncio.sleep(seconds, "done"), 60)  # however slow the host

    async def never_finishes(limit: float) -> str:
        await deadlines.run(asyncio.Event().wait(), limit)
        return "unreachable"

    results = await asyncio.gather(
        finishes(0.01),
        never_finishes(0.1),
        finishes(0.05),
        never_finishes(0.2),
        return_exceptions=True,
    )
    assert results[0] == "done" and results[2] == "done"
    assert isinstance(results[1], TimeoutError) and isinstance(results[3], TimeoutError)
    assert len(deadlines) == 0


async def test_an_outside_cancel_stays_a_cancel_and_a_later_use_is_unaffected() -> None:
    deadlines = Deadlines()
    task = asyncio.create_task(deadlines.run(asyncio.sleep(5), 10))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await deadlines.run(asyncio.sleep(0.01, "ok"), 60) == "ok"
    assert len(deadlines) == 0


async def test_a_timed_out_task_carries_no_leftover_cancellation() -> None:
    deadlines = Deadlines()

    async def turn() -> str:
        try:
            await deadlines.run(asyncio.sleep(5), 0.05)
        except TimeoutError:
            pass
        await asyncio.sleep(0.01)  # would raise CancelledError if the cancel leaked
        task = asyncio.current_task()
        assert task is not None
        return f"carried on ({task.cancelling()})"

    assert await turn() == "carried on (0)"


async def test_a_turn_over_its_time_limit_apologises_and_the_next_one_runs(
    rig: RouterRig,
) -> None:
    rig.router.settings.turn_timeout_s = 0.2
    rig.agent.delay_on = {"ponder": 5}
    src = SessionSource("telegram", "7", "dm", "7", "Ann")
    await rig.router.handle(InboundMessage(src, "ponder this", "1"))
    [out] = await rig.outbox.wait(1)
    assert out.text == APOLOGY
    assert rig.router.last_error and "TimeoutError" in rig.router.last_error
    rig.router.settings.turn_timeout_s = 60  # the next turn must not depend on the host's speed
    await rig.router.handle(InboundMessage(src, "quick one", "2"))
    await rig.outbox.wait(2)
    assert rig.outbox.sent[1].text == "echo: quick one"
    msgs = await rig.db.get_messages(out.session_id)
    assert [m["content"] for m in msgs] == ["ponder this", "quick one", "echo: quick one"]
