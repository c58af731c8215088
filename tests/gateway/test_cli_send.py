"""`switchboard send` as a real subprocess against the fake Telegram server: directly when
no daemon runs (the adapter opened for sending only) and through the running daemon's
`POST /v1/send`; the home channel as target; stdin; and the exit codes a script relies
on (0 sent, 2 usage, 69 unreachable, 77 refused, 78 config)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram


async def sb(
    home: Path, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=90,
        input=stdin,
        env=clean_env(**env),
    )


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    server = FakeTelegram(token="4242:send-token")
    await server.start()
    yield server
    await server.stop()


def _home(tmp_path: Path, fake: FakeTelegram, extra: str = "", port: int | None = None) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port or free_port()}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n{extra}"
    )
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\n")
    return home


async def test_without_a_daemon_the_message_goes_out_directly_and_nothing_is_received(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    home = _home(tmp_path, fake)
    proc = await sb(home, "send", "telegram", "555", "backup finished")
    assert proc.returncode == 0, proc.stderr
    assert "sent to telegram chat 555 (message " in proc.stdout and "directly" in proc.stdout
    assert [(m["chat_id"], m["text"]) for m in fake.sent()] == [(555, "backup finished")]
    assert [name for name, _ in fake.calls] == ["getMe", "sendMessage"]  # no polling, no webhook


async def test_text_comes_from_stdin_and_home_is_the_home_channel(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    home = _home(tmp_path, fake, "    home_channel: '-100200:17'\n")
    proc = await sb(home, "send", "telegram", "home", stdin="disk 91% full\nplease look\n")
    assert proc.returncode == 0, proc.stderr
    sent = fake.sent()[-1]
    assert (sent["chat_id"], sent["message_thread_id"], sent["text"]) == (
        -100200,
        17,
        "disk 91% full\nplease look",
    )


async def test_bad_input_gets_the_documented_exit_codes(tmp_path: Path, fake: FakeTelegram) -> None:
    home = _home(tmp_path, fake)
    unknown = await sb(home, "send", "telegarm", "1", "hi")
    assert unknown.returncode == 78
    assert "platforms.telegarm: unknown platform 'telegarm' (known: telegram," in unknown.stderr
    off = await sb(home, "send", "discord", "1", "hi")
    assert off.returncode == 78 and "platforms.discord.enabled: is false" in off.stderr
    no_home = await sb(home, "send", "telegram", "home", "hi")
    assert no_home.returncode == 78 and "platforms.telegram.home_channel" in no_home.stderr
    empty = await sb(home, "send", "telegram", "555", stdin="\n")
    assert empty.returncode == 2 and "nothing to send" in empty.stderr
    not_an_id = await sb(home, "send", "telegram", "@someone", "hi")
    assert not_an_id.returncode == 2, not_an_id.stderr
    assert (await sb(home, "send", "telegram")).returncode == 2
    assert fake.sent() == []


async def test_a_refusing_platform_exits_77_and_an_unreachable_one_69(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    home = _home(tmp_path, fake)
    (home / "switchboard.env").write_text("TELEGRAM_BOT_TOKEN=4242:wrong-token\n")
    refused = await sb(home, "send", "telegram", "555", "hi")
    assert refused.returncode == 77, refused.stderr
    assert "telegram refused the bot's credentials" in refused.stderr
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\n")
    fake.fail_next("sendMessage", 400)  # Bad Request: chat not found, as Telegram says it
    no_chat = await sb(home, "send", "telegram", "555", "hi")
    assert no_chat.returncode == 77 and "telegram refused the message" in no_chat.stderr
    gone = free_port()  # nothing listens there
    text = (home / "config.yaml").read_text().replace(fake.base_url, f"http://127.0.0.1:{gone}/bot")
    (home / "config.yaml").write_text(text)
    unreachable = await sb(home, "send", "telegram", "555", "hi", "--timeout", "20")
    assert unreachable.returncode == 69, unreachable.stderr
    assert "telegram could not be reached" in unreachable.stderr


async def test_with_a_daemon_running_the_daemon_sends_it(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    port = free_port()
    home = _home(tmp_path, fake, "    home_channel: 777\n", port=port)
    text = (
        (home / "config.yaml")
        .read_text()
        .replace(f"    port: {port}\n", f"    port: {port}\n    key_env: SB_API_KEY\n")
    )
    (home / "config.yaml").write_text(text)
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\nSB_API_KEY=k-123\n")
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url, proc)
        calls_before = len(fake.calls)
        sent = await sb(home, "send", "telegram", "home", "nightly report")
        assert sent.returncode == 0, sent.stderr
        assert f"through the daemon (pid {proc.pid})" in sent.stdout
        assert fake.sent()[-1]["chat_id"] == 777 and fake.sent()[-1]["text"] == "nightly report"
        assert "getMe" not in [n for n, _ in fake.calls[calls_before:]]  # the daemon's own bot
        fake.fail_next("sendMessage", 403)  # Forbidden: bot was blocked by the user
        blocked = await sb(home, "send", "telegram", "555", "hi")
        assert blocked.returncode == 77 and "telegram refused the message" in blocked.stderr
        off = await sb(home, "send", "discord", "1", "hi")
        assert off.returncode == 78
        body = {"platform": "telegram", "target": "1", "text": "x"}
        async with aiohttp.ClientSession() as http:  # the endpoint wants the key like the rest
            async with http.post(f"{url}/v1/send", json=body) as r:
                assert r.status == 401
            proxied = {"Authorization": "Bearer k-123", "X-Forwarded-For": "203.0.113.9"}
            async with http.post(f"{url}/v1/send", json=body, headers=proxied) as r:
                assert r.status == 403  # forwarded by a proxy on this machine: not local
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_send_help_documents_targets_stdin_and_exit_codes(tmp_path: Path) -> None:
    shown = (await sb(tmp_path, "send", "--help")).stdout
    for part in ("chat_id:thread_id", "home", "stdin", "69", "77", "78"):
        assert part in shown


async def test_a_send_the_platform_cannot_take_now_is_queued_and_sent_later(
    tmp_path: Path, fake: FakeTelegram
) -> None:
    """With the daemon running, a message Telegram keeps answering 502 to is stored in the
    outbox (exit 0, "queued") and the daemon sends it once Telegram takes it again."""
    port = free_port()
    home = _home(tmp_path, fake, "outbox:\n  retry_seconds: 1\n", port=port)
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        for _ in range(8):
            fake.fail_next("sendMessage", 502)
        queued = await sb(home, "send", "telegram", "555", "eventually")
        assert queued.returncode == 0, queued.stderr
        assert "queued for telegram chat 555 in the daemon's outbox" in queued.stdout
        for _ in range(400):
            report = json.loads((await sb(home, "status", "--json")).stdout)
            if report["queues"]["outbox"] == 0:
                break
            await asyncio.sleep(0.05)
        assert report["queues"]["outbox"] == 0
        assert not fake.failures["sendMessage"]  # every scripted 502 was met, then it went out
        assert fake.sent()[-1]["text"] == "eventually"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)


async def test_slack_sends_directly_too_without_opening_its_event_link(tmp_path: Path) -> None:
    from tests.fakes.slack import FakeSlack

    slack = FakeSlack(token="xoxb-send")
    await slack.start()
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  slack:\n    enabled: true\n    allow_all_users: true\n"
        f"    mode: socket\n    base_url: {slack.base_url}\n"
    )
    (home / "switchboard.env").write_text("SLACK_BOT_TOKEN=xoxb-send\nSLACK_APP_TOKEN=xapp-1\n")
    try:
        proc = await sb(home, "send", "slack", "C0123:1700000000.000100", "deploy done")
        assert proc.returncode == 0, proc.stderr
        posted = slack.posted()
        assert [(p["channel"], p["thread_ts"], p["text"]) for p in posted] == [
            ("C0123", "1700000000.000100", "deploy done")
        ]
        assert slack.connections_opened == 0  # no Socket Mode link
        (home / "switchboard.env").write_text("SLACK_BOT_TOKEN=xoxb-wrong\nSLACK_APP_TOKEN=x\n")
        refused = await sb(home, "send", "slack", "C0123", "again")
        assert refused.returncode == 77, refused.stderr
    finally:
        await slack.stop()


async def test_discord_sends_directly_over_rest_without_joining_the_gateway(
    tmp_path: Path,
) -> None:
    from tests.fakes.discord import FakeDiscord

    discord = FakeDiscord(token="discord-send")
    await discord.start()
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  discord:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {discord.api}\n    gateway_url: {discord.gateway}\n"
    )
    (home / "switchboard.env").write_text("DISCORD_BOT_TOKEN=discord-send\n")
    try:
        proc = await sb(home, "send", "discord", "4242", "release is out")
        assert proc.returncode == 0, proc.stderr
        assert discord.shown("4242") == ["release is out"]
        assert discord.identifies == 0  # never connected to the gateway
    finally:
        await discord.stop()
