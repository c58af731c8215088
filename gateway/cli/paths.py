"""Where a `switchboard` subcommand finds its home, config file (`--home`, `--config`) and
store, shared by gateway.cli and the subcommand modules it registers."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from state import Store


def home_of(args: argparse.Namespace) -> Path:
    if args.home:
        return Path(args.home).expanduser()
    from gateway.home import default_home

    return default_home()


def config_path_of(args: argparse.Namespace, home: Path) -> Path | None:
    if args.config:
        return Path(args.config).expanduser()
    candidate = home / "config.yaml"
    return candidate if candidate.exists() else None


def store_settings(args: argparse.Namespace, home: Path) -> dict[str, Any] | None:
    """open_store's settings when the home's config puts the store on PostgreSQL (the
    config is then validated in full: its DSN must be set), else None (state.db)."""
    from gateway.wiring import replicated, store_settings

    if not replicated(backend_of(args, home)):
        return None
    from gateway.config import load_config
    from gateway.ops.envfile import environment

    config = load_config(config_path_of(args, home), environment(home))
    return {**store_settings(config), "dsn": config.secret("state.dsn_env")}


async def open_configured(state: Mapping[str, Any] | None, db_path: Path) -> Store:
    """The store a terminal command works on: the one `state` (store_settings) names, else
    the SQLite file at `db_path` (the home's state.db)."""
    from state import SessionDB, open_store

    return await open_store(state, db_path.parent) if state else await SessionDB.open(db_path)


def configured_prices(args: argparse.Namespace, home: Path) -> dict[str, tuple[float, float]]:
    """`dashboard.prices` from the home's config file (none: no prices). Only that section
    is judged: a terminal command needs no platform secrets to show a cost."""
    from gateway.config import load_section
    from gateway.web.queries import prices_of

    return prices_of(load_section(config_path_of(args, home), "dashboard")["prices"])


def backend_of(args: argparse.Namespace, home: Path) -> str | None:
    """`state.backend` as the config file says it, without validating the rest."""
    import yaml

    path = config_path_of(args, home)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path else None
    except (OSError, yaml.YAMLError):
        return None
    state = data.get("state") if isinstance(data, dict) else None
    backend = state.get("backend") if isinstance(state, dict) else None
    return backend if isinstance(backend, str) else None
