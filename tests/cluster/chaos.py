"""The chaos loop: SIGKILL a random live replica every few seconds and start it again, while
the workload runs; bounded by a number of kills.

With one replica the cluster is down between a kill and the restart (the balancer answers
502 and the senders deliver again); with several, the others carry the load and take over
the dead one's keys.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from tests.cluster.harness import Cluster
from tests.cluster.workload import Workload


@dataclass
class Chaos:
    cluster: Cluster
    kills: int
    seed: int
    interval_s: tuple[float, float] = (1.0, 2.5)
    done: int = 0
    log: list[str] = field(default_factory=list)

    async def run(self, until: asyncio.Event) -> None:
        """Kill and restart until `kills` were done or `until` is set (the load ended);
        every replica runs again when it returns. One replica is down at a time: the next
        kill waits for the last restart to answer /health (and for the interval, counted
        from the last kill), so the others always carry the load."""
        rng = random.Random(self.seed)
        restarting: asyncio.Task[None] | None = None
        try:
            while self.done < self.kills and not until.is_set():
                due = asyncio.get_running_loop().time() + rng.uniform(*self.interval_s)
                if restarting is not None:
                    await restarting  # a replica that cannot start again fails the run
                    restarting = None
                try:
                    await asyncio.wait_for(
                        until.wait(), max(0.0, due - asyncio.get_running_loop().time())
                    )
                    break
                except TimeoutError:
                    pass
                up = [r for r in self.cluster.replicas if r.running]
                if not up:
                    continue
                victim = rng.choice(up)
                await victim.kill()
                self.done += 1
                self.log.append(f"kill {self.done}: {victim.name}")
                await victim.start(wait=False)
                restarting = asyncio.create_task(victim.healthy())
        finally:
            if restarting is not None:
                await restarting
        for r in self.cluster.replicas:
            if not r.running:
                await r.start()


async def under_chaos(work: Workload, chaos: Chaos) -> None:
    """Run the workload while the chaos loop kills; once the kills are done (or the
    workload ended on its own), no new message starts and every one under way is
    delivered until acknowledged."""
    ended = asyncio.Event()
    load = asyncio.create_task(work.run())
    load.add_done_callback(lambda _: ended.set())
    try:
        await chaos.run(ended)
    finally:
        work.finish()
        await load
