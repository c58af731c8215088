"""The dashboard's pages as a person reads them, through the api adapter's aiohttp app over
a real state.db: the chat's name in listings (and in `sessions list`), no "Sign out" where
nobody signed in, a live session's delete page, empty fields marked, the per-day chart's
scale, and the refusal of a forged form as a page with a way back."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import aiohttp

from gateway.web.charts import HEIGHT, PAD_B, PAD_T, per_day_chart
from state import SessionDB
from tests.web.conftest import KEY, sign_in, start_site

LIVE_ONE = "20250103_000000_cccc0003"  # the seeded Discord session


def _http() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _named_chat(db: SessionDB) -> str:
    origin = {
        "platform": "api",
        "chat_id": "team-7",
        "chat_type": "group",
        "chat_name": "Release crew",
        "user_id": "u9",
    }
    sid = await db.create_session(
        source="api",
        title="named chat",
        chat_id="team-7",
        chat_type="group",
        origin_json=json.dumps(origin),
    )
    await db.append_message(sid, "user", "ship it")
    return sid


async def test_the_chat_column_shows_the_chats_name_in_the_dashboard_and_the_cli(
    tmp_path: Path,
) -> None:
    site, server = await start_site(tmp_path)
    try:
        named = await _named_chat(site.db)  # type: ignore[arg-type]
        async with _http() as http:
            await sign_in(http, site.base)
            async with http.get(f"{site.base}/ui/sessions") as resp:
                html = await resp.text()
            async with http.get(
                f"{site.base}/api/sessions", headers={"Authorization": f"Bearer {KEY}"}
            ) as resp:
                listed = (await resp.json())["sessions"]
    finally:
        await server.close()
        await site.db.close()
    row = next(r for r in re.findall(r"<tr>.*?</tr>", html) if named in r)
    chat_cell = re.search(r'<td class="chat">(.*?)</td>', row)
    assert chat_cell and "Release crew" in chat_cell.group(1) and "group" in chat_cell.group(1)
    assert next(r for r in listed if r["id"] == named)["chat_name"] == "Release crew"
    assert "origin_json" not in listed[0]
    # the seeded Telegram DM has no name: its chat id stands in
    seeded = re.search(r'<td class="chat">100<div class="sub">dm</div></td>', html)
    assert seeded, html
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway", "--home", str(tmp_path), "sessions", "list"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if named in ln)
    assert "Release crew" in line
    assert "Chat" in done.stdout.splitlines()[0]


async def test_without_a_key_nobody_signed_in_so_no_sign_out_shows(tmp_path: Path) -> None:
    for key, shown in ((None, False), (KEY, True)):
        site, server = await start_site(tmp_path / str(shown), key=key)
        try:
            async with _http() as http:
                if key is not None:
                    await sign_in(http, site.base)
                async with http.get(f"{site.base}/ui/sessions") as resp:
                    assert resp.status == 200
                    assert ("Sign out" in await resp.text()) is shown
        finally:
            await server.close()
            await site.db.close()


async def test_a_live_sessions_delete_page_says_why_and_offers_no_delete(tmp_path: Path) -> None:
    site, server = await start_site(tmp_path, live={LIVE_ONE})
    try:
        async with _http() as http:
            await sign_in(http, site.base)
            async with http.get(f"{site.base}/ui/sessions/{LIVE_ONE}/delete") as resp:
                assert resp.status == 200
                live = await resp.text()
            async with http.get(f"{site.base}/ui/sessions/{site.seeded.slack}/delete") as resp:
                ended = await resp.text()
    finally:
        await server.close()
        await site.db.close()
    assert "Delete for good" not in live and 'id="confirm-delete"' not in live
    assert "is live in a chat; start a new one there (/new) first" in live
    assert f'href="/ui/sessions/{LIVE_ONE}"' in live
    assert 'id="confirm-delete"' in ended


async def test_empty_fields_are_marked_for_eyes_and_screen_readers(tmp_path: Path) -> None:
    site, server = await start_site(tmp_path)
    try:
        bare = await site.db.create_session(source="cli")  # no model, chat, user or name
        async with _http() as http:
            await sign_in(http, site.base)
            async with http.get(f"{site.base}/ui/sessions/{bare}") as resp:
                html = await resp.text()
    finally:
        await server.close()
        await site.db.close()
    meta = dict(re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", html))
    marked = '<span class="none"><span aria-hidden="true">—</span><span class="sr-only">none</span></span>'
    for field in ("Chat type", "Chat", "Chat name", "User", "Model"):
        assert meta[field] == marked, (field, meta[field])
    assert meta["Started"].startswith("<time datetime=")


def test_a_quiet_day_beside_a_busy_one_is_visible_on_the_per_day_chart() -> None:
    """Square-root scale with a least height: a 1-message day beside a 1,000-message day
    is a bar of at least 3 units, and a day four times busier is twice as tall."""
    days = [
        {"day": "2026-01-01", "sources": {"api": 1000}},
        {"day": "2026-01-02", "sources": {"api": 1}},
        {"day": "2026-01-03", "sources": {"api": 250}},
        {"day": "2026-01-04", "sources": {}},
    ]
    svg = per_day_chart(days, ["api"])
    heights = {
        day: float(h)
        for h, day in re.findall(
            r'<rect class="bar[^"]*"[^>]*height="([0-9.]+)" data-day="([^"]+)"', svg
        )
    }
    plot_h = HEIGHT - PAD_B - PAD_T
    assert heights["2026-01-01"] == plot_h
    assert heights["2026-01-02"] >= 3
    assert abs(heights["2026-01-03"] - plot_h / 2) < 0.2
    assert "2026-01-04" not in heights
    assert "square-root scale" in svg


async def test_a_forged_form_is_refused_with_a_page_and_a_way_back(tmp_path: Path) -> None:
    site, server = await start_site(tmp_path)
    try:
        async with _http() as http:
            await sign_in(http, site.base)
            came_from = f"{site.base}/ui/sessions/{site.seeded.slack}/delete"
            async with http.post(
                came_from,
                data={"confirm": "yes", "csrf": "forged"},
                headers={"Origin": site.base, "Referer": came_from},
            ) as resp:
                assert resp.status == 403
                assert resp.content_type == "text/html"
                html = await resp.text()
        assert await site.db.get_session(site.seeded.slack) is not None
    finally:
        await server.close()
        await site.db.close()
    assert '<link rel="stylesheet" href="/ui/static/app.css">' in html
    assert "CSRF token missing or wrong; reload the page" in html
    assert f'<a id="go-back" href="/ui/sessions/{site.seeded.slack}/delete">' in html
