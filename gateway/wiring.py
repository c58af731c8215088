"""Config -> objects: the agent, the reset policies, the router's settings, the store's
settings and the topology (one daemon's sessions.json index, or a replica's shared route
table and lease coordinator). The only module of gateway/ that chooses by backend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway import adapters as registry
from gateway.agent.base import Agent
from gateway.agent.echo import EchoAgent
from gateway.config import Config
from gateway.index import SessionIndex
from gateway.pairing import PairingRules
from gateway.pipeline.backlog import DeliveryRules
from gateway.reset.policy import PolicySet, ResetPolicy, merge
from gateway.services import AccessRules, RouterSettings
from gateway.session_keys import KeySettings
from gateway.topology.coordinator import LocalCoordinator
from gateway.topology.local import LocalTopology
from gateway.vocab import ResetMode
from state import Store

if TYPE_CHECKING:
    from gateway.topology.replicated import ReplicatedTopology

REPLICATED = "postgres"  # the backend whose store several replicas share


def replicated(backend: str | None) -> bool:
    """Does this backend's store serve replicas (routes and leases in the database, no
    sessions.json), rather than one daemon?"""
    return backend == REPLICATED


def home_marker(config: Config) -> str:
    """The file whose absence means a new home: state.db for SQLite; a PostgreSQL home
    keeps only the lock file."""
    return "switchboard.lock" if replicated(config.state.backend) else "state.db"


def store_settings(config: Config) -> dict[str, Any]:
    """open_store's settings: the config's `state` section, with the DSN it resolved."""
    state = asdict(config.state)
    if config.secret("state.dsn_env"):  # postgres: the DSN the config resolved
        state["dsn"] = config.secret("state.dsn_env")
    return state


async def open_topology(
    config: Config, home: Path, db: Store
) -> LocalTopology | ReplicatedTopology:
    """Where the daemon's keys are worked on: one daemon's sessions.json index and
    in-process locks, or on PostgreSQL a replica's cluster membership, shared route table
    and lease coordinator."""
    if not replicated(db.backend):
        return LocalTopology(
            db,
            SessionIndex(
                home / "sessions" / "sessions.json",
                db,
                config.sessions.index_flush_seconds,
                config.sessions.index_activity_seconds,
                settle_on_close=True,  # a clean stop leaves the file current
            ),
            LocalCoordinator(),
        )
    return await _join_cluster(config, db)


async def _join_cluster(config: Config, db: Store) -> ReplicatedTopology:
    """PostgreSQL: this daemon is one replica of possibly several (gateway/topology/cluster.py):
    its control connection, the shared route table, the lease coordinator."""
    from gateway.topology.cluster import PgCoordinator
    from gateway.topology.replicated import ReplicatedTopology
    from gateway.topology.routes import PgRouteIndex
    from state import ClusterStore, default_replica_name

    assert isinstance(db, ClusterStore)
    link = db.control_link(config.cluster.replica_id or default_replica_name())

    async def all_routes() -> list[dict[str, Any]]:
        return await db.routes(link.space)

    routes = PgRouteIndex(all_routes)
    coordinator = PgCoordinator(db, link, routes)
    await coordinator.start()
    return ReplicatedTopology(coordinator)


def build_agent(config: Config) -> Agent:
    if config.agent.backend == "openai":
        from gateway.agent.openai import OpenAIAgent

        o = config.agent.openai
        return OpenAIAgent(
            o.base_url,
            o.model,
            config.secret("agent.openai.api_key_env"),
            timeout_s=o.timeout_seconds,
            max_retries=o.max_retries,
            tools=list(o.tools),
            reply_tokens=config.agent.reply_tokens,
        )
    return EchoAgent()


def _changed_keys(
    old: Any, new: Any, prefix: str = "", ignore: set[str] | None = None
) -> list[str]:
    """Dotted keys whose values differ, skipping `ignore` (and everything under them)."""
    skip = ignore or set()
    if prefix in skip:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            out += _changed_keys(
                old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key), skip
            )
        return out
    return [] if old == new else [prefix]


RELOADABLE = ("logging.level", "access", "session_reset")  # what SIGHUP applies live, with:
RELOADABLE_PLATFORM_KEYS = ("allowed_users", "allow_all_users", "admins")


def restart_keys(old: Any, new: Any) -> list[str]:
    """The dotted keys that differ between two validated configs (`Config.data`) and that a
    reload cannot apply: they take effect at the next start."""
    live = set(RELOADABLE) | {
        f"platforms.{p}.{k}" for p in (*registry.names(), "api") for k in RELOADABLE_PLATFORM_KEYS
    }
    return _changed_keys(old, new, ignore=live)


def reset_policies(config: Config) -> PolicySet:
    r = config.session_reset
    base = ResetPolicy(
        mode=ResetMode(r.mode),  # validated as one of them by the config
        idle_minutes=r.idle_minutes,
        at_hour=r.at_hour,
        timezone=r.timezone,
        notify=r.notify,
    )
    return PolicySet(
        default=base,
        by_platform={k: merge(base, dict(v)) for k, v in r.by_platform.items()},
        by_chat_type={k: merge(base, dict(v)) for k, v in r.by_chat_type.items()},
    )


def router_settings(config: Config) -> RouterSettings:
    access = {"api": AccessRules(allow_all=True)}
    for name, p in config.platforms.items():
        access[name] = AccessRules(
            allow_all=p.allow_all_users,
            allowed=frozenset(str(u) for u in p.allowed_users),
            admins=frozenset(str(u) for u in p.admins),
        )
    return RouterSettings(
        keys=KeySettings(
            group_sessions_per_user=config.sessions.group_sessions_per_user,
            thread_sessions_per_user=config.sessions.thread_sessions_per_user,
        ),
        access=access,
        unknown_dm=config.access.unknown_dm,
        pairing=PairingRules(
            ttl_s=config.access.pairing.code_ttl_minutes * 60,
            user_interval_s=config.access.pairing.user_interval_minutes * 60,
            max_pending=config.access.pairing.max_pending,
        ),
        system_prompt=config.agent.system_prompt,
        history_messages=config.sessions.history_messages,
        context_tokens=config.agent.context_tokens,
        reply_tokens=config.agent.reply_tokens,
        turn_timeout_s=config.agent.turn_timeout_seconds,
        resend_unconfirmed=config.inbox.resend_unconfirmed_replies,
        auto_title=config.agent.auto_title,
    )


@dataclass(frozen=True)
class StoreCursors:
    """An adapter's stream positions, kept in the store's meta table under
    `cursor:<platform>:<name>` (gateway.adapters.base.Cursors)."""

    db: Store
    platform: str

    async def get(self, name: str) -> str | None:
        return await self.db.get_meta(f"cursor:{self.platform}:{name}")

    async def set(self, name: str, value: str) -> None:
        await self.db.set_meta(f"cursor:{self.platform}:{name}", value)


def delivery_rules(config: Config) -> DeliveryRules:
    """The `outbox:` section as the backlog's rules."""
    o = config.outbox
    return DeliveryRules(
        max_age_s=float(o.max_age_minutes) * 60,
        max_age_by_platform={p: float(m) * 60 for p, m in o.max_age_by_platform.items()},
        first_retry_s=float(o.first_retry_seconds),
        retry_cap_s=float(max(o.retry_seconds, o.first_retry_seconds)),
        sends_give_up_s=float(o.give_up_hours) * 3600,
        drain_per_second={p: float(r) for p, r in o.drain_per_second.items()},
    )
