"""Incoming mail as the gateway sees it: pure functions over the raw RFC 5322 bytes.

What is skipped (auto-replies, bounces, lists, our own mail), which text counts (text/plain,
else the HTML turned into text; quoted history and signatures cut), and where a mail
belongs (the sender's session, or a thread we opened) are decided here, so recorded
messages test all of it without a server.
"""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from email.utils import getaddresses, parseaddr, parsedate_to_datetime
from html.parser import HTMLParser

log = logging.getLogger("gateway.adapters.email")

MSGID = re.compile(r"<[^<>\s]+>")
THREAD_MARK = "switchboard-thread."  # the Message-ID local part of threads we open
BOUNCE_SENDERS = ("mailer-daemon", "postmaster")
LIST_PRECEDENCE = ("bulk", "junk", "list")
AUTOREPLY_HEADERS = ("x-autoreply", "x-autorespond", "x-autoresponse")
_ATTRIBUTION = re.compile(
    r"^(On\b[^\n]{0,300}\n?[^\n]{0,200}\bwrote:[ \t]*$"  # Gmail, Apple Mail, Thunderbird
    r"|Le\b[^\n]{0,300}\n?[^\n]{0,200}\ba écrit\s?:[ \t]*$"
    r"|Am\b[^\n]{0,300}\n?[^\n]{0,200}\bschrieb\b[^\n]{0,200}:[ \t]*$"
    r"|-{2,}\s*Original Message\s*-{2,}"
    r"|-{2,}\s*Forwarded message\s*-{2,}"
    r"|_{10,}"  # Outlook's rule above its From:/Sent: block
    r"|From:\s.+\n(Sent|Date):\s.+)",
    re.IGNORECASE | re.MULTILINE,
)
_SIGNATURE = re.compile(
    r"^(-- ?|--|__|Sent from my .{1,40}|Get Outlook for .{1,40})$", re.MULTILINE
)


@dataclass(frozen=True)
class Mail:
    """The parts of one parsed mail the adapter uses."""

    message_id: str | None
    sender: str  # normalised (lower-case) address
    sender_name: str | None
    to: tuple[str, ...]
    cc: tuple[str, ...]
    subject: str
    date: str
    in_reply_to: str | None
    references: tuple[str, ...]
    text: str  # the new words: no quoted history, no signature
    skip: str | None  # why this mail gets no answer, or None

    @property
    def root(self) -> str | None:
        """The first Message-ID of the chain this mail answers (None for a fresh mail)."""
        if self.references:
            return self.references[0]
        return self.in_reply_to


def normalise(address: str) -> str:
    return parseaddr(address)[1].strip().lower()


def parse_mail(raw: bytes, our_address: str) -> Mail:
    msg = message_from_bytes(raw, policy=policy.default)
    assert isinstance(msg, EmailMessage)
    name, addr = parseaddr(str(msg.get("From", "")))
    sender = addr.strip().lower()
    ids = MSGID.findall(str(msg.get("Message-ID", "")))
    reply_ids = MSGID.findall(str(msg.get("In-Reply-To", "")))
    return Mail(
        message_id=ids[0] if ids else None,
        sender=sender,
        sender_name=name or None,
        to=_addresses(msg, "To"),
        cc=_addresses(msg, "Cc"),
        subject=" ".join(str(msg.get("Subject", "")).split()),
        date=str(msg.get("Date", "")).strip(),
        in_reply_to=reply_ids[0] if reply_ids else None,
        references=tuple(MSGID.findall(str(msg.get("References", "")))),
        text=clean_text(body_text(msg)),
        skip=skip_reason(msg, sender, our_address),
    )


def _addresses(msg: EmailMessage, header: str) -> tuple[str, ...]:
    values = [str(v) for v in msg.get_all(header, [])]
    return tuple(a.strip().lower() for _name, a in getaddresses(values) if a)


def skip_reason(msg: EmailMessage, sender: str, our_address: str) -> str | None:
    """Why a mail must not be answered (RFC 3834 and common practice), or None."""
    if not sender or "@" not in sender:
        return "no sender address"
    if sender == our_address.lower():
        return "our own mail"
    auto = str(msg.get("Auto-Submitted", "")).strip().lower()
    if auto and auto.split(";")[0].strip() != "no":
        return f"Auto-Submitted: {auto}"
    if str(msg.get("Precedence", "")).strip().lower() in LIST_PRECEDENCE:
        return f"Precedence: {str(msg.get('Precedence')).strip().lower()}"
    if any(h in (k.lower() for k in msg.keys()) for h in AUTOREPLY_HEADERS):
        return "an auto-reply header"
    if msg.get("List-Id") is not None:
        return "a mailing list"
    if sender.split("@")[0] in BOUNCE_SENDERS:
        return "a bounce (mailer-daemon/postmaster)"
    if str(msg.get("Return-Path", "")).strip() == "<>":
        return "a bounce (null return path)"
    if msg.get_content_type() == "multipart/report":
        return "a delivery or read report"
    return None


def body_text(msg: EmailMessage) -> str:
    """The text/plain body, else the text/html one as text; attachments ignored."""
    for kind in ("plain", "html"):
        part = msg.get_body(preferencelist=(kind,))
        if part is None:
            continue
        try:
            content = part.get_content()
        except (LookupError, ValueError):  # an unknown charset or a broken encoding
            payload = part.get_payload(decode=True)
            content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
        if not isinstance(content, str):
            continue
        return content if kind == "plain" else html_to_text(content)
    return ""


class _TextOf(HTMLParser):
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table"}
    HIDDEN = {"script", "style", "head", "title", "blockquote"}
    QUOTE_CLASSES = ("gmail_quote", "moz-cite-prefix", "yahoo_quoted", "protonmail_quote")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.hidden: list[str] = []  # the open elements whose content is dropped

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        classes = found.get("class") or ""
        quoted = any(c in classes for c in self.QUOTE_CLASSES) or found.get("id") in (
            "divRplyFwdMsg",
            "appendonsend",
        )
        if self.hidden or tag in self.HIDDEN or quoted:
            if tag not in ("br", "img", "hr", "meta", "link", "input"):
                self.hidden.append(tag)
            return
        if tag in self.BLOCK:
            self.out.append("\n")
        if tag == "li":
            self.out.append("- ")

    def handle_endtag(self, tag: str) -> None:
        if self.hidden:
            if tag in self.hidden:  # closes it and whatever was left open inside (<p>, <li>)
                while self.hidden.pop() != tag:
                    pass
            return
        if tag in self.BLOCK and tag != "li":
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.out.append(data)


def html_to_text(markup: str) -> str:
    """Visible text of an HTML mail: scripts, styles and quoted history dropped."""
    parser = _TextOf()
    parser.feed(markup)
    parser.close()
    lines = (" ".join(line.split()) for line in html.unescape("".join(parser.out)).split("\n"))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def clean_text(text: str) -> str:
    """The new words of a mail: cut at the first attribution line ("On ... wrote:",
    "-----Original Message-----", Outlook's From:/Sent: block), drop a trailing block of
    `>` lines, and cut the signature ("-- " and "Sent from my ..." lines)."""
    text = text.replace("\r\n", "\n")
    match = _ATTRIBUTION.search(text)
    if match:
        text = text[: match.start()]
    lines = text.rstrip().split("\n")
    while lines and (lines[-1].startswith(">") or not lines[-1].strip()):
        lines.pop()
    text = "\n".join(lines)
    sig = _SIGNATURE.search(text)
    if sig and sig.start() > 0:
        text = text[: sig.start()]
    return text.strip()


def received_at(mail: Mail, fallback: float) -> float:
    try:
        return parsedate_to_datetime(mail.date).timestamp()
    except (TypeError, ValueError, IndexError):
        return fallback
