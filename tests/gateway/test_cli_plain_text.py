"""The terminal commands print stored text as the characters it holds: a title or message
that looks like rich markup, an emoji code or a terminal escape sequence is shown as it
is (control characters as \\xNN), never styled, linked, sent to the terminal or crashing
the command; our own text that holds brackets (chat's /help) keeps them too."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from state import SessionDB
from tests.daemon import clean_env, switchboard

TITLE = "[bold]loud[/] a[i] [/x]"
SAID = [
    "preview [/i] here",
    "a[i] [bold red]x[/] [link=http://evil]click[/link] :smile:",
    "colour \x1b[31mred\x1b[0m and a bell\x07 \\",
    "needle [/] \u202eevil\u202c \u200b中文 😀",
]


def run(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env=clean_env(COLUMNS="200"),
    )


@pytest.fixture
async def home(tmp_path: Path) -> tuple[Path, str]:
    h = tmp_path / "home"
    db = await SessionDB.open(h / "state.db")
    sid = await db.create_session(source="telegram", title=TITLE, started_at=time.time() - 60)
    await db.append_messages(sid, [{"role": "user", "content": text} for text in SAID])
    await db.close()
    return h, sid


def test_sessions_list_show_and_search_print_stored_markup_as_text(home: tuple[Path, str]) -> None:
    h, sid = home
    listed = run(h, "sessions", "list")
    assert listed.returncode == 0, listed.stderr
    assert TITLE in listed.stdout and "preview [/i] here" in listed.stdout
    shown = run(h, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert f"{TITLE}  {sid}" in shown.stdout
    for text in SAID[:2]:
        assert f"     user {text}" in shown.stdout
    assert "     user colour \\x1b[31mred\\x1b[0m and a bell\\x07 \\" in shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    found = run(h, "sessions", "search", "needle")
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith(f"{TITLE} {sid} #4 ")
    assert "  >>>needle<<< [/] \u202eevil\u202c \u200b中文 😀" in found.stdout
    renamed = run(h, "sessions", "rename", sid, "[red]new[/red]")
    assert renamed.returncode == 0 and "is now titled '[red]new[/red]'" in renamed.stdout


def test_a_title_that_looks_like_markup_is_named_as_it_is_when_not_found(tmp_path: Path) -> None:
    missing = run(tmp_path / "home", "sessions", "show", "[bold]nothing[/]")
    assert missing.returncode == 1
    assert "switchboard: not found: [bold]nothing[/]" in missing.stderr


def test_chat_help_keeps_its_placeholders_and_the_recap_shows_stored_markup(
    home: tuple[Path, str],
) -> None:
    h, sid = home
    helped = run(h, "chat", stdin="/help\n/quit\n")
    assert helped.returncode == 0, helped.stderr
    for usage in ("/new [title]", "/title [name]", "/compress [focus]", "/resume [title|id|N]"):
        assert usage in helped.stdout
    resumed = run(h, "chat", "--resume", sid, stdin="[bold]hi[/] a[i]\n/quit\n")
    assert resumed.returncode == 0, resumed.stderr
    assert "● a[i] [bold red]x[/] [link=http://evil]click[/link] :smile:" in resumed.stdout
    assert "● colour \\x1b[31mred\\x1b[0m" in resumed.stdout and "\x1b" not in resumed.stdout
    assert TITLE in resumed.stdout  # the recap panel's title
    assert "◆ echo: [bold]hi[/] a[i]" in resumed.stdout


def test_insights_print_stored_names_as_text() -> None:
    """Model, tool, platform and end-reason names come from the store: printed as they are."""
    from rich.console import Console

    from gateway.cli.insights import render

    data = {
        "days": 7,
        "source": None,
        "messages": 3,
        "sessions_active": 1,
        "sessions_started": 1,
        "sessions_live": 0,
        "input_tokens": 5,
        "output_tokens": 6,
        "cost": {"estimated_usd": 0.0, "unpriced_models": ["[red]m[/red]"]},
        "per_day": [{"day": "2026-12-01", "sources": {"[b]plat[/b]": 3}}],
        "models": [
            {
                "model": "[link=http://evil]gpt[/link]",
                "sessions": 1,
                "input_tokens": 5,
                "output_tokens": 6,
                "cost_usd": None,
            }
        ],
        "top_tools": [{"tool": "a[i] :smile:", "calls": 2}],
        "end_reasons": [{"reason": "[/x]", "sessions": 1}],
        "heatmap": [[0] * 24 for _ in range(7)],
    }
    console = Console(width=200, highlight=False, emoji=False, color_system=None)
    with console.capture() as captured:
        render(data, console)
    out = captured.get()
    for name in (
        "[red]m[/red]",
        "[b]plat[/b]",
        "[link=http://evil]gpt[/link]",
        "a[i] :smile:",
        "[/x]",
    ):
        assert name in out


async def test_show_prints_the_text_parts_of_structured_content(tmp_path: Path) -> None:
    h = tmp_path / "home"
    db = await SessionDB.open(h / "state.db")
    sid = await db.create_session(source="api")
    parts = [
        {"type": "text", "text": "look [/i] at"},
        {"type": "image_url", "image_url": {"url": "x"}},
    ]
    await db.append_message(sid, "user", parts)  # type: ignore[arg-type]
    await db.close()
    shown = run(h, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "     user look [/i] at" in shown.stdout
