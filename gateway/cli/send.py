"""`switchboard send PLATFORM TARGET [TEXT]`: one message to a chat, for scripts, cron and
CI. Through the running daemon's `POST /v1/send` when one runs on the home (its adapter,
already connected, sends it), else directly through the platform's adapter opened for
sending only. Exit codes a script can rely on: 0 sent, 2 usage, 69 unreachable, 77 refused,
78 config."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.errors import (
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    GatewayError,
    NoHomeChannel,
    PlatformRefused,
    PlatformUnreachable,
)

EPILOG = """\
TARGET is a chat id as the platform writes it, chat_id:thread_id for a thread or forum
topic, or `home` for the platform's home channel (the chat that sent /sethome, else
platforms.<p>.home_channel). TEXT is read from stdin when it is omitted or `-`.

examples:
  switchboard send <platform> home "backup finished"
  df -h | switchboard send <platform> <chat id> -

exit codes:
  0   sent (or, with a daemon running, stored in its outbox and sent when the platform
      can be reached again: stdout says "queued")
  2   usage: no text, a target that is not a chat id there
  69  the platform (or the daemon) could not be reached in time: try again later
  77  the platform refused: its token, the chat, a permission; the same will fail again
  78  config: an unknown platform, one not enabled, its secret unset, no home channel"""


class UsageError(GatewayError):
    exit_code = EXIT_USAGE


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "send",
        "send one message to a chat (for scripts, cron and CI)",
        description="Send one message to a chat through the platform's adapter: "
        "through the running daemon when there is one, else directly.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "platform", metavar="PLATFORM", help="a platform name, as under platforms: in config.yaml"
    )
    p.add_argument(
        "target", metavar="TARGET", help="a chat id, chat_id:thread_id, or home (the home channel)"
    )
    p.add_argument(
        "text",
        metavar="TEXT",
        nargs="?",
        default="-",
        help="the message (default -: read it from stdin)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="give up (exit 69) after this long (default 60)",
    )
    p.add_argument(
        "--direct", action="store_true", help="send from this process even when a daemon runs"
    )
    p.set_defaults(func=cmd_send)


def cmd_send(args: argparse.Namespace) -> int:
    from gateway import adapters
    from gateway.cli.paths import config_path_of, home_of
    from gateway.config import load_config
    from gateway.ops.envfile import environment

    if args.timeout <= 0:
        raise UsageError("--timeout must be more than 0 seconds")
    home = home_of(args)
    platform = args.platform
    if platform not in adapters.names():
        raise ConfigError(
            f"platforms.{platform}",
            f"unknown platform {platform!r} (known: {', '.join(adapters.names())})",
        )
    text = sys.stdin.read() if args.text == "-" else args.text
    text = text.removesuffix("\n")
    if not text.strip():
        raise UsageError("nothing to send: the text is empty")
    target = None if args.target in ("home", "") else args.target
    config = load_config(config_path_of(args, home), environment(home))
    settings = config.platforms.get(platform)
    if settings is None or not settings.enabled:
        raise ConfigError(
            f"platforms.{platform}.enabled",
            "is false: enable the platform "
            f"(switchboard config set platforms.{platform}.enabled true)",
        )
    try:
        how, sent = asyncio.run(_send(home, config, platform, target, text, args))
    except NoHomeChannel as exc:
        raise ConfigError(f"platforms.{platform}.home_channel", str(exc)) from None
    if sent.get("sent") is False:  # the daemon stored it and tries again later
        print(
            f"queued for {platform} chat {sent.get('chat_id')} in the daemon's outbox (send "
            f"{sent.get('id')}): {platform} did not take it yet ({sent.get('error')}); "
            f"the daemon tries again every outbox.retry_seconds"
        )
        return EXIT_OK
    ids = ", ".join(sent.get("message_ids", [])) or "-"
    print(f"sent to {platform} chat {sent.get('chat_id')} (message {ids}) {how}")
    return EXIT_OK


async def _send(
    home: Path, config: Any, platform: str, target: str | None, text: str, args: argparse.Namespace
) -> tuple[str, dict[str, Any]]:
    from gateway.ops.daemon import running_pid
    from gateway.ops.status import health_url

    pid = None if args.direct else running_pid(home)
    url = health_url(config.data)
    if pid is not None and url is not None:
        sent = await _through_daemon(
            url, config.secret("platforms.api.key_env"), platform, target, text, args.timeout
        )
        return f"through the daemon (pid {pid})", sent
    return "directly", await _directly(home, config, platform, target, text, args.timeout)


async def _through_daemon(
    url: str, key: str | None, platform: str, target: str | None, text: str, timeout_s: float
) -> dict[str, Any]:
    import aiohttp

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"platform": platform, "target": target, "text": text}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
            async with http.post(f"{url}/v1/send", json=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
                status = resp.status
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise PlatformUnreachable(
            f"the daemon at {url} did not answer ({type(exc).__name__})"
        ) from None
    if status in (200, 202) and isinstance(answer, dict):
        return answer
    error = answer.get("error", {}) if isinstance(answer, dict) else {}
    message = str(error.get("message") or f"the daemon answered {status}")
    code = error.get("code")
    if code == "not_configured":
        raise ConfigError(f"platforms.{platform}", message)
    if code == "no_home_channel":
        raise ConfigError(f"platforms.{platform}.home_channel", message)
    if code == "platform_unreachable":
        raise PlatformUnreachable(message)
    if status == 400:
        raise UsageError(message)
    if status == 401:
        raise ConfigError("platforms.api.key_env", f"the daemon refused the key ({message})")
    raise PlatformRefused(message)


async def _directly(
    home: Path, config: Any, platform: str, target: str | None, text: str, timeout_s: float
) -> dict[str, Any]:
    from gateway import adapters
    from gateway.ops.send import home_target, send_direct, split_target

    if target is None:
        chat_id, thread_id = home_target(await _home_channel(home, config, platform), platform)
    else:
        chat_id, thread_id = split_target(platform, target)
    from gateway.adapters.base import UsesCursors
    from gateway.wiring import StoreCursors

    cls = adapters.adapter_class(platform)
    adapter = cls.from_config(config.platforms[platform], config.platform_secrets(platform))
    db = None
    if getattr(cls, "cursors_to_send", False) and isinstance(adapter, UsesCursors):
        db = await _existing_store(home, config)  # what it keeps per chat, to send with
        if db is not None:
            adapter.use_cursors(StoreCursors(db, platform))
    try:
        sent = await send_direct(adapter, platform, chat_id, thread_id, text, timeout_s)
    finally:
        if db is not None:
            await db.close()
    return {"chat_id": sent.chat_id, "message_ids": list(sent.message_ids)}


async def _existing_store(home: Path, config: Any) -> Any:
    """The configured store, or None when it is a SQLite file not made yet."""
    from dataclasses import asdict

    from gateway.wiring import replicated
    from state import SessionDB, open_store

    if not replicated(config.state.backend):
        if not (home / "state.db").exists():
            return None
        return await SessionDB.open(home / "state.db")
    return await open_store({**asdict(config.state), "dsn": config.secret("state.dsn_env")}, home)


async def _home_channel(home: Path, config: Any, platform: str) -> dict[str, Any] | None:
    """/sethome's chat from the store (when there is one yet), else the config's."""
    from gateway.handoff import configured_home, home_channel

    configured = config.platforms[platform].home_channel
    db = await _existing_store(home, config)
    if db is None:
        return configured_home(platform, configured)
    try:
        return await home_channel(db, platform, configured)
    finally:
        await db.close()
