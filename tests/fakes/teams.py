"""A loopback fake of the Bot Framework around a Teams bot: the OpenID metadata and JWKS
(an RSA key made here), activity JWTs signed like the Bot Connector's, the OAuth token
endpoint (client credentials), and the Connector REST subset a bot calls (activities,
replies, typing, new conversations), each call recorded."""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jwt
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes import Outage, connection_closer, wait_for_count

APP_ID = "6f1c2b9e-0000-4000-8000-00000000b07"
PASSWORD = "fake-app-password"
BOT_ID = f"28:{APP_ID}"
TENANT = "72f988bf-0000-4000-8000-0000000000aa"
ISSUER = "https://api.botframework.com"


def _rsa() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class FakeTeams:
    outage: Outage = field(default_factory=Outage)  # failures injected into sends
    app_id: str = APP_ID
    password: str = PASSWORD
    port: int = 0
    key: rsa.RSAPrivateKey = field(default_factory=_rsa)
    kid: str = "fake-key-1"
    endorsements: tuple[str, ...] = ("msteams",)
    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # (kind, path, body)
    failures: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)
    tokens: set[str] = field(default_factory=set)
    key_fetches: int = 0
    keep_alive: bool = True  # False: every answer closes its connection (the next call connects)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1700000000001))
    _runner: web.AppRunner | None = None

    # --- addresses ---------------------------------------------------------------------

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:  # like https://smba.trafficmanager.net/amer/
        return f"{self.root}/amer/"

    @property
    def metadata_url(self) -> str:
        return f"{self.root}/v1/.well-known/openidconfiguration"

    @property
    def token_url(self) -> str:
        return f"{self.root}/botframework.com/oauth2/v2.0/token"

    # --- what the bot did ----------------------------------------------------------------

    def posted(self, kind: str = "message") -> list[dict[str, Any]]:
        """Activities of `kind` the bot posted, each with `_conversation` and `_reply_to`."""
        return [b for k, _p, b in self.calls if k == "activity" and b.get("type") == kind]

    async def wait_posted(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return await wait_for_count(self.posted, n, timeout, "posted activities")

    def created(self) -> list[dict[str, Any]]:
        return [b for k, _p, b in self.calls if k == "create"]

    def token_requests(self) -> list[dict[str, Any]]:
        return [b for k, _p, b in self.calls if k == "token"]

    def fail_next(self, kind: str, status: int, headers: dict[str, str] | None = None) -> None:
        """The next call of `kind` (an activity type such as message or typing, create,
        token) answers `status`."""
        self.failures.setdefault(kind, []).append((status, headers or {}))

    def rotate_key(self) -> None:
        self.key, self.kid = _rsa(), f"fake-key-{uuid.uuid4().hex[:8]}"

    # --- playing the Bot Connector ---------------------------------------------------------

    def token_for(
        self,
        activity: dict[str, Any],
        *,
        key: rsa.RSAPrivateKey | None = None,
        kid: str | None = None,
        age_s: int = 0,
        lifetime_s: int = 3600,
        **claims: Any,
    ) -> str:
        """A JWT as the Bot Connector signs one for `activity` (claims may be overridden):
        the service URL in the lowercase `serviceurl` claim, a `typ`, `kid` and `x5t` header."""
        now = int(time.time()) - age_s
        body = {
            "serviceurl": activity.get("serviceUrl"),
            "nbf": now - 5,
            "exp": now + lifetime_s,
            "iss": ISSUER,
            "aud": self.app_id,
        }
        body.update(claims)
        kid = kid or self.kid
        return jwt.encode(
            body, key or self.key, algorithm="RS256", headers={"typ": "JWT", "kid": kid, "x5t": kid}
        )

    async def deliver(
        self,
        url: str,
        activity: dict[str, Any],
        token: str | None = None,
        authorization: str | None = None,
    ) -> int:
        """POST an activity to the bot as the Bot Connector does; the HTTP status."""
        auth = (
            authorization
            if authorization is not None
            else f"Bearer {token or self.token_for(activity)}"
        )
        headers = {"Authorization": auth} if auth else {}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=activity, headers=headers) as resp:
                return resp.status

    def activity(
        self,
        text: str,
        *,
        kind: str = "personal",
        conversation: str = "a:1personal",
        user: str = "29:1ann",
        name: str = "Ann",
        aad: str | None = "aad-ann",
        activity_id: str | None = None,
        mention: bool = False,
        channel: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A message activity as Teams sends it (`<at>` tag and mention entity when asked)."""
        aid = activity_id or str(next(self._ids))
        sender: dict[str, Any] = {"id": user, "name": name}
        if aad:
            sender["aadObjectId"] = aad
        entities: list[dict[str, Any]] = [{"type": "clientInfo", "locale": "en-US"}]
        if mention:
            text = f"<at>Switchboard</at> {text}"
            entities.append(
                {
                    "type": "mention",
                    "text": "<at>Switchboard</at>",
                    "mentioned": {"id": BOT_ID, "name": "Switchboard"},
                }
            )
        conv: dict[str, Any] = {"id": conversation, "conversationType": kind, "tenantId": TENANT}
        if kind != "personal":
            conv["isGroup"] = True
        data: dict[str, Any] = {"tenant": {"id": TENANT}}
        if kind == "channel":
            data["channel"] = {"id": channel or conversation.split(";")[0]}
            data["team"] = {"id": "19:team-general@thread.tacv2"}
        body = {
            "type": "message",
            "id": aid,
            "timestamp": "2026-12-01T10:00:00.000Z",
            "serviceUrl": self.service_url,
            "channelId": "msteams",
            "from": sender,
            "conversation": conv,
            "recipient": {"id": BOT_ID, "name": "Switchboard"},
            "textFormat": "plain",
            "text": text,
            "entities": entities,
            "channelData": data,
        }
        body.update(extra)
        return body

    def installed(self, team_channel: str) -> dict[str, Any]:
        """The conversationUpdate Teams sends when the bot is added to a team."""
        return {
            "type": "conversationUpdate",
            "id": f"f:{uuid.uuid4().hex}",
            "channelId": "msteams",
            "serviceUrl": self.service_url,
            "recipient": {"id": BOT_ID, "name": "Switchboard"},
            "from": {"id": "29:1ann", "aadObjectId": "aad-ann"},
            "conversation": {
                "id": team_channel,
                "conversationType": "channel",
                "isGroup": True,
                "tenantId": TENANT,
            },
            "membersAdded": [{"id": BOT_ID}],
            "channelData": {
                "eventType": "teamMemberAdded",
                "tenant": {"id": TENANT},
                "team": {"id": team_channel, "name": "Ops"},
            },
        }

    # --- the server --------------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application(
            middlewares=[
                self.outage.middleware(lambda r: r.method == "POST" and "/activities" in r.path),
                connection_closer(self),
            ]
        )
        app.router.add_get("/v1/.well-known/openidconfiguration", self._metadata)
        app.router.add_get("/v1/.well-known/keys", self._keys)
        app.router.add_post("/botframework.com/oauth2/v2.0/token", self._token)
        app.router.add_post("/amer/v3/conversations", self._create)
        app.router.add_post("/amer/v3/conversations/{conv}/activities", self._activity)
        app.router.add_post("/amer/v3/conversations/{conv}/activities/{reply}", self._activity)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "issuer": ISSUER,
                "authorization_endpoint": "https://invalid.botframework.com",
                "jwks_uri": f"{self.root}/v1/.well-known/keys",
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            }
        )

    async def _keys(self, request: web.Request) -> web.Response:
        self.key_fetches += 1
        jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        jwk.update({"kid": self.kid, "use": "sig", "endorsements": list(self.endorsements)})
        return web.json_response({"keys": [jwk]})

    def _failure(self, kind: str) -> web.Response | None:
        queued = self.failures.get(kind)
        if not queued:
            return None
        status, headers = queued.pop(0)
        return web.json_response(
            {
                "error": {
                    "code": "Throttled" if status == 429 else "ServiceError",
                    "message": "fake failure",
                }
            },
            status=status,
            headers=headers,
        )

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(await request.post())
        self.calls.append(("token", request.path, form))
        failure = self._failure("token")
        if failure is not None:
            return failure
        if (
            form.get("grant_type") != "client_credentials"
            or form.get("scope") != f"{ISSUER}/.default"
        ):
            return web.json_response({"error": "invalid_request"}, status=400)
        if form.get("client_id") != self.app_id or form.get("client_secret") != self.password:
            return web.json_response(
                {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided.",
                },
                status=401,
            )
        token = f"fake-bot-token-{uuid.uuid4().hex}"
        self.tokens.add(token)
        return web.json_response(
            {
                "token_type": "Bearer",
                "expires_in": 3599,
                "ext_expires_in": 3599,
                "access_token": token,
            }
        )

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        return header.startswith("Bearer ") and header[7:] in self.tokens

    async def _activity(self, request: web.Request) -> web.Response:
        body = await request.json()
        body["_conversation"] = request.match_info["conv"]
        body["_reply_to"] = request.match_info.get("reply")
        self.calls.append(("activity", request.raw_path, body))
        if not self._authorised(request):
            return web.json_response({"message": "Authorization has been denied"}, status=401)
        failure = self._failure(str(body.get("type")))
        if failure is not None:
            body["_failed"] = True
            return failure
        return web.json_response({"id": str(next(self._ids))}, status=201)

    async def _create(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("create", request.path, body))
        if not self._authorised(request):
            return web.json_response({"message": "Authorization has been denied"}, status=401)
        failure = self._failure("create")
        if failure is not None:
            return failure
        channel = body["channelData"]["channel"]["id"]
        root = str(next(self._ids))
        return web.json_response(
            {"id": f"{channel};messageid={root}", "activityId": root}, status=201
        )
