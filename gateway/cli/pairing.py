"""`switchboard pairing list | approve CODE | deny CODE | revoke USER`: the operator's side
of DM pairing (gateway/pairing.py). Decisions are rows in the store the home's config
names, so the running daemon (every replica) sees them without a restart."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.errors import EXIT_OK, GatewayError

EPILOG = """\
With access.unknown_dm: pair, a user the allowlist does not name gets a one-time code when
they DM the bot (and nothing else). They give you the code; approve it here and they are
in, on that platform, at once (no restart, every replica). Codes expire
(access.pairing.code_ttl_minutes) and work once.
Exit 0 when done, 1 when no pending request has that code (or no such paired user)."""


class NoSuchPairing(GatewayError):
    """A code that is not pending (unknown, used, expired: not told apart), or a user who
    is not paired."""


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    fmt = {"epilog": EPILOG, "formatter_class": argparse.RawDescriptionHelpFormatter}
    p = add_command(
        sub,
        "pairing",
        "approve or deny users who asked by DM for access",
        description="Manage DM pairing: the codes unknown users were given, and "
        "the users approved.",
        **fmt,
    )
    sp = p.add_subparsers(dest="pairing_command", required=True, metavar="COMMAND")
    c = add_command(sp, "list", "pending codes and approved users", **fmt)
    c.add_argument("--json", action="store_true", help="print the rows as JSON")
    c.set_defaults(func=cmd_pairing)
    for name, summary in (
        ("approve", "let the user who was given CODE in"),
        ("deny", "refuse the request holding CODE"),
    ):
        c = add_command(sp, name, summary, **fmt)
        c.add_argument("code", metavar="CODE", help="the code, e.g. K7QH-M2XD (any case)")
        c.set_defaults(func=cmd_pairing)
    c = add_command(sp, "revoke", "take an approved user's access away again", **fmt)
    c.add_argument(
        "user", metavar="USER", help="PLATFORM:USER_ID (or USER_ID when one platform has it)"
    )
    c.set_defaults(func=cmd_pairing)


def cmd_pairing(args: argparse.Namespace) -> int:
    from gateway.cli.paths import home_of, store_settings

    home = home_of(args)
    return asyncio.run(_run(args, home, store_settings(args, home)))


async def _run(args: argparse.Namespace, home: Path, state: dict[str, Any] | None) -> int:
    from gateway.cli.paths import open_configured

    db = await open_configured(state, home / "state.db")
    try:
        command = args.pairing_command
        if command == "list":
            return await _list(db, args.json)
        if command == "revoke":
            return await _revoke(db, args.user)
        return await _decide(db, args.code, approve=command == "approve")
    finally:
        await db.close()


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


def _clean(value: object) -> str:
    return "".join(c if c.isprintable() else "?" for c in str(value))


async def _list(db: Any, as_json: bool) -> int:
    from gateway.pairing import shown

    rows = await db.pairing_list(time.time())
    if as_json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("No pending codes and no paired users.")
        return EXIT_OK
    print(f"{'STATE':<9} {'PLATFORM':<12} {'USER':<20} {'NAME':<20} {'CODE':<10} WHEN")
    for r in rows:
        code = shown(r["code"]) if r["code"] else "-"
        when = (
            f"expires {_when(r['expires_at'])}"
            if r["state"] == "pending"
            else f"approved {_when(r['decided_at'])}"
        )
        print(
            f"{r['state']:<9} {_clean(r['platform']):<12} {_clean(r['user_id']):<20} "
            f"{_clean(r['user_name'] or '-'):<20} {code:<10} {when}"
        )
    return EXIT_OK


async def _decide(db: Any, text: str, *, approve: bool) -> int:
    from gateway.pairing import normalised, shown
    from state import APPROVED, DENIED

    code = normalised(text)
    row = await db.pairing_decide(code, APPROVED if approve else DENIED, time.time())
    if row is None:
        raise NoSuchPairing(
            f"no pending request has the code {text.strip()!r} (codes work "
            "once and expire; `switchboard pairing list` shows those pending)"
        )
    who = f"{row['platform']} user {_clean(row['user_id'])}"
    if row["user_name"]:
        who += f" ({_clean(row['user_name'])})"
    if approve:
        print(f"approved {who}: they can talk to the agent now (code {shown(code)} is used up)")
    else:
        print(f"denied {who} (code {shown(code)} is used up)")
    return EXIT_OK


async def _revoke(db: Any, user: str) -> int:
    platform, _, user_id = user.rpartition(":")
    rows = [r for r in await db.pairing_list(time.time()) if r["state"] == "approved"]
    if not platform:
        found = sorted({r["platform"] for r in rows if r["user_id"] == user_id})
        if len(found) > 1:
            raise GatewayError(
                f"user {user_id} is paired on {', '.join(found)}; say which "
                f"(e.g. {found[0]}:{user_id})"
            )
        platform = found[0] if found else ""
    if not platform or not await db.pairing_revoke(platform, user_id, time.time()):
        raise NoSuchPairing(
            f"{user} is not a paired user (users in platforms.<p>."
            "allowed_users are changed with switchboard config set)"
        )
    print(
        f"revoked {platform} user {_clean(user_id)}: the running daemon refuses them within seconds"
    )
    return EXIT_OK
