"""`switchboard chat`: a terminal session on the configured agent and the home's store
(its state.db, or the PostgreSQL database its config names).

The terminal is one more adapter of an in-process router, so every chat command works here
too (/title /new /branch /compress /resume /search /status ...), plus /handoff and /quit.
The router's index lives in a temporary file: sessions.json belongs to the daemon.
Ctrl-C cancels the turn that is running; at the prompt, a second Ctrl-C (or Ctrl-D) leaves
with the summary. Standard input is read through the event loop, never from a thread, so an
interrupted read cannot linger and swallow the next line.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from gateway import adapters
from gateway.cli.paths import open_configured
from gateway.cli.plain import plain, shown
from gateway.config import Config
from gateway.errors import EXIT_FAILURE, EXIT_OK
from gateway.handoff import handoff_from_terminal
from gateway.index import SessionIndex
from gateway.messages import InboundMessage, OutboundMessage, SentRef, ThreadRef
from gateway.pipeline import Router
from gateway.session_keys import SessionSource, build_key
from gateway.timefmt import ago
from gateway.vocab import AdapterState, ChatType
from gateway.wiring import build_agent, router_settings
from gateway.wording import plural
from state import AmbiguousSession, EndReason, SessionNotFound, Store, content_text, encode_content

RECAP_EXCHANGES = 10
BANNER = "switchboard chat: /help for commands, /quit or Ctrl-D to leave"


def _clip(text: str, chars: int, lines: int | None = None) -> str:
    flat = text.strip()
    if lines is not None:
        rows = flat.splitlines()
        if len(rows) > lines:
            flat = "\n".join(rows[:lines]) + " …"
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def _said(m: Mapping[str, Any]) -> str:
    """A message's text: its text parts when it is structured content."""
    content = m.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    return content_text(encode_content(content)) or "[structured content]"


def render_recap(
    messages: Sequence[Mapping[str, Any]], title: str | None, mode: str = "full"
) -> Any:
    """What was said, before the prompt: the last exchanges, dimmed."""
    said = [m for m in messages if m.get("role") in ("user", "assistant")]
    if mode == "minimal":
        return Text(
            f"Resumed {shown(title or 'session')}: {plural(len(said), 'message')}.", style="dim"
        )
    starts = [i for i, m in enumerate(said) if m["role"] == "user"]
    first = starts[-RECAP_EXCHANGES] if len(starts) > RECAP_EXCHANGES else 0
    lines: list[Text] = []
    if first:
        lines.append(Text(f"... {plural(first, 'earlier message')} ...", style="dim italic"))
    for m in said[first:]:
        if m["role"] == "user":
            lines.append(Text.assemble(("● ", "gold1"), shown(_clip(_said(m), 300))))
            continue
        calls = m.get("tool_calls") or []
        if calls and not _said(m).strip():
            names = [
                ((c.get("function") or {}).get("name") or "?") for c in calls if isinstance(c, dict)
            ]
            lines.append(
                Text.assemble(
                    ("◆ ", "green"),
                    shown(
                        f"[{len(calls)} tool call{'s' if len(calls) != 1 else ''}: "
                        f"{', '.join(names)}]"
                    ),
                )
            )
            continue
        lines.append(Text.assemble(("◆ ", "green"), shown(_clip(_said(m), 200, 3))))
    return Panel(
        Group(*lines) if lines else Text("(no messages yet)"),
        title=plain(title) if title else "resumed session",
        style="dim",
    )


INTERRUPT = object()  # Ctrl-C pressed at the prompt
# Chat-platform commands that mean nothing in a terminal (there is no home channel here).
NOT_IN_TERMINAL = frozenset({"sethome"})


def handoff_usage() -> str:
    """The usage line: one word stands for the platform (the list is long), then the list."""
    return f"/handoff PLATFORM (one of: {', '.join(adapters.names())})"


def terminal_commands() -> tuple[tuple[str, str], ...]:
    return (
        (
            "/handoff PLATFORM",
            f"continue this session in a thread on PLATFORM ({', '.join(adapters.names())})",
        ),
        ("/quit", "leave (also Ctrl-D, or Ctrl-C twice at the prompt); prints how to come back"),
    )


def terminal_help(router: Router) -> str:
    """/help for the terminal: the router's commands that work here, plus the terminal's."""
    lines = ["Commands:"]
    lines += [
        f"{c.usage} — {c.summary}" for c in router.commands.all() if c.name not in NOT_IN_TERMINAL
    ]
    lines += [f"{usage} — {summary}" for usage, summary in terminal_commands()]
    lines.append("Ctrl-C cancels a reply that is still being written.")
    return "\n".join(lines)


def resume_command(given: Sequence[str], ref: str) -> str:
    """`switchboard [--home H] [--config C] chat --resume REF`, quoted for a POSIX shell."""
    return shlex.join(["switchboard", *given, "chat", "--resume", ref])


class LineReader:
    """Lines of standard input through the event loop (a queue of str; None at end of input;
    INTERRUPT when Ctrl-C is pressed at the prompt)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self._buf = b""
        self._fd = sys.stdin.fileno()
        self._loop = asyncio.get_running_loop()
        try:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True
        except (PermissionError, OSError):  # a regular file cannot be polled: never blocks
            self._watching = False

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        if not chunk:
            if self._buf:
                self.queue.put_nowait(self._buf.decode(errors="replace"))
                self._buf = b""
            self.queue.put_nowait(None)
            self.close()
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            self.queue.put_nowait(line.decode(errors="replace") + "\n")

    async def get(self) -> object:
        if not self._watching and self.queue.empty():
            self._feed(os.read(self._fd, 65536))
        return await self.queue.get()

    def close(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False


class Interrupts:
    """SIGINT while this chat runs: cancels the running step, or reaches the prompt."""

    def __init__(self, reader: LineReader) -> None:
        self.reader = reader
        self.pressed = asyncio.Event()
        self.busy = False
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGINT, self._on_sigint)

    def _on_sigint(self) -> None:
        if self.busy:
            self.pressed.set()
        else:
            self.reader.queue.put_nowait(INTERRUPT)

    async def run(self, step: Awaitable[Any]) -> tuple[bool, Any]:
        """Run `step` until it finishes or Ctrl-C; returns (finished, its result)."""
        self.busy, task = True, asyncio.ensure_future(step)
        self.pressed.clear()
        stop = asyncio.create_task(self.pressed.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.busy = False
            stop.cancel()
        if task.done():
            if self.pressed.is_set():  # pressed as the step ended: it was meant for the prompt
                self.reader.queue.put_nowait(INTERRUPT)
            return True, task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False, None

    def close(self) -> None:
        self._loop.remove_signal_handler(signal.SIGINT)


class TerminalAdapter:
    platform: ClassVar[str] = "cli"

    def __init__(self, console: Console) -> None:
        self.console = console
        self.replied = asyncio.Event()

    async def start(self, emit: Any) -> None:
        return None

    async def send(self, msg: OutboundMessage) -> SentRef:
        self.console.print(Text.assemble(("◆ ", "green"), shown(msg.text)))
        self.replied.set()
        return SentRef(self.platform, msg.chat_id)

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        return None

    async def stop(self) -> None:
        return None

    def health(self) -> dict[str, object]:
        return {"state": AdapterState.RUNNING}


async def _pick(db: Store, cont: str | bool | None, resume: str | None) -> str | None:
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


# commands that end the current session or hand it over: while the terminal continues a
# session live in another chat, they would end or take it from that chat
DETACHING = ("/new", "/resume")  # the terminal lets go of it first (/resume with an argument)
REFUSED_ATTACHED = ("/branch", "/compress", "/handoff")


def live_elsewhere(row: Mapping[str, Any], own_key: str) -> str | None:
    """Where a session is live when a chat other than this terminal holds it ("telegram
    chat 42"), else None. The terminal continues such a session without ending it."""
    key = row.get("session_key")
    if row.get("ended_at") is not None or not key or key == own_key:
        return None
    return f"{row.get('source')} chat {row.get('chat_id')}"


async def run_chat(
    home: Path,
    config: Config,
    *,
    cont: str | bool | None,
    resume: str | None,
    console: Console | None = None,
    given: Sequence[str] = (),
    state: dict[str, Any] | None = None,
) -> int:
    """The chat loop, on the home's state.db or on the store `state` names (open_store's
    settings: PostgreSQL). `given` are the --home/--config options the user passed,
    repeated in the printed resume command so that it reaches the same store."""
    con = console or Console(highlight=False, emoji=False)
    db = await open_configured(state, home / "state.db")
    tmp = tempfile.TemporaryDirectory(prefix="switchboard-chat-")
    index = SessionIndex(Path(tmp.name) / "sessions.json", db, flush_interval=3600)
    agent = build_agent(config)
    terminal = TerminalAdapter(con)
    router = Router(db, index, agent, terminal.send, router_settings(config))
    user = getpass.getuser()
    source = SessionSource("cli", user, ChatType.DM, user, user)
    key = build_key(source, router.settings.keys)
    reader = LineReader()
    interrupts = Interrupts(reader)
    reply_budget = config.agent.turn_timeout_seconds + 30

    async def turn(text: str) -> None:
        terminal.replied.clear()
        await router.handle(InboundMessage(source, text, received_at=time.time()))
        await asyncio.wait_for(terminal.replied.wait(), reply_budget)

    try:
        try:
            target = await _pick(db, cont, resume)
        except (SessionNotFound, AmbiguousSession) as exc:
            con.print(
                f"switchboard: not found: {getattr(exc, 'ref', exc)}", style="red", markup=False
            )
            return EXIT_FAILURE
        elsewhere: str | None = None  # the chat the resumed session is live in, if another
        if target is not None:
            elsewhere = live_elsewhere(await db.require_session(target), key.format())
            await router.services.sessions.switch(key, source, target)
            row = await db.require_session(target)
            history = await db.get_messages(target, last=200)
            con.print(render_recap(history, row.get("title"), config.display.resume_display))
            if elsewhere:
                con.print(
                    f"This session is live in {elsewhere}; you continue it here, and "
                    "leaving here does not end it.",
                    markup=False,
                    soft_wrap=True,
                )

        def attached() -> bool:
            entry = index.get(key.format())
            return bool(elsewhere) and entry is not None and entry.session_id == target

        # A new session is created by the first message or command: leaving at once keeps none.
        interactive = sys.stdin.isatty()
        if interactive:
            con.print(BANNER, style="dim")
        armed = False  # Ctrl-C was pressed at the prompt; a second one leaves
        while True:
            if interactive:
                con.print("[bold gold1]●[/] ", end="")
            line = await reader.get()
            if line is INTERRUPT:
                if armed:
                    con.print()
                    break
                armed = True
                con.print("\n(Ctrl-C again or Ctrl-D to leave)", style="dim")
                continue
            if line is None:
                if interactive:
                    con.print()  # Ctrl-D leaves the cursor after the prompt
                break
            armed = False
            text = str(line).strip()
            if not text:
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/help" or text.startswith("/help "):
                con.print(terminal_help(router), markup=False)  # [title], [name] are text
                continue
            command = text.split()[0]
            if command in REFUSED_ATTACHED and attached():
                con.print(
                    f"Not done: this session is live in {elsewhere}, and {command} would "
                    "end it there. /new starts a terminal session of its own.",
                    markup=False,
                    soft_wrap=True,
                )
                continue
            if command in DETACHING and attached() and (command == "/new" or text != command):
                index.remove(key.format())  # let go: the command never ends the other chat's
            if text.startswith("/handoff"):
                platform = text.partition(" ")[2].strip()
                if platform not in adapters.names():
                    # one line, however many platforms are registered
                    con.print(f"Usage: {handoff_usage()}", soft_wrap=True)
                    continue
                current = index.get(key.format())
                if current is None:
                    con.print("Nothing to hand off yet: say something first.")
                    continue
                sid = current.session_id
                finished, result = await interrupts.run(
                    handoff_from_terminal(
                        db,
                        sid,
                        platform,
                        enabled=config.platforms[platform].enabled,
                        configured_home=config.platforms[platform].home_channel,
                        heartbeat=lambda beat: con.print(beat, style="dim", markup=False),
                    )
                )
                if not finished:
                    con.print("Handoff cancelled; still here.", style="yellow")
                    continue
                ok, message = result
                if ok:
                    row = await db.require_session(sid)
                    con.print(
                        f"Handed off: {message}. Come back with: "
                        f"{resume_command(given, row.get('title') or sid)}",
                        markup=False,
                        soft_wrap=True,
                    )
                    return EXIT_OK
                con.print(f"Not handed off: {message}", style="yellow", markup=False)
                continue
            finished, _ = await interrupts.run(turn(text))
            if not finished:
                await router.drain(0)  # cancel the turn itself, not only our wait for it
                con.print("(cancelled)", style="yellow")
        entry = index.get(key.format())
        if entry is not None:
            await router.drain(config.shutdown.drain_seconds)
            row = await db.require_session(entry.session_id)
            if not row.get("message_count") and entry.session_id != target:
                await db.delete_session(entry.session_id)  # begun here and never used
                con.print("Nothing was said; no session kept.")
                return EXIT_OK
            staying = attached()
            if not staying:
                await db.end_session(entry.session_id, EndReason.USER_EXIT)
            row = await db.require_session(entry.session_id)
            name = row.get("title") or entry.session_id
            title = row.get("title")
            label = f"{entry.session_id} ({title})" if title else entry.session_id
            active = ago(row.get("last_active"), time.time())
            # a title is the user's text (no markup) and the command must stay one line
            con.print(
                f"Session {label}: {plural(row.get('message_count') or 0, 'message')}, "
                f"last active {active}.",
                markup=False,
                soft_wrap=True,
            )
            if staying:
                con.print(f"It stays live in {elsewhere}.", markup=False, soft_wrap=True)
            con.print(f"Resume with: {resume_command(given, name)}", markup=False, soft_wrap=True)
        return EXIT_OK
    finally:
        interrupts.close()
        reader.close()
        await router.drain(5)
        await index.close()
        await agent.close()
        await db.close()
        tmp.cleanup()
