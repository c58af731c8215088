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

from gateway.errors import ConfigError
from gateway.vocab import ResetMode

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


RESET_FIELDS: dict[str, Field] = {
    "mode": Field(str, "none", _one_of(*ResetMode)),
    "idle_minutes": Field(int, 1440, _range(1, 525_600)),
    "at_hour": Field(int, 4, _range(0, 23)),
    "timezone": Field(str, "UTC", _timezone),
    "notify": Field(bool, True),
}

PLATFORM_SCHEMA: dict[str, Field] = {
    "enabled": Field(bool, False),
    "token_env": Field((str, type(None)), None, _env_name, "env var holding the bot token"),
    "app_token_env": Field(
        (str, type(None)), None, _env_name, "Slack Socket Mode app token env var"
    ),
    "signing_secret_env": Field((str, type(None)), None, _env_name, "Slack signing secret env var"),
    "webhook_secret_env": Field(
        (str, type(None)), None, _env_name, "Telegram webhook secret env var"
    ),
    "allowed_users": Field(list, [], _str_list),
    "allow_all_users": Field(bool, False),
    "admins": Field(list, [], _str_list),
    "home_channel": Field((str, int, type(None)), None),
    "require_mention": Field(bool, True),
    "free_response_channels": Field(list, [], _str_list),
    "base_url": Field((str, type(None)), None),
    "mode": Field((str, type(None)), None, _one_of("polling", "webhook", "http", "socket")),
    "webhook_url": Field((str, type(None)), None),
    "gateway_url": Field((str, type(None)), None, doc="Discord gateway websocket (a proxy)"),
}

SCHEMA: dict[str, Any] = {
    "logging": {
        "level": Field(str, "info", _one_of("debug", "info", "warning", "error")),
        "format": Field(str, "text", _one_of("text", "json")),
    },
    "state": {
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
    "platforms": {
        "api": {
            "enabled": Field(bool, True),
            "host": Field(str, "127.0.0.1"),
            "port": Field(int, 8642, _range(0, 65535)),
            "key_env": Field(
                (str, type(None)), None, _env_name, "bearer key env var (required off loopback)"
            ),
        },
        **{name: dict(PLATFORM_SCHEMA) for name in PLATFORMS},
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


def _validate(raw: Any, schema: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(prefix or "config", "must be a mapping of keys to values")
    unknown = [k for k in raw if k not in schema]
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else str(unknown[0])
        raise ConfigError(key, f"unknown key (known here: {', '.join(schema)})")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(spec, dict):
            out[name] = _validate(raw.get(name), spec, path)
            continue
        value = raw.get(name, spec.default)
        kinds = spec.kind if isinstance(spec.kind, tuple) else (spec.kind,)
        if isinstance(value, bool) and bool not in kinds:
            raise ConfigError(path, f"must be {_type_name(spec.kind)}, not true/false")
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and float in kinds
            and int not in kinds
        ):
            value = float(value)
        if not isinstance(value, kinds):
            raise ConfigError(
                path, f"must be {_type_name(spec.kind)} (got {type(value).__name__} {value!r})"
            )
        if isinstance(value, str) and _PLACEHOLDER.match(value.strip()):
            raise ConfigError(
                path,
                f"{value!r} looks like a placeholder from config.example.yaml; set a real value",
            )
        if spec.check is not None and value is not None:
            problem = spec.check(value)
            if problem:
                raise ConfigError(path, problem)
        out[name] = list(value) if isinstance(value, list) else value
    return out


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _resolve_secrets(data: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    secrets: dict[str, str] = {}

    def need(key: str, var: str | None, why: str) -> None:
        if not var:
            raise ConfigError(key, f"is required ({why})")
        value = env.get(var, "")
        if not value.strip():
            raise ConfigError(key, f"{var} is not set ({why})")
        if _PLACEHOLDER.match(value.strip()):
            raise ConfigError(key, f"{var} holds a placeholder value; set the real secret")
        secrets[key] = value

    api = data["platforms"]["api"]
    if api["enabled"]:
        if api["key_env"]:
            need("platforms.api.key_env", api["key_env"], "the api bearer key")
        elif not _is_loopback(api["host"]):
            raise ConfigError(
                "platforms.api.key_env",
                f"a bearer key is required when listening on {api['host']} (not loopback)",
            )
    for name in PLATFORMS:
        p = data["platforms"][name]
        if p["mode"] is None:
            p["mode"] = {"telegram": "polling", "slack": "http"}.get(name)
        if not p["enabled"]:
            continue
        base = f"platforms.{name}"
        if name == "slack" and p["mode"] not in ("http", "socket"):
            raise ConfigError(f"{base}.mode", "must be http or socket for slack")
        if name == "slack" and p["mode"] == "http" and not data["platforms"]["api"]["enabled"]:
            raise ConfigError(
                f"{base}.enabled",
                "Slack's Events API is served by the api server: enable platforms.api",
            )
        if (
            name == "telegram"
            and p["mode"] == "webhook"
            and not data["platforms"]["api"]["enabled"]
        ):
            raise ConfigError(
                f"{base}.mode", "the webhook is served by the api server: enable platforms.api"
            )
        if name == "telegram" and p["mode"] not in ("polling", "webhook"):
            raise ConfigError(f"{base}.mode", "must be polling or webhook for telegram")
        default_env = {
            "telegram": "TELEGRAM_BOT_TOKEN",
            "discord": "DISCORD_BOT_TOKEN",
            "slack": "SLACK_BOT_TOKEN",
        }[name]
        need(f"{base}.token_env", p["token_env"] or default_env, f"the {name} bot token")
        if name == "slack":
            if p["mode"] == "socket":
                need(
                    f"{base}.app_token_env",
                    p["app_token_env"] or "SLACK_APP_TOKEN",
                    "Socket Mode app token",
                )
            else:
                need(
                    f"{base}.signing_secret_env",
                    p["signing_secret_env"] or "SLACK_SIGNING_SECRET",
                    "request signing",
                )
        if name == "telegram" and p["mode"] == "webhook":
            need(
                f"{base}.webhook_secret_env",
                p["webhook_secret_env"] or "TELEGRAM_WEBHOOK_SECRET",
                "webhook secret",
            )
            if not p["webhook_url"]:
                raise ConfigError(f"{base}.webhook_url", "is required in webhook mode")
        if not p["allow_all_users"] and not p["allowed_users"]:
            raise ConfigError(
                f"{base}.allowed_users", "is empty: list user ids, or set allow_all_users: true"
            )
    if data["agent"]["backend"] == "openai":
        o = data["agent"]["openai"]
        if o["api_key_env"]:
            need("agent.openai.api_key_env", o["api_key_env"], "the model provider's API key")
        unknown = [t for t in o["tools"] if t != "session_search"]
        if unknown:
            raise ConfigError(
                "agent.openai.tools", f"unknown tool {unknown[0]!r} (available: session_search)"
            )
    return secrets


def load_config(path: Path | None, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate; a missing file means the embedded defaults."""
    env = os.environ if env is None else env
    raw: Any = {}
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError("", f"{path}: config file not found") from None
        except OSError as exc:
            raise ConfigError("", f"{path}: cannot be read ({exc.strerror})") from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError("", f"{path}: not valid YAML{where}") from None
    data = _validate(raw, SCHEMA, "")
    _validate_reset_overrides(data["session_reset"])
    return Config(data=data, secrets=_resolve_secrets(data, env), path=path)


def _validate_reset_overrides(section: dict[str, Any]) -> None:
    """by_platform / by_chat_type: known names, each a partial policy checked like the default."""
    from gateway.session_keys import CHAT_TYPES

    known = {"by_platform": ("api", *PLATFORMS), "by_chat_type": CHAT_TYPES}
    for table, names in known.items():
        checked: dict[str, dict[str, Any]] = {}
        for name, override in section[table].items():
            key = f"session_reset.{table}.{name}"
            if name not in names:
                raise ConfigError(
                    key, f"unknown {table[3:].replace('_', ' ')} (known: {', '.join(names)})"
                )
            full = _validate(override, RESET_FIELDS, key)
            given = override or {}
            checked[str(name)] = {k: v for k, v in full.items() if k in given}
        section[table] = checked
