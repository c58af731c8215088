"""The dashboard as two aiohttp sub-applications (`/ui` pages, `/api` JSON) sharing one
`Dashboard` object (its state, gateway.web.context, is what the handlers see), and the
guard middleware every request of both passes through:
security headers, loopback-host check, sign-in, origin and CSRF checks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import Config
from gateway.config import _is_loopback as is_loopback
from gateway.web import api, auth, pages
from gateway.web.context import DASHBOARD, DashboardSettings, DashboardState
from gateway.web.queries import prices_of

log = logging.getLogger("gateway.web")

PUBLIC_PATHS = frozenset({"/ui/login", "/api/openapi.json"})
# Their handlers check the CSRF token themselves, reading it from the multipart stream
# ahead of the upload (the middleware cannot read the body without buffering the file).
MULTIPART_PATHS = frozenset({"/ui/ops/import"})


class Dashboard(DashboardState):
    """The dashboard's state with the two sub-applications built on it and their guard."""

    def subapps(self) -> dict[str, Callable[[], web.Application]]:
        """Prefix -> factory, for the api adapter to mount."""
        return {"/ui": self.ui_app, "/api": self.api_app}

    def ui_app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app[DASHBOARD] = self
        pages.register(app.router)
        return app

    def api_app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app[DASHBOARD] = self
        api.register(app.router)
        return app

    # --- the guard -------------------------------------------------------------------

    @web.middleware
    async def guard(self, request: web.Request, handler: auth.Handler) -> web.StreamResponse:
        try:
            response = await self._guard(request, handler)
        except web.HTTPException as exc:
            for name, value in auth.SECURITY_HEADERS.items():
                exc.headers.setdefault(name, value)
            raise
        auth.add_security_headers(response)
        return response

    async def _guard(self, request: web.Request, handler: auth.Handler) -> web.StreamResponse:
        api = request.path.startswith("/api/")
        key = self.settings.key
        if key is None and not auth.host_is_loopback(request):
            return _refuse(
                request, api, 403, "without a key the dashboard answers loopback names only"
            )
        mutating = request.method in auth.MUTATING
        if mutating and "Origin" in request.headers and not auth.same_origin(request):
            return _refuse(request, api, 403, "cross-origin request refused")
        if request.path in PUBLIC_PATHS or request.path.startswith("/ui/static/"):
            if mutating and not auth.same_origin(request):
                return _refuse(request, api, 403, "cross-origin request refused")
            return await handler(request)
        ws = self.sessions.get(request.cookies.get(auth.COOKIE))
        # API clients: the bearer key, or (no key, loopback) nothing at all; a browser's
        # cross-origin attempts are stopped by the Origin check above
        direct = api and ws is None and (key is None or auth.key_matches(auth.bearer(request), key))
        if ws is None and not direct:
            if api:
                return _refuse(request, True, 401, "sign in at /ui/login or send the bearer key")
            from gateway.web.html import url

            raise web.HTTPFound(url("/ui/login", next=request.path_qs))
        if mutating and ws is not None:
            if not auth.same_origin(request):
                return _refuse(request, api, 403, "cross-origin request refused")
            token = request.headers.get(auth.CSRF_HEADER)
            deferred = False
            if token is None and request.content_type == "multipart/form-data":
                if request.path not in MULTIPART_PATHS:
                    return _refuse(request, api, 403, "CSRF token missing")
                deferred = True
            elif token is None and request.content_type == "application/x-www-form-urlencoded":
                form = await request.post()
                value = form.get(auth.CSRF_FIELD)
                token = value if isinstance(value, str) else ""
            if not deferred and not auth.key_matches(token or "", ws.csrf):
                return _refuse(request, api, 403, "CSRF token missing or wrong; reload the page")
        request[auth.WEB_SESSION] = ws
        return await handler(request)


def settings_from(config: Config) -> DashboardSettings | None:
    """The dashboard's settings, or None when it is off: disabled, or listening off
    loopback with no key to sign in with."""
    dash, api = config.dashboard, config.api
    if not dash.enabled or not api.enabled:
        return None
    key = config.secret("dashboard.key_env") or config.secret("platforms.api.key_env")
    if key is None and not is_loopback(api.host):
        log.warning(
            "the dashboard is off: %s is not loopback and no key is configured "
            "(dashboard.key_env or platforms.api.key_env)",
            api.host,
        )
        return None
    prices = prices_of(dash.prices)
    return DashboardSettings(
        key=key,
        session_hours=float(dash.session_hours),
        secure_cookie=dash.secure_cookie,
        prices=prices,
    )


def _refuse(request: web.Request, api: bool, status: int, message: str) -> web.Response:
    """The guard's refusal: JSON for the API, a page for people with the reason and a
    link back to where the refused form was (a reload gives it a fresh token)."""
    if api:
        return web.json_response({"error": {"message": message}}, status=status)
    from gateway.web.html import t

    referer = urlsplit(request.headers.get("Referer") or "")
    back = "/ui/sessions"
    if referer.netloc.lower() == request.host.lower() and referer.path.startswith("/ui/"):
        back = referer.path + (f"?{referer.query}" if referer.query else "")
    body = t(
        '<p class="error" role="alert">{}.</p><p><a id="go-back" href="{}">Back to the page</a> '
        "(it loads afresh, so its forms work again).</p>",
        message,
        back,
    )
    return pages.page(request, "Not done", body, status=status)
