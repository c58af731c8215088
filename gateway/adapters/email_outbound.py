"""Our mail, composed: the reply's thread headers and subject, the quoted original, and the
agent's markdown as plain text with a simple, escaped HTML alternative.

Pure functions over strings; the adapter hands the result to SMTP.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formatdate, make_msgid

MAX_REPLY_CHARS = 100_000  # longer replies are cut (and say so); email has no small limit
QUOTE_LINES = 30  # the quoted original is trimmed to this many lines
MAX_REFERENCES = 20  # References keeps the root and the latest ids
_RE_PREFIX = re.compile(r"^\s*((re|aw|sv|vs|antw)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)


@dataclass(frozen=True)
class Original:
    """What a reply needs to know about the mail it answers."""

    message_id: str
    subject: str
    date: str
    sender: str  # "Name <addr>" or the address
    text: str  # the cleaned text, to quote
    references: tuple[str, ...] = ()


def reply_subject(subject: str) -> str:
    """`Re: <subject>`, however many Re:/RE:/Aw: it had (never `Re: Re:`)."""
    rest = _RE_PREFIX.sub("", subject).strip()
    return f"Re: {rest}" if rest else "Re:"


def references(original: Original) -> list[str]:
    """The original's References plus its Message-ID: the root and the newest kept."""
    chain = [*original.references, original.message_id]
    chain = list(dict.fromkeys(chain))  # no repeats, order kept
    if len(chain) > MAX_REFERENCES:
        chain = [chain[0], *chain[-(MAX_REFERENCES - 1) :]]
    return chain


def cap(text: str) -> str:
    if len(text) <= MAX_REPLY_CHARS:
        return text
    return text[:MAX_REPLY_CHARS].rstrip() + f"\n\n[reply cut at {MAX_REPLY_CHARS:,} characters]"


def quote(original: Original) -> str:
    """ "On <date>, <sender> wrote:" and the original's text as `> ` lines, trimmed."""
    lines = original.text.split("\n")
    if len(lines) > QUOTE_LINES:
        lines = [*lines[:QUOTE_LINES], "[...]"]
    quoted = "\n".join(f"> {line}" if line else ">" for line in lines)
    return f"On {original.date or 'an earlier date'}, {original.sender} wrote:\n{quoted}"


def compose(
    *,
    sender: str,
    to: str,
    text: str,
    subject: str,
    original: Original | None = None,
    thread_root: str | None = None,
    message_id: str | None = None,
) -> EmailMessage:
    """One mail: a reply to `original` (quoted, threaded), a mail in the thread rooted at
    `thread_root`, or a fresh one. Always `Auto-Submitted: auto-replied`."""
    body = cap(text)
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    msg["Date"] = formatdate(localtime=False, usegmt=True)
    msg["Message-ID"] = message_id or make_msgid(domain=sender.rpartition("@")[2] or None)
    msg["Auto-Submitted"] = "auto-replied"
    msg["X-Auto-Response-Suppress"] = "All"  # no out-of-office answers to us, please
    quoted = ""
    if original is not None:
        msg["Subject"] = reply_subject(original.subject)
        chain = references(original)
        msg["In-Reply-To"] = original.message_id
        msg["References"] = " ".join(chain)
        quoted = quote(original)
    else:
        msg["Subject"] = subject
        if thread_root is not None:
            msg["In-Reply-To"] = thread_root
            msg["References"] = thread_root
    plain = f"{body}\n\n{quoted}\n" if quoted else f"{body}\n"
    msg.set_content(plain)
    markup = markdown_to_html(body)
    if quoted:
        inner = "<br>\n".join(
            html.escape(line[2:] if line.startswith("> ") else line.lstrip(">"))
            for line in quoted.split("\n")[1:]
        )
        markup += (
            f"\n<p>{html.escape(quoted.split(chr(10))[0])}</p>\n"
            f'<blockquote type="cite">{inner}</blockquote>'
        )
    msg.add_alternative(
        f"<!DOCTYPE html>\n<html><body>\n{markup}\n</body></html>\n", subtype="html"
    )
    return msg


# --- markdown, the small common part, to escaped HTML ----------------------------------

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*|__(.+?)__")
_ITALIC = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])|(?<!\w)_(?!\s)(.+?)(?<!\s)_(?!\w)")
_LINK = re.compile(r"\[([^\]\n]+)\]\(((?:https?://|mailto:)[^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^\s*\d+[.)]\s+(.*)$")


def _inline(text: str) -> str:
    """Escape, then code spans, links, bold and italics (code spans are left alone)."""
    out = []
    for i, piece in enumerate(re.split(r"(`[^`\n]+`)", text)):
        if i % 2 == 1:
            out.append(f"<code>{html.escape(piece[1:-1])}</code>")
            continue
        s = html.escape(piece, quote=False)
        s = _LINK.sub(
            lambda m: f'<a href="{html.escape(html.unescape(m.group(2)))}">{m.group(1)}</a>', s
        )
        s = _BOLD.sub(lambda m: f"<strong>{m.group(1) or m.group(2)}</strong>", s)
        s = _ITALIC.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", s)
        out.append(s)
    return "".join(out)


def markdown_to_html(text: str) -> str:
    """Paragraphs, headings, lists, block quotes, fenced code, and inline code, bold,
    italics and http/mailto links; everything else is escaped text."""
    blocks: list[str] = []
    para: list[str] = []
    items: list[str] = []
    list_tag = ""

    def flush() -> None:
        nonlocal list_tag
        if para:
            blocks.append("<p>" + "<br>\n".join(_inline(p) for p in para) + "</p>")
            para.clear()
        if items:
            blocks.append(
                f"<{list_tag}>" + "".join(f"<li>{i}</li>" for i in items) + f"</{list_tag}>"
            )
            items.clear()
            list_tag = ""

    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            flush()
            code: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                code.append(lines[i])
                i += 1
            blocks.append("<pre><code>" + html.escape("\n".join(code)) + "</code></pre>")
        elif not line.strip():
            flush()
        elif m := _HEADING.match(line):
            flush()
            n = len(m.group(1))
            blocks.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif (m := _BULLET.match(line)) or (m2 := _NUMBERED.match(line)):
            tag = "ul" if m else "ol"
            if para or (items and list_tag != tag):
                flush()
            list_tag = tag
            # m2 is the numbered match whenever m is None (mypy cannot follow the `or`)
            items.append(_inline((m or m2).group(1)))  # type: ignore[union-attr]
        elif line.startswith(">"):
            flush()
            quoted = []
            while i < len(lines) and lines[i].startswith(">"):
                quoted.append(lines[i][1:].lstrip())
                i += 1
            blocks.append("<blockquote>" + markdown_to_html("\n".join(quoted)) + "</blockquote>")
            continue
        else:
            if items:
                flush()
            para.append(line)
        i += 1
    flush()
    return "\n".join(blocks)
