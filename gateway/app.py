"""The daemon's lifecycle: start in order (home and lock, state, index, router, adapters),
stop in reverse (stop intake, drain turns within a budget, stop adapters, flush the index,
close the store), and a SIGHUP's reload. Its run loop is gateway/run.py; what it reports
(/health, the gauges) is gateway/health.py."""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import adapters as registry
from gateway.adapters.base import (
    Adapter,
    Listens,
    Route,
    SupervisedStart,
    TurnHooks,
    Typing,
    UsesCursors,
    UsesShards,
    end_retries,
)
from gateway.agent.base import Agent
from gateway.config import Config
from gateway.errors import NotAccepted, PortInUse
from gateway.handoff import HandoffWatcher
from gateway.health import health_report, register_gauges, replica_health
from gateway.home import HomeLock
from gateway.index import RouteIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef
from gateway.ops.metrics import Metrics
from gateway.ops.send import OneOffSends
from gateway.pipeline import Router
from gateway.pipeline.backlog import Backlog
from gateway.reset import Resetter
from gateway.reset.scheduler import ResetScheduler
from gateway.services import Services
from gateway.wiring import (
    StoreCursors,
    build_agent,
    delivery_rules,
    home_marker,
    open_topology,
    reset_policies,
    restart_keys,
    router_settings,
    store_settings,
)
from state import StateError, Store, StoredReply, open_store

if TYPE_CHECKING:
    from gateway.topology.cluster import PgCoordinator

log = logging.getLogger("gateway.app")
TAKEOVER_SCAN_S = 1.0  # replicas: how often inbox rows of dead replicas are looked for


@dataclass
class Gateway:
    config: Config
    home: Path
    agent: Agent | None = None
    adapters: list[Adapter] = field(default_factory=list)
    notify: Callable[[str], object] = lambda _state: None  # systemd notify hook
    db: Store | None = None
    router: Router | None = None
    metrics: Metrics = field(default_factory=Metrics)
    started_at: float = 0.0
    scheduler: ResetScheduler | None = None
    handoffs: HandoffWatcher | None = None
    index: RouteIndex | None = None
    cluster: PgCoordinator | None = None  # replicas: the lease coordinator
    _takeover: asyncio.Task[None] | None = None
    backlog: Backlog | None = None  # the outbox's undelivered replies and sends
    sends: OneOffSends | None = None
    _outbox: asyncio.Task[None] | None = None  # the scan of pending one-off sends
    _catch_up: asyncio.Task[None] | None = None  # rows other programs wrote, indexed late
    indexing_backlog: int | None = None  # how many of those still wait (None: not counted yet)
    _linger_ms: int | float = 0  # what _pace_commits last set
    _lock: HomeLock | None = None
    _started_with: Mapping[str, Any] | None = None  # the config data the daemon started with
    _adapters_by_platform: dict[str, Adapter] = field(default_factory=dict)
    _on_start: dict[str, Callable[[InboundMessage], None]] = field(default_factory=dict)
    _on_end: dict[str, Callable[[InboundMessage, str | None], None]] = field(default_factory=dict)
    _starts: dict[str, SupervisedStart] = field(default_factory=dict)  # platform adapters

    async def start(self) -> None:
        self.started_at = time.time()
        end_retries(False)
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
        # bounded: a backlog of rows other programs wrote is indexed once the daemon serves
        self.db = await open_store(store_settings(self.config), self.home, serving=True)
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
        self.backlog = Backlog(self.db, self._send, self.metrics, delivery_rules(self.config))
        await self.backlog.restore()
        self.router.services.replies.backlog = self.backlog
        self.sends = OneOffSends(
            self.db,
            self.backlog,
            self._adapters_by_platform,
            lambda: self.config,
            self.metrics,
            self._leads,
        )
        if coordinator is None:  # one daemon: its notices were in memory (replicas: routes)
            await self.router.resetter.restore_notices()
        register_gauges(self.metrics, self.db, self.index, self.router)
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
        self.notify("STATUS=recovering interrupted turns")
        await self.router.recover(self.config.inbox.recovery_max_age_seconds)
        # after the replies a stop left: a chat's held messages follow its held replies
        self._outbox = asyncio.create_task(
            self.sends.scan(alone=self.cluster is None), name="gateway.outbox"
        )
        if self.cluster is not None:
            self._takeover = asyncio.create_task(self._take_over(), name="gateway.takeover")
        self._catch_up = asyncio.create_task(self._index_backlog(), name="gateway.catch_up")
        log.info(
            "switchboard is running (home %s; adapters: %s)",
            self.home,
            ", ".join(a.platform for a in self.adapters) or "none",
        )

    async def _index_backlog(self) -> None:
        """Index what other programs wrote into the store and start-up left (write batches
        behind the turns' own writes); search and previews see those rows once it ends."""
        assert self.db is not None
        try:
            waited = await self.db.catch_up(self._backlog_left)
        except Exception as exc:  # the next write batches catch up all the same
            log.warning("indexing rows other programs wrote failed: %s", exc)
            return
        if waited:
            log.info("indexed %d row(s) other programs wrote into the store", waited)

    def _backlog_left(self, rows: int) -> None:
        self.indexing_backlog = rows

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
        self.cluster.store.linger(self._linger_ms / 1000)

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
        """`switchboard send` through the daemon (gateway.pipeline.sends)."""
        if self.sends is None:
            from gateway.errors import ConfigError

            raise ConfigError(f"platforms.{platform}", "is not running on this daemon")
        return await self.sends.send_one(platform, target, text)

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
        return health_report(
            adapters,
            db=self.db,
            index=self.index,
            router=self.router,
            scheduler=self.scheduler,
            metrics=self.metrics,
            started_at=self.started_at,
            replica=None if self.cluster is None else replica_health(self.cluster, self._linger_ms),
            outbox=self.backlog.health() if self.backlog else None,
            indexing_backlog=self.indexing_backlog,
        )

    async def stop(self) -> None:
        """Reverse order; safe to call on a partly started gateway."""
        try:
            await self._stop()
        finally:
            end_retries(False)  # only while this stop ran (other code in the process retries)

    async def _stop(self) -> None:
        self.notify("STOPPING=1")
        if self.handoffs is not None:
            await self.handoffs.stop()
            self.handoffs = None
        if self._takeover is not None:
            self._takeover.cancel()
            await asyncio.gather(self._takeover, return_exceptions=True)
            self._takeover = None
        for task in (self._outbox, self._catch_up):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._outbox = self._catch_up = None
        if self.scheduler is not None:
            await self.scheduler.stop(self.config.shutdown.drain_seconds)
            self.scheduler = None
        if self.router is not None:
            end_retries()  # a send waiting to retry ends unsent: the outbox keeps it
            self.router.stop_intake()
            cancelled = await self.router.drain(self.config.shutdown.drain_seconds)
            if cancelled:
                self.metrics.errors.inc(cancelled, kind="cancelled_on_shutdown")
        if self.backlog is not None:  # what it holds stays in the store for the next start
            await self.backlog.stop(self.config.shutdown.drain_seconds)
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
