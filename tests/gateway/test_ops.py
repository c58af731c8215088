"""Operating the daemon: SIGHUP reloads what can change live; secrets never reach logs or
/health. Both against a real `switchboard run` subprocess."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import clean_env, free_port, switchboard
from tests.fakes.telegram import FakeTelegram


async def _start(home: Path, env_extra: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(**env_extra),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _ask(
    url: str, text: str, headers: dict[str, str] | None = None, timeout: float = 20
) -> str:
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "1", "text": text}, headers=headers
                ) as r:
                    if r.status == 200:
                        return str((await r.json())["reply"])
            except aiohttp.ClientError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError("the daemon did not answer")
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_sighup_reloads_the_reset_policy_and_names_what_needs_a_restart(
    tmp_path: Path,
) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text(f"platforms:\n  api:\n    port: {port}\n")
    proc = await _start(home, {})
    url = f"http://127.0.0.1:{port}"
    try:
        assert "Reset policy: none" in await _ask(url, "/status")
        cfg.write_text(
            f"platforms:\n  api:\n    port: {port + 1}\nsession_reset:\n  mode: idle\n  idle_minutes: 45\nlogging:\n  level: debug\n"
        )
        proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if "after 45 minutes idle" in (status := await _ask(url, "/status")):
                break
            await asyncio.sleep(0.05)
        assert "Reset policy: after 45 minutes idle" in status
        cfg.write_text("agent: [broken\n")
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.3)
        assert (await _ask(url, "still alive?")) == "echo: still alive?"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    log = err.decode()
    assert proc.returncode == 0
    assert "these changes need a restart to take effect: platforms.api.port" in log
    assert "reload refused, keeping the running configuration" in log


@pytest.mark.slow
async def test_secrets_never_reach_the_logs_or_health(tmp_path: Path) -> None:
    fake = FakeTelegram(token="4242:very-secret-bot-token")
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"logging:\n  level: debug\n  format: json\nplatforms:\n  api:\n    port: {port}\n    key_env: API_KEY\n"
        f"  telegram:\n    enabled: true\n    allow_all_users: true\n    base_url: {fake.base_url}\n"
    )
    secrets = {"API_KEY": "api-key-that-must-not-leak", "TELEGRAM_BOT_TOKEN": fake.token}
    proc = await _start(home, secrets)
    url = f"http://127.0.0.1:{port}"
    try:
        auth = {"Authorization": f"Bearer {secrets['API_KEY']}"}
        assert await _ask(url, "hello", auth) == "echo: hello"
        fake.push(fake.message("hi over telegram", fake.dm_chat(5)))
        await fake.wait_sent(1, timeout=20)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/health") as r:
                health = await r.text()
            async with http.get(f"{url}/metrics", headers=auth) as r:
                metrics = await r.text()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        await fake.stop()
    log = err.decode()
    assert proc.returncode == 0
    assert log and all(json.loads(line) for line in log.splitlines() if line.strip())  # JSON lines
    for secret in secrets.values():
        for where, text in (("logs", log), ("health", health), ("metrics", metrics)):
            assert secret not in text, f"{where} leaked a secret"
    assert "telegram" in json.loads(health)["adapters"]


async def test_a_restart_only_key_changed_back_before_the_next_sighup_needs_no_restart(
    tmp_path: Path,
) -> None:
    """Each reload compares the file with the values the daemon runs with, not with the
    file the previous reload read."""
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    cfg, log = home / "config.yaml", home / "run.log"
    running = f"platforms:\n  api:\n    port: {port}\n"
    cfg.write_text(running)
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *switchboard(home, "run"), env=clean_env(), stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"

    async def reload(text: str, reloads: int) -> str:
        cfg.write_text(text)
        proc.send_signal(signal.SIGHUP)
        for _ in range(200):
            if log.read_text().count("configuration reloaded") == reloads:
                break
            await asyncio.sleep(0.05)
        return log.read_text()

    try:
        assert await _ask(url, "up?") == "echo: up?"
        moved = await reload(f"platforms:\n  api:\n    port: {port + 1}\n", 1)
        assert moved.count("need a restart to take effect: platforms.api.port") == 1
        back = await reload(running, 2)
        assert back.count("configuration reloaded") == 2
        assert back.count("need a restart") == 1, back
        again = await reload(f"platforms:\n  api:\n    port: {port + 2}\n", 3)
        assert again.count("need a restart to take effect: platforms.api.port") == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0, log.read_text()
