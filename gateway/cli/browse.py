"""`switchboard sessions browse`: pick a session and continue it in `switchboard chat`.

In a terminal: a curses list (type to filter over title, preview, id and source; arrows to
move; Enter resumes; Esc quits). Every printable key filters, so deletion lives on keys no
word contains: Delete (or ctrl-d) asks, and only the same key pressed again deletes; any
other key cancels the question and then does what it always does. A live session is kept,
as `sessions delete` keeps it without --force. Without a terminal: a
numbered list and a number read from standard input.
"""

from __future__ import annotations

import curses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from rich.cells import set_cell_size

from gateway.cli.plain import shown
from gateway.timefmt import ago

Row = Mapping[str, Any]  # a session as list_sessions gives it
R = TypeVar("R", bound=Row)
TITLE_CELLS = 50


def matches(row: Row, needle: str) -> bool:
    hay = " ".join(str(row.get(k) or "") for k in ("title", "preview", "id", "source")).lower()
    return all(part in hay for part in needle.lower().split())


def label(row: Row, now: float) -> str:
    """One row: the title in 50 terminal cells (a CJK character or an emoji takes two), so
    the columns after it line up whatever the script; its stored text with control
    characters shown, not sent (a NUL, which curses cannot draw, or an escape sequence,
    which the terminal would act on)."""
    title = set_cell_size(shown(row.get("title") or row.get("preview") or "(empty)"), TITLE_CELLS)
    return f"{title} {ago(row.get('last_active'), now):>10}  {shown(row['source']):<9} {shown(row['id'])}"


def pick_numbered(
    rows: Sequence[R], read: Callable[[], str], write: Callable[[str], None]
) -> R | None:
    now = time.time()
    for i, row in enumerate(rows, 1):
        write(f"{i:>3}. {label(row, now)}")
    write("Resume which? (number, empty to cancel)")
    answer = read().strip()
    if answer.isdigit() and 1 <= int(answer) <= len(rows):
        return rows[int(answer) - 1]
    return None


DELETE_KEYS = (curses.KEY_DC, "\x04")  # Delete, ctrl-d: never part of a typed word
HINT = "type to filter · ↑↓ move · Enter resume · Del/ctrl-d delete · Esc quit"


def pick_curses(rows: list[R], delete: Callable[[R], str | None]) -> R | None:
    """The interactive picker; returns the chosen row (None when cancelled). `delete`
    deletes a row, or says why not (a live session is kept)."""

    def ui(screen: Any) -> R | None:
        curses.curs_set(0)
        needle, pos, message = "", 0, ""
        asking: R | None = None  # the row whose deletion awaits a second Delete
        while True:
            shown = [r for r in rows if matches(r, needle)]
            pos = max(0, min(pos, len(shown) - 1))
            height, width = screen.getmaxyx()
            screen.erase()
            screen.addnstr(0, 0, f"filter: {needle}", width - 1, curses.A_BOLD)
            if asking is not None:
                screen.addnstr(
                    1,
                    0,
                    f"delete {asking['id']}? press Del (or ctrl-d) again to "
                    "delete; any other key keeps it",
                    width - 1,
                    curses.A_BOLD,
                )
            else:
                screen.addnstr(1, 0, message or HINT, width - 1, curses.A_DIM)
            now = time.time()
            for i, row in enumerate(shown[: max(0, height - 3)]):
                screen.addnstr(
                    i + 3,
                    0,
                    label(row, now),
                    width - 1,
                    curses.A_REVERSE if i == pos else curses.A_NORMAL,
                )
            screen.refresh()
            key = screen.get_wch()
            message = ""
            if asking is not None:
                target, asking = asking, None
                if key in DELETE_KEYS:
                    refused = delete(target)
                    if refused:
                        message = refused
                        continue
                    rows.remove(target)
                    message = f"deleted {target['id']}"
                    continue
                message = "kept"
                if key == "\x1b":
                    continue  # Esc answers the question; it does not also quit
            if key in ("\n", "\r", curses.KEY_ENTER) and shown:
                return shown[pos]
            if key == "\x1b":
                return None
            if key in DELETE_KEYS:
                if shown:
                    asking = shown[pos]
            elif key == curses.KEY_UP:
                pos -= 1
            elif key == curses.KEY_DOWN:
                pos += 1
            elif key in (curses.KEY_BACKSPACE, "\x7f", "\b"):
                needle = needle[:-1]
            elif isinstance(key, str) and key.isprintable():
                needle += key
                pos = 0

    return curses.wrapper(ui)


def resume_in_chat(home: str, session_id: str) -> None:
    """Replace this process with `switchboard chat --resume <id>`."""
    args = [sys.executable, "-m", "gateway", "--home", home, "chat", "--resume", session_id]
    sys.stdout.flush()
    os.execv(sys.executable, args)
