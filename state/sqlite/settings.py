"""The SQLite writer's settings (`state.synchronous`, `state.queue_size`, ... in config):
how it commits, how much it queues and batches, and when the WAL is checkpointed."""

from __future__ import annotations

from dataclasses import dataclass

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")


@dataclass(frozen=True)
class WriterConfig:
    synchronous: str = "NORMAL"
    queue_size: int = 10_000
    max_batch: int = 1_000
    # While writes queue up (the last batch held more than one operation or left some
    # waiting), each batch waits this long for more before it commits; 0: never.
    commit_linger_s: float = 0.001
    busy_timeout_s: float = 2.0  # per attempt, inside SQLite
    lock_budget_s: float = 60.0  # total time a batch may wait for another process
    checkpoint_every_s: float = 0.1  # how often the background checkpointer copies frames back
    checkpoint_wal_bytes: int = 1024 * 1024  # ... once the WAL file has grown past this size
    restart_wal_frames: int = 1000  # past this many frames (4 MB) the writer restarts the WAL
    writer_checkpoint_pages: int = 16000  # safety net: SQLite's own checkpoint in the writer
    # The search indexes are merged in steps of `merge_pages` once the queue has been empty
    # this long (state/sqlite/compaction.py); None: never.
    merge_idle_s: float | None = 0.5
    merge_pages: int = 32
