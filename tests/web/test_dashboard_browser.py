"""The dashboard in a real browser: Debian's chromium driven by playwright —
sign in, filter, search, open a hit, expand the lineage tree, read the chart, rename,
delete with confirmation, refuse forged forms, show hostile strings as text.

Screenshots of each page go to $SWITCHBOARD_SCREENSHOTS when set (the README's are made
with SWITCHBOARD_SCREENSHOTS=docs/screenshots), else to the test's temporary directory.
"""

from __future__ import annotations

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
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip

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
    assert await rows.count() == 6
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
    assert await rows.count() == 2
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
    site, page, _ = browser_site
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
    # 2. another origin's page posting a complete-looking form at the dashboard
    evil = web.Application()

    async def attack(request: web.Request) -> web.Response:
        return web.Response(content_type="text/html", text=(
            f'<form id="f" method="post" action="{site.base}/ui/sessions/{victim}/delete">'
            '<input name="confirm" value="yes"><input name="csrf" value="guess"></form>'
            "<script>document.getElementById('f').submit()</script>"))  # fmt: skip

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
        assert await nojs.locator("#sessions tbody tr").count() == 6
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
