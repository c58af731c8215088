"""The dashboard's HTML pages under /ui, rendered on the server (every value through
gateway/web/html.py). Reading works without JavaScript; every change goes through a form
with the session's CSRF token and a confirmation step. This module signs in and out,
serves the static files and routes every page; the page families are in pages_sessions.py
and pages_ops.py, their frame in layout.py."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from gateway.web import auth
from gateway.web.context import DashboardState as Dashboard
from gateway.web.context import dashboard_of
from gateway.web.html import Safe, t
from gateway.web.layout import STATIC_TYPES, page, with_errors
from gateway.web.pages_ops import empty_view, import_view, insights_view, ops_view, prune_view
from gateway.web.pages_sessions import (
    delete_form,
    rename_form,
    search_view,
    session_view,
    sessions_list,
)
from gateway.web.ratelimit import client_key

# --- sign-in ------------------------------------------------------------------------------


def _next(raw: str | None) -> str:
    # only our own pages: never an absolute or scheme-relative URL
    return (
        raw
        if raw and raw.startswith("/ui/") and not raw.startswith("//") and "\\" not in raw
        else "/ui/sessions"
    )


async def login_form(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    target = _next(request.query.get("next"))
    if d.settings.key is None:  # loopback without a key: a session for the CSRF token
        return _signed_in(d, target)
    return page(request, "Sign in", _login_body(target, ""))


def _login_body(target: str, error: str) -> Safe:
    return t(
        '{}<form method="post" action="/ui/login" class="login">'
        '<input type="hidden" name="next" value="{}">'
        '<label>Key <input type="password" name="key" autocomplete="current-password" required autofocus></label>'
        "<button>Sign in</button></form>"
        "<p class=hint>The key is the one in the environment variable that dashboard.key_env "
        "(or platforms.api.key_env) names.</p>",
        t('<p class="error" role="alert">{}</p>', error) if error else "",
        target,
    )


def _signed_in(d: Dashboard, target: str) -> web.Response:
    ws = d.sessions.create()
    response = web.HTTPSeeOther(target)
    auth.set_cookie(response, ws, d.settings.secure_cookie)
    raise response


async def login(request: web.Request) -> web.StreamResponse:
    d = dashboard_of(request)
    form = await request.post()
    target = _next(str(form.get("next") or ""))
    if d.settings.key is None:
        return _signed_in(d, target)
    client = client_key(request.remote)
    wait = d.sign_in_limiter.retry_after(client)
    if wait is not None:
        response = page(
            request,
            "Sign in",
            _login_body(target, f"Too many wrong keys from your address: try again in {wait} s."),
            status=429,
        )
        response.headers["Retry-After"] = str(wait)
        return response
    if auth.key_matches(str(form.get("key") or ""), d.settings.key):
        d.sign_in_limiter.succeeded(client)
        return _signed_in(d, target)
    d.sign_in_limiter.failed(client)
    return page(request, "Sign in", _login_body(target, "That key is not right."), status=401)


async def logout(request: web.Request) -> web.StreamResponse:
    dashboard_of(request).sessions.drop(request.cookies.get(auth.COOKIE))
    response = web.HTTPSeeOther("/ui/login")
    response.del_cookie(auth.COOKIE, path="/")
    raise response


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        raise web.HTTPNotFound()
    try:
        data = resources.files("gateway.web").joinpath("static", name).read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise web.HTTPNotFound() from None
    return web.Response(
        body=data, content_type=STATIC_TYPES[suffix], headers={"Cache-Control": "max-age=300"}
    )


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/ui/sessions")


def register(router: web.UrlDispatcher) -> None:
    for method, path, handler in (
        ("GET", "/", home),
        ("GET", "/login", login_form),
        ("POST", "/login", login),
        ("POST", "/logout", logout),
        ("GET", "/static/{name}", static),
        ("GET", "/sessions", sessions_list),
        ("GET", "/sessions/{id}", session_view),
        ("GET", "/sessions/{id}/rename", rename_form),
        ("POST", "/sessions/{id}/rename", rename_form),
        ("GET", "/sessions/{id}/delete", delete_form),
        ("POST", "/sessions/{id}/delete", delete_form),
        ("GET", "/search", search_view),
        ("GET", "/insights", insights_view),
        ("GET", "/ops", ops_view),
        ("GET", "/ops/prune", prune_view),
        ("POST", "/ops/prune", prune_view),
        ("GET", "/ops/empty", empty_view),
        ("POST", "/ops/empty", empty_view),
        ("POST", "/ops/import", import_view),
    ):
        router.add_route(method, path, with_errors(handler))
