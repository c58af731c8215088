"""Configuration: YAML in, a validated frozen `Config` out.

Every key is declared once, on a field of a section dataclass (the core ones here, each
platform's by its adapter), with its type, default and check, so errors name the key path
(`platforms.telegram.token_env: TELEGRAM_BOT_TOKEN is not set`), unknown keys are refused,
and placeholder values copied from config.example.yaml are caught. Secrets are
never in the file: it names environment variables that hold them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gateway import adapters, event_loops
from gateway.adapters.base import ReplicaLimits
from gateway.errors import ConfigError, ConfigErrors
from gateway.sections import (
    Check,
    Field,
    PlatformSettings,
    Schema,
    build,
    env_name,
    in_range,
    one_of,
    schema_of,
    section,
    setting,
)
from gateway.vocab import ResetMode
from gateway.yamlfile import parse as parse  # re-exported: `config set` and the wizard parse
from gateway.yamlfile import read as _read
from state.api import BACKENDS as STORE_BACKENDS

_PLACEHOLDER = re.compile(
    r"^(<.*>|changeme|change[-_ ]?me|your[-_ ].*|xxx+|todo|replace[-_ ]?me|placeholder|\.\.\.)$",
    re.I,
)


def _timezone(v: Any) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {v!r} (use an IANA name such as Europe/Berlin)"
    return None


def _prices(v: Any) -> str | None:
    for model, price in v.items():
        if not isinstance(price, Mapping) or set(price) - {"input", "output"}:
            return f"{model}: must be {{input: <USD per 1M tokens>, output: <USD per 1M tokens>}}"
        for side in ("input", "output"):
            n = price.get(side, 0)
            if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
                return f"{model}.{side}: must be a number of USD per million tokens, 0 or more"
    return None


@dataclass(frozen=True)
class LoggingSettings:
    level: str = setting("info", one_of("debug", "info", "warning", "error"))
    format: str = setting("text", one_of("text", "json"))


@dataclass(frozen=True)
class StateSettings:
    backend: str = setting("sqlite", one_of(*STORE_BACKENDS), "which store holds sessions")
    synchronous: str = setting("NORMAL", one_of("OFF", "NORMAL", "FULL", "EXTRA"))
    queue_size: int = setting(10_000, in_range(10, 1_000_000))
    commit_linger_ms: int | float = setting(1, in_range(0, 50), "a busy SQLite commit's wait")
    dsn_env: str = setting("SWITCHBOARD_PG_DSN", env_name, "env var holding the PostgreSQL DSN")


def _replica_id(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip() or len(v) > 100 or not v.isprintable():
        return f"must be 1 to 100 printable characters (got {v!r})"
    return None


@dataclass(frozen=True)
class ClusterSettings:
    replicas: int = setting(
        1, in_range(1, 1000), "how many replicas share the store (more than one: postgres)"
    )
    replica_id: str | None = setting(None, _replica_id, "this replica's name (host-pid)")
    commit_linger_ms: int | float = setting(2, in_range(0, 50), "a commit's wait beside others")


@dataclass(frozen=True)
class AutoPruneSettings:
    enabled: bool = setting(False)
    retention_days: int | float = setting(90, in_range(1, 36500))
    min_interval_hours: int | float = setting(24, in_range(1, 8760))
    vacuum_after_prune: bool = setting(True)


@dataclass(frozen=True)
class SessionsSettings:
    group_sessions_per_user: bool = setting(True)
    thread_sessions_per_user: bool = setting(False)
    index_flush_seconds: int | float = setting(2.0, in_range(0.05, 300))
    index_activity_seconds: int | float = setting(30.0, in_range(0.05, 3600))
    history_messages: int = setting(200, in_range(1, 100_000))
    auto_prune: AutoPruneSettings = section(AutoPruneSettings)


@dataclass(frozen=True)
class OpenAISettings:
    base_url: str = setting("https://api.openai.com/v1")
    model: str = setting("gpt-4o-mini")
    api_key_env: str | None = setting("OPENAI_API_KEY", env_name)
    timeout_seconds: int | float = setting(120, in_range(1, 3600))
    max_retries: int = setting(3, in_range(0, 20))
    tools: tuple[str, ...] = setting(("session_search",))


@dataclass(frozen=True)
class AgentSettings:
    backend: str = setting("echo", one_of("echo", "openai"))
    system_prompt: str = setting("You are a helpful assistant.")
    context_tokens: int = setting(128_000, in_range(256, 10_000_000))
    reply_tokens: int = setting(4_096, in_range(16, 1_000_000))
    turn_timeout_seconds: int | float = setting(300, in_range(1, 3600))
    auto_title: bool = setting(True)  # a title from the agent after a session's first exchange
    openai: OpenAISettings = section(OpenAISettings)


@dataclass(frozen=True)
class PairingSettings:
    code_ttl_minutes: int | float = setting(60, in_range(1, 10_080), "how long a code works")
    user_interval_minutes: int | float = setting(
        60, in_range(0, 10_080), "no new code for one user sooner than this after the last"
    )
    max_pending: int = setting(10, in_range(1, 10_000), "codes pending at once per platform")


@dataclass(frozen=True)
class AccessSettings:
    unknown_dm: str = setting("refuse", one_of("refuse", "ignore", "pair"))
    pairing: PairingSettings = section(PairingSettings)


@dataclass(frozen=True)
class DisplaySettings:
    resume_display: str = setting("full", one_of("full", "minimal"))


@dataclass(frozen=True)
class ResetFields:
    """One reset policy; also the shape of each by_platform / by_chat_type override."""

    mode: str = setting(ResetMode.NONE.value, one_of(*ResetMode))
    idle_minutes: int = setting(1440, in_range(1, 525_600))
    at_hour: int = setting(4, in_range(0, 23))
    timezone: str = setting("UTC", _timezone)
    notify: bool = setting(True)


@dataclass(frozen=True)
class ResetSettings(ResetFields):
    sweep_seconds: int | float = setting(60, in_range(1, 3600))
    pre_reset_timeout_seconds: int | float = setting(10, in_range(0, 600))
    # platform or chat type -> the keys of ResetFields it overrides
    by_platform: Mapping[str, Mapping[str, Any]] = setting({})
    by_chat_type: Mapping[str, Mapping[str, Any]] = setting({})


@dataclass(frozen=True)
class ShutdownSettings:
    drain_seconds: int | float = setting(10, in_range(0, 600))


@dataclass(frozen=True)
class RuntimeSettings:
    event_loop: str = setting(
        "auto",
        one_of("auto", "uvloop", "asyncio"),
        "the daemon's event loop: uvloop where installed, else asyncio",
    )


@dataclass(frozen=True)
class InboxSettings:
    recovery_max_age_seconds: int | float = setting(3600, in_range(0, 30 * 86400))
    retention_days: int | float = setting(7, in_range(1, 3650))
    resend_unconfirmed_replies: bool = setting(False)


def _directory(v: Any) -> str | None:
    if v is None or (isinstance(v, str) and v.strip() and "\0" not in v):
        return None
    return f"must be a directory path or null (got {v!r})"


@dataclass(frozen=True)
class BackupSettings:
    directory: str | None = setting(
        None, _directory, "where `switchboard backup` writes and `doctor` looks"
    )
    keep: int = setting(7, in_range(1, 100_000), "archives kept in the directory")
    max_age_hours: int | float = setting(
        26, in_range(1, 87_600), "doctor fails when the newest backup is older"
    )


def _per_platform(unit: str, hi: float) -> Check:
    def check(v: Any) -> str | None:
        bad = [p for p, n in v.items() if type(n) not in (int, float) or not 0 < n <= hi]
        return f"{bad[0]}: must be {unit} between 0 and {hi:g}" if bad else None

    return check


@dataclass(frozen=True)
class OutboxSettings:
    retry_seconds: int | float = setting(60, in_range(1, 3600), "the longest wait between tries")
    first_retry_seconds: int | float = setting(2, in_range(0.01, 3600), "doubled up to the above")
    max_age_minutes: int | float = setting(60, in_range(0.01, 43_200), "then a reply expires")
    max_age_by_platform: Mapping[str, int | float] = setting({}, _per_platform("minutes", 43_200))
    give_up_hours: int | float = setting(24, in_range(0.01, 720), "then a one-off send expires")
    drain_per_second: Mapping[str, int | float] = setting({}, _per_platform("messages/s", 1e4))


@dataclass(frozen=True)
class DashboardSettings:
    enabled: bool = setting(True)
    key_env: str | None = setting(None, env_name, "sign-in key env var")
    session_hours: int | float = setting(12, in_range(0.1, 8760))
    secure_cookie: bool = setting(False)
    # model -> {input, output}: USD per million tokens
    prices: Mapping[str, Mapping[str, float]] = setting(
        {}, _prices, "USD per million tokens by model"
    )


@dataclass(frozen=True)
class ApiSettings:
    enabled: bool = setting(True)
    host: str = setting("127.0.0.1")
    port: int = setting(8642, in_range(0, 65535))
    key_env: str | None = setting(None, env_name, "bearer key env var (required off loopback)")


RESET_FIELDS = schema_of(ResetFields)


def _at(path: str) -> Any:
    """A typed section of Config, read from the validated mapping at `path`."""
    return field(init=False, repr=False, compare=False, metadata={"path": path})


@dataclass(frozen=True)
class Config:
    """The validated configuration: typed frozen sections (`config.agent.model`...,
    `config.platforms[name]` from each adapter's declaration), the same values as nested
    mappings in `data` (what reload compares), and the resolved secrets."""

    data: Mapping[str, Any]
    secrets: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None
    logging: LoggingSettings = _at("logging")
    state: StateSettings = _at("state")
    cluster: ClusterSettings = _at("cluster")
    sessions: SessionsSettings = _at("sessions")
    agent: AgentSettings = _at("agent")
    access: AccessSettings = _at("access")
    display: DisplaySettings = _at("display")
    session_reset: ResetSettings = _at("session_reset")
    shutdown: ShutdownSettings = _at("shutdown")
    runtime: RuntimeSettings = _at("runtime")
    inbox: InboxSettings = _at("inbox")
    backup: BackupSettings = _at("backup")
    outbox: OutboxSettings = _at("outbox")
    dashboard: DashboardSettings = _at("dashboard")
    api: ApiSettings = _at("platforms.api")
    platforms: Mapping[str, PlatformSettings] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, kind, path in _sections():
            node: Any = self.data
            for part in path.split("."):
                node = node[part]
            object.__setattr__(self, name, build(kind, node))
        chats = {
            name: build(adapters.adapter_class(name).settings, self.data["platforms"][name])
            for name in adapters.names()
            if name in self.data["platforms"]
        }
        object.__setattr__(self, "platforms", chats)

    def get(self, dotted: str) -> Any:
        """A value of `data` by dotted path (for tools and tests; code reads the sections)."""
        node: Any = self.data
        for part in dotted.split("."):
            node = node[part]
        return node

    def platform(self, name: str) -> Mapping[str, Any]:
        return self.data["platforms"][name]

    def secret(self, key: str) -> str | None:
        return self.secrets.get(key)

    def platform_secrets(self, name: str) -> dict[str, str]:
        """A platform's resolved secrets by their `*_env` key."""
        prefix = f"platforms.{name}."
        return {k[len(prefix) :]: v for k, v in self.secrets.items() if k.startswith(prefix)}


@cache
def _sections() -> list[tuple[str, type, str]]:
    """(attribute, section class, dotted path) for Config's typed core sections."""
    hints = typing.get_type_hints(Config)
    return [
        (f.name, hints[f.name], f.metadata["path"])
        for f in dataclasses.fields(Config)
        if "path" in f.metadata
    ]


def schema() -> Schema:
    """The whole schema: the core sections, then `platforms` (the api server and every
    registered adapter's section)."""
    out: Schema = {}
    for _name, kind, path in _sections():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            child = node.setdefault(part, {})
            assert isinstance(child, dict)
            node = child
        node[leaf] = schema_of(kind)
    platforms = out.setdefault("platforms", {})
    assert isinstance(platforms, dict)
    for name in adapters.names():
        platforms[name] = schema_of(adapters.adapter_class(name).settings)
    return out


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {
        bool: "true/false",
        int: "a whole number",
        float: "a number",
        str: "a string",
        list: "a list",
        type(None): "null",
    }
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _validate(
    raw: Any, schema: Mapping[str, Any], prefix: str, errors: list[ConfigError]
) -> dict[str, Any]:
    """The section with defaults filled in. Each problem is appended to `errors` and the
    key keeps its default, so one pass finds every problem."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        errors.append(ConfigError(prefix or "config", "must be a mapping of keys to values"))
        raw = {}
    for unknown in (k for k in raw if k not in schema):
        key = f"{prefix}.{unknown}" if prefix else str(unknown)
        errors.append(ConfigError(key, f"unknown key (known here: {', '.join(schema)})"))
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(spec, dict):
            out[name] = _validate(raw.get(name), spec, path, errors)
            continue
        value = raw.get(name, spec.default)
        problem = _check_value(value, spec)
        if problem:
            errors.append(ConfigError(path, problem))
            value = spec.default
        elif isinstance(value, int) and not isinstance(value, bool):
            kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
            if float in kinds and int not in kinds:
                value = float(value)
        out[name] = list(value) if isinstance(value, list) else value
    return out


def _check_value(value: Any, spec: Field) -> str | None:
    kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
    if isinstance(value, bool) and bool not in kinds:
        return f"must be {_type_name(spec.kind)}, not true/false"
    numeric = isinstance(value, int) and not isinstance(value, bool) and float in kinds
    if not isinstance(value, kinds) and not numeric:
        return f"must be {_type_name(spec.kind)} (got {type(value).__name__} {value!r})"
    if isinstance(value, str) and _PLACEHOLDER.match(value.strip()):
        return f"{value!r} looks like a placeholder from config.example.yaml; set a real value"
    if spec.check is not None and value is not None:
        return spec.check(value)
    return None


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resolve_secrets(
    data: Mapping[str, Any], env: Mapping[str, str], errors: list[ConfigError]
) -> dict[str, str]:
    """The secrets the enabled parts need, read from the environment; every problem with
    them (or with how the platforms are combined) is appended to `errors`."""
    secrets: dict[str, str] = {}

    def need(key: str, var: str | None, why: str) -> None:
        if not var:
            errors.append(ConfigError(key, f"is required ({why})"))
            return
        value = env.get(var, "")
        if not value.strip():
            errors.append(ConfigError(key, f"{var} is not set ({why})"))
        elif _PLACEHOLDER.match(value.strip()):
            errors.append(ConfigError(key, f"{var} holds a placeholder value; set the real secret"))
        else:
            secrets[key] = value

    api = data["platforms"]["api"]
    if api["enabled"]:
        if api["key_env"]:
            need("platforms.api.key_env", api["key_env"], "the api bearer key")
        elif not _is_loopback(api["host"]):
            errors.append(
                ConfigError(
                    "platforms.api.key_env",
                    f"a bearer key is required when listening on {api['host']} (not loopback)",
                )
            )
    dash = data["dashboard"]
    if api["enabled"] and dash["enabled"] and dash["key_env"]:
        need("dashboard.key_env", dash["key_env"], "the dashboard sign-in key")
    for name in adapters.names():
        cls = adapters.adapter_class(name)
        settings = build(cls.settings, data["platforms"][name])
        if settings.enabled:
            errors.extend(cls.problems(settings, data["platforms"]["api"]["enabled"]))
            if data["access"]["unknown_dm"] != "pair":  # pairing fills the allowlist
                errors.extend(_allowlist_problems(name, settings))
            for want in cls.secrets_needed(settings):
                need(
                    f"platforms.{name}.{want.key}",
                    getattr(settings, want.key, None) or want.default_env,
                    want.why,
                )
    if data["cluster"]["replicas"] > 1:
        errors.extend(_replica_problems(data))
    if data["runtime"]["event_loop"] == "uvloop" and not event_loops.has_uvloop():
        errors.append(
            ConfigError(
                "runtime.event_loop",
                "uvloop is not installed here "
                "(pip install uvloop; it has no Windows build), or say auto",
            )
        )
    if data["state"]["backend"] == "postgres":
        found = _postgres_problems(data["state"]["dsn_env"], env)
        errors.extend(found)
        if not found:
            secrets["state.dsn_env"] = env[data["state"]["dsn_env"]]
    if data["agent"]["backend"] == "openai":
        o = data["agent"]["openai"]
        if o["api_key_env"]:
            need("agent.openai.api_key_env", o["api_key_env"], "the model provider's API key")
        unknown = [t for t in o["tools"] if t != "session_search"]
        if unknown:
            errors.append(
                ConfigError(
                    "agent.openai.tools", f"unknown tool {unknown[0]!r} (available: session_search)"
                )
            )
    return secrets


def _postgres_problems(var: str, env: Mapping[str, str]) -> list[ConfigError]:
    """`state.backend: postgres` needs psycopg and a DSN that parses (not a connection:
    `switchboard doctor` and start-up report an unreachable server)."""
    from state.api import check_postgres

    problem = check_postgres(env.get(var, ""), var)
    return [ConfigError(problem.key, problem.problem)] if problem else []


def _replica_problems(data: Mapping[str, Any]) -> list[ConfigError]:
    """Several replicas need the shared store, and every enabled platform must be able to
    take its messages on any replica (an adapter declares `replica_problems` when a mode of
    it cannot: one poller per bot, say)."""
    out = []
    n = data["cluster"]["replicas"]
    if data["state"]["backend"] != "postgres":
        out.append(
            ConfigError(
                "cluster.replicas",
                f"{n} replicas need state.backend: postgres (one shared database)",
            )
        )
    for name in adapters.names():
        cls = adapters.adapter_class(name)
        settings = build(cls.settings, data["platforms"][name])
        if settings.enabled and issubclass(cls, ReplicaLimits):
            out.extend(cls.replica_problems(settings, n))
    return out


def _allowlist_problems(name: str, settings: PlatformSettings) -> list[ConfigError]:
    if not settings.allow_all_users and not settings.allowed_users:
        return [
            ConfigError(
                f"platforms.{name}.allowed_users",
                "is empty: list user ids, set allow_all_users: true, or let users pair "
                "(access.unknown_dm: pair)",
            )
        ]
    return []


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate; a missing file means the embedded defaults. Every problem found
    is reported at once (a ConfigErrors when there are several)."""
    env = os.environ if env is None else env
    data, secrets, errors = check(_read(path), env)
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return Config(data=data, secrets=secrets, path=path)


def check(
    raw: Any, env: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str], list[ConfigError]]:
    """What load_config decides, without raising: the values with defaults filled in, the
    secrets resolved from `env`, and every problem found (`switchboard config set` compares
    the problems before and after an edit)."""
    errors: list[ConfigError] = []
    data = _validate(raw, schema(), "", errors)
    _validate_reset_overrides(data["session_reset"], errors)
    secrets = _resolve_secrets(data, env, errors)
    return data, secrets, errors


def check_value(value: Any, spec: Field) -> str | None:
    """One value's problem against its schema field (its type, placeholders, its check)."""
    return _check_value(value, spec)


def load_section(path: Path | None, section: str) -> Mapping[str, Any]:
    """One section of the config file, validated with its defaults filled in, for a
    terminal command that needs neither the secrets nor the rest (`sessions stats` reads
    `dashboard.prices`). A problem in that section raises as in load_config."""
    errors: list[ConfigError] = []
    data = _validate(_read(path), schema(), "", errors)
    errors = [e for e in errors if e.key == section or e.key.startswith(f"{section}.")]
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    found: Mapping[str, Any] = data[section]
    return found


def _validate_reset_overrides(section: dict[str, Any], errors: list[ConfigError]) -> None:
    """by_platform / by_chat_type: known names, each a partial policy checked like the default."""
    from gateway.session_keys import CHAT_TYPES

    known = {"by_platform": ("api", *adapters.names()), "by_chat_type": CHAT_TYPES}
    for table, names in known.items():
        checked: dict[str, dict[str, Any]] = {}
        for name, override in section[table].items():
            key = f"session_reset.{table}.{name}"
            if name not in names:
                errors.append(
                    ConfigError(
                        key, f"unknown {table[3:].replace('_', ' ')} (known: {', '.join(names)})"
                    )
                )
                continue
            full = _validate(override, RESET_FIELDS, key, errors)
            given = override or {}
            checked[str(name)] = {k: v for k, v in full.items() if k in given}
        section[table] = checked
