"""The dashboard in a real browser: Debian's chromium driven by playwright —
sign in, filter, search, open a hit, expand the lineage tree, read the chart, rename,
delete with confirmation, refuse forged forms, show hostile strings as text.

Screenshots of each page go to $SWITCHBOARD_SCREENSHOTS when set (the README's are made
with SWITCHBOARD_SCREENSHOTS=docs/screenshots), else to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.web.conftest import KEY, Site, start_site
from tests.web_seed import HOSTILE_TITLE, RTL_TEXT, SCRIPT_TEXT

CHROMIUM = shutil.which("chromium") or (
    "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None
)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="NO CHROMIUM BINARY: the dashboard's browser tests need Debian's chromium "
    "(apt-get install chromium; .ci/run installs it)",
)


@pytest.fixture
async def browser_site(tmp_path: Path) -> AsyncIterator[tuple[Site, Any, Path]]:
    from playwright.async_api import async_playwright

    shots = Path(os.environ.get("SWITCHBOARD_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    site, server = await start_site(tmp_path)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(15_000)
        page = await context.new_page()
        try:
            yield site, page, shots
        finally:
            await context.close()
            await browser.close()
            await server.close()
            await site.db.close()


async def _sign_in(page: Any, site: Site, shots: Path | None = None) -> None:
    await page.goto(f"{site.base}/ui/sessions")
    assert "/ui/login" in page.url
    if shots is not None:
        await page.screenshot(path=shots / "login.png")
    await page.fill("input[name=key]", KEY)
    await page.click("form.login button")
    await page.wait_for_url(f"{site.base}/ui/sessions")


async def test_sign_in_filter_search_open_a_hit_and_hostile_strings_stay_text(
    browser_site: tuple[Site, Any, Path],
) -> None:
    site, page, shots = browser_site
    await page.goto(f"{site.base}/ui/login")
    await page.fill("input[name=key]", "wrong")
    await page.click("form.login button")
    assert "That key is not right." in await page.inner_text("main")
    await _sign_in(page, site, shots)
    rows = page.locator("#sessions tbody tr")
    assert await rows.count() == 7
    await page.screenshot(path=shots / "sessions.png", full_page=True)
    # the menus apply themselves (app.js submits the form on change)
    async with page.expect_navigation():
        await page.select_option("select[name=platform]", "discord")
    assert "platform=discord" in page.url
    assert await rows.count() == 1 and "discord" in await rows.first.inner_text()
    async with page.expect_navigation():
        await page.select_option("select[name=platform]", "")
    async with page.expect_navigation():
        await page.select_option("select[name=titled]", "no")
    assert await rows.count() == 3
    # hostile title: shown literally, no element injected
    await page.goto(f"{site.base}/ui/sessions")
    assert HOSTILE_TITLE in await page.inner_text("#sessions")
    assert await page.locator("img").count() == 0
    await page.click("a[href='/ui/search']")
    await page.fill("input[name=q]", '"needle rtl"')
    await page.click("form.filters button")
    hits = page.locator("#hits li")
    assert await hits.count() == 1
    assert await hits.first.locator("mark").all_inner_texts() == ["needle rtl"]
    await page.screenshot(path=shots / "search.png", full_page=True)
    await hits.first.locator("a").click()
    await page.wait_for_url(
        f"**/ui/sessions/{site.seeded.hostile}?at={site.seeded.rtl_msg}#m{site.seeded.rtl_msg}"
    )
    target = page.locator(".msg.target")
    assert await target.get_attribute("id") == f"m{site.seeded.rtl_msg}"
    assert await target.is_visible()
    text = await page.inner_text("#transcript")
    assert SCRIPT_TEXT in text  # the script tag is text on the page ...
    assert await page.evaluate("window.__pwned === undefined")  # ... and never ran
    assert RTL_TEXT.replace("\u202e", "[U+202E]") in text and "\u202e" not in text
    assert await page.title() == f"{HOSTILE_TITLE} · switchboard"


async def test_lineage_tree_expands_and_marks_the_current_session(
    browser_site: tuple[Site, Any, Path],
) -> None:
    site, page, shots = browser_site
    s = site.seeded
    await _sign_in(page, site)
    await page.goto(f"{site.base}/ui/sessions/{s.branch}")
    tree = page.locator("#lineage")
    current = tree.locator("a.current")
    assert (
        await current.count() == 1
        and await current.get_attribute("href") == f"/ui/sessions/{s.branch}"
    )
    reset_link = tree.locator(f"a[href='/ui/sessions/{s.reset}']")
    assert not await reset_link.is_visible()  # the compression chain starts folded
    await tree.locator(f"li[data-id='{s.compressed}'] > details > summary").click(
        position={"x": 2, "y": 5}
    )
    chained = tree.locator(f"a[href='/ui/sessions/{s.compressed2}']")
    assert await chained.is_visible() and not await reset_link.is_visible()
    await page.click("#expand-tree")  # app.js: open every node
    assert await reset_link.is_visible()
    node = tree.locator(f"li[data-id='{s.reset}']")
    assert (
        "reset" in (await node.inner_text()).lower()
        and "handoff to discord (completed)" in await node.inner_text()
    )
    assert "ended: compression" in await tree.locator(f"li[data-id='{s.root}']").first.inner_text()
    await page.screenshot(path=shots / "session.png", full_page=True)
    await reset_link.click()
    await page.wait_for_url(f"**/ui/sessions/{s.reset}")
    assert (
        await page.locator("#lineage a.current").get_attribute("href") == f"/ui/sessions/{s.reset}"
    )
    # tool calls folded, the long answer collapsed until asked for
    assert not await page.locator("details.tool pre").first.is_visible()
    await page.locator("details.tool summary").first.click()
    assert "alpha" in await page.locator("details.tool pre").first.inner_text()
    long = page.locator("details.long > div.text")
    assert not await long.is_visible()
    await page.locator("details.long > summary").click()
    assert await long.is_visible()


async def test_the_sessions_page_shows_live_sessions_and_a_control_unfolds_lineage(
    browser_site: tuple[Site, Any, Path],
) -> None:
    """The live session a reset started is listed by default, and the compression chain
    shows as its tip; the Show menu lists every session, and shows what it is set to."""
    site, page, _ = browser_site
    s = site.seeded
    await _sign_in(page, site)
    listed = page.locator("#sessions tbody a")

    async def shown() -> set[str]:
        return {
            str(h).rsplit("/", 1)[1]
            for h in await listed.evaluate_all("links => links.map(a => a.getAttribute('href'))")
        }

    folded = await shown()
    assert s.reset in folded and s.compressed2 in folded and s.branch in folded
    assert s.root not in folded and s.compressed not in folded
    async with page.expect_navigation():
        await page.select_option("select[name=children]", "1")
    assert "children=1" in page.url
    assert await shown() == folded | {s.root, s.compressed}
    assert await page.locator("select[name=children]").input_value() == "1"


async def test_insights_chart_values_match_the_api(browser_site: tuple[Site, Any, Path]) -> None:
    site, page, shots = browser_site
    await _sign_in(page, site)
    await page.goto(f"{site.base}/ui/insights?days=30")
    bars = await page.eval_on_selector_all(
        "#per-day rect.bar",
        "els => els.map(e => [e.dataset.day, e.dataset.platform, +e.dataset.value])",
    )
    data = await site.dashboard.db.insights(0, 1e12)
    by_platform: dict[str, int] = {}
    for _, platform, value in bars:
        by_platform[platform] = by_platform.get(platform, 0) + value
    expected: dict[str, int] = {}
    for day in data["per_day"]:
        for platform, n in day["sources"].items():
            expected[platform] = expected.get(platform, 0) + n
    assert by_platform == expected == {"discord": 1, "slack": 1, "telegram": 10}
    heat = await page.eval_on_selector_all(
        "#heatmap td", "els => els.reduce((a, e) => a + +e.dataset.value, 0)"
    )
    assert heat == 12
    assert await page.inner_text("#fig-messages strong") == "12"
    assert await page.inner_text("#fig-cost strong") == "$0.45"
    await page.hover("#per-day rect.p-discord")
    readout = page.locator(".chart-readout")
    assert (await readout.inner_text()).endswith("discord: 1 messages")
    await page.screenshot(path=shots / "insights.png", full_page=True)


async def test_rename_and_delete_need_confirmation(browser_site: tuple[Site, Any, Path]) -> None:
    site, page, shots = browser_site
    s = site.seeded
    await _sign_in(page, site)
    await page.goto(f"{site.base}/ui/sessions/{s.discord}")
    await page.click("text=Rename")
    await page.fill("input[name=title]", "discord <b>renamed</b>")
    await page.click("form.rename button")
    await page.wait_for_url(f"**/ui/sessions/{s.discord}")
    assert await page.inner_text("h1") == "discord <b>renamed</b>"
    assert (await site.db.get_session(s.discord))["title"] == "discord <b>renamed</b>"
    await page.click("text=Delete…")
    assert "cannot be undone" in await page.inner_text("main")
    await page.click("form.confirm >> text=Cancel")
    await page.wait_for_url(f"**/ui/sessions/{s.discord}")
    assert await site.db.get_session(s.discord) is not None
    await page.click("text=Delete…")
    await page.click("#confirm-delete")
    await page.wait_for_url("**/ui/sessions?deleted=*")
    assert "Deleted session" in await page.inner_text(".notice")
    assert await site.db.get_session(s.discord) is None
    await page.goto(f"{site.base}/ui/ops")
    assert "ok" in await page.inner_text("#health") and "running" in await page.inner_text("main")
    await page.screenshot(path=shots / "ops.png", full_page=True)
    await page.click("text=Find ended sessions without messages…")
    assert await page.inner_text("#empty-count") == "1"
    await page.click("form.confirm button")
    assert "Deleted 1 empty session" in await page.inner_text("main")
    assert await site.db.get_session(s.empty) is None


async def test_forged_forms_are_refused(browser_site: tuple[Site, Any, Path]) -> None:
    site, page, shots = browser_site
    victim = site.seeded.slack
    await _sign_in(page, site)
    # 1. same origin, no token (as if a form were injected into a page)
    await page.goto(f"{site.base}/ui/sessions")
    async with page.expect_navigation():
        await page.evaluate(
            """id => { const f = document.createElement('form'); f.method = 'post';
            f.action = '/ui/sessions/' + id + '/delete'; const i = document.createElement('input');
            i.name = 'confirm'; i.value = 'yes'; f.appendChild(i); document.body.appendChild(f); f.submit(); }""",
            victim,
        )
    assert "CSRF token missing or wrong" in await page.inner_text("body")
    await page.screenshot(path=shots / "refused.png")
    async with page.expect_navigation():  # the refusal is a page with a way back
        await page.click("#go-back")
    assert page.url == f"{site.base}/ui/sessions"
    # 2. another origin's page posting a complete-looking form at the dashboard
    evil = web.Application()

    async def attack(request: web.Request) -> web.Response:
        return web.Response(
            content_type="text/html",
            text=(
                f'<form id="f" method="post" action="{site.base}/ui/sessions/{victim}/delete">'
                '<input name="confirm" value="yes"><input name="csrf" value="guess"></form>'
                "<script>document.getElementById('f').submit()</script>"
            ),
        )

    evil.router.add_get("/", attack)
    server = TestServer(evil, host="127.0.0.1")
    await server.start_server()
    try:
        async with page.expect_navigation(url=f"{site.base}/**"):
            await page.goto(f"http://127.0.0.1:{server.port}/")
        assert "cross-origin request refused" in await page.inner_text("body")
    finally:
        await server.close()
    assert await site.db.get_session(victim) is not None


async def test_listing_and_transcripts_work_without_javascript(
    browser_site: tuple[Site, Any, Path],
) -> None:
    site, page, _ = browser_site
    context = await page.context.browser.new_context(java_script_enabled=False)
    try:
        nojs = await context.new_page()
        await _sign_in(nojs, site)
        assert await nojs.locator("#sessions tbody tr").count() == 7
        await nojs.select_option("select[name=platform]", "slack")
        async with nojs.expect_navigation():
            await nojs.click("#filters button")  # no script: the Apply button submits
        assert await nojs.locator("#sessions tbody tr").count() == 1
        await nojs.goto(f"{site.base}/ui/sessions/{site.seeded.reset}")
        assert not await nojs.locator("#expand-tree").is_visible()  # a script-only control
        assert "long answer" in await nojs.inner_text("#transcript")
        await nojs.locator("details.long > summary").click()  # <details> needs no script
        assert await nojs.locator("details.long > div.text").is_visible()
    finally:
        await context.close()


async def test_the_sessions_table_fits_a_1280_px_screen_with_a_long_unbroken_title(
    browser_site: tuple[Site, Any, Path],
) -> None:
    """A 100-character title without spaces breaks inside its cell: the Status column
    stays on screen and each time stays on one line."""
    site, page, shots = browser_site
    await site.db.create_session(source="api", title="Q" * 100, chat_id="7", chat_type="dm")
    await _sign_in(page, site)
    assert await page.evaluate("window.innerWidth") == 1280
    status = await page.locator("#sessions th.status").bounding_box()
    assert status is not None and status["x"] + status["width"] <= 1280, status
    line = await page.evaluate(
        "parseFloat(getComputedStyle(document.querySelector('#sessions td.date')).lineHeight)"
    )
    times = page.locator("#sessions td.date time")
    assert await times.count() == 2 * await page.locator("#sessions tbody tr").count()
    for box in [await times.nth(i).bounding_box() for i in range(await times.count())]:
        assert box is not None and box["height"] < 1.5 * line, (box, line)
    widths = await page.evaluate("document.documentElement.scrollWidth")
    assert widths <= 1280
    await page.screenshot(path=shots / "sessions-long-title.png", full_page=True)


async def test_every_control_on_the_operations_page_has_a_label_and_import_works_through_it(
    browser_site: tuple[Site, Any, Path], tmp_path: Path
) -> None:
    """Each visible input and select on /ui/ops has an accessible name; the import's file
    input is found by its label and imports the file it is given."""
    site, page, _ = browser_site
    await _sign_in(page, site)
    await page.goto(f"{site.base}/ui/ops")
    unlabelled = await page.eval_on_selector_all(
        "main input:not([type=hidden]), main select, main textarea",
        "els => els.filter(e => !e.labels.length && !e.getAttribute('aria-label'))"
        "          .map(e => e.outerHTML)",
    )
    assert unlabelled == []
    export, sid = tmp_path / "one.jsonl", site.seeded.discord
    export.write_text(json.dumps(await site.db.export_session(sid)) + "\n")
    await site.db.delete_session(sid)
    await page.get_by_label("Export file (JSONL)").set_input_files(str(export))
    await page.get_by_label("Import the sessions in this file").check()
    await page.click("form[action='/ui/ops/import'] button")
    assert "Imported 1 session(s)" in await page.inner_text(".notice")
    assert await site.db.get_session(sid) is not None
