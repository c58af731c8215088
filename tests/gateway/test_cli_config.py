"""`switchboard config get | set | unset | path` as real subprocesses: keys checked against
the schema, comments and layout kept, nothing written for bad input, and a running daemon
told to reload (live keys apply, the others are named as needing a restart)."""

from __future__ import annotations

import asyncio
import difflib
import os
import signal
import subprocess
from pathlib import Path

import aiohttp
import yaml

from tests.daemon import clean_env, free_port, switchboard, wait_healthy

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.yaml"


def sb(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, *args), capture_output=True, text=True, timeout=60, env=clean_env(**env)
    )


def _example_home(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text(EXAMPLE.read_text())
    return home, cfg


def _changed_lines(before: str, after: str) -> list[str]:
    return [
        ln
        for ln in difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm="")
        if ln[:1] in "+-" and not ln.startswith(("+++", "---"))
    ]


def test_set_changes_one_line_and_keeps_every_comment_and_other_key(tmp_path: Path) -> None:
    home, cfg = _example_home(tmp_path)
    before = cfg.read_text()
    proc = sb(home, "config", "set", "platforms.api.port", "9123")
    assert proc.returncode == 0, proc.stderr
    assert "platforms.api.port: 8642 -> 9123" in proc.stdout
    assert _changed_lines(before, cfg.read_text()) == ["-    port: 8642", "+    port: 9123"]
    proc = sb(home, "config", "set", "platforms.telegram.allowed_users", "[111, 222]")
    assert proc.returncode == 0, proc.stderr
    changed = _changed_lines(before, cfg.read_text())
    assert "+    allowed_users: [111, 222] # user ids allowed to talk to the agent" in changed
    assert len(changed) == 4
    assert sb(home, "config", "get", "platforms.telegram.allowed_users").stdout == "[111, 222]\n"


def test_get_prints_the_files_value_or_the_default_and_json_on_request(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("# mine\nagent:\n  system_prompt: Be brief.\n")
    assert sb(home, "config", "get", "agent.system_prompt").stdout == "Be brief.\n"
    assert sb(home, "config", "get", "platforms.api.port").stdout == "8642\n"
    assert sb(home, "config", "get", "access.unknown_dm", "--json").stdout == '"refuse"\n'
    assert sb(home, "config", "path").stdout.strip() == str((home / "config.yaml").absolute())


def test_an_unknown_key_exits_78_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    home, cfg = _example_home(tmp_path)
    before = cfg.read_bytes()
    proc = sb(home, "config", "set", "platforms.telegarm.enabled", "true")
    assert proc.returncode == 78
    assert proc.stderr.startswith(
        "switchboard: config error: platforms.telegarm: not a key of "
        "the config schema (known here: api, telegram,"
    )
    assert sb(home, "config", "get", "agent.modle").returncode == 78
    assert sb(home, "config", "unset", "nope").returncode == 78
    assert cfg.read_bytes() == before


def test_a_value_of_the_wrong_type_exits_78_and_writes_nothing(tmp_path: Path) -> None:
    home, cfg = _example_home(tmp_path)
    before = cfg.read_bytes()
    cases = {
        (
            "platforms.api.port",
            "eighty",
        ): "platforms.api.port: must be a whole number (got str 'eighty')",
        (
            "platforms.api.port",
            "70000",
        ): "platforms.api.port: must be between 0 and 65535 (got 70000)",
        (
            "session_reset.mode",
            "weekly",
        ): "session_reset.mode: must be one of none, idle, daily, both",
        ("logging", "debug"): "logging: is a section; set its keys one at a time",
    }
    for (key, value), message in cases.items():
        proc = sb(home, "config", "set", key, value)
        assert proc.returncode == 78, (key, proc.stderr)
        assert message in proc.stderr
    assert cfg.read_bytes() == before


def test_an_edit_that_makes_the_config_invalid_is_refused_until_its_secret_exists(
    tmp_path: Path,
) -> None:
    """Enabling Telegram needs its token; the home's secrets file counts, as for the service."""
    home, cfg = _example_home(tmp_path)
    assert sb(home, "config", "set", "platforms.telegram.allow_all_users", "true").returncode == 0
    before = cfg.read_bytes()
    proc = sb(home, "config", "set", "platforms.telegram.enabled", "true")
    assert proc.returncode == 78
    assert "platforms.telegram.token_env: TELEGRAM_BOT_TOKEN is not set" in proc.stderr
    assert cfg.read_bytes() == before
    (home / "switchboard.env").write_text("TELEGRAM_BOT_TOKEN=123:abc\n")
    proc = sb(home, "config", "set", "platforms.telegram.enabled", "true")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(cfg.read_text())["platforms"]["telegram"]["enabled"] is True
    assert sb(home, "check-config").returncode == 0


def test_text_that_yaml_would_misread_is_kept_as_text(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for text in ("yes", "You are: terse", "0123", "null-ish", " padded "):
        assert sb(home, "config", "set", "agent.system_prompt", text).returncode == 0
        assert yaml.safe_load((home / "config.yaml").read_text())["agent"]["system_prompt"] == text


def test_unset_removes_the_key_and_the_sections_it_empties(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text("# top comment\nlogging:\n  level: debug\nagent:\n  backend: echo  # why\n")
    proc = sb(home, "config", "unset", "logging.level")
    assert proc.returncode == 0, proc.stderr
    assert cfg.read_text() == "# top comment\nagent:\n  backend: echo  # why\n"
    again = sb(home, "config", "unset", "logging.level")
    assert again.returncode == 0 and "is not set" in again.stdout


def test_the_file_keeps_its_mode_and_a_broken_file_is_not_touched(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text("agent:\n  backend: echo\n")
    cfg.chmod(0o640)
    assert sb(home, "config", "set", "agent.backend", "echo").stdout.endswith("is unchanged\n")
    assert sb(home, "config", "set", "logging.level", "debug").returncode == 0
    assert cfg.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in home.iterdir()] == ["config.yaml"]  # no temp file left behind
    cfg.write_text("agent: [broken\n")
    proc = sb(home, "config", "set", "logging.level", "info")
    assert proc.returncode == 78 and "not valid YAML at line" in proc.stderr
    assert cfg.read_text() == "agent: [broken\n"


async def _status(url: str) -> str:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/messages", json={"chat_id": "1", "text": "/status"}) as r:
            return str((await r.json())["reply"])


async def test_a_running_daemon_reloads_and_the_command_says_what_needs_a_restart(
    tmp_path: Path,
) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}  # keep me\n")
    proc = await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url, proc)
        assert "Reset policy: none" in await _status(url)
        live = await asyncio.to_thread(sb, home, "config", "set", "session_reset.mode", "idle")
        assert live.returncode == 0, live.stderr
        assert (
            f"the daemon (pid {proc.pid}) reloads its config now: the change applies live"
            in live.stdout
        )
        for _ in range(100):
            if "after 1440 minutes idle" in (status := await _status(url)):
                break
            await asyncio.sleep(0.05)
        assert "Reset policy: after 1440 minutes idle" in status
        later = await asyncio.to_thread(
            sb, home, "config", "set", "platforms.api.port", str(port + 1)
        )
        assert later.returncode == 0, later.stderr
        assert "but platforms.api.port only takes effect at a restart" in later.stdout
        assert "# keep me" in (home / "config.yaml").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert "these changes need a restart to take effect: platforms.api.port" in err.decode()
    stopped = sb(home, "config", "set", "logging.level", "debug")
    assert "no daemon is running" in stopped.stdout
    assert not os.path.exists(home / ".config.yaml.tmp")


def test_config_help_explains_keys_values_and_exit_codes(tmp_path: Path) -> None:
    shown = sb(tmp_path, "config", "set", "--help").stdout
    assert "dotted paths of the config schema" in shown and "78" in shown
    for command in ("get", "set", "unset", "path"):
        assert command in sb(tmp_path, "config", "--help").stdout
