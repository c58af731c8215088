"""The outbox keeps a reply the platform did not take: an in-process gateway whose Telegram
adapter (python-telegram-bot) talks to the loopback FakeTelegram with its send path down,
then back; a permanent refusal; the expiry notice; /health and /metrics figures."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.adapters.base import Backoff
from gateway.adapters.telegram import TelegramAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import (
    SEND_REFUSED,
    SEND_RETRY_AFTER,
    SEND_TRANSIENT,
    InvalidToken,
    PlatformRefused,
    RetryAfter,
    TransientError,
    send_failure,
)
from gateway.ops.doctor import run_doctor
from gateway.pipeline.backlog import DeliveryRules
from gateway.services import EXPIRY_NOTICE
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram

QUICK = Backoff(initial_s=0.01, factor=2.0, max_s=0.02, jitter=0.0)  # the adapter's own tries


class QuickTelegram(Gateway):
    """The configured gateway (the api server with its dashboard), its Telegram adapter
    with quick retries of its own."""

    telegram: TelegramAdapter | None = None

    def _default_adapters(self) -> list[Any]:
        return [
            self.telegram if a.platform == "telegram" else a for a in super()._default_adapters()
        ]


@contextlib.asynccontextmanager
async def outbox_gateway(
    tmp_path: Path, outbox: str = ""
) -> AsyncIterator[tuple[QuickTelegram, FakeTelegram]]:
    """A gateway on FakeTelegram; `outbox`: extra lines of the outbox section."""
    fake = FakeTelegram()
    await fake.start()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"platforms:\n  api:\n    port: {free_port()}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
        "outbox:\n  first_retry_seconds: 0.05\n  retry_seconds: 1\n"
        + "".join(f"  {line}\n" for line in outbox.splitlines())
    )
    adapter = TelegramAdapter(fake.token, base_url=fake.base_url, poll_timeout_s=1, backoff=QUICK)
    gateway = QuickTelegram(
        config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": fake.token}), home=tmp_path / "home"
    )
    gateway.telegram = adapter
    try:
        await gateway.start()
        yield gateway, fake
    finally:
        await gateway.stop()
        await fake.stop()


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll until `check()` is truthy (a bounded wait; nothing is measured)."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return found


def reply_states(home: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(home / "state.db") as conn:
        return [
            (str(s), r)
            for s, r in conn.execute(
                "SELECT reply_state, reply_ref FROM inbox WHERE reply_state IS NOT NULL ORDER BY id"
            )
        ]


def texts(fake: FakeTelegram) -> list[str]:
    return [str(p["text"]) for p in fake.sent()]


def say(fake: FakeTelegram, text: str) -> None:
    fake.push(fake.message(text, fake.dm_chat()))


async def test_replies_outlive_an_outage_and_arrive_in_order(tmp_path: Path) -> None:
    async with outbox_gateway(tmp_path) as (gw, fake):
        fake.outage.down("502")
        say(fake, "one")
        await until(lambda: gw.health()["outbox"]["pending"].get("telegram") == 1, "one held")
        say(fake, "two")
        await until(lambda: gw.health()["outbox"]["pending"].get("telegram") == 2, "two held")
        health = gw.health()["outbox"]
        assert "Bad Gateway" in health["failing"]["telegram"]["error"]
        # held: 'ready' (sent again after a restart), 'sending' during a try
        assert {s for s, _ in reply_states(gw.home)} <= {"ready", "sending"}
        assert len(reply_states(gw.home)) == 2
        assert 'switchboard_outbox_pending{platform="telegram"} 2' in gw.metrics.render()
        assert texts(fake) == []  # nothing reached the chat while it was down
        outbox = await until_async(lambda: _doctor_outbox(gw, ok=False), "doctor names it", 10)
        assert "telegram" in outbox.detail and "Bad Gateway" in outbox.detail
        tries = fake.outage.failed
        await until(lambda: fake.outage.failed > tries, "a try while down")  # still trying
        fake.outage.up()
        await fake.wait_sent(2)
        await until(lambda: not gw.health()["outbox"]["pending"], "the backlog drained")
        assert texts(fake) == ["echo: one", "echo: two"]  # oldest first, each once
        await until(
            lambda: [s for s, _ in reply_states(gw.home)] == ["sent", "sent"], "both marked sent"
        )
        assert 'switchboard_outbox_delivered_total{platform="telegram"} 2' in gw.metrics.render()
        await until_async(lambda: _doctor_outbox(gw, ok=True), "doctor clears it", 10)


async def test_a_reset_and_a_429_are_held_too(tmp_path: Path) -> None:
    async with outbox_gateway(tmp_path) as (gw, fake):
        fake.outage.down("reset")
        say(fake, "one")
        await until(lambda: gw.health()["outbox"]["pending"].get("telegram") == 1, "one held")
        fake.outage.up()
        fake.outage.fail("429:1", "429:1")  # the drain waits each out as asked
        await fake.wait_sent(1)
        await until(lambda: [s for s, _ in reply_states(gw.home)] == ["sent"], "sent")
        assert texts(fake) == ["echo: one"]
        assert fake.outage.failed >= 3  # the resets, then both 429s, before it went


async def test_a_permanent_refusal_is_recorded_and_not_retried(tmp_path: Path) -> None:
    async with outbox_gateway(tmp_path) as (gw, fake):
        fake.outage.fail("403")
        say(fake, "blocked")
        await until(
            lambda: reply_states(gw.home) and reply_states(gw.home)[0][0] == "refused", "refused"
        )
        state, reason = reply_states(gw.home)[0]
        assert reason is not None and "blocked" in reason
        assert gw.health()["outbox"]["pending"] == {}
        say(fake, "again")  # the chat is not held behind a refused reply
        await fake.wait_sent(1)
        assert texts(fake) == ["echo: again"]
        assert fake.outage.failed == 1  # the refused reply was tried once
        assert 'switchboard_outbox_refused_total{platform="telegram"} 1' in gw.metrics.render()
        page, detail = await _session_page(gw)
        assert page.count('class="undelivered"') == 1
        assert "the platform refused it" in page and "bot was blocked" in page
        marks = list(detail["undelivered"].values())
        assert [m["state"] for m in marks] == ["refused"]


async def test_an_expired_reply_leaves_one_notice_on_the_next_message(tmp_path: Path) -> None:
    async with outbox_gateway(tmp_path, "max_age_minutes: 0.01") as (gw, fake):
        fake.outage.down("503")
        say(fake, "lost")
        await until(lambda: gw.health()["outbox"]["pending"].get("telegram"), "held")
        say(fake, "lost too")
        await until(lambda: gw.health()["outbox"]["expired"].get("telegram") == 2, "expiry")
        assert [s for s, _ in reply_states(gw.home)] == ["expired", "expired"]
        assert all("Service Unavailable" in (r or "") for _, r in reply_states(gw.home))
        assert 'switchboard_outbox_expired_total{platform="telegram"} 2' in gw.metrics.render()
        fake.outage.up()
        say(fake, "next")
        await fake.wait_sent(2)
        say(fake, "after")
        await fake.wait_sent(3)
        assert texts(fake) == [EXPIRY_NOTICE, "echo: next", "echo: after"]  # one notice
        # the expired reply stays in its session
        with sqlite3.connect(gw.home / "state.db") as conn:
            stored = [r[0] for r in conn.execute("SELECT content FROM messages ORDER BY id")]
        assert "echo: lost" in stored and "echo: lost too" in stored
        page, _detail = await _session_page(gw)
        assert "it expired in the outbox" in page


async def test_a_one_off_send_waits_behind_the_chats_held_replies(tmp_path: Path) -> None:
    async with outbox_gateway(tmp_path) as (gw, fake):
        fake.outage.down("502")
        say(fake, "first")
        await until(lambda: gw.health()["outbox"]["pending"].get("telegram") == 1, "held")
        answer = await gw.send_one("telegram", "7", "a notice from ops")
        assert answer["state"] == "pending"
        fake.outage.up()
        await fake.wait_sent(2)
        assert texts(fake) == ["echo: first", "a notice from ops"]
        with sqlite3.connect(gw.home / "state.db") as conn:
            await until(
                lambda: conn.execute("SELECT state FROM sends").fetchall() == [("sent",)],
                "the send row marked sent",
            )


def _daemon(home: Path, port: int, fake: FakeTelegram) -> subprocess.Popen[str]:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
        # a held reply's next try is far off: the stop finds it held, not mid-try
        "outbox:\n  first_retry_seconds: 600\n  retry_seconds: 600\n"
    )
    return subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(TELEGRAM_BOT_TOKEN=fake.token),
    )


async def _health(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
        return dict(await resp.json())


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
async def test_held_replies_are_delivered_once_after_a_restart(tmp_path: Path, stop: str) -> None:
    """Down while the daemon runs, two replies and a `switchboard send` message held;
    stopped (cleanly or killed), started again with the platform back: each reaches the
    chat once, in order."""
    fake = FakeTelegram()
    await fake.start()
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _daemon(home, port, fake)
    try:
        await wait_healthy(url, proc)
        fake.outage.down("502")
        say(fake, "one")
        await until_async(lambda: _pending(url, 1), "one held", 60)
        say(fake, "two")
        await until_async(lambda: _pending(url, 2), "two held", 30)
        async with aiohttp.ClientSession() as http:  # `switchboard send`'s way in
            body = {"platform": "telegram", "target": "7", "text": "from ops"}
            async with http.post(f"{url}/v1/send", json=body) as resp:
                assert resp.status == 202 and (await resp.json())["state"] == "pending"
        await until_async(lambda: _pending(url, 3), "the send held behind them", 30)
        proc.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGKILL)
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc == (0 if stop == "sigterm" else -signal.SIGKILL)
        assert [s for s, _ in reply_states(home)] == ["ready", "ready"]
        assert texts(fake) == []
        fake.outage.up()
        proc = _daemon(home, port, fake)
        await wait_healthy(url, proc)
        await fake.wait_sent(3, timeout=30)
        await until(lambda: [s for s, _ in reply_states(home)] == ["sent", "sent"], "marked sent")
        assert texts(fake) == ["echo: one", "echo: two", "from ops"]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
        await fake.stop()
    assert texts(fake) == ["echo: one", "echo: two", "from ops"]  # nothing sent twice


async def _doctor_outbox(gw: Gateway, ok: bool) -> Any:
    checks = await run_doctor(
        gw.home, gw.config, None, fix=False, full=False, check_platforms=False
    )
    found = next(c for c in checks if c.name == "outbox")
    return found if found.ok is ok else None


async def _session_page(gw: Gateway) -> tuple[str, dict[str, Any]]:
    """The dashboard's page of the chat's session and its JSON (loopback: no sign-in)."""
    with sqlite3.connect(gw.home / "state.db") as conn:
        (sid,) = conn.execute("SELECT id FROM sessions").fetchone()
    base = f"http://127.0.0.1:{gw.config.api.port}"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/ui/sessions/{sid}") as resp:
            assert resp.status == 200
            page = await resp.text()
        async with http.get(f"{base}/api/sessions/{sid}") as resp:
            assert resp.status == 200
            detail = await resp.json()
    return page, detail


async def _pending(url: str, n: int) -> bool:
    return bool((await _health(url))["outbox"]["pending"].get("telegram") == n)


async def until_async(check: Callable[[], Awaitable[Any]], what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return found


def test_a_whatsapp_reply_expires_when_its_24_hour_window_closes() -> None:
    rules = DeliveryRules(max_age_s=48 * 3600.0, max_age_by_platform={"telegram": 600.0})
    received = 1_000_000.0
    due = received + 23 * 3600  # a reply first due 23 h after the user's message
    assert rules.reply_horizon("whatsapp", due, received) == received + 24 * 3600
    assert rules.reply_horizon("slack", due, received) == due + 48 * 3600
    assert rules.reply_horizon("telegram", due, received) == due + 600


def test_failures_are_sorted_into_kept_and_refused() -> None:
    assert send_failure(TransientError("Bad Gateway")) == (SEND_TRANSIENT, 0.0)
    assert send_failure(RetryAfter(3.0)) == (SEND_RETRY_AFTER, 3.0)
    assert send_failure(InvalidToken("revoked"))[0] == SEND_TRANSIENT  # kept for the fix
    assert send_failure(PlatformRefused("bot was blocked"))[0] == SEND_REFUSED
    assert send_failure(ConnectionResetError())[0] == SEND_TRANSIENT
    assert send_failure(TimeoutError())[0] == SEND_TRANSIENT
    assert send_failure(ValueError("not a chat id"))[0] == SEND_REFUSED


@pytest.mark.slow
async def test_a_stop_during_the_adapters_own_retries_keeps_the_reply(tmp_path: Path) -> None:
    """SIGTERM while a reply's first send is between the adapter's own retries (Telegram
    cannot deduplicate, so a send cut off there could not be sent again): the wait ends at
    once, the reply is held, and the restart delivers it once."""
    fake = FakeTelegram()
    await fake.start()
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _daemon(home, port, fake)
    try:
        await wait_healthy(url, proc)
        fake.outage.down("502")
        say(fake, "mid-retry")
        await until(lambda: fake.outage.failed >= 1, "the first try failed")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert [s for s, _ in reply_states(home)] == ["ready"]  # held, not unconfirmed
        fake.outage.up()
        proc = _daemon(home, port, fake)
        await wait_healthy(url, proc)
        await fake.wait_sent(1, timeout=30)
        await until(lambda: [s for s, _ in reply_states(home)] == ["sent"], "marked sent")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
        await fake.stop()
    assert texts(fake) == ["echo: mid-retry"]
