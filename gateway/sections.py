"""Config sections as frozen dataclasses: each key's type, default, check and doc are
declared once, on a field, and config.py derives the schema it validates from them. The
core sections live in config.py; each platform adapter declares its own by subclassing
`PlatformSettings`, so a new platform never edits the core.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Check = Callable[[Any], "str | None"]
S = TypeVar("S", bound="DataclassInstance")  # a section class: a dataclass


@dataclass(frozen=True)
class Field:
    """One key of the schema: the YAML types it accepts, its default and its check."""

    kind: type | tuple[type, ...]
    default: Any
    check: Check | None = None
    doc: str = ""
    env: str | None = None  # an `*_env` key: the variable read when the key is null


Schema = dict[str, "Field | Schema"]


def setting(
    default: Any, check: Check | None = None, doc: str = "", *, env: str | None = None
) -> Any:
    """A section field: its default (a tuple stands for a YAML list), check and doc."""
    meta = {"check": check, "doc": doc, "env": env}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def section(cls: type[S]) -> Any:
    """A nested section field, defaulting to the section's defaults."""
    return dataclasses.field(default_factory=cls)


def one_of(*choices: str) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)} (got {v!r})"


def in_range(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be between {lo} and {hi} (got {v})"


def env_name(v: Any) -> str | None:
    if v is None:
        return None
    return (
        None
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)
        else f"must be an environment variable name (got {v!r})"
    )


def id_list(v: Any) -> str | None:
    if not all(isinstance(x, (str, int)) for x in v):
        return "must be a list of ids (strings or numbers)"
    return None


def home_channel(v: Any) -> str | None:
    parts = str(v).split(":")
    if len(parts) > 2 or not all(part.strip() for part in parts):
        return f"must be a chat id or chat_id:thread_id (got {v!r})"
    return None


def platform_mode(platform: str, *modes: str) -> Check:
    choices = " or ".join(modes)
    return lambda v: None if v in modes else f"must be {choices} for {platform} (got {v!r})"


@dataclass(frozen=True)
class PlatformSettings:
    """The keys every chat platform accepts; an adapter's section subclasses this and
    adds its own (field order is the order `unknown key` errors list them in)."""

    enabled: bool = setting(False)
    token_env: str | None = setting(None, env_name, "env var holding the bot token")
    allowed_users: tuple[str | int, ...] = setting((), id_list)
    allow_all_users: bool = setting(False)
    admins: tuple[str | int, ...] = setting((), id_list)
    home_channel: str | int | None = setting(
        None, home_channel, "handoff target unless /sethome names one"
    )
    require_mention: bool = setting(True)
    base_url: str | None = setting(None)


@dataclass(frozen=True)
class SecretNeed:
    """A secret an enabled section needs: the `*_env` key naming it, the variable read
    when that key is null, and what it is for (both appear in the error when it is unset)."""

    key: str
    default_env: str
    why: str


def _plain(hint: Any) -> type:
    origin = typing.get_origin(hint) or hint
    if origin is tuple or origin is list:
        return list
    if origin is dict or origin is Mapping:
        return dict
    return typing.cast(type, origin)


def _kind(hint: Any) -> type | tuple[type, ...]:
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    kinds = tuple(_plain(a) for a in typing.get_args(hint)) if union else (_plain(hint),)
    return kinds[0] if len(kinds) == 1 else kinds


@cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def schema_of(cls: type) -> Schema:
    """The validation schema a section class declares (nested sections nest). Cached per
    class: callers only read it."""
    return _schema_of(cls)


@cache
def _schema_of(cls: Any) -> Schema:
    hints = _hints(cls)
    out: Schema = {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out[f.name] = schema_of(typing.cast(type, hint))
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: a section's field needs a default")
        if isinstance(default, tuple):
            default = list(default)
        out[f.name] = Field(
            _kind(hint),
            default,
            f.metadata.get("check"),
            f.metadata.get("doc", ""),
            f.metadata.get("env"),
        )
    return out


def build(cls: type[S], data: Mapping[str, Any]) -> S:
    """The frozen section from its validated mapping (lists become tuples)."""
    hints = _hints(typing.cast(Any, cls))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        value = data[f.name]
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            value = build(typing.cast(type, hint), value)
        elif isinstance(value, list):
            value = tuple(value)
        values[f.name] = value
    return cls(**values)
