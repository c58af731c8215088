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
