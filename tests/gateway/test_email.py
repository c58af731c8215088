"""Email: pure parsing and composing on recorded mail, the adapter against a loopback IMAP
fake (driven by the real aioimaplib) and aiosmtpd (driven by the real aiosmtplib), and the
whole daemon (router, state.db, echo agent) answering mail."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.adapters.email import EmailAdapter, SmtpAccount, _smtp_login, is_our_thread, to_inbound
from gateway.adapters.email_imap import MAX_FETCH_BYTES, Connection, ImapAccount
from gateway.adapters.email_inbound import clean_text, html_to_text, parse_mail
from gateway.adapters.email_outbound import (
    MAX_REFERENCES,
    MAX_REPLY_CHARS,
    Original,
    compose,
    markdown_to_html,
    reply_subject,
)
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import AdapterError, InvalidToken, NotAccepted
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage, OutboundMessage
from gateway.vocab import ChatType
from tests.fakes import stalled_then_on_time, wait_for_count
from tests.fakes.imap import FakeImap, self_signed
from tests.fakes.smtp import FakeSmtp
from tests.gateway.conftest import refused_at_start

US = "agent@example.com"
ALICE = "alice@example.com"


def mail(
    text: str = "hello",
    *,
    sender: str = f"Alice <{ALICE}>",
    subject: str = "Hi",
    headers: dict[str, str] | None = None,
    html: str | None = None,
    to: str = US,
    message_id: str | None = None,
) -> bytes:
    m = EmailMessage()
    m["From"], m["To"], m["Subject"] = sender, to, subject
    m["Date"] = formatdate(localtime=False)
    m["Message-ID"] = message_id or make_msgid(domain="example.com")
    for name, value in (headers or {}).items():
        m[name] = value
    if text:
        m.set_content(text)
    if html is not None:
        if text:
            m.add_alternative(html, subtype="html")
        else:
            m.set_content(html, subtype="html")
    return bytes(m)


def reply_to(answer: EmailMessage, text: str, sender: str = f"Alice <{ALICE}>") -> bytes:
    """What a mail client sends when a person answers `answer`."""
    refs = f"{answer.get('References', '')} {answer['Message-ID']}".strip()
    return mail(
        text + "\n\nOn some day, the agent wrote:\n> earlier words\n",
        sender=sender,
        subject=f"Re: {answer['Subject']}",
        headers={"In-Reply-To": str(answer["Message-ID"]), "References": refs},
    )


def plain(msg: EmailMessage) -> str:
    part = msg.get_body(preferencelist=("plain",))
    assert part is not None
    return str(part.get_content()).replace("\r\n", "\n")  # SMTP carries CRLF


# --- pure: parsing recorded mail --------------------------------------------------------

GMAIL_REPLY = (
    b"From: Alice Example <Alice@Example.COM>\r\nTo: agent@example.com\r\n"
    b"Subject: Re: Trip\r\nDate: Tue, 1 Dec 2026 10:00:00 +0100\r\n"
    b"Message-ID: <CAB123@mail.gmail.com>\r\nIn-Reply-To: <ours-1@example.com>\r\n"
    b"References: <first@mail.gmail.com> <ours-1@example.com>\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n\r\n"
    b"Sounds good, book the 9:15.\r\n\r\n-- \r\nAlice\r\n\r\n"
    b"On Tue, 1 Dec 2026 at 09:00, agent@example.com <agent@example.com>\r\nwrote:\r\n"
    b"> Which train?\r\n"
)


def test_a_recorded_reply_is_parsed_and_cleaned() -> None:
    m = parse_mail(GMAIL_REPLY, US)
    assert (m.sender, m.sender_name, m.message_id) == (
        ALICE,
        "Alice Example",
        "<CAB123@mail.gmail.com>",
    )
    assert m.root == "<first@mail.gmail.com>" and m.skip is None
    assert m.text == "Sounds good, book the 9:15."
    msg = to_inbound(m, US, fallback_id="x")
    assert msg is not None
    src = msg.source
    assert (src.platform, src.chat_id, src.chat_type, src.thread_id) == (
        "email",
        ALICE,
        ChatType.DM,
        None,
    )
    assert msg.platform_message_id == msg.reply_to == "<CAB123@mail.gmail.com>"


@pytest.mark.parametrize(
    "body, expected",
    [
        ("Yes please.\n\nOn Mon, 30 Nov 2026, Bob <b@x.org> wrote:\n> old\n> older", "Yes please."),
        ("Fine.\n\n-----Original Message-----\nFrom: x\nquestion", "Fine."),
        ("Fine.\n________________________________\nFrom: Agent\nSent: Monday", "Fine."),
        ("Ok.\nFrom: Agent <agent@example.com>\nSent: Monday\nTo: me\n\nold", "Ok."),
        ("Merci.\n\nLe lun. 30 nov. 2026, Bob <b@x.org> a écrit :\n> vieux", "Merci."),
        ("Danke.\n\nAm 30.11.2026 um 10:00 schrieb Bob <b@x.org>:\n> alt", "Danke."),
        ("Thanks!\n\n> quoted at the end\n> more", "Thanks!"),
        ("Thanks\n-- \nAlice Example\nCEO", "Thanks"),
        ("On it.\n\nSent from my iPhone", "On it."),
        (
            "> first question\nfirst answer\n> second question\nsecond answer",
            "> first question\nfirst answer\n> second question\nsecond answer",
        ),  # interleaved: kept
        ("On Monday I wrote: a letter to my aunt.", "On Monday I wrote: a letter to my aunt."),
    ],
)
def test_quoted_history_and_signatures_are_cut(body: str, expected: str) -> None:
    assert clean_text(body) == expected


def test_an_html_only_mail_is_read_as_text_without_its_quote() -> None:
    markup = (
        "<html><head><style>p{color:red}</style><title>t</title></head><body>"
        "<div>Please <b>summarise</b> this&nbsp;&amp; that.</div><div><br></div>"
        "<ul><li>one</li><li>two</li></ul><script>alert(1)</script>"
        '<div class="gmail_quote"><div>On Mon, Bob wrote:</div><blockquote>old stuff</blockquote></div>'
        "</body></html>"
    )
    m = parse_mail(mail("", html=markup), US)
    assert m.text == "Please summarise this & that.\n\n- one\n- two"
    assert html_to_text("<p>new</p><blockquote>old stuff</blockquote>") == "new"
    assert html_to_text("<blockquote><p>old<li>unclosed</blockquote><p>after</p>") == "after"


def test_text_plain_is_preferred_over_html() -> None:
    m = parse_mail(mail("the plain words", html="<p>the html words</p>"), US)
    assert m.text == "the plain words"


@pytest.mark.parametrize(
    "headers, sender, reason",
    [
        ({"Auto-Submitted": "auto-replied"}, ALICE, "Auto-Submitted"),
        ({"Auto-Submitted": "auto-generated"}, ALICE, "Auto-Submitted"),
        ({"Precedence": "bulk"}, ALICE, "Precedence"),
        ({"Precedence": "junk"}, ALICE, "Precedence"),
        ({"Precedence": "list"}, ALICE, "Precedence"),
        ({"X-Autoreply": "yes"}, ALICE, "auto-reply"),
        ({"List-Id": "<team.lists.example.com>"}, ALICE, "mailing list"),
        ({}, "MAILER-DAEMON@mx.example.com", "bounce"),
        ({}, "postmaster@example.com", "bounce"),
        ({"Return-Path": "<>"}, ALICE, "bounce"),
        ({}, US, "our own"),
    ],
)
def test_auto_replies_bounces_and_lists_get_no_answer(
    headers: dict[str, str], sender: str, reason: str
) -> None:
    m = parse_mail(mail("I am out of office", sender=sender, headers=headers), US)
    assert m.skip is not None and reason in m.skip
    assert to_inbound(m, US, fallback_id="x") is None


def test_a_delivery_report_is_a_bounce_and_auto_submitted_no_is_a_person() -> None:
    report = (
        b"From: Mail Delivery System <bounces@mx.example.com>\r\nTo: agent@example.com\r\n"
        b"Subject: Undelivered Mail\r\nMessage-ID: <b1@mx>\r\nMIME-Version: 1.0\r\n"
        b'Content-Type: multipart/report; report-type=delivery-status; boundary="B"\r\n\r\n'
        b"--B\r\nContent-Type: text/plain\r\n\r\nCould not deliver.\r\n"
        b"--B\r\nContent-Type: message/delivery-status\r\n\r\nStatus: 5.1.1\r\n--B--\r\n"
    )
    assert "report" in str(parse_mail(report, US).skip)
    assert parse_mail(mail("hi", headers={"Auto-Submitted": "no"}), US).skip is None


def test_garbage_is_read_without_a_crash_and_gets_no_answer() -> None:
    m = parse_mail(b"\x00\xff not a mail at all", US)
    assert m.skip == "no sender address" and to_inbound(m, US, fallback_id="x") is None


def test_only_a_chain_rooted_in_our_thread_is_a_thread() -> None:
    root = "<switchboard-thread.abc123@example.com>"
    assert is_our_thread(root, US) and not is_our_thread("<switchboard-thread.abc@evil.org>", US)
    ours = parse_mail(mail("carry on", headers={"In-Reply-To": root, "References": root}), US)
    msg = to_inbound(ours, US, fallback_id="x")
    assert msg is not None and msg.source.chat_type == ChatType.THREAD
    assert (msg.source.chat_id, msg.source.thread_id) == (ALICE, root)
    other = parse_mail(mail("hm", headers={"References": "<switchboard-thread.x@evil.org>"}), US)
    msg = to_inbound(other, US, fallback_id="x")
    assert msg is not None and (msg.source.chat_type, msg.source.thread_id) == (ChatType.DM, None)


def test_no_message_id_falls_back_and_an_empty_body_uses_the_subject() -> None:
    raw = b"From: alice@example.com\r\nTo: agent@example.com\r\nSubject: /status\r\n\r\n"
    msg = to_inbound(parse_mail(raw, US), US, fallback_id="<uid.7.3@imap>")
    assert msg is not None and (msg.text, msg.platform_message_id) == ("/status", "<uid.7.3@imap>")


def test_require_mention_wants_our_address_in_to_or_cc() -> None:
    bcc = parse_mail(mail("hi", to="someone@else.org"), US)
    cc = parse_mail(
        mail("hi", to="someone@else.org", headers={"Cc": "Agent <AGENT@example.com>"}), US
    )
    assert to_inbound(bcc, US, fallback_id="x", require_mention=True).mentioned is False  # type: ignore[union-attr]
    assert to_inbound(cc, US, fallback_id="x", require_mention=True).mentioned is True  # type: ignore[union-attr]
    assert to_inbound(bcc, US, fallback_id="x").mentioned is True  # type: ignore[union-attr]


# --- pure: composing ------------------------------------------------------------------


@pytest.mark.parametrize(
    "subject, expected",
    [
        ("Trip", "Re: Trip"),
        ("Re: Trip", "Re: Trip"),
        ("RE: re: Aw: Trip", "Re: Trip"),
        ("Re[2]: Trip", "Re: Trip"),
        ("Fwd: Trip", "Re: Fwd: Trip"),
        ("", "Re:"),
    ],
)
def test_reply_subjects_never_pile_up(subject: str, expected: str) -> None:
    assert reply_subject(subject) == expected


def test_a_reply_keeps_the_thread_quotes_and_is_marked_automatic() -> None:
    refs = tuple(f"<r{i}@x>" for i in range(30))
    original = Original(
        "<m@x>",
        "Re: Trip",
        "Tue, 1 Dec 2026 10:00:00 +0100",
        "Alice <alice@example.com>",
        "line one\nline two",
        refs,
    )
    msg = compose(
        sender=US, to=ALICE, text="**Yes** <b>not html</b>", subject="", original=original
    )
    assert (msg["Subject"], msg["In-Reply-To"], msg["Auto-Submitted"]) == (
        "Re: Trip",
        "<m@x>",
        "auto-replied",
    )
    chain = str(msg["References"]).split()
    assert len(chain) == MAX_REFERENCES and chain[0] == "<r0@x>" and chain[-1] == "<m@x>"
    assert plain(msg) == (
        "**Yes** <b>not html</b>\n\nOn Tue, 1 Dec 2026 10:00:00 +0100, Alice <alice@example.com> wrote:\n"
        "> line one\n> line two\n"
    )
    part = msg.get_body(preferencelist=("html",))
    assert part is not None
    markup = str(part.get_content())
    assert "<strong>Yes</strong> &lt;b&gt;not html&lt;/b&gt;" in markup
    assert '<blockquote type="cite">line one<br>\nline two</blockquote>' in markup


def test_a_long_reply_is_capped_and_a_long_original_is_trimmed_in_the_quote() -> None:
    original = Original("<m@x>", "s", "d", ALICE, "\n".join(f"l{i}" for i in range(100)))
    msg = compose(
        sender=US, to=ALICE, text="x" * (MAX_REPLY_CHARS + 50), subject="", original=original
    )
    body = plain(msg)
    assert f"[reply cut at {MAX_REPLY_CHARS:,} characters]" in body
    assert "> l29\n> [...]" in body and "l30" not in body


def test_markdown_becomes_simple_escaped_html() -> None:
    text = (
        "# Plan\n\nUse `a<b>` and **bold**, *it* and [docs](https://x.org/?a=1&b=2).\n\n"
        "- one\n- two\n\n1. first\n\n```\n<script>x</script>\n```\n> quoted\n\n"
        "[bad](javascript:alert(1)) <img src=x>"
    )
    assert markdown_to_html(text) == (
        "<h1>Plan</h1>\n<p>Use <code>a&lt;b&gt;</code> and <strong>bold</strong>, <em>it</em> and "
        '<a href="https://x.org/?a=1&amp;b=2">docs</a>.</p>\n<ul><li>one</li><li>two</li></ul>\n'
        "<ol><li>first</li></ol>\n<pre><code>&lt;script&gt;x&lt;/script&gt;</code></pre>\n"
        "<blockquote><p>quoted</p></blockquote>\n<p>[bad](javascript:alert(1)) &lt;img src=x&gt;</p>"
    )


# --- the adapter against the fakes ---------------------------------------------------


class MemoryCursors:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    async def get(self, name: str) -> str | None:
        return self.values.get(name)

    async def set(self, name: str, value: str) -> None:
        self.values[name] = value


@pytest.fixture
async def servers() -> AsyncIterator[tuple[FakeImap, FakeSmtp]]:
    imap, smtp = FakeImap(user=US), FakeSmtp(user=US)
    await imap.start()
    await smtp.start()
    try:
        yield imap, smtp
    finally:
        await imap.stop()
        await smtp.stop()


def make_adapter(
    imap: FakeImap,
    smtp: FakeSmtp,
    *,
    password: str | None = None,
    smtp_password: str | None = None,
    poll_s: float = 0.2,
    allowed: tuple[str, ...] | None = None,
) -> EmailAdapter:
    from gateway.adapters.base import Backoff

    return EmailAdapter(
        US,
        ImapAccount("127.0.0.1", imap.port, "plain", US, password or imap.password, timeout_s=5),
        SmtpAccount(
            "127.0.0.1", smtp.port, "plain", US, smtp_password or smtp.password, timeout_s=5
        ),
        poll_s=poll_s,
        allowed=allowed,
        backoff=Backoff(initial_s=0.05, max_s=0.2),
    )


class Inbox:
    def __init__(self) -> None:
        self.seen: list[InboundMessage] = []
        self.refuse = 0  # raise NotAccepted this many times

    async def emit(self, msg: InboundMessage) -> None:
        if self.refuse:
            self.refuse -= 1
            raise NotAccepted("the store is busy")
        self.seen.append(msg)

    async def wait(self, n: int, timeout: float = 10.0) -> list[InboundMessage]:
        return await wait_for_count(lambda: self.seen, n, timeout, "inbound mails")


async def test_idle_delivers_a_new_mail_at_once(servers: tuple[FakeImap, FakeSmtp]) -> None:
    imap, smtp = servers
    imap.deliver(mail("already here before the first start"))
    adapter, inbox = make_adapter(imap, smtp, poll_s=3600), Inbox()
    await adapter.start(inbox.emit)
    try:
        await imap.wait_command("IDLE")
        imap.deliver(mail("pushed"))
        [msg] = await inbox.wait(1)  # poll_s is an hour: only the IDLE push can bring it
        assert msg.text == "pushed" and adapter.health()["imap"] == "idle"
        [fetch] = imap.sent("UID_FETCH")  # never the old one
        assert fetch == f"UID_FETCH 2 (UID BODY.PEEK[]<0.{MAX_FETCH_BYTES}>)"
    finally:
        await adapter.stop()
        await adapter.stop()
    assert adapter.health()["state"] == "stopped" and imap.sent("LOGOUT")


async def test_without_idle_the_folder_is_polled(servers: tuple[FakeImap, FakeSmtp]) -> None:
    imap, smtp = servers
    imap.idle = False
    adapter, inbox = make_adapter(imap, smtp, poll_s=0.2), Inbox()
    await adapter.start(inbox.emit)
    try:
        await imap.wait_command("NOOP")  # a poll went by with nothing new
        imap.deliver(mail("polled"))
        [msg] = await inbox.wait(1)
        assert msg.text == "polled" and adapter.health()["imap"] == "polling"
        assert not imap.sent("IDLE")
    finally:
        await adapter.stop()


async def test_a_dropped_connection_is_reopened(servers: tuple[FakeImap, FakeSmtp]) -> None:
    imap, smtp = servers
    adapter, inbox = make_adapter(imap, smtp), Inbox()
    await adapter.start(inbox.emit)
    try:
        await imap.wait_command("IDLE")
        imap.drop_connections()
        await wait_for_count(lambda: [ok for _u, ok in imap.logins if ok], 2, 10, "logins")
        imap.deliver(mail("after the outage"))
        [msg] = await inbox.wait(1)
        assert msg.text == "after the outage"
    finally:
        await adapter.stop()


async def test_a_mail_the_gateway_could_not_take_is_offered_again(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    imap, smtp = servers
    adapter, inbox, cursors = make_adapter(imap, smtp), Inbox(), MemoryCursors()
    adapter.use_cursors(cursors)
    inbox.refuse = 2
    await adapter.start(inbox.emit)
    try:
        uid = imap.deliver(mail("keep me"))
        [msg] = await inbox.wait(1)
        assert msg.text == "keep me" and len(imap.sent("UID_FETCH")) == 3
        [name] = cursors.values

        def place() -> list[dict[str, int]]:
            found = json.loads(cursors.values[name])
            return [found] if found["uid"] == uid else []

        [found] = await wait_for_count(place, 1, 5, "the cursor at the mail's UID")
        assert found["uidvalidity"] == imap.uidvalidity
    finally:
        await adapter.stop()


async def test_senders_outside_the_allowlist_are_dropped_without_an_answer(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    imap, smtp = servers
    adapter, inbox = make_adapter(imap, smtp, allowed=("Alice@Example.com",)), Inbox()
    await adapter.start(inbox.emit)
    try:
        imap.deliver(mail("let me in", sender="mallory@evil.org"))
        imap.deliver(mail("it is me", sender="ALICE@example.com"))
        [msg] = await inbox.wait(1)
        assert (msg.source.chat_id, msg.source.user_id) == (ALICE, "Alice@Example.com")
        await asyncio.sleep(0.2)
        assert len(inbox.seen) == 1 and smtp.accepted == []
    finally:
        await adapter.stop()


async def test_an_email_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    """Replicas: the process stands still after a reply's send began (its SMTP connection
    on the way) and before the mail went out. Connected, the send finds its SEND_BY passed
    and stops before MAIL FROM (SetOutLate), so the turn can ask its lease first. On time,
    the mail is sent once."""
    imap, smtp = servers
    adapter = make_adapter(imap, smtp)
    await adapter.start(Inbox().emit)
    try:
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("email", ALICE, "once")),
            lambda: [plain(a.message).split("\n")[0] for a in smtp.accepted],
        )
    finally:
        await adapter.stop()


async def test_a_temporary_smtp_failure_is_retried(servers: tuple[FakeImap, FakeSmtp]) -> None:
    imap, smtp = servers
    adapter = make_adapter(imap, smtp)
    await adapter.start(Inbox().emit)
    try:
        smtp.fail_next = 2
        ref = await adapter.send(OutboundMessage("email", ALICE, "third time lucky"))
        [sent] = smtp.accepted
        assert plain(sent.message).startswith("third time lucky") and sent.rcpt_tos == [ALICE]
        assert ref.message_ids == (str(sent.message["Message-ID"]),)
        assert sent.message["Subject"] == "A message from your agent"
    finally:
        await adapter.stop()


@pytest.mark.parametrize("which", ["imap", "smtp"])
async def test_a_refused_password_stops_the_adapter_with_one_clear_line(
    servers: tuple[FakeImap, FakeSmtp], which: str, caplog: pytest.LogCaptureFixture
) -> None:
    imap, smtp = servers
    bad = {"password": "wrong"} if which == "imap" else {"smtp_password": "wrong"}
    adapter = make_adapter(imap, smtp, **bad)
    with pytest.raises(InvalidToken, match=f"{which.upper()} login refused for {US}"):
        await adapter.start(Inbox().emit)
    assert str(adapter.health()["state"]).startswith("failed: ")
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(lines) == 1 and lines[0].startswith("email adapter stopped: ")
    assert "wrong" not in lines[0]
    await adapter.stop()


async def test_create_thread_sends_a_mail_whose_message_id_is_the_thread(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    imap, smtp = servers
    adapter, inbox = make_adapter(imap, smtp), Inbox()
    await adapter.start(inbox.emit)
    try:
        ref = await adapter.create_thread(ALICE, "deploy  plan")
        assert ref is not None and is_our_thread(ref.thread_id, US)
        [sent] = smtp.accepted
        assert (sent.message["Subject"], sent.message["Message-ID"]) == (
            "deploy plan",
            ref.thread_id,
        )
        await adapter.send(OutboundMessage("email", ALICE, "more", thread_id=ref.thread_id))
        second = (await smtp.wait(2))[1].message
        assert (second["Subject"], second["In-Reply-To"]) == ("Re: deploy plan", ref.thread_id)
        imap.deliver(reply_to(sent.message, "carry on"))
        [msg] = await inbox.wait(1)
        assert (msg.source.chat_type, msg.source.thread_id, msg.text) == (
            ChatType.THREAD,
            ref.thread_id,
            "carry on",
        )
        assert EmailAdapter.thread_source(ref).chat_id == msg.source.chat_id
    finally:
        await adapter.stop()


# --- the whole daemon ----------------------------------------------------------------

KEY = f"agent:main:email:dm:{ALICE}"


async def start_gateway(
    tmp_path: Path, imap: FakeImap, smtp: FakeSmtp, password: str | None = None
) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  email:\n    enabled: true\n"
        f"    allowed_users: [Alice@Example.com]\n    address: {US}\n"
        f"    imap_host: 127.0.0.1\n    imap_port: {imap.port}\n    imap_tls: plain\n"
        f"    smtp_host: 127.0.0.1\n    smtp_port: {smtp.port}\n    smtp_tls: plain\n"
        "    poll_seconds: 1\n"
    )
    env = {"EMAIL_PASSWORD": password or imap.password}
    gw = Gateway(config=load_config(cfg, env), home=tmp_path / "home")
    await gw.start()
    return gw


@pytest.fixture
async def daemon(
    tmp_path: Path, servers: tuple[FakeImap, FakeSmtp]
) -> AsyncIterator[tuple[Gateway, FakeImap, FakeSmtp]]:
    imap, smtp = servers
    gw = await start_gateway(tmp_path, imap, smtp)
    try:
        yield gw, imap, smtp
    finally:
        await gw.stop()


async def stored(gw: Gateway, key: str = KEY) -> list[str]:
    assert gw.index is not None and gw.db is not None
    entry = gw.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gw.db.get_messages(entry.session_id)]


@pytest.mark.slow
@pytest.mark.parametrize("idle", [True, False], ids=["idle", "polling"])
async def test_a_mail_is_answered_and_a_reply_in_its_thread_shares_the_session(
    tmp_path: Path, servers: tuple[FakeImap, FakeSmtp], idle: bool
) -> None:
    imap, smtp = servers
    imap.idle = idle
    gw = await start_gateway(tmp_path, imap, smtp)
    try:
        first = mail("hello\n\n-- \nAlice", subject="Trip")
        first_id = str(parse_mail(first, US).message_id)
        imap.deliver(first)
        [answer] = await smtp.wait(1)
        a = answer.message
        assert (answer.mail_from, answer.rcpt_tos) == (US, [ALICE])
        assert (a["From"], a["To"], a["Subject"]) == (US, ALICE, "Re: Trip")
        assert (a["In-Reply-To"], a["References"], a["Auto-Submitted"]) == (
            first_id,
            first_id,
            "auto-replied",
        )
        assert plain(a).startswith("echo: hello\n\nOn ") and plain(a).endswith("wrote:\n> hello\n")
        assert a.get_body(preferencelist=("html",)) is not None
        reply = reply_to(a, "and tomorrow?")
        imap.deliver(reply)
        second = (await smtp.wait(2))[1].message
        assert second["Subject"] == "Re: Trip"  # not Re: Re:
        assert str(second["References"]).split() == [
            first_id,
            str(a["Message-ID"]),
            str(parse_mail(reply, US).message_id),
        ]
        assert await stored(gw) == ["hello", "echo: hello", "and tomorrow?", "echo: and tomorrow?"]
        assert bool(imap.sent("IDLE")) is idle
    finally:
        await gw.stop()


async def test_a_chat_command_by_mail(daemon: tuple[Gateway, FakeImap, FakeSmtp]) -> None:
    gw, imap, smtp = daemon
    imap.deliver(mail("/status", subject="status please"))
    [answer] = await smtp.wait(1)
    assert plain(answer.message).startswith("Session: ")
    assert answer.message["Subject"] == "Re: status please"


async def test_bounces_and_auto_replies_get_no_answer(
    daemon: tuple[Gateway, FakeImap, FakeSmtp],
) -> None:
    gw, imap, smtp = daemon
    imap.deliver(mail("Delivery failed", sender="MAILER-DAEMON@example.com", subject="Undelivered"))
    imap.deliver(
        mail("I am away", headers={"Auto-Submitted": "auto-replied"}, subject="Out of office")
    )
    imap.deliver(mail("news", headers={"Precedence": "bulk"}))
    real = mail("a real question")
    imap.deliver(real)
    [answer] = await smtp.wait(1)
    await asyncio.sleep(0.3)
    assert (
        len(smtp.accepted) == 1 and answer.message["In-Reply-To"] == parse_mail(real, US).message_id
    )
    assert await stored(gw) == ["a real question", "echo: a real question"]


async def test_a_restart_neither_answers_twice_nor_skips_mail_that_came_meanwhile(
    tmp_path: Path, servers: tuple[FakeImap, FakeSmtp]
) -> None:
    imap, smtp = servers
    sent = [mail(f"question {i}") for i in range(3)]
    gw = await start_gateway(tmp_path, imap, smtp)
    try:
        imap.deliver(sent[0])
        await smtp.wait(1)
    finally:
        await gw.stop()
    imap.deliver(sent[1])  # while the daemon is down
    imap.deliver(sent[2])
    fetched_before = len(imap.sent("UID_FETCH"))
    gw = await start_gateway(tmp_path, imap, smtp)
    try:
        await smtp.wait(3)
        await asyncio.sleep(0.5)
        # the stored UID cursor, not only the store's dedupe: the answered mail is not even read
        assert [c.split()[1] for c in imap.sent("UID_FETCH")[fetched_before:]] == ["2", "3"]
        answered = [a.message["In-Reply-To"] for a in smtp.accepted]
        assert answered == [parse_mail(m, US).message_id for m in sent]
        assert await stored(gw) == [
            t for i in range(3) for t in (f"question {i}", f"echo: question {i}")
        ]
    finally:
        await gw.stop()


async def test_a_new_uidvalidity_rereads_recent_mail_without_answering_twice(
    daemon: tuple[Gateway, FakeImap, FakeSmtp],
) -> None:
    gw, imap, smtp = daemon
    first, second = mail("before the rebuild"), mail("after the rebuild")
    imap.deliver(first)
    await smtp.wait(1)
    imap.renumber()  # the server rebuilt the folder: new UIDVALIDITY, new UIDs, links dropped
    imap.deliver(second)
    await smtp.wait(2)
    reread = await wait_for_count(
        lambda: [c for c in imap.sent("UID_SEARCH") if "SINCE" in c], 1, 5, "re-reads"
    )
    assert reread[0].endswith(
        "SINCE " + (datetime.now(UTC) - timedelta(days=1)).strftime("%-d-%b-%Y")
    )
    await asyncio.sleep(0.5)
    answered = [a.message["In-Reply-To"] for a in smtp.accepted]
    assert answered == [parse_mail(first, US).message_id, parse_mail(second, US).message_id]


async def test_a_bad_password_stops_the_adapter_while_the_daemon_runs(
    tmp_path: Path, servers: tuple[FakeImap, FakeSmtp]
) -> None:
    imap, smtp = servers
    gw = await start_gateway(tmp_path, imap, smtp, password="wrong")
    try:
        refused_at_start(gw, "email", "IMAP login refused", ["platforms.email.token_env"])
    finally:
        await gw.stop()


async def test_sethome_then_handoff_opens_a_mail_thread_that_continues_the_session(
    daemon: tuple[Gateway, FakeImap, FakeSmtp],
) -> None:
    gw, imap, smtp = daemon
    assert gw.db is not None and gw.handoffs is not None
    gw.handoffs.poll_s = 0.05
    imap.deliver(mail("/sethome"))
    [home] = await smtp.wait(1)
    assert plain(home.message).startswith("Home channel for email set to this chat.")
    assert json.loads(str(await gw.db.get_meta(HOME_KEY.format("email"))))["chat_id"] == ALICE
    sid = await gw.db.create_session(source="cli", title="deploy plan")
    await gw.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, detail = await asyncio.wait_for(
        handoff_from_terminal(gw.db, sid, "email", enabled=True), 30
    )
    assert ok, detail
    _home, root, confirm = await smtp.wait(3)
    assert root.message["Subject"] == "deploy plan" and is_our_thread(
        str(root.message["Message-ID"]), US
    )
    assert confirm.message["In-Reply-To"] == root.message["Message-ID"]
    assert plain(confirm.message).startswith("Continuing here from the terminal (deploy plan).")
    imap.deliver(reply_to(confirm.message, "carry on"))
    await smtp.wait(4)
    contents = [m["content"] for m in await gw.db.get_messages(sid)]
    assert contents[-2:] == ["[Alice] carry on", "echo: [Alice] carry on"]  # the same session id


# --- config ---------------------------------------------------------------------------


def test_the_section_refuses_what_cannot_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.errors import ConfigError

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  email:\n    enabled: true\n    allowed_users: ['*@example.com', bob]\n"
        "    imap_host: imap.example.com\n    imap_tls: plain\n    smtp_host: 127.0.0.1\n"
        "    smtp_tls: plain\n    base_url: http://x\n    poll_seconds: 0\n"
    )
    monkeypatch.setitem(sys.modules, "aiosmtplib", None)  # as if it were not installed
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    found = {e.key: e.problem for e in err.value.all()}
    assert found["platforms.email.address"] == "is required when email is enabled"
    assert found["platforms.email.imap_tls"].startswith(
        "plain (no TLS) is allowed only for a loopback"
    )
    assert "platforms.email.smtp_tls" not in found  # 127.0.0.1 may be plain
    assert found["platforms.email.base_url"].startswith("is not used by email")
    users = [e.problem for e in err.value.all() if e.key == "platforms.email.allowed_users"]
    assert users == [
        "must list whole email addresses (got '*@example.com')",
        "must list whole email addresses (got 'bob')",
    ]
    assert found["platforms.email.poll_seconds"].startswith("must be between 1 and 3600")
    assert found["platforms.email.token_env"].startswith("EMAIL_PASSWORD is not set")
    assert (
        found["platforms.email"] == "needs the aiosmtplib package: pip install 'switchboard[email]'"
    )


async def test_a_notice_rides_at_the_top_of_the_answer(servers: tuple[FakeImap, FakeSmtp]) -> None:
    imap, smtp = servers
    adapter = make_adapter(imap, smtp)
    await adapter.start(Inbox().emit)
    try:
        notice = OutboundMessage(
            "email", ALICE, "A new session was started.", reply_to="<m@x>", notice=True
        )
        assert (await adapter.send(notice)).message_ids == ()
        await adapter.send(OutboundMessage("email", ALICE, "echo: hi", reply_to="<m@x>"))
        [sent] = await smtp.wait(1)
        assert plain(sent.message) == "A new session was started.\n\necho: hi\n"
    finally:
        await adapter.stop()


@pytest.mark.parametrize("smtp_tls", ["starttls", "tls"])
async def test_tls_on_both_sides_verifies_the_servers_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smtp_tls: str
) -> None:
    cert, context = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted by ssl.create_default_context()
    imap, smtp = FakeImap(user=US, tls=context), FakeSmtp(user=US, tls=context, tls_mode=smtp_tls)
    await imap.start()
    await smtp.start()
    adapter, inbox = make_adapter(imap, smtp), Inbox()
    adapter.watcher.account = replace(adapter.watcher.account, tls="tls")
    adapter.smtp = replace(adapter.smtp, tls=smtp_tls)
    try:
        await adapter.start(inbox.emit)
        imap.deliver(mail("over TLS"))
        [msg] = await inbox.wait(1)
        await adapter.send(OutboundMessage("email", ALICE, "echo: over TLS", reply_to=msg.reply_to))
        [sent] = await smtp.wait(1)
        assert plain(sent.message).startswith("echo: over TLS")
        assert smtp.auth_attempts == [(US, True), (US, True)]  # the check at start, the send
        monkeypatch.delenv("SSL_CERT_FILE")  # a certificate nobody vouches for is refused
        with pytest.raises(AdapterError):
            await _smtp_login(adapter.smtp)
        with pytest.raises(AdapterError, match="SSLCertVerificationError"):
            await Connection(adapter.watcher.account).open()
    finally:
        await adapter.stop()
        await imap.stop()
        await smtp.stop()


async def test_an_imap_server_down_at_start_up_is_waited_for(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    imap, smtp = servers
    await imap.stop()
    adapter, inbox = make_adapter(imap, smtp), Inbox()
    await adapter.start(inbox.emit)  # not fatal: only a refused login is
    try:
        assert adapter.health()["imap"] == "connecting" and "unreachable" in str(
            adapter.health()["last_error"]
        )
        await imap.start(imap.port)
        await imap.wait_command("SELECT")
        imap.deliver(mail("you are back"))
        [msg] = await inbox.wait(1)
        assert msg.text == "you are back"
    finally:
        await adapter.stop()


@settings(max_examples=150, deadline=None)
@given(
    st.binary(max_size=2000)
    | st.text(max_size=2000).map(lambda t: t.encode("utf-8", "surrogatepass"))
)
def test_any_bytes_parse_without_an_exception(raw: bytes) -> None:
    m = parse_mail(b"From: alice@example.com\r\nContent-Type: text/html\r\n\r\n" + raw, US)
    assert isinstance(m.text, str)
    parse_mail(raw, US)


async def test_a_password_refused_on_reconnect_stops_the_adapter(
    servers: tuple[FakeImap, FakeSmtp], caplog: pytest.LogCaptureFixture
) -> None:
    imap, smtp = servers
    adapter = make_adapter(imap, smtp)
    await adapter.start(Inbox().emit)
    try:
        await imap.wait_command("IDLE")
        imap.password = "rotated"
        imap.drop_connections()
        await wait_for_count(
            lambda: [1] if str(adapter.health()["state"]).startswith("failed") else [],
            1,
            10,
            "failure",
        )
        assert "IMAP login refused" in str(adapter.health()["state"])
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and errors[0].startswith(
            "email adapter stopped: IMAP login refused"
        )
        logins = len(imap.logins)
        await asyncio.sleep(0.5)
        assert len(imap.logins) == logins  # it does not keep knocking
    finally:
        await adapter.stop()


async def test_a_huge_attachment_is_cut_and_the_text_still_read(
    servers: tuple[FakeImap, FakeSmtp],
) -> None:
    imap, smtp = servers
    m = EmailMessage()
    m["From"], m["To"], m["Subject"], m["Message-ID"] = f"Alice <{ALICE}>", US, "big", "<big@x>"
    m.set_content("see the attached logs")
    m.add_attachment(
        bytes(range(256)) * (6 * 4096),
        maintype="application",
        subtype="octet-stream",
        filename="logs.bin",
    )
    raw = bytes(m)
    assert len(raw) > MAX_FETCH_BYTES
    adapter, inbox = make_adapter(imap, smtp), Inbox()
    await adapter.start(inbox.emit)
    try:
        imap.deliver(raw)
        [msg] = await inbox.wait(1)
        assert (msg.text, msg.platform_message_id) == ("see the attached logs", "<big@x>")
    finally:
        await adapter.stop()
