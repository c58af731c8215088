"""The garbage collector, set for a long-running daemon, and its pauses measured.

CPython frees almost every object by reference counting; the cyclic collector exists for
the rest and runs whenever the objects it tracks grow by `threshold0` (700) since the
last pass. A daemon under load allocates and frees many such objects per message (request
and reply dicts, futures, tasks), so at 800 messages/s one replica ran about 120
collections a second, and every few seconds a full one that walks every object alive:
modules, the config, the adapters, the index. Those full passes took 28 ms each (34 ms
at most), long enough to be the turn p99 (`python bench/cluster_bench.py`,
docs/benchmarks.md).

`settle()` runs once the daemon has started: one collection, then `gc.freeze()` moves
everything alive into a generation the collector never walks (what start-up built lives
as long as the process; reference counting still frees any of it that is dropped), and
the youngest generation may grow to 10,000 objects before a pass. Measured on one replica
at 800 msg/s offered: 3,439 collections taking 1.37 s in all (the longest 34 ms) became
13 taking 43 ms (the longest 11 ms), and the turn p99 went from 104-151 ms to 53-69 ms.
Garbage in cycles waits longer for its pass, bounded by those 10,000 objects.

`Pauses` counts the collections and their time for /metrics (`watch`).
"""

from __future__ import annotations

import gc
import sys
import time
from typing import Any

from gateway.ops.metrics import Metrics

THRESHOLDS = (10_000, 10, 10)  # gc.set_threshold: young objects before a pass, then passes


def settle() -> int:
    """Once start-up is done: collect, freeze what is alive, raise the thresholds.
    Returns how many objects the collector will no longer walk."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    return gc.get_freeze_count()


class Pauses:
    """The collector's passes and the time they held the process (gc.callbacks)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]  # per generation
        self.seconds = 0.0
        self.longest_ms = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        self.passes[info["generation"]] += 1
        self.seconds += took
        self.longest_ms = max(self.longest_ms, took * 1000)

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


def watch(metrics: Metrics, pauses: Pauses) -> None:
    """/metrics lines for the collector: passes, full passes, time paused, the longest
    pause, and the objects frozen at start-up."""
    metrics.gauge(
        "switchboard_gc_passes_total",
        "Garbage collector passes",
        lambda: sum(pauses.passes),
        kind="counter",
    )
    metrics.gauge(
        "switchboard_gc_full_passes_total",
        "Passes over every object not frozen",
        lambda: pauses.passes[2],
        kind="counter",
    )
    metrics.gauge(
        "switchboard_gc_pause_seconds_total",
        "Time the collector held the process",
        lambda: pauses.seconds,
        kind="counter",
    )
    metrics.gauge(
        "switchboard_gc_pause_longest_ms",
        "The longest collector pause so far",
        lambda: pauses.longest_ms,
    )
    metrics.gauge(
        "switchboard_gc_frozen_objects",
        "Objects frozen after start-up, never walked",
        gc.get_freeze_count,
    )


# The event loop and the store's writer thread share the GIL. The writer gives it up around
# every SQLite statement and needs it back after; at CPython's default switch interval (5 ms)
# it then waits up to 5 ms for a busy loop to let go, once per statement. At 0.2 ms the
# gateway bench measured 3,159-3,495 msg/s against 2,751-2,756 at the default, with the same
# p99 at 1,000 msg/s (bench/gateway_bench.py runs with it too).
SWITCH_INTERVAL_S = 0.0002


def tune_interpreter() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
