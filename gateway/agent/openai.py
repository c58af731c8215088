"""An agent on any OpenAI-compatible `/v1/chat/completions` endpoint.

Retries 429/5xx and network errors with exponential backoff (honouring Retry-After), runs
tool calls (session_search) for a bounded number of rounds, and reports token usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from typing import Any

import aiohttp

from gateway.agent.base import AgentReply, ChatMessage, TurnContext, estimate_tokens
from gateway.agent.tools import session_search as session_search_tool
from gateway.errors import AgentError

log = logging.getLogger("gateway.agent.openai")
MAX_TOOL_ROUNDS = 4


def _encode(value: Any) -> bytes:
    """Compact JSON, every non-ASCII character escaped (so a lone surrogate a user typed
    travels as its escape rather than failing the UTF-8 encoding)."""
    return json.dumps(value, separators=(",", ":")).encode("ascii")


class EncodedMessages:
    """The request body's `messages`, each message made of a role and a text encoded once.

    Every turn sends the session's whole history window again (up to `history_messages`,
    200 by default), and the window hands each turn new dicts around the same strings
    (state/history.py), so a message's JSON is kept by its role and text: the lookup hashes
    nothing new and compares the strings by identity. A body of 50 or 200 such messages
    costs about half the CPU of encoding them anew (`python bench/request_body_bench.py`,
    docs/benchmarks.md). Messages with anything else (tool calls, a tool's answer,
    multimodal content) are encoded each time.

    Bounded by `limit` bytes of kept JSON in two generations: a new encoding goes into the
    young one, a hit in the old one moves there, and when the young one holds half the
    limit it becomes the old one and the old one is dropped, so the messages of the windows
    in use stay and the rest go."""

    def __init__(self, limit: int = 16 << 20) -> None:
        self._half = limit // 2
        self._young: dict[tuple[str, str], bytes] = {}
        self._old: dict[tuple[str, str], bytes] = {}
        self._young_bytes = 0

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def __contains__(self, message: ChatMessage) -> bool:
        """Whether `message`'s JSON is kept."""
        role, content = message.get("role"), message.get("content")
        if len(message) != 2 or type(role) is not str or type(content) is not str:
            return False
        return (role, content) in self._young or (role, content) in self._old

    def body(self, messages: Sequence[ChatMessage]) -> bytes:
        """`messages` as a JSON array, as `_encode(messages)` would write it."""
        parts = []
        for m in messages:
            role, content = m.get("role"), m.get("content")
            if len(m) != 2 or type(role) is not str or type(content) is not str:
                parts.append(_encode(m))
                continue
            key = (role, content)
            got = self._young.get(key)
            if got is None:
                got = self._old.pop(key, None)
                if got is None:
                    got = _encode({"role": role, "content": content})
                self._keep(key, got)
            parts.append(got)
        return b"[" + b",".join(parts) + b"]"

    def _keep(self, key: tuple[str, str], encoded: bytes) -> None:
        if self._young_bytes + len(encoded) > self._half:
            self._old, self._young, self._young_bytes = self._young, {}, 0
        self._young[key] = encoded
        self._young_bytes += len(encoded)


class OpenAIAgent:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None,
        *,
        timeout_s: float = 120,
        max_retries: int = 3,
        tools: Sequence[str] = ("session_search",),
        reply_tokens: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model: str | None = model
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_retries = max_retries
        # The tools' schemas are the same in every request: encoded once, spliced in.
        self._tools_json = (
            b',"tools":' + _encode([session_search_tool.SCHEMA])
            if "session_search" in tools
            else b""
        )
        self._reply_tokens = reply_tokens
        self._session: aiohttp.ClientSession | None = None
        self._messages = EncodedMessages()

    @staticmethod
    async def check_credentials(base_url: str, api_key: str | None) -> tuple[bool, str]:
        """Ask the provider (`GET /models`) whether it takes the key: (accepted, what it
        said). Only a 401 or 403 is a refusal; a server without the listing is given the
        benefit of the doubt."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
                async with http.get(f"{base_url.rstrip('/')}/models", headers=headers) as resp:
                    status = resp.status
                    body = await resp.json(content_type=None) if status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return False, f"unreachable ({type(exc).__name__})"
        if status in (401, 403):
            return False, f"the provider refused the key (HTTP {status})"
        if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
            return True, f"{len(body['data'])} model(s) offered"
        return True, f"the key was not refused (GET /models answered HTTP {status})"

    async def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Content-Type": "application/json"}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            self._session = aiohttp.ClientSession(headers=headers, timeout=self._timeout)
        return self._session

    async def before_reset(self, session_id: str, reason: str) -> None:
        return None  # nothing kept outside the transcript

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _complete(self, messages: list[ChatMessage], with_tools: bool) -> dict[str, Any]:
        body = b"".join(
            (
                b'{"model":',
                _encode(self.model),
                b',"messages":',
                self._messages.body(messages),
                self._tools_json if with_tools else b"",
                b',"max_tokens":%d' % self._reply_tokens if self._reply_tokens else b"",
                b"}",
            )
        )
        http = await self._http()
        delay = 0.5
        for attempt in range(self._max_retries + 1):
            retry_after: float | None = None
            try:
                async with http.post(f"{self.base_url}/chat/completions", data=body) as resp:
                    if resp.status == 200:
                        try:
                            data = json.loads(await resp.read())
                        except ValueError:
                            raise AgentError(
                                "the model endpoint answered 200 without JSON"
                            ) from None
                        if not isinstance(data, dict) or not data.get("choices"):
                            raise AgentError("the model endpoint returned no choices")
                        return data
                    text = (await resp.text())[:300]
                    if resp.status in (401, 403):
                        raise AgentError(f"the model endpoint refused the API key ({resp.status})")
                    if resp.status != 429 and resp.status < 500:
                        raise AgentError(f"the model endpoint answered {resp.status}: {text}")
                    ra = resp.headers.get("Retry-After")
                    retry_after = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
                    problem = f"HTTP {resp.status}"
            except (TimeoutError, aiohttp.ClientError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if attempt == self._max_retries:
                raise AgentError(
                    f"the model endpoint failed after {attempt + 1} attempts ({problem})"
                )
            wait = retry_after if retry_after is not None else delay * random.uniform(0.8, 1.2)
            log.warning("model call failed (%s); retrying in %.1fs", problem, wait)
            await asyncio.sleep(min(wait, 30))
            delay = min(delay * 2, 10)
        raise AgentError("unreachable")

    async def _ask(self, instruction: str, history: Sequence[ChatMessage]) -> str:
        transcript = "\n".join(
            f"{m.get('role')}: {m.get('content') or ''}"
            for m in history
            if m.get("role") in ("user", "assistant")
        )
        data = await self._complete(
            [{"role": "system", "content": instruction}, {"role": "user", "content": transcript}],
            with_tools=False,
        )
        text = ((data["choices"][0] or {}).get("message") or {}).get("content") or ""
        if not text.strip():
            raise AgentError("the model returned an empty answer")
        return text.strip()

    async def summarize(self, history: Sequence[ChatMessage], focus: str | None) -> str:
        instruction = (
            "Summarise the conversation below so it can be continued without it: decisions, "
            "facts, open questions, names and numbers. Be concise."
        )
        if focus:
            instruction += f" Pay most attention to: {focus}."
        return await self._ask(instruction, history)

    async def suggest_title(self, history: Sequence[ChatMessage]) -> str:
        text = await self._ask(
            "Reply with only a 3 to 7 word title for this conversation, no quotes.", history[:6]
        )
        return text.strip().strip('"').splitlines()[0][:100]

    async def respond(self, history: Sequence[ChatMessage], ctx: TurnContext) -> AgentReply:
        messages: list[ChatMessage] = []
        if ctx.system_prompt:
            messages.append({"role": "system", "content": ctx.system_prompt})
        messages.extend(history)
        tool_messages: list[ChatMessage] = []
        tokens_in = tokens_out = 0
        estimated = False
        for _round in range(MAX_TOOL_ROUNDS + 1):
            can_call = ctx.run_tool is not None and _round < MAX_TOOL_ROUNDS
            data = await self._complete(messages, with_tools=can_call)
            msg = (data["choices"][0] or {}).get("message") or {}
            usage = data.get("usage")
            if isinstance(usage, dict) and "prompt_tokens" in usage:
                tokens_in += int(usage.get("prompt_tokens") or 0)
                tokens_out += int(usage.get("completion_tokens") or 0)
            else:  # a server that reports no usage: our estimate of this round's
                estimated = True
                tokens_in += sum(estimate_tokens(m) for m in messages)
                tokens_out += estimate_tokens(msg)
            calls = msg.get("tool_calls") or []
            if not calls or not can_call:
                return AgentReply(
                    text=msg.get("content") or "",
                    input_tokens=tokens_in,
                    output_tokens=tokens_out,
                    tool_messages=tuple(tool_messages),
                    model=data.get("model") or self.model,
                    tokens_estimated=estimated,
                )
            assistant = {"role": "assistant", "content": msg.get("content"), "tool_calls": calls}
            messages.append(assistant)
            tool_messages.append(assistant)
            for call in calls:
                fn = call.get("function") or {}
                name = fn.get("name") or ""
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments must be an object")
                    result = await ctx.run_tool(name, args) if ctx.run_tool else "{}"
                except ValueError as exc:
                    result = json.dumps({"success": False, "error": f"bad arguments: {exc}"})
                reply = {
                    "role": "tool",
                    "tool_call_id": call.get("id"),
                    "content": result,
                    "name": name,
                }
                messages.append(reply)
                tool_messages.append(reply)
        raise AgentError("too many tool rounds")
