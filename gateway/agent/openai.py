"""An agent on any OpenAI-compatible `/v1/chat/completions` endpoint.

Retries 429/5xx and network errors with exponential backoff (honouring Retry-After), runs
tool calls (session_search) for a bounded number of rounds, and reports token usage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import OrderedDict
from collections.abc import Sequence
from itertools import repeat
from json.encoder import encode_basestring_ascii as _quote
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


def _one(message: ChatMessage) -> bytes:
    """One message as `_encode` writes it; a message of a role and a text (the usual one)
    through json's C string encoder alone (0.4 us against json.dumps's 2.4 us here for an
    80-character text)."""
    role, content = message.get("role"), message.get("content")
    if len(message) == 2 and type(role) is str and type(content) is str:
        return ('{"role":' + _quote(role) + ',"content":' + _quote(content) + "}").encode("ascii")
    return _encode(message)


# where the run of the last request's messages may start, tried in order (a window's
# oldest message can be a text that stands in it more than once: "ok", "thanks")
TRIES = 4


class EncodedMessages:
    """The request body's `messages`, reusing what the session's last request encoded.

    Every turn sends the session's whole history window again (up to `history_messages`,
    200 by default): the last request's messages, the oldest perhaps fallen out, and the
    new ones. So the JSON of each session's last request is kept message by message, and a
    request that is the last one's system prompt, then a run of its messages, then new ones
    encodes only the new ones. The run is found and checked in C: the window hands each
    turn new dicts around the same strings (state/history.py), so comparing the texts and
    roles of 200 messages compares pointers. Anything else (another system prompt, an edited
    or undone history, a message with more than a role and a text, such as a tool call) is
    encoded whole, message by message. A body of 200 messages costs about 40% of
    `json.dumps` of the list, and a turn with a 200-message history about a fifth fewer
    instructions in the daemon (`python bench/request_body_bench.py`, docs/benchmarks.md).

    Bounded by `limit` bytes of kept JSON (and PER_MESSAGE per message), the sessions used
    least recently dropped first."""

    # bytes counted per kept message beside its JSON (the lists' slots, the bytes object)
    PER_MESSAGE = 100

    def __init__(self, limit: int = 16 << 20) -> None:
        self._limit = limit
        self._used = 0
        # session -> (texts, roles, each message's JSON, their size)
        self._last: OrderedDict[str, tuple[list[Any], list[Any], list[bytes], int]] = OrderedDict()

    def __len__(self) -> int:
        """Sessions whose last request is kept."""
        return len(self._last)

    @property
    def used(self) -> int:
        return self._used

    def body(self, messages: Sequence[ChatMessage], session: str | None = None) -> bytes:
        """`messages` as a JSON array: with no session `_encode(messages)`, with one the
        same JSON (a message of a role and a text may have its two keys the other way
        round)."""
        if session is None:
            return _encode(messages)
        texts = list(map(dict.get, messages, repeat("content")))
        roles = list(map(dict.get, messages, repeat("role")))
        plain = set(map(len, messages)) <= {2} and None not in texts and None not in roles
        kept = self._reused(session, texts, roles) if plain else None
        parts, size = kept if kept is not None else ([], 0)
        for m in messages[len(parts) :]:
            part = _one(m)
            parts.append(part)
            size += len(part)
        old = self._last.pop(session, None)
        if old is not None:
            self._used -= old[3] + self.PER_MESSAGE * len(old[2])
        if plain:  # else nothing of it can be reused
            self._keep(session, (texts, roles, parts, size))
        return b"[" + b",".join(parts) + b"]"

    def _reused(
        self, session: str, texts: list[Any], roles: list[Any]
    ) -> tuple[list[bytes], int] | None:
        """The kept JSON of the leading messages that are the session's last request's
        system prompt and then a run of its messages through its last, and its size in
        bytes; None if none is."""
        last = self._last.get(session)
        if last is None or not texts:
            return None
        was_texts, was_roles, was_parts, was_size = last
        head = int(texts[0] == was_texts[0] and roles[0] == was_roles[0])
        if head == len(texts):
            return was_parts[:1], len(was_parts[0])
        start = head - 1
        for _try in range(TRIES):  # where the run starts: a text may stand in it twice
            try:
                start = was_texts.index(texts[head], start + 1)
            except ValueError:
                return None
            n = len(was_texts) - start
            if (
                texts[head : head + n] == was_texts[start:]
                and roles[head : head + n] == was_roles[start:]
            ):
                dropped = sum(map(len, was_parts[head:start]))  # fell out of the window
                return was_parts[:head] + was_parts[start:], was_size - dropped
        return None

    def _keep(self, session: str, entry: tuple[list[Any], list[Any], list[bytes], int]) -> None:
        cost = entry[3] + self.PER_MESSAGE * len(entry[2])
        if cost > self._limit // 4:  # one session never takes most of the room
            return
        self._last[session] = entry
        self._used += cost
        while self._used > self._limit:
            _s, (_t, _r, parts, size) = self._last.popitem(last=False)
            self._used -= size + self.PER_MESSAGE * len(parts)


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

    async def _complete(
        self, messages: list[ChatMessage], with_tools: bool, session: str | None = None
    ) -> dict[str, Any]:
        body = b"".join(
            (
                b'{"model":',
                _encode(self.model),
                b',"messages":',
                self._messages.body(messages, session),
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
            data = await self._complete(messages, with_tools=can_call, session=ctx.session_id)
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
