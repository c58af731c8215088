"""`switchboard chat`: a terminal session through the real router, continue/resume, the
recap panel, /handoff refusals, and the exit hint."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from rich.console import Console

from gateway.cli_chat import render_recap
from tests.daemon import clean_env, switchboard


def chat(home: Path, lines: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(switchboard(home, "chat", *args), input=lines, capture_output=True,
                          text=True, timeout=60, env=clean_env(COLUMNS="120"))  # fmt: skip


def test_a_terminal_session_with_commands_then_continue_and_resume(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = chat(home, "hello there\n/title terminal work\n/quit\n")
    assert first.returncode == 0, first.stderr
    assert "◆ echo: hello there" in first.stdout and "Title set: terminal work" in first.stdout
    assert "Resume with: switchboard chat --resume terminal work" in first.stdout
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


def test_misses_exit_1_with_a_clear_message(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert (
        r := chat(home, "", "-c")
    ).returncode == 1 and "no terminal session to continue" in r.stdout
    assert (
        r := chat(home, "", "-r", "nothing-like-this")
    ).returncode == 1 and "not found: nothing-like-this" in r.stdout
    assert (r := chat(home, "", "-c", "no such title")).returncode == 1


def test_handoff_refusals_keep_the_terminal_session(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = chat(home, "hi\n/handoff telegram\n/handoff pigeon\nstill here\n/quit\n")
    assert "Not handed off: telegram is not enabled" in r.stdout
    assert "Usage: /handoff telegram|discord|slack" in r.stdout
    assert "◆ echo: still here" in r.stdout and r.returncode == 0


def _render(renderable: object) -> str:
    console = Console(width=100, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_recap_folds_tool_calls_clips_and_hides_tool_results() -> None:
    msgs: list[dict] = [{"role": "system", "content": "hidden system prompt"}]
    for i in range(12):
        msgs.append({"role": "user", "content": f"question {i} " + "x" * 400})
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "terminal"}}, {"function": {"name": "web_search"}}, {"function": {"name": "terminal"}}]})  # fmt: skip
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
