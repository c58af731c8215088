"""Microsoft Teams outbound: the bot's access token and the Bot Connector REST calls.

`BotToken` gets a token with the OAuth client-credentials flow (app id + app password) and
keeps it until shortly before it expires. `Connector` posts activities and creates
conversations at the `serviceUrl` a `ConversationRef` keeps for each conversation, mapping
HTTP answers onto the gateway's errors (429 -> RetryAfter, 5xx and network ->
TransientError, a refused app password -> InvalidToken), retried through `call_with_retry`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gateway.adapters.base import DEFAULT_BACKOFF, Backoff, call_with_retry
from gateway.errors import AdapterError, InvalidToken, PlatformRefused, RetryAfter, TransientError

log = logging.getLogger("gateway.adapters.teams")
DEFAULT_TOKEN_URL = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
SCOPE = "https://api.botframework.com/.default"
EARLY_S = 300.0  # renew this long before the token's stated expiry
REFUSALS = ("invalid_client", "unauthorized_client", "invalid_grant")
THREAD_MARK = ";messageid="


def split_conversation(conversation_id: str) -> tuple[str, str | None]:
    """`19:x@thread.tacv2;messageid=17` -> ("19:x@thread.tacv2", "17"); others unchanged."""
    base, mark, root = conversation_id.partition(THREAD_MARK)
    return base, (root or None) if mark else None


def conversation_of(chat_id: str, thread_id: str | None) -> str:
    return f"{chat_id}{THREAD_MARK}{thread_id}" if thread_id else chat_id


@dataclass(frozen=True)
class ConversationRef:
    """What a proactive message to a conversation needs, kept across restarts."""

    service_url: str
    kind: str  # personal | groupChat | channel
    tenant_id: str | None = None
    bot_id: str | None = None

    @classmethod
    def of(cls, activity: Mapping[str, Any]) -> tuple[str, ConversationRef] | None:
        """(chat_id, reference) for any activity that names its conversation."""
        conversation = activity.get("conversation") or {}
        service_url = activity.get("serviceUrl")
        if (
            not isinstance(conversation, dict)
            or not conversation.get("id")
            or not isinstance(service_url, str)
        ):
            return None
        data = activity.get("channelData") or {}
        kind = str(conversation.get("conversationType") or "personal")
        chat = str(conversation["id"])
        if kind == "channel":
            chat = str((data.get("channel") or {}).get("id") or split_conversation(chat)[0])
        tenant = conversation.get("tenantId") or (data.get("tenant") or {}).get("id")
        bot = (activity.get("recipient") or {}).get("id")
        return chat, cls(service_url, kind, tenant, bot)

    def dumps(self) -> str:
        return json.dumps(
            {
                "service_url": self.service_url,
                "kind": self.kind,
                "tenant_id": self.tenant_id,
                "bot_id": self.bot_id,
            }
        )

    @classmethod
    def loads(cls, text: str) -> ConversationRef | None:
        try:
            data = json.loads(text)
            return cls(
                str(data["service_url"]),
                str(data["kind"]),
                data.get("tenant_id"),
                data.get("bot_id"),
            )
        except (ValueError, KeyError, TypeError):
            return None


class BotToken:
    """The bot's bearer token for the Connector, cached until `expires_in - EARLY_S`."""

    def __init__(
        self,
        http: Any,
        token_url: str,
        app_id: str,
        password: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self.token_url = token_url
        self._form = {
            "grant_type": "client_credentials",
            "client_id": app_id,
            "client_secret": password,
            "scope": SCOPE,
        }
        self._clock = clock
        self._token: str | None = None
        self._until = 0.0
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        self._token = None

    async def get(self) -> str:
        async with self._lock:
            if self._token is None or self._clock() >= self._until:
                self._token, lifetime = await self._fetch()
                self._until = self._clock() + max(0.0, lifetime - EARLY_S)
            return self._token

    async def _fetch(self) -> tuple[str, float]:
        import aiohttp

        try:
            async with self._http.post(self.token_url, data=self._form) as resp:
                status, headers = resp.status, resp.headers
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            raise TransientError(
                f"the token endpoint is unreachable ({type(exc).__name__})"
            ) from exc
        body = body if isinstance(body, dict) else {}
        if status == 200 and isinstance(body.get("access_token"), str):
            return body["access_token"], float(body.get("expires_in") or 3600)
        error = str(body.get("error") or f"HTTP {status}")
        if status == 401 or (status == 400 and error in REFUSALS):
            raise InvalidToken(f"the token endpoint refused the app id or password ({error})")
        if status == 429:
            raise RetryAfter(_retry_after(headers))
        if status >= 500:
            raise TransientError(f"the token endpoint answered {status}")
        raise AdapterError(f"the token endpoint answered {status} ({error})")


def _retry_after(headers: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0  # an HTTP date: wait a little, the next answer says again


class Connector:
    """Bot Connector REST (v3) at a conversation's serviceUrl."""

    def __init__(self, http: Any, token: BotToken, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self._http = http
        self._token = token
        self._backoff = backoff

    async def post_activity(
        self,
        service_url: str,
        conversation_id: str,
        activity: Mapping[str, Any],
        reply_to: str | None = None,
        *,
        once: bool = False,
    ) -> dict[str, Any]:
        """Send an activity into a conversation (as a reply to `reply_to` when given);
        `once`: a single attempt, for what is not worth a wait (typing)."""
        path = f"v3/conversations/{quote(conversation_id, safe='')}/activities"
        if reply_to:
            path += f"/{quote(reply_to, safe='')}"
        return await self._call(service_url, path, activity, once)

    async def create_conversation(
        self, service_url: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        """POST /v3/conversations: a new conversation (in Teams, a new channel thread)."""
        return await self._call(service_url, "v3/conversations", params)

    async def _call(
        self, service_url: str, path: str, body: Mapping[str, Any], once: bool = False
    ) -> dict[str, Any]:
        import yarl

        # ids hold ':', ';' and '@'; send them percent-encoded, as the Bot Framework SDKs do
        url = yarl.URL(service_url.rstrip("/") + "/" + path, encoded=True)
        refreshed = False

        async def attempt() -> dict[str, Any]:
            nonlocal refreshed
            import aiohttp

            token = await self._token.get()
            try:
                async with self._http.post(
                    url, json=body, headers={"Authorization": f"Bearer {token}"}
                ) as resp:
                    status, headers = resp.status, resp.headers
                    text = await resp.text()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise TransientError(
                    f"the connector is unreachable ({type(exc).__name__})"
                ) from exc
            if status in (200, 201, 202):
                return _json_object(text)
            if status == 429:
                raise RetryAfter(_retry_after(headers))
            if status >= 500:
                raise TransientError(f"the connector answered {status}")
            if status == 401 and not refreshed:  # a token revoked or expired early: once more
                refreshed = True
                self._token.invalidate()
                raise TransientError("the connector refused the token; fetching a new one")
            raise ConnectorRefused(status, text[:300])

        if once:
            return await attempt()
        return await call_with_retry(attempt, backoff=self._backoff, log=log)


class ConnectorRefused(PlatformRefused):
    """The Connector refused a call for good (403: not in that conversation, 404 ...)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the connector answered {status}: {detail}")
        self.status = status


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
