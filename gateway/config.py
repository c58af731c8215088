"""Configuration: YAML in, a validated frozen `Config` out.

Every key is declared once in SCHEMA with its type, default and check, so errors name the
key path (`platforms.telegram.token_env: TELEGRAM_BOT_TOKEN is not set`), unknown keys are
refused, and placeholder values copied from config.example.yaml are caught. Secrets are
never in the file: it names environment variables that hold them.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError, ConfigErrors
from gateway.vocab import ResetMode
from state.api import BACKENDS as STORE_BACKENDS

PLATFORMS = ("telegram", "discord", "slack")
_PLACEHOLDER = re.compile(
    r"^(<.*>|changeme|change[-_ ]?me|your[-_ ].*|xxx+|todo|replace[-_ ]?me|placeholder|\.\.\.)$",
    re.I,
)


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...]
    default: Any
    check: Callable[[Any], str | None] | None = None
    doc: str = ""


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)} (got {v!r})"


def _range(lo: float, hi: float) -> Callable[[Any], str | None]:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi} (got {v})"


def _env_name(v: Any) -> str | None:
    if v is None:
        return None
    return (
        None
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
        else f"must be an environment variable name (got {v!r})"
    )


def _str_list(v: Any) -> str | None:
    if not all(isinstance(x, (str, int)) for x in v):
        return "must be a list of ids (strings or numbers)"
    return None


def _timezone(v: Any) -> str | None:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(v)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {v!r} (use an IANA name such as Europe/Berlin)"
    return None


def _home_channel(v: Any) -> str | None:
    parts = str(v).split(":")
    if len(parts) > 2 or not all(part.strip() for part in parts):
        return f"must be a chat id or chat_id:thread_id (got {v!r})"


def _prices(v: Any) -> str | None:
    for model, price in v.items():
        if not isinstance(price, Mapping) or set(price) - {"input", "output"}:
            return f"{model}: must be {{input: <USD per 1M tokens>, output: <USD per 1M tokens>}}"
        for side in ("input", "output"):
            n = price.get(side, 0)
            if isinstance(n, bool) or not isinstance(n, (int, float)) or n < 0:
                return f"{model}.{side}: must be a number of USD per million tokens, 0 or more"
    return None


RESET_FIELDS: dict[str, Field] = {
    "mode": Field(str, "none", _one_of(*ResetMode)),
    "idle_minutes": Field(int, 1440, _range(1, 525_600)),
    "at_hour": Field(int, 4, _range(0, 23)),
    "timezone": Field(str, "UTC", _timezone),
    "notify": Field(bool, True),
}

_PLATFORM_COMMON: dict[str, Field] = {
    "enabled": Field(bool, False),
    "token_env": Field((str, type(None)), None, _env_name, "env var holding the bot token"),
    "allowed_users": Field(list, [], _str_list),
    "allow_all_users": Field(bool, False),
    "admins": Field(list, [], _str_list),
    "home_channel": Field(
        (str, int, type(None)), None, _home_channel, "handoff target unless /sethome names one"
    ),
    "require_mention": Field(bool, True),
    "base_url": Field((str, type(None)), None),
}


def _mode(platform: str, *modes: str) -> Field:
    choices = " or ".join(modes)
    return Field(
        (str, type(None)),
        None,
        lambda v: None if v in modes else f"must be {choices} for {platform} (got {v!r})",
    )


# Each platform accepts only the keys its adapter reads.
PLATFORM_SCHEMAS: dict[str, dict[str, Field]] = {
    "telegram": {
        **_PLATFORM_COMMON,
        "mode": _mode("telegram", "polling", "webhook"),
        "webhook_url": Field((str, type(None)), None),
        "webhook_secret_env": Field(
            (str, type(None)), None, _env_name, "Telegram webhook secret env var"
        ),
    },
    "discord": {
        **_PLATFORM_COMMON,
        "free_response_channels": Field(list, [], _str_list),
        "gateway_url": Field((str, type(None)), None, doc="Discord gateway websocket (a proxy)"),
    },
    "slack": {
        **_PLATFORM_COMMON,
        "mode": _mode("slack", "http", "socket"),
        "signing_secret_env": Field(
            (str, type(None)), None, _env_name, "Slack signing secret env var"
        ),
        "app_token_env": Field(
            (str, type(None)), None, _env_name, "Slack Socket Mode app token env var"
        ),
    },
}

SCHEMA: dict[str, Any] = {
    "logging": {
        "level": Field(str, "info", _one_of("debug", "info", "warning", "error")),
        "format": Field(str, "text", _one_of("text", "json")),
    },
    "state": {
        "backend": Field(str, "sqlite", _one_of(*STORE_BACKENDS), "which store holds sessions"),
        "synchronous": Field(str, "NORMAL", _one_of("OFF", "NORMAL", "FULL", "EXTRA")),
        "queue_size": Field(int, 10_000, _range(10, 1_000_000)),
    },
    "sessions": {
        "group_sessions_per_user": Field(bool, True),
        "thread_sessions_per_user": Field(bool, False),
        "index_flush_seconds": Field((int, float), 2.0, _range(0.05, 300)),
        "index_activity_seconds": Field((int, float), 30.0, _range(0.05, 3600)),
        "history_messages": Field(int, 200, _range(1, 100_000)),
        "auto_prune": {
            "enabled": Field(bool, False),
            "retention_days": Field((int, float), 90, _range(1, 36500)),
            "min_interval_hours": Field((int, float), 24, _range(1, 8760)),
            "vacuum_after_prune": Field(bool, True),
        },
    },
    "agent": {
        "backend": Field(str, "echo", _one_of("echo", "openai")),
        "system_prompt": Field(str, "You are a helpful assistant."),
        "context_tokens": Field(int, 128_000, _range(256, 10_000_000)),
        "reply_tokens": Field(int, 4_096, _range(16, 1_000_000)),
        "turn_timeout_seconds": Field((int, float), 300, _range(1, 3600)),
        "openai": {
            "base_url": Field(str, "https://api.openai.com/v1"),
            "model": Field(str, "gpt-4o-mini"),
            "api_key_env": Field((str, type(None)), "OPENAI_API_KEY", _env_name),
            "timeout_seconds": Field((int, float), 120, _range(1, 3600)),
            "max_retries": Field(int, 3, _range(0, 20)),
            "tools": Field(list, ["session_search"]),
        },
    },
    "access": {
        "unknown_dm": Field(str, "refuse", _one_of("refuse", "ignore")),
    },
    "display": {
        "resume_display": Field(str, "full", _one_of("full", "minimal")),
    },
    "session_reset": {
        **{name: spec for name, spec in RESET_FIELDS.items()},
        "sweep_seconds": Field((int, float), 60, _range(1, 3600)),
        "pre_reset_timeout_seconds": Field((int, float), 10, _range(0, 600)),
        "by_platform": Field(dict, {}),
        "by_chat_type": Field(dict, {}),
    },
    "shutdown": {
        "drain_seconds": Field((int, float), 10, _range(0, 600)),
    },
    "dashboard": {
        "enabled": Field(bool, True),
        "key_env": Field((str, type(None)), None, _env_name, "sign-in key env var"),
        "session_hours": Field((int, float), 12, _range(0.1, 8760)),
        "secure_cookie": Field(bool, False),
        "prices": Field(dict, {}, _prices, "USD per million tokens by model"),
    },
    "platforms": {
        "api": {
            "enabled": Field(bool, True),
            "host": Field(str, "127.0.0.1"),
            "port": Field(int, 8642, _range(0, 65535)),
            "key_env": Field(
                (str, type(None)), None, _env_name, "bearer key env var (required off loopback)"
            ),
        },
        **{name: dict(PLATFORM_SCHEMAS[name]) for name in PLATFORMS},
    },
}


@dataclass(frozen=True)
class Config:
    """The validated configuration as nested dicts plus resolved secrets."""

    data: Mapping[str, Any]
    secrets: Mapping[str, str] = field(default_factory=dict)
    path: Path | None = None

    def get(self, dotted: str) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            node = node[part]
        return node

    def platform(self, name: str) -> Mapping[str, Any]:
        return self.data["platforms"][name]

    def secret(self, key: str) -> str | None:
        return self.secrets.get(key)


def _type_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {bool: "true/false", int: "a whole number", float: "a number", str: "a string",
             list: "a list", type(None): "null"}  # fmt: skip
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
            errors.append(ConfigError(
                "platforms.api.key_env",
                f"a bearer key is required when listening on {api['host']} (not loopback)",
            ))  # fmt: skip
    dash = data["dashboard"]
    if api["enabled"] and dash["enabled"] and dash["key_env"]:
        need("dashboard.key_env", dash["key_env"], "the dashboard sign-in key")
    for name in PLATFORMS:
        p = data["platforms"][name]
        if "mode" in p and p["mode"] is None:
            p["mode"] = {"telegram": "polling", "slack": "http"}[name]
        if p["enabled"]:
            errors.extend(_platform_problems(name, p, data["platforms"]["api"]["enabled"]))
            default_env = {"telegram": "TELEGRAM_BOT_TOKEN", "discord": "DISCORD_BOT_TOKEN",
                           "slack": "SLACK_BOT_TOKEN"}[name]  # fmt: skip
            base = f"platforms.{name}"
            need(f"{base}.token_env", p["token_env"] or default_env, f"the {name} bot token")
            if name == "slack" and p["mode"] == "socket":
                need(f"{base}.app_token_env", p["app_token_env"] or "SLACK_APP_TOKEN",
                     "Socket Mode app token")  # fmt: skip
            elif name == "slack":
                need(f"{base}.signing_secret_env",
                     p["signing_secret_env"] or "SLACK_SIGNING_SECRET", "request signing")  # fmt: skip
            if name == "telegram" and p["mode"] == "webhook":
                need(f"{base}.webhook_secret_env",
                     p["webhook_secret_env"] or "TELEGRAM_WEBHOOK_SECRET", "webhook secret")  # fmt: skip
    if data["agent"]["backend"] == "openai":
        o = data["agent"]["openai"]
        if o["api_key_env"]:
            need("agent.openai.api_key_env", o["api_key_env"], "the model provider's API key")
        unknown = [t for t in o["tools"] if t != "session_search"]
        if unknown:
            errors.append(ConfigError(
                "agent.openai.tools", f"unknown tool {unknown[0]!r} (available: session_search)"
            ))  # fmt: skip
    return secrets


def _platform_problems(name: str, p: Mapping[str, Any], api_enabled: bool) -> list[ConfigError]:
    """How an enabled platform's settings fit together (its secrets are checked apart)."""
    base = f"platforms.{name}"
    out = []
    if name == "slack" and p["mode"] == "http" and not api_enabled:
        out.append(ConfigError(
            f"{base}.enabled", "Slack's Events API is served by the api server: enable platforms.api"
        ))  # fmt: skip
    if name == "telegram" and p["mode"] == "webhook":
        if not api_enabled:
            out.append(ConfigError(
                f"{base}.mode", "the webhook is served by the api server: enable platforms.api"
            ))  # fmt: skip
        if not p["webhook_url"]:
            out.append(ConfigError(f"{base}.webhook_url", "is required in webhook mode"))
    if not p["allow_all_users"] and not p["allowed_users"]:
        out.append(ConfigError(
            f"{base}.allowed_users", "is empty: list user ids, or set allow_all_users: true"
        ))  # fmt: skip
    return out


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, which keeps the last of two equal keys without a word; the
    composed node tree is checked for duplicates before anything is constructed."""


def _duplicate_keys(node: yaml.Node | None, prefix: str) -> list[ConfigError]:
    found: list[ConfigError] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[object, int] = {}
        for key_node, value_node in node.value:
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            path = f"{prefix}.{name}" if prefix else str(name)
            line = key_node.start_mark.line + 1
            if name is not None and name != "<<":
                if name in first:
                    found.append(ConfigError(
                        path, f"duplicate key at line {line} (first at line {first[name]})"
                    ))  # fmt: skip
                else:
                    first[name] = line
            found.extend(_duplicate_keys(value_node, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found.extend(_duplicate_keys(item, f"{prefix}[{i}]"))
    return found


def _parse(text: str, path: Path) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        duplicates = _duplicate_keys(node, "")
        if duplicates:
            raise duplicates[0] if len(duplicates) == 1 else ConfigErrors(duplicates)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError("", f"{path}: not valid YAML{where}") from None
    finally:
        loader.dispose()


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate; a missing file means the embedded defaults. Every problem found
    is reported at once (a ConfigErrors when there are several)."""
    env = os.environ if env is None else env
    raw: Any = {}
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("", f"{path}: config file not found") from None
        except OSError as exc:
            raise ConfigError("", f"{path}: cannot be read ({exc.strerror})") from None
        raw = _parse(text, path)
    errors: list[ConfigError] = []
    data = _validate(raw, SCHEMA, "", errors)
    _validate_reset_overrides(data["session_reset"], errors)
    secrets = _resolve_secrets(data, env, errors)
    if errors:
        raise errors[0] if len(errors) == 1 else ConfigErrors(errors)
    return Config(data=data, secrets=secrets, path=path)


def _validate_reset_overrides(section: dict[str, Any], errors: list[ConfigError]) -> None:
    """by_platform / by_chat_type: known names, each a partial policy checked like the default."""
    from gateway.session_keys import CHAT_TYPES

    known = {"by_platform": ("api", *PLATFORMS), "by_chat_type": CHAT_TYPES}
    for table, names in known.items():
        checked: dict[str, dict[str, Any]] = {}
        for name, override in section[table].items():
            key = f"session_reset.{table}.{name}"
            if name not in names:
                errors.append(ConfigError(
                    key, f"unknown {table[3:].replace('_', ' ')} (known: {', '.join(names)})"
                ))  # fmt: skip
                continue
            full = _validate(override, RESET_FIELDS, key, errors)
            given = override or {}
            checked[str(name)] = {k: v for k, v in full.items() if k in given}
        section[table] = checked
