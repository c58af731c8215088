"""`switchboard`: the command line. Each subcommand is a thin shell over library calls that
turns a GatewayError (or a StateError) into one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.cli.paths import config_path_of as _config_path
from gateway.cli.paths import home_of as _home
from gateway.errors import EXIT_CONFIG, EXIT_FAILURE, EXIT_OK, ConfigError, GatewayError
from state import StateError

log = logging.getLogger("gateway.cli")


def cmd_run(args: argparse.Namespace) -> int:
    from gateway import event_loops
    from gateway.app import Gateway
    from gateway.config import load_config
    from gateway.ops.logs import setup_logging
    from gateway.run import run_until_signalled

    home = _home(args)
    config = load_config(_config_path(args, home), _environment(home))
    setup_logging(
        "debug" if args.debug else config.logging.level,
        config.logging.format,
        config.secrets.values(),
    )
    from gateway.ops.notify import sd_notify

    event_loops.run(
        run_until_signalled(Gateway(config=config, home=home, notify=sd_notify)),
        config.runtime.event_loop,
    )
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    from gateway.config import load_config

    home = _home(args)
    path = _config_path(args, home)
    load_config(path, _environment(home))
    print(f"config ok: {path or '(embedded defaults)'}")
    return EXIT_OK


def cmd_service(args: argparse.Namespace) -> int:
    from gateway.config import load_config
    from gateway.ops.service import install

    home = _home(args)
    config_path = _config_path(args, home)
    config = load_config(config_path)  # refuse to install a unit for a config that cannot start
    path, hints = install(
        home=home,
        config=config_path,
        user=not args.system,
        drain_s=config.shutdown.drain_seconds,
        target=Path(args.output) if args.output else None,
    )
    print(f"wrote {path}\nnext:\n{hints}")
    return EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    from gateway.config import load_config
    from gateway.ops.doctor import as_json, exit_code, run_doctor

    home = _home(args)
    config, problem = None, None
    try:
        config = load_config(_config_path(args, home), _environment(home))
    except ConfigError as exc:
        problem = str(exc)
    checks = asyncio.run(
        run_doctor(
            home, config, problem, fix=args.fix, full=args.full, check_platforms=not args.offline
        )
    )
    print(as_json(checks) if args.json else "\n".join(c.line() for c in checks))
    return exit_code(checks)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from gateway.config import check, parse
    from gateway.ops.status import collect, exit_code, render

    home = _home(args).absolute()
    path = _config_path(args, home)
    try:
        raw = parse(path.read_text(encoding="utf-8"), path) if path else {}
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot be read ({exc.strerror})") from None
    data, secrets, problems = check(raw, _environment(home))
    report = asyncio.run(collect(home, data, secrets, [str(p) for p in problems]))
    print(json.dumps(report, indent=2) if args.json else render(report))
    return exit_code(report)


def cmd_sessions(args: argparse.Namespace) -> int:
    from gateway.cli.paths import store_settings
    from gateway.cli.sessions import run

    home = _home(args)
    return asyncio.run(run(args, home / "state.db", store_settings(args, home)))


def cmd_import(args: argparse.Namespace) -> int:
    from gateway.cli.hermes_import import hermes_db_file, run
    from gateway.cli.paths import store_settings
    from gateway.config import load_config

    home = _home(args)
    state = store_settings(args, home)
    config = load_config(_config_path(args, home), _environment(home))  # key settings
    return asyncio.run(run(args, home, hermes_db_file(args.from_hermes), config, state))


def cmd_chat(args: argparse.Namespace) -> int:
    from gateway.cli.chat import run_chat
    from gateway.cli.paths import store_settings
    from gateway.config import load_config

    home = _home(args)
    state = store_settings(args, home)
    config = load_config(_config_path(args, home), _environment(home))
    # the options the resume hint must repeat so that it reaches this same store
    given = ["--home", str(home.resolve())] if args.home else []  # no `.` or `..` left
    if args.config:
        given += ["--config", str(Path(args.config).expanduser().resolve())]
    return asyncio.run(
        run_chat(home, config, cont=args.cont, resume=args.resume, given=given, state=state)
    )


def _environment(home: Path) -> dict[str, str]:
    """The process's environment, and the home's secrets file for what it does not set."""
    from gateway.ops.envfile import environment

    return environment(home)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("switchboard")
    except PackageNotFoundError:
        return "unknown"


def global_options(*, suppress: bool) -> argparse.ArgumentParser:
    """--home, --config and --debug, accepted before the subcommand and after it. On a
    subcommand they default to SUPPRESS so an absent one keeps the value given before."""
    common = argparse.ArgumentParser(add_help=False)
    unset: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    common.add_argument(
        "--home", help="home directory (default $SWITCHBOARD_HOME or ~/.switchboard)", **unset
    )
    common.add_argument(
        "--config", help="config file (default <home>/config.yaml if present)", **unset
    )
    common.add_argument(
        "--debug", action="store_true", help="debug logging and full tracebacks", **unset
    )
    return common


def add_command(sub: Any, name: str, summary: str, **kwargs: Any) -> argparse.ArgumentParser:
    """A subcommand that takes the global options too; its summary is also its description."""
    return sub.add_parser(
        name,
        help=summary,
        description=kwargs.pop("description", summary),
        parents=[global_options(suppress=True)],
        **kwargs,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description="A gateway daemon for AI agents on chat platforms.",
        parents=[global_options(suppress=False)],
    )
    parser.add_argument("--version", action="version", version=f"switchboard {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = add_command(
        sub,
        "run",
        "run the daemon",
        description="Run the gateway daemon in the foreground until SIGTERM or "
        "SIGINT, then drain in-flight turns and stop. Exit 78 on a config error.",
    )
    p.set_defaults(func=cmd_run)
    p = add_command(
        sub,
        "check-config",
        "validate the configuration and exit",
        description="Load and validate the configuration (and the environment "
        "variables it names) without starting anything; exit 0 if it is valid, "
        "78 naming the key if not.",
    )
    p.set_defaults(func=cmd_check_config)
    p = add_command(sub, "service", "install a systemd unit for this installation")
    sp = p.add_subparsers(dest="service_command", required=True, metavar="COMMAND")
    inst = add_command(sp, "install", "write the unit and print the systemctl commands")
    scope = inst.add_mutually_exclusive_group()
    scope.add_argument(
        "--user", action="store_true", help="for the user manager (default; no root needed)"
    )
    scope.add_argument(
        "--system", action="store_true", help="for the system manager (/etc/systemd/system)"
    )
    inst.add_argument(
        "--output",
        metavar="FILE",
        help="write the unit to this file instead (its folder must exist)",
    )
    inst.set_defaults(func=cmd_service)
    p = add_command(sub, "doctor", "check the installation; exit 0 only when all is well")
    p.add_argument(
        "--fix", action="store_true", help="rebuild sessions.json, clear dangling lineage"
    )
    p.add_argument(
        "--full", action="store_true", help="full integrity_check instead of quick_check"
    )
    p.add_argument("--offline", action="store_true", help="do not contact the platforms")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=cmd_doctor)
    p = add_command(
        sub,
        "status",
        "the daemon, adapters, queues, sessions and store at a glance",
        description="One screen on this home: the daemon (pid, uptime, version; "
        "replica and leader on PostgreSQL), each adapter's state and last error, "
        "queue depths, live sessions and today's messages, the store's size and "
        "last backup, the next reset sweep. Works with the daemon down. Exit 0 "
        "when the daemon runs and is healthy, 1 when it runs degraded or cannot "
        "be asked, 3 when it is not running.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_status)
    from gateway.cli.sessions import add_parser as add_sessions

    add_sessions(sub, add_command).set_defaults(func=cmd_sessions)
    from gateway.cli.hermes_import import add_parser as add_import

    add_import(sub, add_command).set_defaults(func=cmd_import)
    from gateway.cli.setup import add_parser as add_setup

    add_setup(sub, add_command)
    from gateway.cli.send import add_parser as add_send

    add_send(sub, add_command)
    from gateway.cli.pairing import add_parser as add_pairing

    add_pairing(sub, add_command)
    from gateway.cli.config_cmd import add_parser as add_config

    add_config(sub, add_command)
    from gateway.cli.insights import add_parser as add_insights

    add_insights(sub, add_command)
    from gateway.cli.backup import add_parsers as add_backup

    add_backup(sub, add_command)
    from gateway.cli.login import add_parser as add_login

    add_login(sub, add_command)
    p = add_command(sub, "chat", "talk to the agent from the terminal")
    p.add_argument(
        "-c",
        "--continue",
        dest="cont",
        nargs="?",
        const=True,
        default=None,
        metavar="TITLE",
        help="continue the most recent terminal session (or that title's newest)",
    )
    p.add_argument("-r", "--resume", metavar="ID|PREFIX|TITLE", help="resume a session")
    p.set_defaults(func=cmd_chat)
    return parser


def _quiet_stdout() -> None:
    """The reader of stdout went away (`| head`): point stdout at /dev/null so the flush
    at exit does not raise a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout has no descriptor (captured in-process): nothing will flush to it
    finally:
        os.close(devnull)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        for problem in exc.all():
            print(f"switchboard: config error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    except (GatewayError, StateError) as exc:
        if args.debug:
            raise
        print(f"switchboard: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_FAILURE)
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
