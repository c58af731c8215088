"""The daemon's lifecycle: start in order (home and lock, state, index, router, adapters),
stop in reverse (stop intake, drain turns within a budget, stop adapters, flush the index,
close the store)."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import adapters as registry
from gateway import event_loops
from gateway.adapters.base import (
    Adapter,
    Listens,
    Route,
    SupervisedStart,
    TurnHooks,
    Typing,
    UsesCursors,
    UsesShards,
)
from gateway.agent.base import Agent
from gateway.config import Config
from gateway.errors import GatewayError, NotAccepted, PortInUse
from gateway.handoff import HandoffWatcher
from gateway.home import HomeLock, version
from gateway.index import RouteIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.ops import heap
from gateway.ops.metrics import Metrics
from gateway.pipeline import Router
from gateway.reset import Resetter
from gateway.reset.scheduler import ResetScheduler
from gateway.services import Services
from gateway.vocab import AdapterState
from gateway.wiring import (
    StoreCursors,
    build_agent,
    home_marker,
    open_topology,
    reset_policies,
    restart_keys,
    router_settings,
    store_settings,
)
from state import StateError, Store, StoredReply, open_store

if TYPE_CHECKING:
    from gateway.cluster import PgCoordinator

log = logging.getLogger("gateway.app")
TAKEOVER_SCAN_S = 1.0  # replicas: how often inbox rows of dead replicas are looked for


@dataclass
class Gateway:
    config: Config
    home: Path
    agent: Agent | None = None
    adapters: list[Adapter] = field(default_factory=list)
    notify: Callable[[str], None] = lambda _state: None  # systemd notify hook
    db: Store | None = None
    router: Router | None = None
    metrics: Metrics = field(default_factory=Metrics)
    started_at: float = 0.0
    scheduler: ResetScheduler | None = None
    handoffs: HandoffWatcher | None = None
    index: RouteIndex | None = None
    cluster: PgCoordinator | None = None  # replicas: the lease coordinator
    _takeover: asyncio.Task[None] | None = None
    _outbox: asyncio.Task[None] | None = None  # one-off sends tried again (gateway._resend)
    _linger_ms: int | float = 0  # what _pace_commits last set
    _lock: HomeLock | None = None
    _started_with: Mapping[str, Any] | None = None  # the config data the daemon started with
    _adapters_by_platform: dict[str, Adapter] = field(default_factory=dict)
    _on_start: dict[str, Callable[[InboundMessage], None]] = field(default_factory=dict)
    _on_end: dict[str, Callable[[InboundMessage, str | None], None]] = field(default_factory=dict)
    _starts: dict[str, SupervisedStart] = field(default_factory=dict)  # platform adapters

    async def start(self) -> None:
        self.started_at = time.time()
        self._started_with = self.config.data
        fresh = not (self.home / home_marker(self.config)).exists()
        self.home.mkdir(parents=True, exist_ok=True)
        self._lock = HomeLock(self.home)
        self._lock.acquire()
        if fresh:
            log.info("created a new home at %s", self.home)
        try:
            await self._start_inner()
        except BaseException:
            await self.stop()
            raise

    async def _start_inner(self) -> None:
        self.notify("STATUS=opening state.db")
        self.db = await open_store(store_settings(self.config), self.home)
        topology = await open_topology(self.config, self.home, self.db)
        self.index, self.cluster = topology.index, topology.cluster
        coordinator = topology.cluster
        await self.index.load()
        agent = self.agent = self.agent or build_agent(self.config)
        policies = reset_policies(self.config)
        hook_timeout_s = self.config.session_reset.pre_reset_timeout_seconds

        def resetter(services: Services) -> Resetter:
            return Resetter(
                services, policies, hook=agent.before_reset, hook_timeout_s=hook_timeout_s
            )

        self.router = Router(
            self.db,
            self.index,
            agent,
            self._send,
            router_settings(self.config),
            self.metrics,
            events=self,
            resetter=resetter,
            topology=topology,
        )
        assert self.router.resetter is not None
        if coordinator is None:  # one daemon: its notices were in memory (replicas: routes)
            await self.router.resetter.restore_notices()
        self._register_gauges()
        prune = self.config.sessions.auto_prune
        db = self.db

        inbox_days = self.config.inbox.retention_days

        async def auto_prune() -> object:
            if not self._leads():
                return None
            # the inbox's bookkeeping always; sessions only when sessions.auto_prune is on
            forgotten = await db.prune_inbox(time.time() - inbox_days * 86400)
            if forgotten:
                log.info(
                    "forgot %d answered inbox row(s) older than %g days", forgotten, inbox_days
                )
            if not prune.enabled:
                return forgotten
            return await db.maybe_auto_prune_and_vacuum(
                prune.retention_days, prune.min_interval_hours, prune.vacuum_after_prune
            )

        resetter_ = self.router.resetter

        async def sweep() -> object:
            return await resetter_.apply() if self._leads() else 0

        self.scheduler = ResetScheduler(
            sweep,
            sweep_seconds=self.config.session_reset.sweep_seconds,
            daily=[(p.at_hour, p.timezone) for p in policies.all() if p.mode.daily],
            prune=auto_prune,
        )
        self.notify("STATUS=starting the scheduler")
        self.scheduler.start()
        if not self.adapters:
            self.adapters = self._default_adapters()
        self.notify("STATUS=starting adapters")
        # what the adapters hand over is committed at once; its turn waits for recovery
        await self.router.hold_until_recovered()
        for adapter in self.adapters:
            self._adapters_by_platform[adapter.platform] = adapter
            if isinstance(adapter, Typing):  # looked up once: no protocol check per message
                self._on_start[adapter.platform] = adapter.turn_started
            if isinstance(adapter, TurnHooks):
                self._on_end[adapter.platform] = adapter.turn_ended
            if isinstance(adapter, UsesCursors):
                adapter.use_cursors(StoreCursors(self.db, adapter.platform))
            if isinstance(adapter, UsesShards):
                ledger = topology.shards(adapter.platform)
                if ledger is not None:  # one replica's share of the connections
                    adapter.use_shards(ledger)
            if adapter.platform != "api":  # unreachable: retried; refused credentials: stopped
                start = SupervisedStart(adapter, self._credential_keys(adapter.platform))
                self._starts[adapter.platform] = start
                await start.start(self.router.handle)
                continue
            try:  # the daemon's own server: any failure ends the start
                await adapter.start(self.router.handle)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                where = (adapter.port, adapter.host) if isinstance(adapter, Listens) else ("?", "?")
                raise PortInUse(*where) from None
        self.handoffs = HandoffWatcher(
            self.router.services,
            self._adapters_by_platform,
            configured_homes={p: s.home_channel for p, s in self.config.platforms.items()},
        )
        self.handoffs.start()
        self._outbox = asyncio.create_task(self._resend(), name="gateway.outbox")
        self.notify("STATUS=recovering interrupted turns")
        await self.router.recover(self.config.inbox.recovery_max_age_seconds)
        if self.cluster is not None:
            self._takeover = asyncio.create_task(self._take_over(), name="gateway.takeover")
        log.info(
            "switchboard is running (home %s; adapters: %s)",
            self.home,
            ", ".join(a.platform for a in self.adapters) or "none",
        )

    def _credential_keys(self, platform: str) -> list[str]:
        """The config keys naming a platform's secrets (`platforms.telegram.token_env`)."""
        settings = self.config.platforms.get(platform)
        if settings is None or platform not in registry.names():
            return []
        needs = registry.adapter_class(platform).secrets_needed(settings)
        return [f"platforms.{platform}.{need.key}" for need in needs]

    def _leads(self) -> bool:
        """Leader-only work (the reset sweep, pruning) runs here: always with one daemon,
        on the holder of the leader lock among replicas."""
        return self.cluster is None or bool(self.cluster.leading)

    async def _take_over(self) -> None:
        """Every TAKEOVER_SCAN_S: run the inbox rows of replicas that are gone (the
        multi-process form of the start-up recovery)."""
        assert self.router is not None
        while True:
            await asyncio.sleep(TAKEOVER_SCAN_S)
            self._pace_commits()
            try:
                await self.router.recover(self.config.inbox.recovery_max_age_seconds)
            except Exception as exc:
                log.warning("takeover scan failed: %s", exc)

    def _pace_commits(self) -> None:
        """While other replicas are live, each commit of this one waits
        `cluster.commit_linger_ms` for more operations to join it: on one database the
        replicas' batches are each smaller than one daemon's, and fewer, fuller commits cost
        the replicas and the server less CPU per message (cluster_bench, docs/benchmarks.md).
        Alone, a replica commits what one pass of its loop gathered."""
        assert self.cluster is not None
        others = self.cluster.link.live > 1
        self._linger_ms = self.config.cluster.commit_linger_ms if others else 0
        self.db.linger(self._linger_ms / 1000)  # type: ignore[union-attr]

    def _default_adapters(self) -> list[Adapter]:
        """Platform adapters first, each built by its registered class from its section;
        the api server last, serving their webhook routes beside its own endpoints."""
        adapters: list[Adapter] = []
        routes: dict[str, Route] = {}
        for name, settings in self.config.platforms.items():
            if settings.enabled:
                adapter = registry.adapter_class(name).from_config(
                    settings, self.config.platform_secrets(name)
                )
                adapters.append(adapter)
                routes.update(adapter.routes())
        api = self.config.api
        if api.enabled:
            from gateway.adapters.api import ApiAdapter

            adapters.insert(
                0,
                ApiAdapter(
                    api.host,
                    api.port,
                    self.config.secret("platforms.api.key_env"),
                    reply_timeout_s=self.config.agent.turn_timeout_seconds + 30,
                    health=self.health,
                    metrics=self.metrics.render,
                    routes=routes,
                    models=(self.agent.model,) if self.agent and self.agent.model else (),
                    subapps=self._dashboard(),
                    stored_replies=self._stored_api_reply,
                    send_one=self.send_one,
                ),
            )
        return adapters

    async def send_one(self, platform: str, target: str | None, text: str) -> dict[str, Any]:
        """One message to a chat of a running adapter (`switchboard send` through the
        daemon): `target` is a chat id or chat_id:thread_id, None for the home channel. The
        message is stored in the outbox first; one the platform does not take now stays
        there and is sent again later (`outbox.retry_seconds`)."""
        from gateway.errors import ConfigError
        from gateway.handoff import home_channel
        from gateway.ops.send import home_target, split_target

        adapter = self._adapters_by_platform.get(platform)
        if adapter is None or platform == "api" or self.db is None:
            raise ConfigError(
                f"platforms.{platform}",
                "is not running on this daemon (not enabled in its config, or not a chat platform)",
            )
        if target is None:
            configured = self.config.platforms[platform].home_channel
            chat_id, thread_id = home_target(
                await home_channel(self.db, platform, configured), platform
            )
        else:
            chat_id, thread_id = split_target(platform, target)
        send_id = await self.db.send_add(platform, chat_id, thread_id, text, time.time())
        row = {
            "id": send_id,
            "platform": platform,
            "chat_id": chat_id,
            "thread_id": thread_id,
            "text": text,
        }
        return await self._attempt_send(row, raise_refusal=True)

    async def _attempt_send(self, row: dict[str, Any], *, raise_refusal: bool) -> dict[str, Any]:
        """One try of an outbox row: `sent`, `failed` (refused: raised when asked), or still
        `pending` when the platform could not be reached in time (tried again later)."""
        from gateway.errors import PlatformUnreachable
        from gateway.ops.send import deliver
        from state import SEND_FAILED as FAILED
        from state import SEND_PENDING as PENDING
        from state import SEND_SENT as SENT

        assert self.db is not None
        platform = row["platform"]
        adapter = self._adapters_by_platform.get(platform)
        msg = OutboundMessage(platform, row["chat_id"], row["text"], thread_id=row["thread_id"])
        answer = {
            "id": row["id"],
            "platform": platform,
            "chat_id": row["chat_id"],
            "message_ids": [],
            "state": PENDING,
        }
        try:
            if adapter is None:
                raise PlatformUnreachable(f"{platform} is not running on this daemon")
            sent = await deliver(adapter, msg, self.config.outbox.retry_seconds)
        except PlatformUnreachable as exc:
            await self.db.send_finish(row["id"], PENDING, str(exc), (), time.time())
            answer["error"] = str(exc)
            return answer
        except GatewayError as exc:
            await self.db.send_finish(row["id"], FAILED, str(exc), (), time.time())
            log.warning("outbox send %d to %s refused: %s", row["id"], platform, exc)
            if raise_refusal:
                raise
            return {**answer, "state": FAILED, "error": str(exc)}
        await self.db.send_finish(row["id"], SENT, None, sent.message_ids, time.time())
        self.metrics.messages_out.inc(platform=platform)
        return {**answer, "state": SENT, "message_ids": list(sent.message_ids)}

    async def _resend(self) -> None:
        """Every little while, on the leader: outbox rows whose last try is older than
        `outbox.retry_seconds` are tried again; past `outbox.give_up_hours`, failed."""
        from state import SEND_FAILED as FAILED

        assert self.db is not None
        every = self.config.outbox.retry_seconds
        while True:
            await asyncio.sleep(min(30.0, max(0.2, every / 4)))
            if not self._leads():
                continue
            try:
                now = time.time()
                for row in await self.db.sends_claim_due(now - every, now):
                    if now - row["created_at"] > self.config.outbox.give_up_hours * 3600:
                        await self.db.send_finish(
                            row["id"], FAILED, "gave up: not sent in outbox.give_up_hours", (), now
                        )
                        log.warning("outbox send %d to %s given up", row["id"], row["platform"])
                        continue
                    done = await self._attempt_send(row, raise_refusal=False)
                    log.info(
                        "outbox send %d to %s tried again: %s",
                        row["id"],
                        row["platform"],
                        done["state"],
                    )
            except Exception as exc:
                log.warning("outbox scan failed: %s", exc)

    async def _stored_api_reply(self, chat_id: str, key: str) -> StoredReply | None:
        """The HTTP API's idempotent repeats: the stored answer to a message id. A store
        that cannot be read is NotAccepted: the request is answered "send it again"."""
        if self.db is None:
            return None
        try:
            return await self.db.reply_to_platform_message("api", chat_id, key)
        except StateError as exc:
            raise NotAccepted(f"the store cannot be read: {exc}") from exc

    def _dashboard(self) -> dict[str, Any]:
        """The web dashboard's sub-apps (gateway/web), or none when it is off."""
        from gateway.web.app import Dashboard, settings_from

        settings = settings_from(self.config)
        if settings is None or self.db is None or self.index is None:
            return {}
        index = self.index
        return Dashboard(
            self.db,
            settings,
            health=self.health,
            live_ids=lambda: {e.session_id for _, e in index.items()},
            is_live=lambda sid: bool(index.keys_for_session(sid)),
        ).subapps()

    def _register_gauges(self) -> None:
        assert self.db is not None and self.index is not None and self.router is not None
        db, index, router = self.db, self.index, self.router
        self.metrics.gauge(
            "switchboard_writer_queue_depth",
            "Writes waiting for the writer",
            lambda: db.write_stats().queue_depth,
        )
        self.metrics.gauge(
            "switchboard_writer_last_batch_size",
            "Operations in the last commit",
            lambda: db.write_stats().last_batch_size,
        )
        self.metrics.gauge(
            "switchboard_writer_last_commit_ms",
            "Duration of the last commit",
            lambda: db.write_stats().last_commit_ms,
        )
        self.metrics.gauge(
            "switchboard_writer_batches_total",
            "Commits so far",
            lambda: db.write_stats().batches,
            kind="counter",
        )

        def quantile(values: Sequence[float], q: float) -> float:
            ordered = sorted(values[-512:])
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0

        self.metrics.gauge(
            "switchboard_writer_commit_ms_p50",
            "Median commit time, recent batches",
            lambda: quantile(db.write_stats().recent_commit_ms, 0.5),
        )
        self.metrics.gauge(
            "switchboard_writer_commit_ms_p99",
            "99th percentile commit time, recent batches",
            lambda: quantile(db.write_stats().recent_commit_ms, 0.99),
        )
        self.metrics.gauge(
            "switchboard_writer_batch_size_p50",
            "Median operations per commit, recent batches",
            lambda: quantile([float(b) for b in db.write_stats().recent_batch_sizes], 0.5),
        )
        self.metrics.gauge(
            "switchboard_sessions_live", "Entries in the session index", lambda: len(index)
        )
        self.metrics.gauge(
            "switchboard_turns_in_flight", "Turns running or queued", lambda: router.inflight
        )

    async def _send(self, msg: OutboundMessage) -> SentRef | None:
        adapter = self._adapters_by_platform.get(msg.platform)
        if adapter is None:
            log.error(
                "no adapter for platform %s; reply dropped (session_key=%s)",
                msg.platform,
                msg.session_key,
            )
            return None
        return await adapter.send(msg)

    # TurnEvents for the router: passed on to the message's adapter when it declares them
    # (Discord shows typing for a running turn; the api answers a dropped request at once)
    def turn_started(self, msg: InboundMessage) -> None:
        if (hook := self._on_start.get(msg.source.platform)) is not None:
            hook(msg)

    def turn_ended(self, msg: InboundMessage, dropped: str | None) -> None:
        if (hook := self._on_end.get(msg.source.platform)) is not None:
            hook(msg, dropped)

    def reload(self, new: Config) -> list[str]:
        """Apply what can change without a restart (allowlists, admins, the reset policy,
        the log level); return the keys that differ from what runs and need a restart.
        Those are compared with the values the daemon started with, not the last file
        read: a key changed and then changed back needs no restart."""
        old = self.config
        running = old.data if self._started_with is None else self._started_with
        needs_restart = restart_keys(running, new.data)
        if self.router is not None:
            self.router.settings = router_settings(new)
            if self.router.resetter is not None:
                self.router.resetter.policies = reset_policies(new)
            self.router.sessions.system_prompt = self.router.settings.system_prompt
        logging.getLogger().setLevel(new.logging.level.upper())
        self.config = replace(new, secrets=old.secrets)
        return needs_restart

    def health(self) -> dict[str, Any]:
        adapters = {
            a.platform: (self._starts[a.platform] if a.platform in self._starts else a).health()
            for a in self.adapters
        }
        ok = self.db is not None and all(
            h.get("state") == AdapterState.RUNNING for h in adapters.values()
        )
        return {
            "status": "ok" if ok else "degraded",
            "pid": os.getpid(),
            "version": version(),
            "uptime_seconds": round(time.time() - self.started_at, 1),
            "next_reset_sweep": self.scheduler.next_sweep() if self.scheduler else None,
            "event_loop": event_loops.running(),
            "adapters": adapters,
            "writer_queue_depth": self.db.write_stats().queue_depth if self.db else None,
            "sessions": len(self.index) if self.index else 0,
            "turns_in_flight": self.router.inflight if self.router else 0,
            "recovered_turns": {
                outcome: int(n)
                for (((_label, outcome),), n) in self.metrics.recovered.values.items()
            },
            "unsent_replies": int(self.metrics.unsent.total()),
            "failed_sends": int(self.metrics.errors.values.get((("kind", "send"),), 0)),
            "last_error": self.router.last_error if self.router else None,
            **self._replica_health(),
        }

    def _replica_health(self) -> dict[str, Any]:
        if self.cluster is None:
            return {}
        link = self.cluster.link
        return {
            "replica": {
                "name": link.name,
                "incarnation": link.incarnation,
                "leader": bool(link.leading),
                "live_replicas": link.live,
                "commit_linger_ms": self._linger_ms,
            }
        }

    async def stop(self) -> None:
        """Reverse order; safe to call on a partly started gateway."""
        self.notify("STOPPING=1")
        if self.handoffs is not None:
            await self.handoffs.stop()
            self.handoffs = None
        if self._takeover is not None:
            self._takeover.cancel()
            await asyncio.gather(self._takeover, return_exceptions=True)
            self._takeover = None
        if self._outbox is not None:
            self._outbox.cancel()
            await asyncio.gather(self._outbox, return_exceptions=True)
            self._outbox = None
        if self.scheduler is not None:
            await self.scheduler.stop(self.config.shutdown.drain_seconds)
            self.scheduler = None
        if self.router is not None:
            self.router.stop_intake()
            cancelled = await self.router.drain(self.config.shutdown.drain_seconds)
            if cancelled:
                self.metrics.errors.inc(cancelled, kind="cancelled_on_shutdown")
        for start in self._starts.values():  # no retry may start an adapter from here on
            await start.stop()
        for adapter in reversed(self.adapters):
            try:
                await adapter.stop()
            except Exception:
                log.exception("stopping the %s adapter failed", adapter.platform)
        if self.cluster is not None:  # after the drain: its turns freed their leases
            try:
                await self.cluster.close()
            except Exception:
                log.exception("leaving the cluster failed")
            self.cluster = None
        if self.index is not None:
            await self.index.close()
        if self.agent is not None:
            await self.agent.close()
        if self.db is not None:
            await self.db.close()
            self.db = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _reload_from_disk(gateway: Gateway) -> None:
    """SIGHUP: re-read the config file; a broken file is reported and ignored."""
    from gateway.config import load_config
    from gateway.errors import ConfigError
    from gateway.ops.envfile import environment

    gateway.notify("RELOADING=1")
    try:
        new = load_config(gateway.config.path, environment(gateway.home))
    except ConfigError as exc:
        log.error("reload refused, keeping the running configuration: %s", exc)
    else:
        restart = gateway.reload(new)
        log.info("configuration reloaded (allowlists, admins, reset policy, log level)")
        if restart:
            log.warning("these changes need a restart to take effect: %s", ", ".join(restart))
    gateway.notify("READY=1")


async def run_until_signalled(gateway: Gateway) -> None:
    """Start, tell systemd we are ready, ping its watchdog from the loop, wait for
    SIGTERM/SIGINT, drain, stop."""
    from gateway.ops.notify import watchdog, watchdog_interval

    heap.tune_interpreter()
    pauses = heap.Pauses()
    pauses.install()
    heap.watch(gateway.metrics, pauses)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload_from_disk, gateway)
    dog: asyncio.Task[None] | None = None
    try:
        await gateway.start()
        log.debug("collector settled: %d objects frozen", heap.settle())
        gateway.notify(
            f"READY=1\nSTATUS=running ({', '.join(a.platform for a in gateway.adapters)})"
        )
        interval = watchdog_interval()
        if interval is not None:
            dog = asyncio.create_task(watchdog(interval), name="systemd.watchdog")
        await stop.wait()
        log.info("signal received; draining")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if dog is not None:
            dog.cancel()
            await asyncio.gather(dog, return_exceptions=True)
        await gateway.stop()
        pauses.remove()
