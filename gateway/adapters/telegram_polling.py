"""Telegram long polling that confirms an update only after the gateway has committed it.

python-telegram-bot's Updater asks for the next offset (which confirms a batch to Telegram)
before its handlers ran; this loop calls getUpdates itself and moves the offset past an
update only once `emit` returned for it. Translation and the Bot API stay with the adapter.

The updates are read as the Bot API's JSON (`Bot.do_api_request`), as the webhook reads
them: `to_inbound` checks every field it uses, so one malformed update is ignored on its own
and the offset moves past it. python-telegram-bot's `get_updates` builds an `Update` per
update and fails a whole batch on one it cannot parse (the bot would be stuck on it); the
adapter never used those objects (about 300 µs per update on the Intel Xeon host, with
the round trip back to a dict).
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.adapters.base import Backoff
from gateway.errors import NotAccepted

log = logging.getLogger("gateway.adapters.telegram")

Handle = Callable[[dict[str, Any]], Awaitable[None]]  # one update, as a dict; raises to retry
POLL_READ_S = 10.0  # a getUpdates answer may take this long beyond its long-poll timeout


def readable(updates: object) -> list[dict[str, Any]] | None:
    """The updates of a getUpdates answer that carry an update_id; anything else in the
    list (not an object, no integer id) is logged and left out. It has no id to confirm,
    and Telegram moves past it with the next update's. None: the answer is not a list."""
    if not isinstance(updates, list):
        return None
    kept = []
    for update in updates:
        if isinstance(update, dict) and type(update.get("update_id")) is int:
            kept.append(update)
        else:
            log.warning("dropped a Telegram update without an update_id")
    return kept


def retry_after_s(exc: Any) -> float:
    """PTB's RetryAfter wait in seconds (an int today, a timedelta in later releases)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        wait = exc.retry_after
    return float(wait) if isinstance(wait, (int, float)) else float(wait.total_seconds())


class Poller:
    """One getUpdates loop. `offset` is the next update id to ask for: every update below it
    was handed to the gateway (`handle` returned). A `NotAccepted` (or any failure to hand
    over) leaves the offset on that update, backs off and polls from it again."""

    def __init__(self, bot: Any, handle: Handle, *, timeout_s: float, backoff: Backoff) -> None:
        self._bot = bot
        self._handle = handle
        self._timeout = int(timeout_s)
        self._backoff = backoff
        self.offset: int | None = None
        self.last_error: str | None = None
        self.stopped_by: str | None = None  # why the loop ended on its own (an invalid token)

    async def run(self) -> None:
        from telegram import Update
        from telegram import error as tg_error

        failures = 0
        while True:
            try:
                updates = readable(
                    await self._bot.do_api_request(
                        "getUpdates",
                        api_kwargs={
                            "offset": self.offset,
                            "timeout": self._timeout,
                            "allowed_updates": Update.ALL_TYPES,
                        },
                        read_timeout=POLL_READ_S + self._timeout,
                    )
                )
            except tg_error.RetryAfter as exc:
                wait = retry_after_s(exc)
                self._note(
                    f"RetryAfter: {wait:.0f}s", "telegram flood control: waiting %.0fs", wait
                )
                await asyncio.sleep(wait)
                continue
            except (tg_error.InvalidToken, tg_error.EndPointNotFound) as exc:
                # once getMe has worked, do_api_request reports a rejected token as
                # EndPointNotFound
                self.stopped_by = "invalid token"
                self.last_error = f"InvalidToken: {exc}"
                log.error("telegram refused the bot token while polling; polling stopped")
                return
            except tg_error.Conflict as exc:
                failures += 1
                self._note(
                    f"Conflict: {exc}",
                    "telegram 409 Conflict: another getUpdates "
                    "poller or a webhook uses this bot token (%s)",
                    exc,
                )
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            except tg_error.TelegramError as exc:  # network trouble, 5xx, timeouts
                failures += 1
                self._note(
                    f"{type(exc).__name__}: {exc}", "telegram polling error (retrying): %s", exc
                )
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            if updates is None:  # not the Bot API's answer: as a server error, back off
                failures += 1
                self._note("not a list of updates", "telegram getUpdates: not a list of updates")
                await asyncio.sleep(self._backoff.delay(failures))
                continue
            failures = 0
            for update in updates:
                update_id = update["update_id"]
                try:
                    await self._handle(update)
                except NotAccepted as exc:
                    failures += 1
                    self._note(
                        f"NotAccepted: {exc}",
                        "telegram update %s not accepted (polling it again): %s",
                        update_id,
                        exc,
                    )
                    await asyncio.sleep(self._backoff.delay(failures))
                    break
                except Exception:  # never ack what we could not hand over
                    failures += 1
                    log.exception("telegram update %s failed; polling it again", update_id)
                    await asyncio.sleep(self._backoff.delay(failures))
                    break
                self.offset = update_id + 1

    async def confirm(self) -> None:
        """Tell Telegram what was handled (a last getUpdates with the offset, no wait), so a
        restart does not fetch it again. Harmless if it fails: the core dedupes."""
        if self.offset is None:
            return
        try:
            await self._bot.do_api_request(
                "getUpdates", api_kwargs={"offset": self.offset, "timeout": 0, "limit": 1}
            )
        except Exception as exc:  # shutting down: the next start polls from the same place
            log.info("telegram: could not confirm the last updates on stop (%s)", exc)

    def _note(self, error: str, fmt: str, *args: object) -> None:
        self.last_error = error
        log.warning(fmt, *args)
