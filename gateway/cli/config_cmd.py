"""`switchboard config get | set | unset | path`: one key of config.yaml at a time, checked
against the schema before anything is written, comments and layout kept; the running
daemon is told to reload, and the command says whether the change applies live or waits
for a restart."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.errors import EXIT_OK, ConfigError

HELP = """\
Keys are dotted paths of the config schema (config.example.yaml documents each one):
  switchboard config get platforms.api.port
  switchboard config set platforms.<platform>.allowed_users "[12345, 67890]"
  switchboard config set session_reset.mode idle
  switchboard config unset logging.level
Values are read as YAML, the way the daemon reads the file: true/false, numbers, null,
[a, b] for a list; a key that takes text keeps what you typed.
Exit 0 when done, 78 (naming the key) for a key not in the schema, a value of the wrong
type, or an edit that would make the config invalid (nothing is written then)."""


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "config",
        "read or change one key of config.yaml",
        description="Read or change one key of config.yaml; the running daemon "
        "reloads after a change.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sp = p.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    g = add_command(sp, "get", "print a key's value (the default when the file omits it)")
    g.add_argument("key", metavar="KEY", help="a dotted key, e.g. platforms.api.port")
    g.add_argument("--json", action="store_true", help="print the value as JSON")
    g.set_defaults(func=cmd_get)
    s = add_command(
        sp,
        "set",
        "set a key, validate the whole config, write it, reload",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("key", metavar="KEY", help="a dotted key, e.g. platforms.api.enabled")
    s.add_argument("value", metavar="VALUE", help="the value, read as YAML (true, 42, [a, b])")
    s.set_defaults(func=cmd_set)
    u = add_command(sp, "unset", "remove a key from the file (its default applies again)")
    u.add_argument("key", metavar="KEY", help="a dotted key")
    u.set_defaults(func=cmd_unset)
    add_command(sp, "path", "print the config file's path").set_defaults(func=cmd_path)


def target(args: argparse.Namespace) -> tuple[Path, Path]:
    """The home and the config file a command edits (`--config`, else <home>/config.yaml,
    which `set` creates when missing)."""
    from gateway.cli.paths import home_of

    home = home_of(args)
    path = Path(args.config).expanduser() if args.config else home / "config.yaml"
    return home, path


def cmd_path(args: argparse.Namespace) -> int:
    _home, path = target(args)
    print(path.absolute())
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    from gateway.ops import envfile
    from gateway.ops.config_edit import Document, problems_of, resolve, show, value_at

    home, path = target(args)
    key = resolve(args.key)
    doc = Document(path)
    data, _errors = problems_of(doc.text, path, envfile.environment(home))
    found, value = value_at(data, key.parts)
    if not found:  # an entry of a mapping-valued key that the file does not name
        raise ConfigError(key.dotted, "is not set (and has no default)")
    print(json.dumps(value) if args.json else show(value))
    return EXIT_OK


def cmd_set(args: argparse.Namespace) -> int:
    from gateway.ops.config_edit import Document, parse_value, resolve

    home, path = target(args)
    key = resolve(args.key)
    if key.spec is None:
        example = next(iter(key.section or {}), "KEY")
        raise ConfigError(
            key.dotted, f"is a section; set its keys one at a time (e.g. {key.dotted}.{example})"
        )
    value = parse_value(key, args.value)
    doc = Document(path)
    doc.set(key.parts, value)
    return _finish(home, doc, key.parts)


def cmd_unset(args: argparse.Namespace) -> int:
    from gateway.ops.config_edit import Document, resolve

    home, path = target(args)
    key = resolve(args.key)
    doc = Document(path)
    if not doc.unset(key.parts):
        print(f"{key.dotted} is not set in {path}; nothing to do")
        return EXIT_OK
    return _finish(home, doc, key.parts)


def _finish(home: Path, doc: Any, parts: tuple[str, ...]) -> int:
    from gateway.ops import envfile
    from gateway.ops.config_edit import commit, show, value_at
    from gateway.wiring import restart_keys

    dotted = ".".join(parts)
    outcome = commit(doc, envfile.environment(home))
    _, old = value_at(outcome.before, parts)
    _, new = value_at(outcome.after, parts)
    if not outcome.changed:
        print(f"{dotted} is already {show(new)}; {doc.path} is unchanged")
        return EXIT_OK
    print(f"{dotted}: {show(old)} -> {show(new)}")
    print(f"wrote {doc.path}")
    for problem in outcome.remaining:  # there before this edit; the edit is not refused for them
        print(f"switchboard: note: the config still has a problem: {problem}", file=sys.stderr)
    _tell_daemon(home, restart_keys(outcome.before, outcome.after))
    return EXIT_OK


def _tell_daemon(home: Path, restart: list[str]) -> None:
    from gateway.ops.daemon import running_pid, signal_reload

    pid = running_pid(home)
    if pid is None or not signal_reload(pid):
        print(f"no daemon is running on {home}; the change applies when it starts")
        return
    if restart:
        print(
            f"the daemon (pid {pid}) was told to reload, but {', '.join(restart)} only "
            "takes effect at a restart (systemctl restart switchboard, or stop and start "
            "switchboard run)"
        )
    else:
        print(f"the daemon (pid {pid}) reloads its config now: the change applies live")
