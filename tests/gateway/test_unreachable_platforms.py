"""A platform that cannot be reached when the daemon starts is retried with backoff while
the daemon and every other adapter keep running: `switchboard run` as a real subprocess
against a Telegram API port that is closed and then opened, and the same start-up rule on
every adapter whose start contacts its platform. A credential the platform refuses stops
that adapter alone, with one line naming the config key."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.base import Adapter, Backoff, StartFailure, start_failure
from gateway.adapters.dingtalk import DingTalkAdapter
from gateway.adapters.discord import DiscordAdapter
from gateway.adapters.feishu import FeishuAdapter
from gateway.adapters.homeassistant import HomeAssistantAdapter
from gateway.adapters.matrix import MatrixAdapter
from gateway.adapters.mattermost import MattermostAdapter
from gateway.adapters.qqbot import QQBotAdapter
from gateway.adapters.signal import SignalAdapter
from gateway.adapters.slack import SlackAdapter
from gateway.adapters.telegram import TelegramAdapter
from gateway.adapters.wecom import WeComAdapter
from gateway.adapters.weixin import WeixinAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import AdapterError, InvalidToken, TransientError
from tests.daemon import clean_env, free_port, switchboard
from tests.fakes import dingtalk, feishu, matrix, wecom
from tests.fakes.discord import restore_discord_globals
from tests.fakes.telegram import FakeTelegram

TOKEN = "123:ABC"


async def _health(url: str) -> tuple[int, dict[str, Any]] | None:
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/health") as resp:
                return resp.status, await resp.json()
    except aiohttp.ClientError:
        return None


async def _until(
    url: str, proc: subprocess.Popen[str], ok: Callable[[dict[str, Any]], bool], what: str
) -> tuple[int, dict[str, Any]]:
    """Poll /health until `ok(body)`; fail at once if the daemon exits (bounded wait)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the daemon exited: {proc.communicate()[1]}"
        got = await _health(url)
        if got is not None and ok(got[1]):
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"the daemon never reported {what}")


def _run(home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(TELEGRAM_BOT_TOKEN=TOKEN),
    )


def _telegram(body: dict[str, Any]) -> dict[str, Any]:
    return dict(body["adapters"]["telegram"])


async def test_telegram_unreachable_at_start_is_retried_until_it_answers(tmp_path: Path) -> None:
    home, api_port, tg_port = tmp_path / "home", free_port(), free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {api_port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: http://127.0.0.1:{tg_port}/bot\n"
    )
    proc = _run(home)
    url, fake = f"http://127.0.0.1:{api_port}", FakeTelegram(token=TOKEN, port=tg_port)
    try:
        # the outage: the daemon answers, says degraded, names the adapter's state and error
        status, body = await _until(
            url, proc, lambda b: _telegram(b).get("start_attempts", 0) >= 2, "a second attempt"
        )
        tg = _telegram(body)
        assert status == 503 and body["status"] == "degraded"
        assert tg["state"] == "retrying" and f"127.0.0.1:{tg_port}" in tg["last_error"]
        assert body["adapters"]["api"]["state"] == "running"
        async with aiohttp.ClientSession() as http:  # the rest of the daemon works meanwhile
            async with http.post(f"{url}/v1/messages", json={"chat_id": "c", "text": "hi"}) as resp:
                assert resp.status == 200 and (await resp.json())["reply"] == "echo: hi"
        # the platform comes back: the adapter starts on its next attempt and answers
        await fake.start()
        status, body = await _until(
            url, proc, lambda b: _telegram(b)["state"] == "running", "telegram running"
        )
        assert status == 200 and body["status"] == "ok"
        fake.push(fake.message("are you there", fake.dm_chat(7)))
        [reply] = await fake.wait_sent(1, timeout=30)
        assert reply["text"] == "echo: are you there"
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        await fake.stop()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err
    # one line per failed attempt, then one when it connected on the attempt after them
    failures = [line for line in err.splitlines() if "the platform is unreachable" in line]
    [connected] = [line for line in err.splitlines() if "telegram: connected on attempt" in line]
    assert len(failures) >= 2 and connected.endswith(f"connected on attempt {len(failures) + 1}")
    assert "start_attempts" not in _telegram(body)  # running: the adapter's own health again


async def test_sigterm_while_a_platform_is_still_unreachable_exits_0_without_a_traceback(
    tmp_path: Path,
) -> None:
    home, api_port, tg_port = tmp_path / "home", free_port(), free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {api_port}\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: http://127.0.0.1:{tg_port}/bot\n"
    )
    proc = _run(home)
    try:
        await _until(
            f"http://127.0.0.1:{api_port}",
            proc,
            lambda b: _telegram(b)["state"] == "retrying",
            "telegram retrying",
        )
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in out + err and "signal received; draining" in err


async def test_a_refused_token_stops_that_adapter_alone_with_one_line_naming_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeTelegram(token=TOKEN)
    await fake.start()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
    )
    gateway = Gateway(
        config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": "999:WRONG"}), home=tmp_path / "home"
    )
    try:
        with caplog.at_level(logging.INFO):
            await gateway.start()
        health = gateway.health()
        tg = health["adapters"]["telegram"]
        assert health["status"] == "degraded" and health["adapters"]["api"]["state"] == "running"
        assert tg["state"] == "failed: invalid token"
        assert tg["config_keys"] == ["platforms.telegram.token_env"]
        lines = [r for r in caplog.records if "platforms.telegram.token_env" in r.getMessage()]
        assert len(lines) == 1 and lines[0].levelno == logging.ERROR and lines[0].exc_info is None
        assert "rejected the bot token" in lines[0].getMessage()
        assert [r for r in caplog.records if "is unreachable" in r.getMessage()] == []
        await asyncio.sleep(0.5)  # a retry would have been logged by now; none may come
        assert [r for r in caplog.records if "attempt" in r.getMessage()] == []
    finally:
        await gateway.stop()
        await fake.stop()


FAST = Backoff(initial_s=0.01, factor=1.0, max_s=0.01, jitter=0.0)


def _closed(platform: str, port: int) -> Adapter:
    """The platform's adapter with every platform URL at `port`, where nothing listens."""
    url = f"http://127.0.0.1:{port}"
    made: dict[str, Callable[[], Adapter]] = {
        "telegram": lambda: TelegramAdapter(TOKEN, base_url=f"{url}/bot", backoff=FAST),
        "discord": lambda: DiscordAdapter(
            "tok", api_base=f"{url}/api/v10", gateway_url=f"ws://127.0.0.1:{port}/gw", backoff=FAST
        ),
        "slack": lambda: SlackAdapter("xoxb-fake", "secret", base_url=f"{url}/api/", backoff=FAST),
        "signal": lambda: SignalAdapter(url, "+15550001", backoff=FAST),
        "mattermost": lambda: MattermostAdapter("tok", url, backoff=FAST),
        "feishu": lambda: FeishuAdapter(
            feishu.APP_ID,
            feishu.APP_SECRET,
            feishu.ENCRYPT_KEY,
            feishu.VERIFICATION_TOKEN,
            domain=url,
            backoff=FAST,
        ),
        "dingtalk": lambda: DingTalkAdapter(
            dingtalk.CLIENT_ID, dingtalk.CLIENT_SECRET, base_url=url, backoff=FAST
        ),
        "matrix": lambda: MatrixAdapter(url, matrix.BOT, "syt_tok", poll_timeout_s=1, backoff=FAST),
        "qqbot": lambda: QQBotAdapter("1", "secret", api_base=url, token_base=url, backoff=FAST),
        "homeassistant": lambda: HomeAssistantAdapter("tok", url, backoff=FAST),
        "wecom": lambda: WeComAdapter(
            wecom.BOT_ID, wecom.SECRET, url=f"ws://127.0.0.1:{port}/", backoff=FAST
        ),
        "weixin": lambda: WeixinAdapter("tok", base_url=url, backoff=FAST),
    }
    return made[platform]()


@pytest.mark.parametrize(
    "platform",
    [
        "telegram",
        "discord",
        "slack",
        "signal",
        "mattermost",
        "feishu",
        "dingtalk",
        "matrix",
        "qqbot",
        "homeassistant",
        "wecom",
        "weixin",
    ],
)
async def test_every_adapter_whose_platform_is_unreachable_at_start_retries_without_ending_the_start(
    tmp_path: Path, platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if platform == "discord":
        restore_discord_globals(monkeypatch)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n")
    adapter, api = _closed(platform, free_port()), ApiAdapter(port=0)
    gateway = Gateway(config=load_config(cfg, {}), home=tmp_path / "home", adapters=[api, adapter])
    try:
        await gateway.start()
        health = gateway.health()
        mine = health["adapters"][platform]
        assert health["status"] == "degraded" and health["adapters"]["api"]["state"] == "running"
        assert mine["state"] == "retrying" and mine["last_error"] and mine["start_attempts"] == 1
    finally:
        await gateway.stop()
    assert gateway.health()["adapters"][platform]["state"] in ("retrying", "stopped")


@pytest.mark.parametrize(
    "error, kind",
    [
        (ConnectionRefusedError(111, "refused"), StartFailure.NETWORK),
        (socket.gaierror(-2, "Name or service not known"), StartFailure.NETWORK),
        (TimeoutError(), StartFailure.NETWORK),
        (TransientError("5xx"), StartFailure.NETWORK),
        (InvalidToken("no"), StartFailure.CREDENTIALS),
        (ValueError("a bug"), None),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), None),
        (AdapterError("refused the call (100)"), None),
    ],
)
def test_start_failures_are_told_apart_by_their_typed_causes(
    error: Exception, kind: StartFailure | None
) -> None:
    assert start_failure(error) is kind
    try:
        try:
            raise error
        except Exception as inner:
            raise RuntimeError("a library's own wrapper") from inner
    except RuntimeError as outer:
        assert start_failure(outer) is kind


async def test_a_server_error_at_start_is_retried_and_the_adapter_then_answers(
    tmp_path: Path,
) -> None:
    fake = FakeTelegram(token=TOKEN)
    await fake.start()
    fake.fail_next("getMe", 502)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n    port: 0\n  telegram:\n    enabled: true\n"
        f"    allow_all_users: true\n    base_url: {fake.base_url}\n"
    )
    gateway = Gateway(config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": TOKEN}), home=tmp_path / "h")
    try:
        await gateway.start()
        tg = gateway.health()["adapters"]["telegram"]
        assert tg["state"] == "retrying" and tg["next_attempt_in_seconds"] >= 0
        deadline = time.monotonic() + 60
        while gateway.health()["adapters"]["telegram"]["state"] != "running":
            assert time.monotonic() < deadline, gateway.health()["adapters"]["telegram"]
            await asyncio.sleep(0.05)
        assert gateway.health()["status"] == "ok"
        fake.push(fake.message("back again", fake.dm_chat(7)))
        [reply] = await fake.wait_sent(1, timeout=30)
        assert reply["text"] == "echo: back again"
    finally:
        await gateway.stop()
        await fake.stop()
