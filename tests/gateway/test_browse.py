"""`switchboard sessions browse`: the numbered fallback without a terminal, and the curses
picker in a real terminal (tmux): filter, Enter resumes in `switchboard chat`, d deletes."""

from __future__ import annotations

import asyncio
import shlex
import shutil
import subprocess
import sys
import time
import unicodedata
import uuid
from pathlib import Path

import pytest

from gateway.cli.browse import matches
from state import SessionDB
from tests.daemon import clean_env, switchboard


async def _home(path: Path) -> dict[str, str]:
    db = await SessionDB.open(path / "state.db")
    ids = {}
    for title, text in (("kyoto trip", "plan a trip to kyoto"), ("tax return", "file the taxes")):
        sid = await db.create_session(source="cli", title=title)
        await db.append_messages(
            sid,
            [{"role": "user", "content": text}, {"role": "assistant", "content": f"echo: {text}"}],
        )
        ids[title] = sid
    await db.end_session(ids["tax return"], "user_exit")  # kyoto trip stays live
    await db.close()
    return ids


def test_filter_matches_title_preview_id_and_source() -> None:
    row = {
        "title": "Kyoto trip",
        "preview": "plan a trip",
        "id": "20261129_1_abc",
        "source": "telegram",
    }
    assert (
        matches(row, "kyoto")
        and matches(row, "TRIP plan")
        and matches(row, "abc")
        and matches(row, "telegram")
    )
    assert not matches(row, "kyoto tax")


@pytest.mark.slow
def test_without_a_terminal_a_numbered_list_resumes_the_choice(tmp_path: Path) -> None:
    ids = asyncio.run(_home(tmp_path / "home"))
    proc = subprocess.run(
        switchboard(tmp_path / "home", "sessions", "browse"),
        input="2\n/quit\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "  1. tax return" in proc.stdout and "  2. kyoto trip" in proc.stdout
    assert "● plan a trip to kyoto" in proc.stdout  # `switchboard chat --resume` took over
    assert f"Session {ids['kyoto trip']} (kyoto trip)" in proc.stdout


def _cells(text: str) -> int:
    """Terminal cells by Unicode's East Asian Width: wide and fullwidth characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def test_rows_line_up_whatever_the_script_of_their_titles(tmp_path: Path) -> None:
    async def make() -> list[str]:
        db = await SessionDB.open(tmp_path / "home" / "state.db")
        ids = []
        for title in (
            "plain title",
            "项目计划讨论会议纪要和后续安排一二三四五六七八九十甲乙丙丁戊己庚辛",
            "🎉🎉 party plans",
            "日本語 mixed with latin",
        ):
            sid = await db.create_session(source="cli", title=title)
            await db.append_message(sid, "user", "hello")
            ids.append(sid)
        await db.close()
        return ids

    ids = asyncio.run(make())
    proc = subprocess.run(
        switchboard(tmp_path / "home", "sessions", "browse"),
        input="\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if any(ln.endswith(sid) for sid in ids)]
    assert len(rows) == 4, proc.stdout
    assert len({_cells(row) for row in rows}) == 1, rows  # the id column ends in the same cell
    assert len({_cells(row.split("  cli ")[0]) for row in rows}) == 1, rows


def _screen(name: str) -> str:
    return subprocess.run(
        ["tmux", "capture-pane", "-p", "-J", "-t", name], capture_output=True, text=True
    ).stdout


def _wait_for(name: str, text: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        screen = _screen(name)
        if text in screen:
            return screen
        time.sleep(0.1)
    raise AssertionError(f"{text!r} never appeared:\n{_screen(name)}")


def _keys(name: str, *keys: str, literal: bool = False) -> None:
    subprocess.run(
        ["tmux", "send-keys", "-t", name, *(["-l"] if literal else []), *keys], check=True
    )


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed here")
def test_the_interactive_picker_filters_resumes_and_deletes(tmp_path: Path) -> None:
    """Letters always filter (typing `dynamo` deletes nothing); Delete or ctrl-d asks, only
    the same key again deletes, and any other key keeps the session; a live session is never
    deleted from here."""
    home = tmp_path / "home"
    ids = asyncio.run(_home(home))
    name = f"sb-{uuid.uuid4().hex[:8]}"
    cmd = f"{shlex.quote(sys.executable)} -m gateway --home {shlex.quote(str(home))} sessions browse; sleep 30"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", "140", "-y", "30", cmd], check=True
    )
    try:
        _wait_for(name, "filter:")
        _keys(name, "dynamo", literal=True)
        _wait_for(name, "filter: dynamo")
        for _ in "dynamo":
            _keys(name, "BSpace")
        _wait_for(name, "Del/ctrl-d delete")
        _keys(name, "DC")  # Delete asks about the top one (tax return)
        _wait_for(name, f"delete {ids['tax return']}? press Del")
        _keys(name, "y", literal=True)  # a letter answers nothing: kept, and it filters
        _wait_for(name, "filter: y")
        assert "kept" in _screen(name)
        _keys(name, "BSpace")
        _keys(name, "C-d")
        _wait_for(name, f"delete {ids['tax return']}? press Del")
        _keys(name, "C-d")
        _wait_for(name, f"deleted {ids['tax return']}")
        _keys(name, "DC")  # the live one is kept, as `sessions delete` keeps it
        _wait_for(name, f"delete {ids['kyoto trip']}? press Del")
        _keys(name, "DC")
        _wait_for(name, f"{ids['kyoto trip']} is live: kept (`sessions delete --force` deletes it)")
        _keys(name, "kyoto", literal=True)
        _wait_for(name, "filter: kyoto")
        _keys(name, "Enter")
        _wait_for(name, "plan a trip to kyoto")  # the recap of `switchboard chat --resume`
        _keys(name, "/quit", literal=True)
        _keys(name, "Enter")
        _wait_for(name, "chat --resume 'kyoto trip'")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", name], capture_output=True)

    async def remaining() -> set[str]:
        db = await SessionDB.open(home / "state.db")
        try:
            return {r["id"] for r in await db.list_sessions()}
        finally:
            await db.close()

    assert asyncio.run(remaining()) == {ids["kyoto trip"]}


def test_the_numbered_list_shows_stored_control_characters_instead_of_sending_them() -> None:
    """A title holding an escape sequence or a NUL (curses cannot draw one) is listed with
    those characters as \\xNN; brackets and the rest stay as they are."""
    from gateway.cli.browse import pick_numbered

    row = {
        "id": "20261101_100000_aaaaaaaa",
        "source": "api",
        "last_active": time.time(),
        "title": "[bold]x[/] \x1b[2J\x00end",
        "preview": None,
    }
    written: list[str] = []
    assert pick_numbered([row], lambda: "1", written.append) is row
    assert written[0].startswith("  1. [bold]x[/] \\x1b[2J\\x00end")
    assert not any("\x1b" in w or "\x00" in w for w in written)
