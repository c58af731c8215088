"""`switchboard`: the command line. Each subcommand is a thin shell over library calls that
turns a GatewayError (or a StateError) into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from gateway.errors import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, GatewayError
from state import StateError

log = logging.getLogger("gateway.cli")


def _home(args: argparse.Namespace) -> Path:
    if args.home:
        return Path(args.home).expanduser()
    from gateway.app import default_home

    return default_home()


def _config_path(args: argparse.Namespace, home: Path) -> Path | None:
    if args.config:
        return Path(args.config).expanduser()
    candidate = home / "config.yaml"
    return candidate if candidate.exists() else None


def cmd_run(args: argparse.Namespace) -> int:
    from gateway.app import Gateway, run_until_signalled
    from gateway.config import load_config
    from gateway.logs import setup_logging

    home = _home(args)
    config = load_config(_config_path(args, home))
    setup_logging("debug" if args.debug else config.get("logging.level"), config.get("logging.format"),
                  config.secrets.values())  # fmt: skip
    asyncio.run(run_until_signalled(Gateway(config=config, home=home)))
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    from gateway.config import load_config

    home = _home(args)
    path = _config_path(args, home)
    load_config(path)
    print(f"config ok: {path or '(embedded defaults)'}")
    return EXIT_OK


def cmd_later(args: argparse.Namespace) -> int:
    print(f"switchboard {args.command}: not available in this version yet", file=sys.stderr)
    return EXIT_USAGE


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="A gateway daemon for AI agents on chat platforms."
    )
    parser.add_argument(
        "--home", help="home directory (default $SWITCHBOARD_HOME or ~/.switchboard)"
    )
    parser.add_argument("--config", help="config file (default <home>/config.yaml if present)")
    parser.add_argument("--debug", action="store_true", help="debug logging and full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the daemon")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check-config", help="validate the configuration and exit")
    p.set_defaults(func=cmd_check_config)
    for name, help_ in (("chat", "talk to the agent from the terminal"), ("sessions", "list, search and manage sessions"),
                        ("doctor", "check the installation")):  # fmt: skip
        p = sub.add_parser(name, help=help_)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=cmd_later)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"switchboard: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (GatewayError, StateError) as exc:
        if args.debug:
            raise
        print(f"switchboard: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_FAILURE)
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
