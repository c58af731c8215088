"""`switchboard chat`: a terminal session through the real router, continue/resume, the
recap panel, /handoff refusals, and the exit hint; on a state.db and on a home whose store
is on PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from gateway.cli.chat import render_recap
from state import SessionDB, open_store
from tests import pgserver
from tests.daemon import clean_env, switchboard


def chat(home: Path, lines: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, "chat", *args),
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(COLUMNS="120", **env),
    )


@pytest.mark.slow
def test_a_terminal_session_with_commands_then_continue_and_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = chat(home, "hello there\n/title terminal work\n/quit\n")
    assert first.returncode == 0, first.stderr
    assert "◆ echo: hello there" in first.stdout and "Title set: terminal work" in first.stdout
    assert f"Resume with: switchboard --home {home} chat --resume 'terminal work'" in first.stdout
    sid = re.search(r"Session (\d{8}_\d{6}_[0-9a-f]{6}) ", first.stdout)
    assert sid, first.stdout  # a terminal id: 6 hex characters
    again = chat(home, "one more\n/quit\n", "-c")
    assert "● hello there" in again.stdout and "◆ echo: hello there" in again.stdout  # the recap
    assert f"Session {sid.group(1)} (terminal work): 4 messages" in again.stdout
    by_title = chat(home, "/status\n/quit\n", "--resume", "terminal work")
    assert f"Session: {sid.group(1)}" in by_title.stdout and "Messages: 4" in by_title.stdout
    by_prefix = chat(home, "/quit\n", "-r", sid.group(1)[:-2])
    assert by_prefix.returncode == 0 and "terminal work" in by_prefix.stdout
    fresh = chat(home, "new conversation\n/quit\n")
    assert sid.group(1) not in fresh.stdout  # plain `chat` starts a new session


@pytest.mark.slow
def test_a_terminal_session_on_a_postgres_home(tmp_path: Path, pg_server: str) -> None:
    """The home's config puts the store on PostgreSQL: the session, its title and messages
    are rows there (no state.db appears), continue and resume find them, a chat that said
    nothing keeps no session, and without the DSN variable the command exits 78 naming
    the key."""
    schema = pgserver.fresh_schema(pg_server)
    dsn = pgserver.with_schema(pg_server, schema)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: postgres\n  dsn_env: SB_CHAT_DSN\n")
    try:
        first = chat(home, "hello there\n/title terminal work\n/quit\n", SB_CHAT_DSN=dsn)
        assert first.returncode == 0, first.stderr
        assert "◆ echo: hello there" in first.stdout and "Title set: terminal work" in first.stdout
        sid = re.search(r"Session (\d{8}_\d{6}_[0-9a-f]{6}) ", first.stdout)
        assert sid, first.stdout
        again = chat(home, "one more\n/quit\n", "-c", SB_CHAT_DSN=dsn)
        assert "● hello there" in again.stdout  # the recap, read back from the database
        assert f"Session {sid.group(1)} (terminal work): 4 messages" in again.stdout
        resumed = chat(home, "/status\n/quit\n", "--resume", "terminal work", SB_CHAT_DSN=dsn)
        assert f"Session: {sid.group(1)}" in resumed.stdout and "Messages: 4" in resumed.stdout
        silent = chat(home, "/status\n/quit\n", SB_CHAT_DSN=dsn)
        assert "Nothing was said; no session kept." in silent.stdout

        async def stored() -> list[tuple[str, str, str, list[str]]]:
            db = await open_store({"backend": "postgres", "dsn": dsn}, home)
            try:
                rows = await db.list_sessions(include_children=True, limit=10)
                found = []
                for r in rows:
                    texts = [m["content"] for m in await db.get_messages(r["id"])]
                    found.append((r["id"], r["title"], r["source"], texts))
                return found
            finally:
                await db.close()

        assert asyncio.run(stored()) == [
            (
                sid.group(1),
                "terminal work",
                "cli",
                ["hello there", "echo: hello there", "one more", "echo: one more"],
            )
        ]
        assert not (home / "state.db").exists()
        unset = chat(home, "hi\n/quit\n")
        assert unset.returncode == 78 and "state.dsn_env" in unset.stderr, unset.stderr
    finally:
        pgserver.drop_schema(pg_server, schema)


@pytest.mark.slow
def test_misses_exit_1_with_a_clear_message(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert (
        r := chat(home, "", "-c")
    ).returncode == 1 and "no terminal session to continue" in r.stdout
    assert (
        r := chat(home, "", "-r", "nothing-like-this")
    ).returncode == 1 and "not found: nothing-like-this" in r.stdout
    assert (r := chat(home, "", "-c", "no such title")).returncode == 1


@pytest.mark.slow
def test_handoff_refusals_keep_the_terminal_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = chat(home, "hi\n/handoff telegram\n/handoff pigeon\nstill here\n/quit\n")
    assert "Not handed off: telegram is not enabled" in r.stdout
    assert "Usage: /handoff PLATFORM (one of: telegram, discord, slack" in r.stdout
    assert "◆ echo: still here" in r.stdout and r.returncode == 0


def _render(renderable: object) -> str:
    console = Console(width=100, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_recap_folds_tool_calls_clips_and_hides_tool_results() -> None:
    msgs: list[dict] = [{"role": "system", "content": "hidden system prompt"}]
    for i in range(12):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 400})
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": "terminal"}},
                    {"function": {"name": "web_search"}},
                    {"function": {"name": "terminal"}},
                ],
            }
        )
        msgs.append({"role": "tool", "content": "a tool result nobody wants to see"})
        msgs.append({"role": "assistant", "content": "line one\nline two\nline three\nline four"})
    text = _render(render_recap(msgs, "long chat"))
    assert "... 6 earlier messages ..." in text  # 12 exchanges, the last 10 shown
    assert "question 2 " in text and "question 1 " not in text
    assert "[3 tool calls: terminal, web_search, terminal]" in text
    assert "hidden system prompt" not in text and "tool result" not in text
    assert "line four" not in text  # assistant replies: 3 lines at most
    assert "x" * 300 not in text  # user messages clipped at 300 characters
    assert (
        _render(render_recap(msgs, "long chat", "minimal")).strip()
        == "Resumed long chat: 36 messages."
    )


def _sessions(home: Path) -> list[dict[str, object]]:
    async def read() -> list[dict[str, object]]:
        db = await SessionDB.open(home / "state.db")
        try:
            return await db.list_sessions(include_children=True, limit=100)
        finally:
            await db.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_the_resume_hint_is_quoted_and_works_as_printed(tmp_path: Path) -> None:
    """The hint carries --home and quotes the title, so pasting it into a
    shell resumes that very session."""
    home = tmp_path / "my home"
    first = chat(home, "hello\n/title it's piped chat\n/quit\n")
    hint = next(ln for ln in first.stdout.splitlines() if ln.startswith("Resume with: "))
    command = hint.removeprefix("Resume with: ")
    assert command == shlex.join(
        ["switchboard", "--home", str(home), "chat", "--resume", "it's piped chat"]
    )
    env = clean_env(COLUMNS="120", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    pasted = subprocess.run(
        ["sh", "-c", command],
        input="/status\n/quit\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert pasted.returncode == 0, pasted.stderr
    assert "Title: it's piped chat" in pasted.stdout and "Messages: 2" in pasted.stdout


@pytest.mark.slow
def test_leaving_without_a_word_keeps_no_session_and_help_fits_the_terminal(tmp_path: Path) -> None:
    """/help lists /handoff and /quit, not /sethome; a chat that said
    nothing (commands only, or straight to end of input) leaves no session behind."""
    home = tmp_path / "home"
    helped = chat(home, "/help\n/status\n/quit\n")
    assert helped.returncode == 0, helped.stderr
    assert "/handoff PLATFORM" in helped.stdout and "/quit" in helped.stdout
    assert "on PLATFORM (telegram, discord, slack," in " ".join(helped.stdout.split())
    assert "/sethome" not in helped.stdout and "/resume" in helped.stdout
    assert "Nothing was said; no session kept." in helped.stdout
    assert chat(home, "").returncode == 0
    assert _sessions(home) == []
    kept = chat(home, "a real question\n")  # end of input (Ctrl-D) leaves with the summary
    assert "Session " in kept.stdout and ": 2 messages" in kept.stdout
    assert len(_sessions(home)) == 1


class HangingModel:
    """An OpenAI-compatible endpoint that holds every request until released, so a turn
    is reliably in progress when the test presses Ctrl-C."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                model.arrived.set()
                model.release.wait(60)
                self.send_response(500)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class Output:
    """A child's stdout, collected by a thread so the test can wait for a line."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.text = ""
        self._lock = threading.Lock()
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._pump, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._lock:
                self.text += line

    def wait_for(self, needle: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if needle in self.text:
                    return
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} never appeared in:\n{self.text}")


@pytest.mark.slow
def test_ctrl_c_cancels_the_turn_then_twice_at_the_prompt_leaves_with_the_summary(
    tmp_path: Path,
) -> None:
    """Ctrl-C during a reply cancels that turn and the next line is still
    read (not swallowed); Ctrl-C at the prompt asks, a second one leaves with the summary."""
    home = tmp_path / "home"
    home.mkdir()
    model = HangingModel()
    (home / "config.yaml").write_text(
        "agent:\n  backend: openai\n  openai:\n"
        f"    base_url: {model.url}\n    model: m\n    api_key_env: FAKE_MODEL_KEY\n"
        "    max_retries: 0\n    timeout_seconds: 60\n"
    )
    proc = subprocess.Popen(
        switchboard(home, "chat"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(COLUMNS="120", FAKE_MODEL_KEY="k-123456"),
    )
    assert proc.stdin is not None
    out = Output(proc)
    try:
        proc.stdin.write("a question that will hang\n")
        proc.stdin.flush()
        assert model.arrived.wait(30), "the turn never reached the model"
        proc.send_signal(signal.SIGINT)
        out.wait_for("(cancelled)")
        proc.stdin.write("/status\n")
        proc.stdin.flush()
        out.wait_for("Messages: 1")  # the line after Ctrl-C was read; the question was kept
        proc.send_signal(signal.SIGINT)
        out.wait_for("(Ctrl-C again or Ctrl-D to leave)")
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        model.close()
    out._thread.join(10)
    assert re.search(r"Session \d{8}_\d{6}_[0-9a-f]{6}: 1 message, last active", out.text), out.text
    assert f"Resume with: switchboard --home {home} chat --resume " in out.text


async def test_resuming_a_chats_live_session_continues_it_and_leaving_does_not_end_it(
    tmp_path: Path,
) -> None:
    """`chat -r` on the session a platform chat is live in: the terminal says so, continues
    it (both write into it), refuses what would end it there, and /quit leaves it live: the
    chat goes on in it, doctor finds the index in order, and after a restart the chat still
    continues it. /new from there starts a terminal session of its own."""
    import aiohttp

    from tests.daemon import free_port, wait_healthy

    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
    url = f"http://127.0.0.1:{port}"

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            switchboard(home, "run"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=clean_env(),
        )

    async def say(text: str) -> str:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{url}/v1/messages", json={"chat_id": "a", "text": text}) as r,
        ):
            assert r.status == 200, await r.text()
            body = await r.json()
            assert body["reply"] == f"echo: {text}"
            return str(body["session_id"])

    async def stop(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0

    def row(sid: str) -> tuple[object, ...]:
        conn = sqlite3.connect(home / "state.db")
        try:
            return tuple(
                conn.execute(
                    "SELECT ended_at, end_reason, message_count FROM sessions WHERE id = ?", (sid,)
                ).fetchone()
            )
        finally:
            conn.close()

    proc = start()
    try:
        await wait_healthy(url, proc)
        sid = await say("hello from the chat")
        here = await asyncio.to_thread(
            chat, home, "hello from the terminal\n/branch\n/quit\n", "-r", sid
        )
        assert here.returncode == 0, here.stderr
        assert (
            "This session is live in api chat a; you continue it here, and leaving here "
            "does not end it."
        ) in here.stdout
        assert "◆ echo: hello from the terminal" in here.stdout
        assert (
            "Not done: this session is live in api chat a, and /branch would end it" in here.stdout
        )
        assert "It stays live in api chat a." in here.stdout
        assert row(sid)[:2] == (None, None)
        assert await say("still here") == sid  # the chat goes on in the same session
        assert row(sid)[2] == 6
        doctor = await asyncio.to_thread(
            subprocess.run,
            switchboard(home, "doctor"),
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(),
        )
        assert "[ok  ] session index: 1 entries agree with state.db" in doctor.stdout, doctor.stdout
        await stop(proc)
        proc = start()
        await wait_healthy(url, proc)
        assert await say("after a restart") == sid
        # /new from the terminal lets go first: the chat's session is never ended
        fresh = await asyncio.to_thread(chat, home, "/new\nmy own\n/quit\n", "-r", sid)
        assert fresh.returncode == 0 and "It stays live" not in fresh.stdout, fresh.stdout
        assert row(sid)[:2] == (None, None)
        assert await say("and on") == sid
        await stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_terminal_chat_opens_saying_how_to_get_help_and_how_to_leave(tmp_path: Path) -> None:
    """At a terminal the prompt is not bare: the first line names /help and how to leave."""
    import pty
    import select

    home = tmp_path / "home"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        switchboard(home, "chat"),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=clean_env(COLUMNS="120"),
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while b"Ctrl-D to leave" not in seen and time.monotonic() < deadline:
            if select.select([leader], [], [], 1)[0]:
                seen += os.read(leader, 4096)
        os.write(leader, b"/quit\n")
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(leader)
    text = re.sub(r"\x1b\[[0-9;]*m", "", seen.decode(errors="replace"))
    assert "/help for commands, /quit or Ctrl-D to leave" in text, text


def test_the_resume_hint_names_the_home_without_dot_dot(tmp_path: Path) -> None:
    (tmp_path / "x" / "sb").mkdir(parents=True)
    done = chat(tmp_path / "x" / "sb" / ".." / "h1", "hello\n/quit\n")
    assert done.returncode == 0, done.stderr
    hint = next(ln for ln in done.stdout.splitlines() if ln.startswith("Resume with: "))
    assert hint.startswith(f"Resume with: switchboard --home {tmp_path / 'x' / 'h1'} chat"), hint
