"""Chat commands. Each handler gets a CommandContext and returns the reply text.

This module holds the registry, parsing (`/cmd@botname args`) and the commands that only
read state (/help, /status); session-changing commands register here too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.messages import InboundMessage
from gateway.services import Services
from gateway.session_keys import SessionKey


def no_reset_policy(key: SessionKey) -> str:
    """/status without a Resetter (the terminal's router)."""
    return "none (sessions are never reset automatically)"


@dataclass(frozen=True)
class CommandContext:
    """What a command handler gets: the shared services and the message it answers."""

    services: Services
    msg: InboundMessage
    key: SessionKey
    session_id: str
    args: str
    describe_reset: Callable[[SessionKey], str] = no_reset_policy  # the chat's reset policy


Handler = Callable[[CommandContext], Awaitable[str]]


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    summary: str
    handler: Handler


def parse_command(text: str) -> tuple[str, str] | None:
    """`/Status@my_bot  some args` -> ("status", "some args"); None if not a command."""
    stripped = text.strip()
    if not stripped.startswith("/") or len(stripped) < 2 or stripped[1].isspace():
        return None
    head, _, rest = stripped[1:].partition(" ")
    name = head.split("@", 1)[0].lower()
    if not name or not all(ch.isalnum() or ch == "_" for ch in name):
        return None
    return name, rest.strip()


class CommandRegistry:
    def __init__(self) -> None:
        self._commands: dict[str, Command] = {}

    def add(self, name: str, usage: str, summary: str, handler: Handler) -> None:
        self._commands[name] = Command(name, usage, summary, handler)

    def get(self, name: str) -> Command | None:
        return self._commands.get(name)

    def all(self) -> list[Command]:
        return list(self._commands.values())


def _fmt_tokens(n: int | None) -> str:
    return f"{n or 0:,}"


async def _status(ctx: CommandContext) -> str:
    db = ctx.services.db
    row = await db.require_session(ctx.session_id)
    lines = [
        f"Session: {row['id']}",
        f"Title: {row.get('title') or '(untitled)'}",
        f"Messages: {row.get('message_count') or 0}",
        f"Tokens: {_fmt_tokens(row.get('input_tokens'))} in / {_fmt_tokens(row.get('output_tokens'))} out",
    ]
    if row.get("parent_session_id"):
        lines.append(f"Parent: {row['parent_session_id']} ({row.get('child_kind') or 'child'})")
    jobs = ctx.services.coordinator.live_jobs(ctx.session_id)
    lines.append(f"Live jobs: {', '.join(jobs) if jobs else 'none'}")
    lines.append(f"Reset policy: {ctx.describe_reset(ctx.key)}")
    return "\n".join(lines)


def builtin_commands() -> CommandRegistry:
    reg = CommandRegistry()

    async def _help(ctx: CommandContext) -> str:  # lists this registry, whatever joins it
        lines = ["Commands:"]
        lines += [f"{c.usage} — {c.summary}" for c in reg.all()]
        return "\n".join(lines)

    reg.add("help", "/help", "this list", _help)
    reg.add("status", "/status", "the current session, its size and lineage", _status)
    return reg
