"""`switchboard weixin login`: the iLink QR login. Asks for a login QR code
(`get_bot_qrcode`), prints it in the terminal (as text, with the `qrcode` package of the
`weixin` extra; its link alone without it), polls `get_qrcode_status` until the code is
scanned and confirmed on the phone (a code that expires is replaced, three times at most),
then stores the bot token in the home's secrets file under the variable
`platforms.weixin.token_env` names (WEIXIN_TOKEN by default) and the base URL iLink gave
in config.yaml's `platforms.weixin.base_url`."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from gateway.errors import EXIT_OK, PlatformRefused, PlatformUnreachable

DEFAULT_TIMEOUT_S = 480.0
REFRESHES = 3  # expired QR codes replaced before giving up
STATUS_WAIT_S = 40.0  # iLink holds a status poll up to about 35 s
PAUSE_S = 1.0  # between status polls that came back at once


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(sub, "weixin", "Weixin (personal WeChat) through iLink: log the bot in")
    sp = p.add_subparsers(dest="weixin_command", required=True, metavar="COMMAND")
    login = add_command(
        sp,
        "login",
        "print a QR code to scan with WeChat and store the bot token it yields",
        description="Ask iLink for a login QR code, print it in the terminal, wait until "
        "it is scanned and confirmed in WeChat, then write the bot token to "
        "<home>/switchboard.env (mode 600, under the variable platforms.weixin.token_env "
        "names) and the bot's base URL to config.yaml. Exit 0 when logged in, 69 when "
        "iLink cannot be reached, 77 when the code expired or the time ran out.",
    )
    login.add_argument(
        "--base-url",
        metavar="URL",
        help="the iLink API to log in at (default: platforms.weixin.base_url, else "
        "https://ilinkai.weixin.qq.com)",
    )
    login.add_argument(
        "--bot-type", default="3", metavar="N", help="iLink's bot_type for the QR code (default 3)"
    )
    login.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up after this long (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    login.set_defaults(func=cmd_login)


def cmd_login(args: argparse.Namespace) -> int:
    from gateway.adapters.weixin_api import DEFAULT_BASE_URL
    from gateway.cli.config_cmd import target
    from gateway.ops import envfile
    from gateway.ops.config_edit import Document, commit, problems_of

    home, path = target(args)
    doc = Document(path)
    data, _ = problems_of(doc.text, path, envfile.environment(home))
    section = data.get("platforms", {}).get("weixin", {})
    base = args.base_url or section.get("base_url") or DEFAULT_BASE_URL
    var = section.get("token_env") or "WEIXIN_TOKEN"
    got = asyncio.run(login(base, args.bot_type, args.timeout, sys.stdout))
    envfile.write(envfile.path_of(home), {var: got["token"]})
    print(f"wrote {envfile.path_of(home)} (mode 600): {var}")
    if got["base_url"] != section.get("base_url"):
        doc.set(("platforms", "weixin", "base_url"), got["base_url"])
        commit(doc, envfile.environment(home))
        print(f"wrote {path}: platforms.weixin.base_url = {got['base_url']}")
    print(
        f"logged in as {got['bot_id'] or 'the bot'}; scanned by WeChat user {got['user_id'] or '?'}"
        " (add it to platforms.weixin.allowed_users to let them talk to the bot)"
    )
    if not section.get("enabled"):
        print("next: switchboard config set platforms.weixin.enabled true")
    print("a running daemon reads the new token when it is restarted")
    return EXIT_OK


async def login(base: str, bot_type: str, timeout_s: float, out: TextIO) -> dict[str, str]:
    """The QR login at `base`: {"token", "base_url", "bot_id", "user_id"} once confirmed."""
    import aiohttp

    from gateway.adapters.weixin_api import login_get, status_path
    from gateway.errors import TransientError

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        try:
            code = await _new_code(http, base, bot_type, out)
            refreshed, asked_at = 0, base
            while time.monotonic() < deadline:
                wait = max(1.0, min(STATUS_WAIT_S, deadline - time.monotonic()))
                try:
                    answer = await login_get(http, asked_at, status_path(code), wait)
                except TransientError as exc:
                    if not isinstance(exc.__cause__, TimeoutError):
                        raise
                    continue  # a held poll that ran out on our side: ask again
                status = str(answer.get("status") or "wait")
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
                    code, asked_at = await _new_code(http, base, bot_type, out), base
                else:
                    out.write(".")
                out.flush()
                await asyncio.sleep(PAUSE_S)
        except TransientError as exc:
            raise PlatformUnreachable(str(exc)) from None
    raise PlatformRefused(f"no confirmed login within {timeout_s:.0f}s; run the login again")


async def _new_code(http: Any, base: str, bot_type: str, out: TextIO) -> str:
    from gateway.adapters.weixin_api import login_get, qrcode_path

    answer = await login_get(http, base, qrcode_path(bot_type), STATUS_WAIT_S)
    code = str(answer.get("qrcode") or "") if isinstance(answer, dict) else ""
    if not code:
        raise PlatformRefused(f"iLink at {base} gave no QR code: {str(answer)[:200]}")
    link = str(answer.get("qrcode_img_content") or code)
    out.write("Scan this QR code with WeChat (Me > Scan), then confirm on the phone:\n\n")
    out.write(render_qr(link))
    out.write(f"\nor open: {link}\n")
    out.flush()
    return code


def render_qr(data: str) -> str:
    """`data` as a QR code drawn with text (half-block characters: two rows a line); an
    empty string without the `qrcode` package."""
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
    glyph = {
        (False, False): "\u2588",
        (True, False): "\u2584",
        (False, True): "\u2580",
        (True, True): " ",
    }
    lines = [
        "".join(glyph[(top, bottom)] for top, bottom in zip(upper, lower, strict=True))
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
