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
        every replica runs again when it returns. A restart goes on in the background (the
        others carry the load meanwhile); the next victim is one that is up and healthy."""
        rng = random.Random(self.seed)
        starting: dict[str, asyncio.Task[None]] = {}
        try:
            while self.done < self.kills and not until.is_set():
                try:
                    await asyncio.wait_for(until.wait(), rng.uniform(*self.interval_s))
                    break
                except TimeoutError:
                    pass
                for name, task in list(starting.items()):
                    if task.done():
                        task.result()  # a replica that could not start again fails the run
                        del starting[name]
                up = [r for r in self.cluster.replicas if r.running and r.name not in starting]
                if not up:
                    continue
                victim = rng.choice(up)
                await victim.kill()
                self.done += 1
                self.log.append(f"kill {self.done}: {victim.name}")
                await victim.start(wait=False)
                starting[victim.name] = asyncio.create_task(victim.healthy())
        finally:
            if starting:
                await asyncio.gather(*starting.values())
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
