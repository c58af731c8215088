"""A loopback fake of an OpenAI-compatible chat completions endpoint.

Scripted responses are consumed in order; every request body is recorded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class FakeOpenAI:
    script: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    port: int = 0
    api_key: str | None = None  # set: GET /v1/models answers 401 to any other bearer key
    _runner: web.AppRunner | None = None

    def reply(
        self,
        content: str | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        status: int = 200,
        headers: dict[str, str] | None = None,
        raw: Any = None,
    ) -> None:
        if raw is not None or status != 200:
            self.script.append(
                (status, raw if raw is not None else {"error": {"message": "nope"}}, headers or {})
            )
            return
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        body = {
            "id": "c1",
            "model": "fake-model",
            "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 5},
        }
        self.script.append((200, body, headers or {}))

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        status, body, headers = (
            self.script.pop(0) if self.script else (500, {"error": "no script"}, {})
        )
        return web.Response(
            status=status,
            body=body if isinstance(body, bytes) else json.dumps(body).encode(),
            content_type="application/json",
            headers=headers,
        )

    async def _models(self, request: web.Request) -> web.Response:
        if self.api_key is not None:
            if request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
