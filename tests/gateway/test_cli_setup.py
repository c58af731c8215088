"""`switchboard setup` driven as a user drives it: through a pseudo-terminal (pexpect), with
the token checked live against the fake Telegram server; and its non-interactive form as a
plain subprocess. The config keeps its comments, secrets land only in the 0600 secrets
file, and it ends with check-config and doctor passing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
import yaml

from tests.daemon import clean_env, switchboard
from tests.fakes.telegram import FakeTelegram


def _wizard(home: Path, fake: FakeTelegram) -> tuple[int, str]:
    """The conversation, typed into a pty the way a person over SSH would."""
    child = pexpect.spawn(
        sys.executable,
        ["-m", "gateway", "--home", str(home), "setup"],
        env=clean_env(TERM="dumb", COLUMNS="200"),
        encoding="utf-8",
        timeout=60,
    )
    try:
        child.expect_exact("Agent backend (echo, openai) [echo]: ")
        child.sendline("")
        child.expect_exact("Platforms to enable, comma-separated (")
        child.sendline("telegarm")
        child.expect_exact("unknown platform 'telegarm'")
        child.expect_exact("Platforms to enable, comma-separated (")
        child.sendline("telegram")
        child.expect_exact("Who may talk to the bot on telegram?")
        child.sendline("111, 222")
        child.expect_exact("the telegram bot token (TELEGRAM_BOT_TOKEN) (typing is hidden): ")
        child.sendline("4242:not-the-token")
        child.expect_exact("telegram: refused the token: ")
        child.expect_exact("(TELEGRAM_BOT_TOKEN) (typing is hidden): ")
        child.sendline(fake.token)
        child.expect_exact("telegram: the token is accepted (@switchboard_bot)")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    return int(child.exitstatus if child.exitstatus is not None else -1), str(child.before)


async def test_the_wizard_over_a_terminal_checks_the_token_and_keeps_the_config(
    tmp_path: Path,
) -> None:
    fake = FakeTelegram(token="4242:wizard-token")
    await fake.start()
    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text(
        "# my gateway\nlogging:\n  level: debug   # while setting up\n"
        f"platforms:\n  telegram:\n    base_url: {fake.base_url}  # a local Bot API server\n"
    )
    try:
        code, tail = await asyncio.to_thread(_wizard, home, fake)
    finally:
        await fake.stop()
    assert code == 0, tail
    assert "check-config: config ok" in tail
    assert "[ok  ] telegram reachable: @switchboard_bot" in tail
    assert "ready: start it with `switchboard run`" in tail
    text = cfg.read_text()
    assert text.startswith("# my gateway\nlogging:\n  level: debug   # while setting up\n")
    assert "# a local Bot API server" in text and fake.token not in text
    data = yaml.safe_load(text)
    assert data["platforms"]["telegram"]["enabled"] is True
    assert data["platforms"]["telegram"]["allowed_users"] == [111, 222]
    secrets = home / "switchboard.env"
    assert secrets.stat().st_mode & 0o777 == 0o600
    assert f"TELEGRAM_BOT_TOKEN={fake.token}" in secrets.read_text().splitlines()
    again = await asyncio.to_thread(
        subprocess.run,
        switchboard(home, "check-config"),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert again.returncode == 0, again.stderr  # the secrets file stands in for the service's env


def sb(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, "setup", "--non-interactive", *args),
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(**env),
    )


async def test_the_non_interactive_form_takes_flags_and_reruns_keep_what_was_there(
    tmp_path: Path,
) -> None:
    fake = FakeTelegram(token="4242:script-token")
    await fake.start()
    home = tmp_path / "home"
    try:
        first = await asyncio.to_thread(
            sb,
            home,
            "--platform",
            "telegram",
            "--allow",
            "telegram=pair",
            "--set",
            f"platforms.telegram.base_url={fake.base_url}",
            TELEGRAM_BOT_TOKEN=fake.token,
        )
        assert first.returncode == 0, first.stdout + first.stderr
        cfg = home / "config.yaml"
        cfg.write_text(cfg.read_text() + "# added by hand\nsessions:\n  history_messages: 50\n")
        second = await asyncio.to_thread(
            sb, home, "--agent", "echo", "--set", "session_reset.mode=idle"
        )
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        await fake.stop()
    data = yaml.safe_load(cfg.read_text())
    assert data["access"]["unknown_dm"] == "pair" and data["platforms"]["telegram"]["enabled"]
    assert data["sessions"]["history_messages"] == 50 and data["session_reset"]["mode"] == "idle"
    assert "# added by hand" in cfg.read_text()
    assert f"TELEGRAM_BOT_TOKEN={fake.token}" in (home / "switchboard.env").read_text()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--platform", "telegarm"), 78, "platforms.telegarm: unknown platform 'telegarm'"),
        (("--set", "agent.modle=x"), 78, "agent.modle: not a key of the config schema"),
        (("--set", "platforms.api.port=eighty"), 78, "must be a whole number"),
        (
            ("--platform", "telegram", "--allow", "telegram=1"),
            78,
            "platforms.telegram.token_env: TELEGRAM_BOT_TOKEN is not set",
        ),
        (("--set",), 2, "expected one argument"),
    ],
)
def test_bad_input_is_one_line_with_its_exit_code_and_writes_nothing(
    tmp_path: Path, args: tuple[str, ...], code: int, message: str
) -> None:
    home = tmp_path / "home"
    proc = sb(home, *args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (home / "config.yaml").exists() and not (home / "switchboard.env").exists()


async def test_a_token_the_platform_refuses_exits_77_and_writes_nothing(tmp_path: Path) -> None:
    fake = FakeTelegram(token="4242:right")
    await fake.start()
    home = tmp_path / "home"
    try:
        proc = await asyncio.to_thread(
            sb,
            home,
            "--platform",
            "telegram",
            "--allow",
            "telegram=all",
            "--set",
            f"platforms.telegram.base_url={fake.base_url}",
            "--secret",
            "TELEGRAM_BOT_TOKEN=4242:wrong",
        )
    finally:
        await fake.stop()
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert "telegram: refused the token" in proc.stderr
    assert not os.path.exists(home / "switchboard.env")


def test_without_a_terminal_it_asks_for_the_non_interactive_form(tmp_path: Path) -> None:
    proc = subprocess.run(
        switchboard(tmp_path, "setup"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env=clean_env(),
    )
    assert proc.returncode == 2 and "--non-interactive" in proc.stderr


async def test_the_model_providers_key_is_checked_before_it_is_saved(tmp_path: Path) -> None:
    from tests.fakes.openai import FakeOpenAI

    provider = FakeOpenAI(api_key="sk-right")
    url = await provider.start()
    home = tmp_path / "home"
    flags = ("--agent", "openai", "--set", f"agent.openai.base_url={url}")
    try:
        wrong = await asyncio.to_thread(sb, home, *flags, "--secret", "OPENAI_API_KEY=sk-wrong")
        assert wrong.returncode == 77, wrong.stdout + wrong.stderr
        assert (
            "the model provider: refused the token (the provider refused the key (HTTP 401))"
            in wrong.stderr
        )
        assert not (home / "config.yaml").exists()
        right = await asyncio.to_thread(sb, home, *flags, OPENAI_API_KEY="sk-right")
        assert right.returncode == 0, right.stdout + right.stderr
        assert "the model provider: the token is accepted (1 model(s) offered)" in right.stdout
    finally:
        await provider.stop()
    assert "OPENAI_API_KEY=sk-right" in (home / "switchboard.env").read_text().splitlines()
    assert yaml.safe_load((home / "config.yaml").read_text())["agent"]["backend"] == "openai"
