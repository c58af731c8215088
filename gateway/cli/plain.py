"""Stored and user text on the terminal: printed as the characters it holds, never read as
rich markup or emoji codes, with control characters shown rather than sent, so no message,
title or id can restyle the terminal, make a link, move the cursor or crash a command.
Our own styling goes around such text as `Text` spans; the text itself is never parsed.
`out` and `err` are the consoles the `sessions` subcommands print on."""

from __future__ import annotations

import re
import sys

from rich.console import Console
from rich.text import Text

# C0 controls but tab and newline, DEL and C1: terminals act on these (ESC starts colour,
# cursor and hyperlink sequences), so they are shown as \xNN escapes instead of written
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(value: object) -> str:
    """`value` as a string a terminal shows as it is (control characters as \\xNN)."""
    text = "" if value is None else str(value)
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def plain(value: object, style: str = "") -> Text:
    """`value` as a rich Text span: printed literally, in `style` (ours)."""
    return Text(shown(value), style=style, end="")


def styled(*parts: str | Text | tuple[str, str]) -> Text:
    """One line from parts: a str or (str, style) pair is our own text, a Text is a
    `plain` span; nothing in it is read as markup."""
    return Text.assemble(*parts, end="")


# Piped output is for reading whole lines (grep, a file, a pager): no width to wrap at, so
# a table row stays one line however long its title.
# Stored text reaches these consoles only as gateway.cli.plain spans; stderr carries no
# markup of ours at all, so whatever an error message quotes is printed as it is.
out = Console(
    highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 100_000
)
err = Console(stderr=True, highlight=False, emoji=False, markup=False, soft_wrap=True)
