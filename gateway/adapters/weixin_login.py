"""Weixin's QR login through iLink (`switchboard login weixin`): ask for a login QR code
(`get_bot_qrcode`), print it in the terminal (drawn with text from the `qrcode` package of
the `weixin` extra; its link alone without it), poll `get_qrcode_status` until the code is
scanned and confirmed on the phone (an expired code is replaced, REFRESHES times at most),
and yield the bot token and the base URL iLink gives for the bot."""

from __future__ import annotations

import asyncio
import time
from typing import Any, TextIO

from gateway.adapters.weixin_api import login_get, qrcode_path, status_path
from gateway.errors import PlatformRefused, PlatformUnreachable, TransientError

BOT_TYPE = "3"  # the bot_type iLink's QR login takes for a bot
REFRESHES = 3  # expired QR codes replaced before giving up
STATUS_WAIT_S = 40.0  # iLink holds a status poll up to about 35 s
PAUSE_S = 1.0  # between status polls that came back at once


async def qr_login(base: str, timeout_s: float, out: TextIO) -> dict[str, str]:
    """The QR login at `base`: {"token", "base_url", "bot_id", "user_id"} once confirmed.
    PlatformUnreachable when iLink cannot be reached, PlatformRefused when the codes
    expired or the time ran out."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        try:
            code = await _new_code(http, base, out)
            refreshed, asked_at = 0, base
            while time.monotonic() < deadline:
                wait = max(1.0, min(STATUS_WAIT_S, deadline - time.monotonic()))
                try:
                    answer = await login_get(http, asked_at, status_path(code), wait)
                except TransientError as exc:
                    if not isinstance(exc.__cause__, TimeoutError):
                        raise
                    continue  # a held poll that ran out on our side: ask again
                status = str(answer.get("status") or "wait") if isinstance(answer, dict) else ""
                if status == "confirmed":
                    return _confirmed(answer, asked_at, out)
                if status == "scaned":
                    out.write("\nscanned: confirm the login in WeChat on the phone\n")
                elif status == "scaned_but_redirect" and answer.get("redirect_host"):
                    asked_at = f"https://{answer['redirect_host']}"
                elif status == "expired":
                    refreshed += 1
                    if refreshed > REFRESHES:
                        raise PlatformRefused(
                            f"the QR code expired {REFRESHES + 1} times; run the login again"
                        )
                    out.write(f"\nthe QR code expired; a new one ({refreshed}/{REFRESHES}):\n")
                    code, asked_at = await _new_code(http, base, out), base
                else:
                    out.write(".")
                out.flush()
                await asyncio.sleep(PAUSE_S)
        except TransientError as exc:
            raise PlatformUnreachable(str(exc)) from None
    raise PlatformRefused(f"no confirmed login within {timeout_s:.0f}s; run the login again")


async def _new_code(http: Any, base: str, out: TextIO) -> str:
    answer = await login_get(http, base, qrcode_path(BOT_TYPE), STATUS_WAIT_S)
    code = str(answer.get("qrcode") or "") if isinstance(answer, dict) else ""
    if not code:
        raise PlatformRefused(f"iLink at {base} gave no QR code: {str(answer)[:200]}")
    link = str(answer.get("qrcode_img_content") or code)
    out.write("Scan this QR code with WeChat (Me > Scan), then confirm on the phone:\n\n")
    out.write(render_qr(link))
    out.write(f"\nor open: {link}\n")
    out.flush()
    return code


# a pair of QR rows per line: (top dark, bottom dark) -> the character; light is drawn, dark
# left as the terminal's background, so the code reads on a dark or a light terminal alike
# as long as its background is darker than its text
_GLYPHS = {
    (False, False): "\u2588",
    (True, False): "\u2584",
    (False, True): "\u2580",
    (True, True): " ",
}


def render_qr(data: str) -> str:
    """`data` as a QR code drawn with text (half blocks, two rows a line); an empty string
    without the `qrcode` package."""
    try:
        import qrcode
    except ImportError:
        return ""
    qr = qrcode.QRCode(border=2)
    qr.add_data(data)
    qr.make(fit=True)
    rows = qr.get_matrix()
    if len(rows) % 2:
        rows.append([False] * len(rows[0]))
    lines = [
        "".join(_GLYPHS[(top, bottom)] for top, bottom in zip(upper, lower, strict=True))
        for upper, lower in zip(rows[0::2], rows[1::2], strict=True)
    ]
    return "\n".join(lines) + "\n"


def _confirmed(answer: dict[str, Any], asked_at: str, out: TextIO) -> dict[str, str]:
    token = str(answer.get("bot_token") or "")
    if not token:
        raise PlatformRefused("iLink confirmed the login but gave no bot token; run it again")
    out.write("\nconfirmed\n")
    return {
        "token": token,
        "base_url": str(answer.get("baseurl") or asked_at).rstrip("/"),
        "bot_id": str(answer.get("ilink_bot_id") or ""),
        "user_id": str(answer.get("ilink_user_id") or ""),
    }
