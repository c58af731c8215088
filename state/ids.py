"""Session id generation: `YYYYMMDD_HHMMSS_<hex>` (8 hex for gateway, 6 for terminal)."""

from __future__ import annotations

import re
import secrets
import time

GATEWAY_HEX = 8
TERMINAL_HEX = 6
_ID_RE = re.compile(r"^\d{8}_\d{6}_[0-9a-f]{6,8}$")


def new_session_id(*, terminal: bool = False, now: float | None = None) -> str:
    """A fresh id stamped with `now` (UTC); the random tail makes collisions negligible."""
    stamp = time.strftime("%Y%m%d_%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}_{secrets.token_hex(8)[: TERMINAL_HEX if terminal else GATEWAY_HEX]}"


def looks_like_session_id(text: str) -> bool:
    return bool(_ID_RE.match(text))
