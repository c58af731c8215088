"""DM pairing (`access.unknown_dm: pair`): an unknown user's DM gets a short one-time code
and nothing else; the operator approves it (`switchboard pairing approve CODE`), which
adds the user to the platform's allowlist in the store, where every replica and a running
daemon see it without a restart.

This module draws and shows codes and keeps a short-lived memory of who is paired, so a
paired user's messages do not each read the store; the rows and their rules (one pending
code per user, limits, single use) live in state/sqlite/pairing.py."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from state import TAKEN, Store

# no 0/O, 1/I: a code is read off a phone and typed into a terminal
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8  # 40 bits: guessing one of a platform's few pending codes is hopeless
REMEMBER_S = (
    5.0  # how long who-is-paired answers are reused (an approval or revoke lands within it)
)
REMEMBERED = 10_000
DRAWS = 5


@dataclass(frozen=True)
class PairingRules:
    """The `access.pairing` settings, in seconds."""

    ttl_s: float = 3600.0
    user_interval_s: float = 3600.0
    max_pending: int = 10


def new_code() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(CODE_LENGTH))


def shown(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def normalised(text: str) -> str:
    """A code as the operator typed it (any case, with or without the dash or spaces)."""
    return "".join(c for c in text.upper() if c not in "- ")


def code_message(code: str, ttl_s: float) -> str:
    minutes = max(1, round(ttl_s / 60))
    return (
        f"Pairing code: {shown(code)}\nGive it to this bot's operator to be let in. "
        f"It works once, for {minutes} minutes."
    )


async def offer(
    db: Store,
    rules: PairingRules,
    platform: str,
    user_id: str,
    user_name: str | None,
    chat_id: str,
    now: float,
) -> str | None:
    """A new code for the user, or None when the rules give them none now."""
    for _ in range(DRAWS):
        code = await db.pairing_offer(
            platform,
            user_id,
            user_name,
            chat_id,
            new_code(),
            now=now,
            ttl_s=rules.ttl_s,
            user_interval_s=rules.user_interval_s,
            max_pending=rules.max_pending,
        )
        if code != TAKEN:
            return code
    return None


class PairedUsers:
    """Who the store says is paired, each answer reused for REMEMBER_S."""

    def __init__(self, db: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._clock = clock
        self._known: OrderedDict[tuple[str, str], tuple[bool, float]] = OrderedDict()

    async def allows(self, platform: str, user_id: str) -> bool:
        key = (platform, user_id)
        now = self._clock()
        found = self._known.get(key)
        if found is not None and now - found[1] < REMEMBER_S:
            return found[0]
        paired = await self._db.pairing_approved(platform, user_id)
        self._known[key] = (paired, now)
        self._known.move_to_end(key)
        while len(self._known) > REMEMBERED:
            self._known.popitem(last=False)
        return paired
