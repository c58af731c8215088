"""Telegram long polling that confirms an update only after the gateway has committed it.

python-telegram-bot's Updater asks for the next offset (which confirms a batch to Telegram)
before its handlers ran; this loop calls `Bot.get_updates` itself and moves the offset past
an update only once `emit` returned for it. Translation and the Bot API stay with the adapter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import warnings
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.adapters.base import Backoff
from gateway.errors import NotAccepted

log = logging.getLogger("gateway.adapters.telegram")

Handle = Callable[[dict[str, Any]], Awaitable[None]]  # one update, as a dict; raises to retry


def sanitize_updates(payload: bytes) -> bytes:
    """python-telegram-bot parses a getUpdates batch as a whole: one malformed update fails
    the batch, the offset never advances and the bot is stuck on it forever. Each update is
    checked on its own here; a poison one is replaced by its bare update_id, so the offset
    still moves on and the handler sees nothing."""
    from telegram import Update

    try:
        data = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(data, dict) or not data.get("ok") or not isinstance(data.get("result"), list):
        return payload
    clean: list[Any] = []
    for update in data["result"]:
        try:
            Update.de_json(update, None)
            clean.append(update)
        except Exception as exc:  # any parse failure: this update alone is dropped
            uid = update.get("update_id") if isinstance(update, dict) else None
            log.warning("dropped a malformed Telegram update %s: %s", uid, type(exc).__name__)
            if isinstance(uid, int):
                clean.append({"update_id": uid})
    data["result"] = clean
    return json.dumps(data).encode()


def sanitizing_request(**kwargs: Any) -> Any:
    """The Bot API transport whose getUpdates answers pass through `sanitize_updates`."""
    from gateway.adapters.telegram_request import AiohttpRequest

    def sanitize(url: str, status: int, payload: bytes) -> bytes:
        return (
            sanitize_updates(payload) if status == 200 and url.endswith("/getUpdates") else payload
        )

    return AiohttpRequest(pool_size=1, transform=sanitize, **kwargs)


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
                updates = await self._bot.get_updates(
                    offset=self.offset, timeout=self._timeout, allowed_updates=Update.ALL_TYPES
                )
            except tg_error.RetryAfter as exc:
                wait = retry_after_s(exc)
                self._note(
                    f"RetryAfter: {wait:.0f}s", "telegram flood control: waiting %.0fs", wait
                )
                await asyncio.sleep(wait)
                continue
            except tg_error.InvalidToken as exc:
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
            failures = 0
            for update in updates:
                try:
                    await self._handle(update.to_dict())
                except NotAccepted as exc:
                    failures += 1
                    self._note(
                        f"NotAccepted: {exc}",
                        "telegram update %s not accepted (polling it again): %s",
                        update.update_id,
                        exc,
                    )
                    await asyncio.sleep(self._backoff.delay(failures))
                    break
                except Exception:  # never ack what we could not hand over
                    failures += 1
                    log.exception("telegram update %s failed; polling it again", update.update_id)
                    await asyncio.sleep(self._backoff.delay(failures))
                    break
                self.offset = update.update_id + 1

    async def confirm(self) -> None:
        """Tell Telegram what was handled (a last getUpdates with the offset, no wait), so a
        restart does not fetch it again. Harmless if it fails: the core dedupes."""
        if self.offset is None:
            return
        try:
            await self._bot.get_updates(offset=self.offset, timeout=0, limit=1)
        except Exception as exc:  # shutting down: the next start polls from the same place
            log.info("telegram: could not confirm the last updates on stop (%s)", exc)

    def _note(self, error: str, fmt: str, *args: object) -> None:
        self.last_error = error
        log.warning(fmt, *args)
