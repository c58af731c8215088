"""Where a `switchboard` subcommand finds its home and config file (`--home`, `--config`),
shared by gateway.cli and the subcommand modules it registers."""

from __future__ import annotations

import argparse
from pathlib import Path


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


def refuse_postgres(args: argparse.Namespace, home: Path, command: str) -> None:
    """The terminal commands read the home's state.db; on a config that puts the store on
    PostgreSQL they would silently show (and create) an empty file instead. Only the
    `state.backend` value is read here, so a config with other problems changes nothing."""
    import yaml

    from gateway.errors import ConfigError

    path = config_path_of(args, home)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) if path else None
    except (OSError, yaml.YAMLError):
        return
    state = data.get("state") if isinstance(data, dict) else None
    if isinstance(state, dict) and state.get("backend") == "postgres":
        raise ConfigError(
            "state.backend",
            f"`switchboard {command}` works on the SQLite state.db only for now; "
            "this home's store is on PostgreSQL",
        )
