"""Where a `switchboard` subcommand finds its home and config file (`--home`, `--config`),
shared by gateway.cli and the subcommand modules it registers."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def home_of(args: argparse.Namespace) -> Path:
    if args.home:
        return Path(args.home).expanduser()
    from gateway.app import default_home

    return default_home()


def config_path_of(args: argparse.Namespace, home: Path) -> Path | None:
    if args.config:
        return Path(args.config).expanduser()
    candidate = home / "config.yaml"
    return candidate if candidate.exists() else None


def store_settings(args: argparse.Namespace, home: Path) -> dict[str, Any] | None:
    """open_store's settings when the home's config puts the store on PostgreSQL (the
    config is then validated in full: its DSN must be set), else None (state.db)."""
    if _backend(args, home) != "postgres":
        return None
    from dataclasses import asdict

    from gateway.config import load_config

    config = load_config(config_path_of(args, home))
    return {**asdict(config.state), "dsn": config.secret("state.dsn_env")}


def _backend(args: argparse.Namespace, home: Path) -> str | None:
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
