"""The echo agent: deterministic and offline; the default, and what tests and demos use."""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.agent.base import AgentReply, ChatMessage, TurnContext, estimate_tokens

_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")
SUMMARY_HEADER = "Summary of the earlier conversation:"


def _text(m: ChatMessage) -> str:
    """A message's text: the text parts of structured (multimodal) content."""
    content = m.get("content")
    if isinstance(content, list):
        return " ".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return content if isinstance(content, str) else ""


class EchoAgent:
    name = "echo"
    model: str | None = "echo"

    async def respond(self, history: Sequence[ChatMessage], ctx: TurnContext) -> AgentReply:
        last = next((m for m in reversed(history) if m.get("role") == "user"), None)
        text = _text(last) if last is not None else ""
        reply = f"echo: {text}" if text else "echo: (empty message)"
        # no model counts them: our estimate (about 4 characters a token), marked as such
        return AgentReply(
            text=reply,
            input_tokens=sum(estimate_tokens(m) for m in history),
            output_tokens=estimate_tokens({"role": "assistant", "content": reply}),
            model="echo",
            tokens_estimated=True,
        )

    async def summarize(self, history: Sequence[ChatMessage], focus: str | None) -> str:
        """Extractive: the opening of each user message (those mentioning the focus first)."""
        said = [
            " ".join(_text(m).split())[:100]
            for m in history
            if m.get("role") == "user" and _text(m).strip()
        ]
        if focus:
            words = {w.lower() for w in _WORD.findall(focus)}
            said.sort(key=lambda s: not (words & {w.lower() for w in _WORD.findall(s)}))
        lines = [f"- {s}" for s in said[:20]] or ["- (nothing was said)"]
        head = SUMMARY_HEADER + (f" (focus: {focus})" if focus else "")
        return "\n".join([head, *lines])

    async def suggest_title(self, history: Sequence[ChatMessage]) -> str:
        """The user's first distinct words, in order and as written, at most 7 of them: a
        word already taken in another case is not taken again ("Tea tea" is "Tea"), and
        nothing is added or re-cased (a one-word question is a one-word title)."""
        words: list[str] = []
        seen: set[str] = set()
        for m in history:
            if m.get("role") != "user":
                continue
            for word in _WORD.findall(_text(m)):
                if word.casefold() not in seen:
                    seen.add(word.casefold())
                    words.append(word)
            if len(words) >= 7:
                break
        return " ".join(words[:7]) or "Untitled"

    async def before_reset(self, session_id: str, reason: str) -> None:
        return None  # nothing kept outside the transcript

    async def close(self) -> None:
        return None
