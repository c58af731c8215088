"""Microsoft Teams inbound authentication: the Bot Framework's bearer JWT on every activity.

`BotFrameworkAuth` fetches the signing keys from the OpenID metadata's `jwks_uri`, keeps
them (refreshing daily, and on an unknown `kid` at most once per `refresh_floor_s`), and
checks a token's RS256 signature, issuer, audience (the bot's app id) and lifetime; then
`check_activity` ties the token to the activity (its `serviceurl` claim, the key's channel
endorsements). It knows nothing of messages or sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import AdapterError, TransientError

log = logging.getLogger("gateway.adapters.teams")
ISSUER = "https://api.botframework.com"
# The Bot Connector issues the activity's service URL in an all-lowercase claim (Microsoft's
# SDKs read `serviceurl` too); the activity itself spells its field `serviceUrl`.
SERVICE_URL_CLAIM = "serviceurl"
DEFAULT_METADATA_URL = "https://login.botframework.com/v1/.well-known/openidconfiguration"
CLOCK_SKEW_S = 300.0  # the Bot Framework's authentication spec allows five minutes
KEYS_TTL_S = 24 * 3600.0


class TokenRefused(AdapterError):
    """An inbound request whose bearer token is missing or not acceptable: `status` is 401
    (we cannot tell who sent it) or 403 (a valid token, but not for this bot or activity)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Verified:
    """A token that passed: its claims and the channels its signing key is endorsed for."""

    claims: Mapping[str, Any]
    endorsements: frozenset[str] | None  # None: the key lists no endorsements


@dataclass
class _Key:
    key: Any  # a PyJWK
    endorsements: frozenset[str] | None


@dataclass
class BotFrameworkAuth:
    app_id: str
    metadata_url: str = DEFAULT_METADATA_URL
    issuer: str = ISSUER
    leeway_s: float = CLOCK_SKEW_S
    refresh_floor_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    _keys: dict[str, _Key] = field(default_factory=dict)
    _fetched_at: float | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def verify(self, authorization: str | None, http: Any) -> Verified:
        """The claims of `Authorization: Bearer <jwt>`, or TokenRefused. `http` is an
        aiohttp ClientSession used to fetch keys; fetching failures raise TransientError."""
        import jwt

        if not authorization or not authorization.startswith("Bearer "):
            raise TokenRefused(401, "missing bearer token")
        token = authorization[len("Bearer ") :].strip()
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenRefused(401, "malformed token") from exc
        if header.get("alg") != "RS256":  # never "none", never an HMAC keyed by a public key
            raise TokenRefused(401, f"unexpected algorithm {header.get('alg')!r}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused(401, "token names no key")
        key = await self._key(kid, http)
        if key is None:
            raise TokenRefused(401, "token signed by an unknown key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=["RS256"],
                audience=self.app_id,
                issuer=self.issuer,
                leeway=self.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except (jwt.InvalidAudienceError, jwt.InvalidIssuerError) as exc:
            raise TokenRefused(403, f"token not for this bot ({exc})") from exc
        except jwt.PyJWTError as exc:  # signature, expiry, not-before, missing claims
            raise TokenRefused(401, f"token refused ({exc})") from exc
        return Verified(claims, key.endorsements)

    @staticmethod
    def check_activity(verified: Verified, activity: Mapping[str, Any]) -> None:
        """The activity is the one the token was issued for: the same serviceUrl (replies
        carry our own token there, so an unsigned one must never be trusted) and a channel
        the signing key is endorsed for."""
        claimed = verified.claims.get(SERVICE_URL_CLAIM)
        given = activity.get("serviceUrl")
        if not isinstance(claimed, str):
            raise TokenRefused(403, f"the token has no {SERVICE_URL_CLAIM} claim")
        if not isinstance(given, str):
            raise TokenRefused(403, "the activity has no serviceUrl")
        if claimed.rstrip("/").lower() != given.rstrip("/").lower():
            raise TokenRefused(403, "serviceUrl does not match the token")
        channel = activity.get("channelId")
        if verified.endorsements is not None and channel not in verified.endorsements:
            raise TokenRefused(403, f"signing key not endorsed for channel {channel!r}")

    async def _key(self, kid: str, http: Any) -> _Key | None:
        async with self._lock:
            age = None if self._fetched_at is None else self.clock() - self._fetched_at
            if kid in self._keys and age is not None and age <= KEYS_TTL_S:
                return self._keys[kid]
            if age is None or age >= self.refresh_floor_s:  # stale, or a kid we have not seen
                try:
                    await self._refresh(http)
                except TransientError:
                    if not self._keys:
                        raise
                    log.warning("could not refresh the Bot Framework keys; using the cached ones")
            return self._keys.get(kid)

    async def _refresh(self, http: Any) -> None:
        import aiohttp
        import jwt

        try:
            async with http.get(self.metadata_url) as resp:
                resp.raise_for_status()
                metadata = await resp.json(content_type=None)
            async with http.get(metadata["jwks_uri"]) as resp:
                resp.raise_for_status()
                jwks = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, KeyError, TypeError, ValueError) as exc:
            raise TransientError(f"cannot fetch the Bot Framework signing keys ({exc})") from exc
        keys: dict[str, _Key] = {}
        for raw in jwks.get("keys", []) if isinstance(jwks, dict) else []:
            try:
                key = jwt.PyJWK(raw, algorithm="RS256")
            except jwt.PyJWTError:
                continue  # a key type we do not use
            endorsed = raw.get("endorsements")
            kid = raw.get("kid")
            if isinstance(kid, str):
                keys[kid] = _Key(key, frozenset(endorsed) if isinstance(endorsed, list) else None)
        self._keys = keys
        self._fetched_at = self.clock()
        log.info("fetched %d Bot Framework signing keys", len(keys))
