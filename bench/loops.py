"""How the benchmarks offer load and read what it cost: an open loop, and a process's CPU
time from /proc."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any


async def open_loop(
    rate: float, count: int, one: Callable[[int], Coroutine[Any, Any, None]]
) -> float:
    """Start `one(i)` at i/rate seconds for each i < count, whatever became of the earlier
    ones (a slow answer does not lower the rate offered), and wait for them all; the
    seconds from the first start to the last end."""
    tasks: set[asyncio.Task[None]] = set()  # only unfinished ones: no heap of done tasks
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
