"""What the running daemon reports about itself: the document /health answers (and
`switchboard status` reads), and the gauges /metrics adds to the counters (the writer's
queue and commits, the live sessions, the turns in flight)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway import event_loops
from gateway.home import version
from gateway.ops.metrics import Metrics
from gateway.vocab import AdapterState

if TYPE_CHECKING:
    from gateway.index import RouteIndex
    from gateway.pipeline import Router
    from gateway.reset.scheduler import ResetScheduler
    from gateway.topology.cluster import PgCoordinator
    from state import Store

RECENT_COMMITS = 512  # how many of the writer's latest commits the quantiles read


def health_report(
    adapters: Mapping[str, Mapping[str, object]],
    *,
    db: Store | None,
    index: RouteIndex | None,
    router: Router | None,
    scheduler: ResetScheduler | None,
    metrics: Metrics,
    started_at: float,
    replica: Mapping[str, Any] | None,
    outbox: Mapping[str, Any] | None = None,
    indexing_backlog: int | None = None,
) -> dict[str, Any]:
    """/health's document: `ok` while the store is open and every adapter runs, else
    `degraded`; `adapters` maps each platform to its adapter's (or its start's) health,
    `replica` is this replica's place among the others (absent on one daemon), `outbox` the
    replies and sends held per platform, `indexing_backlog` how many rows other programs
    wrote into the store still wait to be indexed for search and previews (None until
    counted after start-up)."""
    ok = db is not None and all(h.get("state") == AdapterState.RUNNING for h in adapters.values())
    return {
        "status": "ok" if ok else "degraded",
        "pid": os.getpid(),
        "version": version(),
        "uptime_seconds": round(time.time() - started_at, 1),
        "next_reset_sweep": scheduler.next_sweep() if scheduler else None,
        "event_loop": event_loops.running(),
        "adapters": dict(adapters),
        "writer_queue_depth": db.write_stats().queue_depth if db else None,
        "sessions": len(index) if index else 0,
        "turns_in_flight": router.inflight if router else 0,
        "recovered_turns": {
            outcome: int(n) for (((_label, outcome),), n) in metrics.recovered.values.items()
        },
        "unsent_replies": int(metrics.unsent.total()),
        "outbox": dict(outbox) if outbox is not None else None,
        "indexing_backlog": indexing_backlog,
        "failed_sends": int(metrics.errors.values.get((("kind", "send"),), 0)),
        "last_error": router.last_error if router else None,
        **({"replica": dict(replica)} if replica is not None else {}),
    }


def replica_health(cluster: PgCoordinator, commit_linger_ms: float) -> dict[str, Any]:
    """A replica's part of /health: its name and incarnation, whether it leads, how many
    replicas are live, and how long its commits wait for company."""
    link = cluster.link
    return {
        "name": link.name,
        "incarnation": link.incarnation,
        "leader": bool(link.leading),
        "live_replicas": link.live,
        "commit_linger_ms": commit_linger_ms,
    }


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values[-RECENT_COMMITS:])
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def register_gauges(metrics: Metrics, db: Store, index: RouteIndex, router: Router) -> None:
    """The gauges read when /metrics is scraped: the writer's figures from the store, the
    index's size and the router's turns in flight."""
    metrics.gauge(
        "switchboard_writer_queue_depth",
        "Writes waiting for the writer",
        lambda: db.write_stats().queue_depth,
    )
    metrics.gauge(
        "switchboard_writer_last_batch_size",
        "Operations in the last commit",
        lambda: db.write_stats().last_batch_size,
    )
    metrics.gauge(
        "switchboard_writer_last_commit_ms",
        "Duration of the last commit",
        lambda: db.write_stats().last_commit_ms,
    )
    metrics.gauge(
        "switchboard_writer_batches_total",
        "Commits so far",
        lambda: db.write_stats().batches,
        kind="counter",
    )
    metrics.gauge(
        "switchboard_writer_commit_ms_p50",
        "Median commit time, recent batches",
        lambda: _quantile(db.write_stats().recent_commit_ms, 0.5),
    )
    metrics.gauge(
        "switchboard_writer_commit_ms_p99",
        "99th percentile commit time, recent batches",
        lambda: _quantile(db.write_stats().recent_commit_ms, 0.99),
    )
    metrics.gauge(
        "switchboard_writer_batch_size_p50",
        "Median operations per commit, recent batches",
        lambda: _quantile([float(b) for b in db.write_stats().recent_batch_sizes], 0.5),
    )
    metrics.gauge("switchboard_sessions_live", "Entries in the session index", lambda: len(index))
    metrics.gauge("switchboard_turns_in_flight", "Turns running or queued", lambda: router.inflight)
