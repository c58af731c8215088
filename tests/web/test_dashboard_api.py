"""The dashboard's JSON API and pages over a real state.db, through the api adapter's
aiohttp app: sign-in, CSRF, escaping, headers, listing, search, insights,
lineage, operations, and the OpenAPI document against the registered handlers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.web import api as web_api
from gateway.web.auth import Sessions
from gateway.web.openapi import document
from gateway.web.ratelimit import FailureLimiter, client_key
from tests.web.conftest import KEY, Site, sign_in, start_site
from tests.web_seed import HOSTILE_TITLE, SCRIPT_TEXT

BEARER = {"Authorization": f"Bearer {KEY}"}


def _http() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _get(http: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, Any]:
    async with http.get(url, **kw) as resp:
        body = await resp.json() if resp.content_type == "application/json" else await resp.text()
        return resp.status, body


def test_openapi_documents_exactly_the_registered_routes() -> None:
    """Every /api route is in /api/openapi.json and every documented operation is served."""
    served = {(m.lower(), "/api" + p) for m, p, _ in web_api.ROUTES}
    doc = document()
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented
    assert doc["openapi"].startswith("3.")
    for path, ops in doc["paths"].items():
        names = set(re.findall(r"{(\w+)}", path))
        for op in ops.values():
            assert names == {p["name"] for p in op["parameters"] if p["in"] == "path"}, path


def test_the_openapi_document_is_a_valid_openapi_3_0_document() -> None:
    """The whole document, as served (JSON), passes openapi-spec-validator's 3.0 checks."""
    from openapi_spec_validator import OpenAPIV30SpecValidator

    errors = [
        e.message for e in OpenAPIV30SpecValidator(json.loads(json.dumps(document()))).iter_errors()
    ]
    assert errors == []


async def test_openapi_is_served_and_routes_answer_as_documented(site: Site) -> None:
    async with _http() as http:
        status, doc = await _get(http, f"{site.base}/api/openapi.json")
        assert status == 200 and doc == json.loads(json.dumps(document()))
        for path, ops in doc["paths"].items():
            if "get" not in ops:
                continue
            real = path.replace("{id}", site.seeded.root)
            query = "?q=needle" if path == "/api/search" else ""
            async with http.get(site.base + real + query, headers=BEARER) as resp:
                assert resp.status == 200, path


async def test_api_needs_the_key_or_a_signed_in_cookie(site: Site) -> None:
    async with _http() as http:
        status, body = await _get(http, f"{site.base}/api/sessions")
        assert status == 401 and "sign in" in body["error"]["message"]
        status, _ = await _get(
            http, f"{site.base}/api/sessions", headers={"Authorization": "Bearer nope"}
        )
        assert status == 401
        status, body = await _get(http, f"{site.base}/api/sessions", headers=BEARER)
        assert status == 200 and body["sessions"]
        async with http.get(f"{site.base}/ui/sessions", allow_redirects=False) as resp:
            assert resp.status == 302 and resp.headers["Location"].startswith("/ui/login?next=")
        await sign_in(http, site.base)
        status, body = await _get(http, f"{site.base}/api/sessions")
        assert status == 200


async def test_sign_in_sets_an_httponly_samesite_strict_cookie(site: Site) -> None:
    async with _http() as http:
        async with http.post(
            f"{site.base}/ui/login", data={"key": "wrong"}, headers={"Origin": site.base}
        ) as resp:
            assert resp.status == 401 and "not right" in await resp.text()
        async with http.post(
            f"{site.base}/ui/login", data={"key": KEY}, allow_redirects=False
        ) as resp:
            assert resp.status == 403  # no Origin: a login from nowhere is refused
        async with http.post(
            f"{site.base}/ui/login",
            data={"key": KEY, "next": "//evil.example/x"},
            headers={"Origin": site.base},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/ui/sessions"
            cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie


async def test_secure_cookie_setting_marks_the_cookie_secure(tmp_path: Path) -> None:
    s, server = await start_site(tmp_path, secure_cookie=True)
    try:
        async with (
            _http() as http,
            http.post(
                f"{s.base}/ui/login",
                data={"key": KEY},
                headers={"Origin": s.base},
                allow_redirects=False,
            ) as resp,
        ):
            assert "Secure" in resp.headers["Set-Cookie"]
    finally:
        await server.close()
        await s.db.close()


def test_browser_sessions_expire_after_their_lifetime() -> None:
    now = [1000.0]
    sessions = Sessions(ttl_s=3600, clock=lambda: now[0])
    ws = sessions.create()
    assert sessions.get(ws.id) is ws
    now[0] += 3599
    assert sessions.get(ws.id) is ws
    now[0] += 2
    assert sessions.get(ws.id) is None
    assert sessions.get("made-up") is None


async def test_csrf_token_and_origin_are_required_for_cookie_mutations(site: Site) -> None:
    sid = site.seeded.branch
    async with _http() as http:
        csrf = await sign_in(http, site.base)
        url = f"{site.base}/api/sessions/{sid}"
        async with http.delete(url, headers={"Origin": site.base}) as resp:
            assert resp.status == 403 and "CSRF" in (await resp.json())["error"]["message"]
        async with http.delete(
            url, headers={"Origin": site.base, "X-CSRF-Token": "forged"}
        ) as resp:
            assert resp.status == 403
        async with http.delete(
            url, headers={"Origin": "http://evil.example", "X-CSRF-Token": csrf}
        ) as resp:
            assert resp.status == 403
        async with http.delete(url, headers={"X-CSRF-Token": csrf}) as resp:
            assert resp.status == 403  # neither Origin nor Referer
        # a forged form: right cookie, no token
        async with http.post(
            f"{site.base}/ui/sessions/{sid}/delete",
            data={"confirm": "yes"},
            headers={"Origin": site.base},
        ) as resp:
            assert resp.status == 403
        async with http.post(
            f"{site.base}/ui/sessions/{sid}/delete",
            data={"confirm": "yes", "csrf": "x"},
            headers={"Origin": site.base},
        ) as resp:
            assert resp.status == 403
        assert await site.db.get_session(sid) is not None
        async with http.delete(url, headers={"Origin": site.base, "X-CSRF-Token": csrf}) as resp:
            assert resp.status == 200
    assert await site.db.get_session(sid) is None


async def test_security_headers_on_pages_api_errors_and_assets(site: Site) -> None:
    async with _http() as http:
        for path, headers in (
            ("/ui/login", {}),
            ("/api/sessions", {}),
            ("/api/sessions", BEARER),
            ("/ui/static/app.js", {}),
            ("/ui/sessions", {}),
            ("/api/sessions/nope", BEARER),
        ):
            async with http.get(site.base + path, headers=headers, allow_redirects=False) as resp:
                csp = resp.headers.get("Content-Security-Policy", "")
                assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
                assert "unsafe-inline" not in csp
                assert resp.headers.get("X-Content-Type-Options") == "nosniff", path


async def test_hostile_titles_and_messages_reach_pages_only_as_text(site: Site) -> None:
    h = site.seeded.hostile
    async with _http() as http:
        await sign_in(http, site.base)
        pages = []
        for path in (
            "/ui/sessions",
            f"/ui/sessions/{h}",
            "/ui/search?q=needle",
            f"/ui/sessions/{h}/rename",
            f"/ui/sessions/{h}/delete",
            "/ui/insights",
        ):
            status, text = await _get(http, site.base + path)
            assert status == 200, path
            pages.append(text)
    joined = "\n".join(pages)
    assert "<script>window" not in joined and "<img src=x" not in joined
    assert "&lt;script&gt;window.__pwned" in pages[1]
    assert "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in pages[0]
    assert "\u202e" not in joined and "[U+202E]gpj.exe" in pages[1]
    assert SCRIPT_TEXT not in joined and HOSTILE_TITLE not in joined


async def test_listing_filters_sort_and_keyset_paging(site: Site) -> None:
    s = site.seeded
    async with _http() as http:

        async def ids(query: str) -> list[str]:
            status, body = await _get(http, f"{site.base}/api/sessions?{query}", headers=BEARER)
            assert status == 200, body
            return [r["id"] for r in body["sessions"]]

        assert set(await ids("platform=discord")) == {s.discord}
        assert set(await ids("chat_type=channel")) == {s.slack}
        titled = await ids("titled=yes")
        assert s.discord not in titled and s.compressed2 in titled  # a chain shows as its tip
        assert set(await ids("titled=no")) == {s.discord, s.empty, s.reset}  # reset: live
        assert set(await ids("status=ended")) == {s.slack, s.empty, s.compressed2}
        assert s.slack not in await ids("status=live")
        day = lambda d: (
            __import__("datetime")
            .datetime.fromtimestamp(d, __import__("datetime").UTC)
            .strftime("%Y-%m-%d")
        )  # noqa: E731
        started = (await site.db.get_session(s.slack))["started_at"]
        assert set(await ids(f"sort=started&from={day(started)}&to={day(started)}")) == {s.slack}
        everything = await ids("limit=500&children=1")
        assert {s.compressed, s.reset} <= set(everything)
        assert s.compressed not in await ids("limit=500")  # folded into its continuation
        # keyset: pages of 2 visit every row once, in order, for both sorts and orders
        for sort in ("sort=active", "sort=started&order=asc"):
            seen: list[str] = []
            cursor = None
            while True:
                status, body = await _get(
                    http,
                    f"{site.base}/api/sessions?{sort}&children=1&limit=2"
                    + (f"&after={cursor}" if cursor else ""),
                    headers=BEARER,
                )
                seen += [r["id"] for r in body["sessions"]]
                cursor = body["next"]
                if cursor is None:
                    break
            assert seen == await ids(f"{sort}&children=1&limit=500")
            assert len(seen) == len(set(seen)) == len(everything)
        for bad, name in (
            ("platform=irc", "platform"),
            ("from=yesterday", "from"),
            ("after=zzz", "after"),
            ("limit=0", "limit"),
            ("sort=size", "sort"),
        ):
            status, body = await _get(http, f"{site.base}/api/sessions?{bad}", headers=BEARER)
            assert status == 400 and name in body["error"]["message"]


async def test_search_uses_the_query_language_and_links_to_the_message(site: Site) -> None:
    async with _http() as http:
        status, body = await _get(http, f"{site.base}/api/search?q=needle NOT rtl", headers=BEARER)
        assert status == 200
        assert {h["session_id"] for h in body["hits"]} == {site.seeded.hostile, site.seeded.discord}
        assert all(">>>needle<<<" in h["snippet"].lower() for h in body["hits"])
        status, body = await _get(http, f'{site.base}/api/search?q="needle rtl"', headers=BEARER)
        assert [h["id"] for h in body["hits"]] == [site.seeded.rtl_msg]
        status, body = await _get(http, f"{site.base}/api/search?q=", headers=BEARER)
        assert status == 400
        await sign_in(http, site.base)
        status, page = await _get(http, f"{site.base}/ui/search?q=needle+rtl")
    assert "<mark>needle</mark>" in page
    assert (
        f"/ui/sessions/{site.seeded.hostile}?at={site.seeded.rtl_msg}#m{site.seeded.rtl_msg}"
        in page
    )


async def test_session_page_shows_lineage_tree_folded_tools_and_collapsed_long_text(
    site: Site,
) -> None:
    s = site.seeded
    async with _http() as http:
        status, body = await _get(http, f"{site.base}/api/sessions/{s.compressed2}", headers=BEARER)
        tree = body["lineage"]
        assert tree["id"] == s.root
        kinds = {c["id"]: c["child_kind"] for c in tree["children"]}
        assert kinds == {s.compressed: "compression", s.branch: "branch"}
        chain = (
            tree["children"][0]
            if tree["children"][0]["id"] == s.compressed
            else tree["children"][1]
        )
        assert chain["children"][0]["id"] == s.compressed2
        assert chain["children"][0]["children"][0] == chain["children"][0]["children"][0] | {
            "id": s.reset,
            "child_kind": "reset",
            "handoff_state": "completed",
        }
        await sign_in(http, site.base)
        status, page = await _get(http, f"{site.base}/ui/sessions/{s.compressed2}")
        assert status == 200
        assert page.count('aria-current="page" class="node current"') == 1
        assert f'href="/ui/sessions/{s.compressed2}" aria-current="page"' in page
        assert "ended: compression" in page and "handoff to discord (completed)" in page
        status, page = await _get(http, f"{site.base}/ui/sessions/{s.reset}?at={s.tool_msg}")
        assert '<details class="tool"><summary>tool call: session_search</summary>' in page
        assert '<details class="tool"><summary>tool result: session_search</summary>' in page
        assert '<details class="long">' in page
        assert f'class="msg role-tool target" id="m{s.tool_msg}"' in page
        status, _ = await _get(http, f"{site.base}/ui/sessions/nope")
        assert status == 404


async def test_insights_figures_and_cost(site: Site) -> None:
    async with _http() as http:
        status, body = await _get(http, f"{site.base}/api/insights?days=30", headers=BEARER)
        assert status == 200
        assert body["messages"] == 12
        assert len(body["per_day"]) == 31  # every calendar day of the period
        assert sum(sum(d["sources"].values()) for d in body["per_day"]) == 12
        assert sum(map(sum, body["heatmap"])) == 12
        assert body["top_tools"] == [{"tool": "session_search", "calls": 1}]
        assert body["input_tokens"] == 1_002_000 and body["output_tokens"] == 501_000
        assert body["cost"] == {"estimated_usd": 0.45, "unpriced_models": ["claude-x"]}
        reasons = {r["reason"]: r["sessions"] for r in body["end_reasons"]}
        assert reasons == {"compression": 2, "idle": 1, "session_reset": 2}
        status, body = await _get(
            http, f"{site.base}/api/insights?days=30&platform=discord", headers=BEARER
        )
        assert body["messages"] == 1 and body["sessions_active"] == 1
        status, body = await _get(http, f"{site.base}/api/insights?days=5", headers=BEARER)
        assert body["messages"] == 11  # the slack session is 10 days old
        status, body = await _get(http, f"{site.base}/api/insights?days=0", headers=BEARER)
        assert status == 400 and "days" in body["error"]["message"]


LIVE_ONE = "20250103_000000_cccc0003"  # the seeded Discord session, live for the operations


async def test_rename_delete_live_refusal_prune_and_empty_sessions(tmp_path: Path) -> None:
    s, server = await start_site(tmp_path, live={LIVE_ONE})
    try:
        await rename_delete_live_refusal_prune_and_empty(s)
    finally:
        await server.close()
        await s.db.close()


async def rename_delete_live_refusal_prune_and_empty(s: Site) -> None:
    """The operations over the API on a site whose seeded Discord session is live."""
    async with _http() as http:
        async with http.post(
            f"{s.base}/api/sessions/{s.seeded.root}/title",
            json={"title": "renamed <b>"},
            headers=BEARER,
        ) as resp:
            assert resp.status == 200 and (await resp.json())["title"] == "renamed <b>"
        async with http.post(
            f"{s.base}/api/sessions/{s.seeded.discord}/title",
            json={"title": "slack standup"},
            headers=BEARER,
        ) as resp:
            assert resp.status == 400 and "slack standup" in (await resp.json())["error"]["message"]
        async with http.delete(f"{s.base}/api/sessions/{s.seeded.discord}", headers=BEARER) as resp:
            assert resp.status == 409
        async with http.post(
            f"{s.base}/api/empty-sessions", json={"dry_run": True}, headers=BEARER
        ) as resp:
            assert await resp.json() == {"empty": 1}
        async with http.post(f"{s.base}/api/empty-sessions", json={}, headers=BEARER) as resp:
            assert await resp.json() == {"deleted": 1}
        async with http.post(
            f"{s.base}/api/prune", json={"older_than_days": 7, "dry_run": True}, headers=BEARER
        ) as resp:
            assert await resp.json() == {"would_prune": 1}
        async with http.post(
            f"{s.base}/api/prune", json={"older_than_days": 7}, headers=BEARER
        ) as resp:
            assert await resp.json() == {"pruned": 1}
        async with http.post(
            f"{s.base}/api/prune", json={"older_than_days": "x"}, headers=BEARER
        ) as resp:
            assert resp.status == 400
    assert await s.db.get_session(s.seeded.empty) is None
    assert await s.db.get_session(s.seeded.slack) is None
    assert (await s.db.get_session(s.seeded.root))["title"] == "renamed <b>"
    assert await s.db.get_session(s.seeded.discord) is not None


async def test_page_actions_confirm_first(site: Site) -> None:
    s = site.seeded
    async with _http() as http:
        csrf = await sign_in(http, site.base)
        origin = {"Origin": site.base}
        status, page = await _get(http, f"{site.base}/ui/ops/empty")
        assert 'id="empty-count">1<' in page and await site.db.get_session(s.empty) is not None
        async with http.post(
            f"{site.base}/ui/ops/empty", data={"csrf": csrf}, headers=origin
        ) as resp:
            assert resp.status == 400  # no confirmation
        async with http.post(
            f"{site.base}/ui/ops/empty", data={"csrf": csrf, "confirm": "yes"}, headers=origin
        ) as resp:
            assert "Deleted 1 empty session" in await resp.text()
        status, page = await _get(http, f"{site.base}/ui/ops/prune?days=7")
        assert 'id="prune-count">1<' in page
        async with http.post(
            f"{site.base}/ui/ops/prune",
            data={"csrf": csrf, "confirm": "yes", "days": "7"},
            headers=origin,
        ) as resp:
            assert "Pruned 1 session" in await resp.text()
        async with http.post(
            f"{site.base}/ui/sessions/{s.branch}/rename",
            data={"csrf": csrf, "title": "new name"},
            headers=origin,
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303
        async with http.post(
            f"{site.base}/ui/sessions/{s.branch}/delete",
            data={"csrf": csrf, "confirm": "yes"},
            headers=origin,
            allow_redirects=False,
        ) as resp:
            assert resp.status == 303 and "deleted=" in resp.headers["Location"]
        status, page = await _get(http, f"{site.base}/ui/ops")
        assert 'id="health"' in page and "running" in page
    assert await site.db.get_session(s.branch) is None
    assert await site.db.get_session(s.slack) is None


async def test_export_then_import_through_the_api(site: Site, tmp_path: Path) -> None:
    async with _http() as http:
        async with http.get(f"{site.base}/api/export", headers=BEARER) as resp:
            assert resp.status == 200 and "attachment" in resp.headers["Content-Disposition"]
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
            dump = await resp.read()
        async with http.get(
            f"{site.base}/api/sessions/{site.seeded.hostile}/export", headers=BEARER
        ) as resp:
            one = [json.loads(line) for line in (await resp.text()).splitlines()]
        assert [r["session"]["id"] for r in one] == [site.seeded.hostile]
    lines = dump.decode().splitlines()
    assert len(lines) == 9
    other, server = await start_site(tmp_path / "b")
    try:
        for sid in (r["session"]["id"] for r in map(json.loads, lines)):
            if await other.db.get_session(sid) is not None:
                await other.db.delete_session(sid)
        async with _http() as http:
            async with http.post(
                f"{other.base}/api/import",
                data=dump + b"not json\n",
                headers={**BEARER, "Content-Type": "application/x-ndjson"},
            ) as resp:
                report = await resp.json()
        assert report["imported"] == 9 and report["errors"] == ["line 10: not JSON; skipped"]
        assert (await other.db.get_session(site.seeded.hostile))["title"] == HOSTILE_TITLE
    finally:
        await server.close()
        await other.db.close()


async def test_without_a_key_only_loopback_host_names_are_answered(tmp_path: Path) -> None:
    s, server = await start_site(tmp_path, key=None)
    try:
        async with _http() as http:
            status, _ = await _get(http, f"{s.base}/api/sessions")
            assert status == 200  # loopback, no key: no sign-in
            status, _ = await _get(http, f"{s.base}/api/sessions", headers={"Host": "evil.example"})
            assert status == 403  # a DNS-rebinding page would arrive with its own host name
            async with http.delete(
                f"{s.base}/api/sessions/{s.seeded.branch}",
                headers={"Origin": "http://evil.example"},
            ) as resp:
                assert resp.status == 403
            async with http.get(f"{s.base}/ui/sessions") as resp:  # signed in without a form
                assert resp.status == 200 and str(resp.url).endswith("/ui/sessions")
    finally:
        await server.close()
        await s.db.close()


@pytest.mark.parametrize("path", ["/v1/messages", "/metrics"])
async def test_the_api_servers_own_endpoints_still_need_the_bearer_key(
    site: Site, path: str
) -> None:
    async with _http() as http:
        await sign_in(http, site.base)
        async with http.get(site.base + path) as resp:
            assert resp.status in (401, 405)
        async with http.post(site.base + path, json={}) as resp:
            assert resp.status == 401


async def test_import_page_checks_the_token_and_confirmation_before_reading_the_file(
    site: Site,
) -> None:
    async with _http() as http:
        async with http.get(
            f"{site.base}/api/sessions/{site.seeded.hostile}/export", headers=BEARER
        ) as resp:
            dump = await resp.read()
    await site.db.delete_session(site.seeded.hostile)

    def form(csrf: str, confirm: bool) -> aiohttp.FormData:
        data = aiohttp.FormData()
        data.add_field("csrf", csrf)
        if confirm:
            data.add_field("confirm", "yes")
        data.add_field("file", dump, filename="x.jsonl", content_type="application/x-ndjson")
        return data

    async with _http() as http:
        csrf = await sign_in(http, site.base)
        origin = {"Origin": site.base}
        async with http.post(
            f"{site.base}/ui/ops/import", data=form("forged", True), headers=origin
        ) as resp:
            assert resp.status == 403
        async with http.post(
            f"{site.base}/ui/ops/import", data=form(csrf, False), headers=origin
        ) as resp:
            assert resp.status == 400 and "confirm" in await resp.text()
        assert await site.db.get_session(site.seeded.hostile) is None
        async with http.post(
            f"{site.base}/ui/ops/import", data=form(csrf, True), headers=origin
        ) as resp:
            assert (
                resp.status == 200 and "Imported 1 session(s) and 2 message(s)" in await resp.text()
            )
    assert (await site.db.get_session(site.seeded.hostile))["title"] == HOSTILE_TITLE


async def test_sign_in_is_refused_with_retry_after_after_ten_wrong_keys(site: Site) -> None:
    async with _http() as http:
        for _ in range(10):
            async with http.post(
                f"{site.base}/ui/login", data={"key": "guess"}, headers={"Origin": site.base}
            ) as resp:
                assert resp.status == 401
        # now even the right key is refused, so a lucky guess cannot be told apart
        async with http.post(
            f"{site.base}/ui/login",
            data={"key": KEY},
            headers={"Origin": site.base},
            allow_redirects=False,
        ) as resp:
            assert resp.status == 429
            assert 1 <= int(resp.headers["Retry-After"]) <= 300
            assert "Too many wrong keys" in await resp.text()
        # the bearer key on the API is not the sign-in form's business
        status, _ = await _get(http, f"{site.base}/api/sessions", headers=BEARER)
        assert status == 200


def test_failure_limiter_window_success_and_memory_bound() -> None:
    now = [0.0]
    lim = FailureLimiter(max_failures=3, window_s=60, max_clients=100, clock=lambda: now[0])
    for i in range(3):
        assert lim.retry_after("a") is None
        now[0] = i * 10.0
        lim.failed("a")
    assert lim.retry_after("a") == 40  # at t=20; the first failure (t=0) leaves at t=60
    now[0] = 59.5
    assert lim.retry_after("a") == 1
    now[0] = 60.0
    assert lim.retry_after("a") is None  # one failure left the window: one more try
    lim.failed("a")
    assert lim.retry_after("a") == 10
    lim.succeeded("a")
    assert lim.retry_after("a") is None
    for i in range(1000):
        lim.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(lim) == 100
    assert lim.retry_after("10.0.0.0") is None  # the oldest were forgotten
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff") == "2001:db8::/64"
    assert client_key("::ffff:192.0.2.1") == "192.0.2.1"
    assert client_key("192.0.2.7") == "192.0.2.7"
