"""`switchboard login PLATFORM`: log a platform's bot in from the terminal, for a platform
whose adapter declares the Login capability (a QR code to scan, say). What the login yields
goes where `switchboard setup` puts it: each secret into the home's secrets file
(`<home>/switchboard.env`, mode 600) under the variable its `*_env` key names, the other
keys into config.yaml (comments and unrelated keys kept)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

from gateway.errors import EXIT_OK, ConfigError

DEFAULT_TIMEOUT_S = 480.0


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "login",
        "log a platform's bot in from the terminal (a QR code to scan)",
        description="Log a platform's bot in from the terminal, for platforms that log in "
        "that way (see its guide): the secrets it yields go to <home>/switchboard.env "
        "(mode 600) under the variables the *_env keys name, its settings to config.yaml. "
        "Exit 0 when logged in, 69 when the platform cannot be reached, 77 when it refused "
        "or the time ran out, 78 for a platform that has no terminal login.",
    )
    p.add_argument("platform", metavar="PLATFORM", help="the platform to log in")
    p.add_argument(
        "--base-url",
        metavar="URL",
        help="the platform's API to log in at (default: the section's base_url)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up after this long (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    p.set_defaults(func=cmd_login)


def cmd_login(args: argparse.Namespace) -> int:
    from gateway import adapters
    from gateway.adapters.base import Login
    from gateway.cli.config_cmd import target
    from gateway.ops import envfile
    from gateway.ops.config_edit import Document, commit, problems_of
    from gateway.sections import build, schema_of

    name = args.platform
    if name not in adapters.names():
        raise ConfigError(
            f"platforms.{name}", f"unknown platform {name!r} (known: {', '.join(adapters.names())})"
        )
    cls = adapters.adapter_class(name)
    if not issubclass(cls, Login):
        raise ConfigError(
            f"platforms.{name}",
            f"{name} has no terminal login: its credentials come from its console "
            "(switchboard setup asks for them)",
        )
    home, path = target(args)
    doc = Document(path)
    data, _ = problems_of(doc.text, path, envfile.environment(home))
    section = data.get("platforms", {}).get(name)
    if not isinstance(section, dict):  # a section the config could not read: its defaults
        section = {k: v.default for k, v in schema_of(cls.settings).items()}  # type: ignore[union-attr]
    settings = build(cls.settings, section)
    got = asyncio.run(cls.login(settings, args.base_url, args.timeout, sys.stdout))
    needs = {n.key: n.default_env for n in cls.secrets_needed(settings)}
    variables = {str(section.get(key) or needs[key]): value for key, value in got.secrets.items()}
    envfile.write(envfile.path_of(home), variables)
    print(f"wrote {envfile.path_of(home)} (mode 600): {', '.join(sorted(variables))}")
    changed = {k: v for k, v in got.settings.items() if section.get(k) != v}
    for key, value in changed.items():
        doc.set(("platforms", name, key), value)
    if changed:
        commit(doc, envfile.environment(home))
        shown = ", ".join(f"platforms.{name}.{k} = {v}" for k, v in changed.items())
        print(f"wrote {path}: {shown}")
    for note in got.notes:
        print(note)
    if not section.get("enabled"):
        print(f"next: switchboard config set platforms.{name}.enabled true")
    print("a running daemon reads the new credentials when it is restarted")
    return EXIT_OK
