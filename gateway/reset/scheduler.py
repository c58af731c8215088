"""The APScheduler loop (the only module that imports apscheduler): a sweep every
`sweep_seconds`, one at each daily boundary in use, and the daily auto-prune.

APScheduler cancels running coroutine jobs on shutdown, so `stop` first waits (bounded)
for our own jobs to finish, then shuts the scheduler down."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("gateway.reset.scheduler")
Job = Callable[[], Awaitable[object]]


class ResetScheduler:
    def __init__(
        self,
        sweep: Job,
        *,
        sweep_seconds: float = 60.0,
        daily: Iterable[tuple[int, str]] = (),
        prune: Job | None = None,
    ) -> None:
        self._sweep = sweep
        self._sweep_seconds = sweep_seconds
        self._daily = sorted(set(daily))
        self._prune = prune
        self._scheduler: AsyncIOScheduler | None = None
        self._running: set[asyncio.Task[object]] = set()
        self.runs = 0

    async def _guarded(self, job: Job, name: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            await job()
            self.runs += 1
        except Exception:
            log.exception("scheduled %s failed", name)
        finally:
            if task is not None:
                self._running.discard(task)

    def start(self) -> None:
        """Start inside the running loop (AsyncIOScheduler needs it)."""
        sched = AsyncIOScheduler(timezone="UTC")
        opts = {"coalesce": True, "max_instances": 1, "misfire_grace_time": 60}
        sched.add_job(
            self._guarded,
            IntervalTrigger(seconds=self._sweep_seconds, timezone="UTC"),
            args=(self._sweep, "reset sweep"),
            id="reset-sweep",
            **opts,
        )
        for hour, tz in self._daily:
            sched.add_job(
                self._guarded,
                CronTrigger(hour=hour, minute=0, second=1, timezone=tz),
                args=(self._sweep, "daily reset"),
                id=f"reset-daily-{hour}-{tz}",
                **opts,
            )
        if self._prune is not None:
            sched.add_job(
                self._guarded,
                CronTrigger(hour=3, minute=30, timezone="UTC"),
                args=(self._prune, "auto-prune"),
                id="auto-prune",
                **opts,
            )
            sched.add_job(
                self._guarded,
                args=(self._prune, "auto-prune at start-up"),
                id="auto-prune-start",
                next_run_time=datetime.now(UTC),
                **opts,
            )
        sched.start()
        self._scheduler = sched

    def next_sweep(self) -> float | None:
        """When the reset policy is next applied (the sweep or a daily boundary, whichever
        comes first), as seconds since the epoch; None when the scheduler is not running."""
        if self._scheduler is None:
            return None
        times = [
            job.next_run_time.timestamp()
            for job in self._scheduler.get_jobs()
            if job.id.startswith("reset-") and job.next_run_time is not None
        ]
        return min(times, default=None)

    async def stop(self, budget_s: float = 10.0) -> None:
        if self._scheduler is None:
            return
        self._scheduler.pause()
        if self._running:
            done, pending = await asyncio.wait(set(self._running), timeout=budget_s)
            for task in pending:
                task.cancel()
        self._scheduler.shutdown(wait=False)
        await asyncio.sleep(0)  # APScheduler finishes shutting down on the next loop pass
        self._scheduler = None
