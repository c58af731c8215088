"""User text on the dashboard is data: the JSON API returns it exactly, the pages show it
escaped, and an import keeps what no store can hold as U+FFFD and says how much."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp

from tests.web.conftest import KEY, Site, sign_in

BEARER = {"Authorization": f"Bearer {KEY}"}
TEXT = '<script>alert(1)</script> [bold]x[/] a[i] &amp; "q" \u202eevil \u200b中文 😀'


async def test_markup_looking_text_is_exact_in_the_json_api_and_escaped_in_the_page(
    site: Site,
) -> None:
    sid = await site.db.create_session(source="api", user_id="u", title="[bold]t[/] <b>x</b>")
    await site.db.append_message(sid, "user", TEXT)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{site.base}/api/sessions/{sid}", headers=BEARER) as resp:
            detail = await resp.json()
        await sign_in(http, site.base)
        async with http.get(f"{site.base}/ui/sessions/{sid}") as resp:
            page = await resp.text()
    assert [m["content"] for m in detail["messages"]] == [TEXT]
    assert detail["session"]["title"] == "[bold]t[/] <b>x</b>"
    assert "<script>alert(1)</script>" not in page and "<b>x</b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; [bold]x[/] a[i] &amp;amp;" in page
    assert "[bold]t[/] &lt;b&gt;x&lt;/b&gt;" in page


async def test_an_import_keeps_unstorable_characters_as_u_fffd_and_counts_them(
    site: Site, tmp_path: Path
) -> None:
    record = {
        "format": 1,
        "session": {
            "id": "20250101_000000_feedbeef",
            "source": "api",
            "user_id": "u\x00v",
            "started_at": 1.0,
        },
        "messages": [{"role": "user", "content": "before\x00after \ud800"}],
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{site.base}/api/import",
            data=json.dumps(record).encode() + b"\n",
            headers={**BEARER, "Content-Type": "application/x-ndjson"},
        ) as resp:
            report = await resp.json()
    assert report["imported"] == 1 and report["replaced_characters"] == 3, report
    [message] = await site.db.get_messages("20250101_000000_feedbeef")
    assert message["content"] == "before\ufffdafter \ufffd"
    assert (await site.db.require_session("20250101_000000_feedbeef"))["user_id"] == "u\ufffdv"
