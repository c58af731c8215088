"""`switchboard chat`: a terminal session on the configured agent and the same state.db.

The terminal is one more adapter of an in-process router, so every chat command works here
too (/title /new /branch /compress /resume /search /status ...), plus /handoff and /quit.
The router's index lives in a temporary file: sessions.json belongs to the daemon.
"""

from __future__ import annotations

import asyncio
import getpass
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from gateway.app import build_agent, router_settings
from gateway.config import Config
from gateway.errors import EXIT_FAILURE, EXIT_OK
from gateway.handoff import handoff_from_terminal
from gateway.index import SessionIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.router import Router
from gateway.session_keys import SessionSource, build_key
from gateway.timefmt import ago
from gateway.vocab import AdapterState, ChatType
from state import AmbiguousSession, EndReason, SessionDB, SessionNotFound

RECAP_EXCHANGES = 10


def _clip(text: str, chars: int, lines: int | None = None) -> str:
    flat = text.strip()
    if lines is not None:
        rows = flat.splitlines()
        if len(rows) > lines:
            flat = "\n".join(rows[:lines]) + " …"
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def render_recap(messages: Sequence[dict[str, Any]], title: str | None, mode: str = "full") -> Any:
    """What was said, before the prompt: the last exchanges, dimmed."""
    shown = [m for m in messages if m.get("role") in ("user", "assistant")]
    if mode == "minimal":
        return Text(f"Resumed {title or 'session'}: {len(shown)} messages.", style="dim")
    starts = [i for i, m in enumerate(shown) if m["role"] == "user"]
    first = starts[-RECAP_EXCHANGES] if len(starts) > RECAP_EXCHANGES else 0
    lines: list[Text] = []
    if first:
        lines.append(Text(f"... {first} earlier messages ...", style="dim italic"))
    for m in shown[first:]:
        if m["role"] == "user":
            lines.append(Text.assemble(("● ", "gold1"), _clip(m.get("content") or "", 300)))
            continue
        calls = m.get("tool_calls") or []
        if calls and not (m.get("content") or "").strip():
            names = [
                ((c.get("function") or {}).get("name") or "?") for c in calls if isinstance(c, dict)
            ]
            lines.append(
                Text.assemble(
                    ("◆ ", "green"),
                    f"[{len(calls)} tool call{'s' if len(calls) != 1 else ''}: {', '.join(names)}]",
                )
            )
            continue
        lines.append(Text.assemble(("◆ ", "green"), _clip(m.get("content") or "", 200, 3)))
    return Panel(
        Group(*lines) if lines else Text("(no messages yet)"),
        title=title or "resumed session",
        style="dim",
    )


class TerminalAdapter:
    platform: ClassVar[str] = "cli"

    def __init__(self, console: Console) -> None:
        self.console = console
        self.replied = asyncio.Event()

    async def start(self, emit: Any) -> None:
        return None

    async def send(self, msg: OutboundMessage) -> SentRef:
        self.console.print(Text.assemble(("◆ ", "green"), msg.text))
        self.replied.set()
        return SentRef(self.platform, msg.chat_id)

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        return None

    async def stop(self) -> None:
        return None

    def health(self) -> dict[str, object]:
        return {"state": AdapterState.RUNNING}


async def _pick(db: SessionDB, cont: str | bool | None, resume: str | None) -> str | None:
    """The session to continue, or None for a new one. Raises SessionNotFound on a miss."""
    if resume:
        return await db.resolve_resume_session_id(await db.resolve_session_ref(resume))
    if cont is True:
        rows = await db.list_sessions("cli", include_children=True, limit=1)
        if not rows:
            raise SessionNotFound("(no terminal session to continue)")
        return await db.resolve_resume_session_id(rows[0]["id"])
    if isinstance(cont, str):
        sid = await db.resolve_session_by_title(cont)
        if sid is None:
            raise SessionNotFound(cont)
        return await db.resolve_resume_session_id(sid)
    return None


async def run_chat(home: Path, config: Config, *, cont: str | bool | None, resume: str | None,
                   console: Console | None = None) -> int:  # fmt: skip
    con = console or Console(highlight=False)
    db = await SessionDB.open(home / "state.db")
    tmp = tempfile.TemporaryDirectory(prefix="switchboard-chat-")
    index = SessionIndex(Path(tmp.name) / "sessions.json", db, flush_interval=3600)
    agent = build_agent(config)
    terminal = TerminalAdapter(con)
    router = Router(db, index, agent, terminal.send, router_settings(config))
    user = getpass.getuser()
    source = SessionSource("cli", user, ChatType.DM, user, user)
    key = build_key(source, router.settings.keys)
    try:
        try:
            target = await _pick(db, cont, resume)
        except (SessionNotFound, AmbiguousSession) as exc:
            con.print(f"switchboard: not found: {getattr(exc, 'ref', exc)}", style="red")
            return EXIT_FAILURE
        if target is not None:
            await router.services.sessions.switch(key, source, target)
            row = await db.require_session(target)
            history = await db.get_messages(target, last=200)
            con.print(render_recap(history, row.get("title"), config.get("display.resume_display")))
        else:
            await router.services.sessions.create(key, source)
        interactive = sys.stdin.isatty()
        while True:
            if interactive:
                con.print("[bold gold1]●[/] ", end="")
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line:
                break
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            sid = index.get(key.format()).session_id  # type: ignore[union-attr]
            if text.startswith("/handoff"):
                platform = text.partition(" ")[2].strip()
                if platform not in ("telegram", "discord", "slack"):
                    con.print("Usage: /handoff telegram|discord|slack")
                    continue
                ok, message = await handoff_from_terminal(
                    db, sid, platform, enabled=config.platform(platform)["enabled"],
                    heartbeat=lambda beat: con.print(beat, style="dim"),
                )  # fmt: skip
                if ok:
                    row = await db.require_session(sid)
                    con.print(
                        f"Handed off: {message}. Come back with: switchboard chat --resume {row.get('title') or sid}"
                    )
                    return EXIT_OK
                con.print(f"Not handed off: {message}", style="yellow")
                continue
            terminal.replied.clear()
            await router.handle(InboundMessage(source, text, received_at=time.time()))
            await asyncio.wait_for(
                terminal.replied.wait(), config.get("agent.turn_timeout_seconds") + 30
            )
        entry = index.get(key.format())
        if entry is not None:
            await router.drain(config.get("shutdown.drain_seconds"))
            await db.end_session(entry.session_id, EndReason.USER_EXIT)
            row = await db.require_session(entry.session_id)
            name = row.get("title") or entry.session_id
            title = row.get("title")
            label = f"{entry.session_id} ({title})" if title else entry.session_id
            active = ago(row.get("last_active"), time.time())
            con.print(
                f"Session {label}: {row.get('message_count') or 0} messages, last active {active}."
            )
            con.print(f"Resume with: switchboard chat --resume {name!s}")
        return EXIT_OK
    finally:
        await router.drain(5)
        await index.close()
        await agent.close()
        await db.close()
        tmp.cleanup()
