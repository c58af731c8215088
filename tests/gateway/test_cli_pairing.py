"""DM pairing end to end: a real daemon on the fake Telegram server with
`access.unknown_dm: pair`, and `switchboard pairing` as real subprocesses. An unknown
user's DM gets one code and nothing else; approving it lets them in without a restart, and
the approval survives one; wrong, used and expired codes get the same answer."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from pathlib import Path

from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.telegram import FakeTelegram

CODE = re.compile(r"Pairing code: ([A-Z2-9]{4}-[A-Z2-9]{4})\n")


async def sb(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )


async def _daemon(home: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *switchboard(home, "run"),
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _stop(proc: asyncio.subprocess.Process) -> None:
    proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 30)


def _to(fake: FakeTelegram, chat: int) -> list[str]:
    return [m["text"] for m in fake.sent() if m["chat_id"] == chat]


async def _until_answered(fake: FakeTelegram, user: int, text: str) -> None:
    """DM `text` until the agent's echo of it comes back (a decision reaches the daemon
    within gateway.pairing.REMEMBER_S)."""
    for _ in range(60):
        fake.push(fake.message(text, fake.dm_chat(user), user_id=user))
        for _ in range(10):
            if f"echo: {text}" in _to(fake, user):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"user {user} was never answered")


async def test_an_approved_code_lets_the_user_in_at_once_and_across_a_restart(
    tmp_path: Path,
) -> None:
    fake = FakeTelegram(token="4242:pair-token")
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"access:\n  unknown_dm: pair\n  pairing:\n    code_ttl_minutes: 30\n"
        f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
        f"    allowed_users: [1]\n    base_url: {fake.base_url}\n"
    )
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\n")
    proc = await _daemon(home)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        fake.push(fake.message("let me in", fake.dm_chat(5), user_id=5, name="Eve"))
        await fake.wait_sent(1, timeout=20)
        first = _to(fake, 5)
        assert len(first) == 1 and CODE.match(first[0]) and "30 minutes" in first[0]
        code = CODE.match(first[0]).group(1)  # type: ignore[union-attr]
        fake.push(fake.message("hello?", fake.dm_chat(5), user_id=5))  # no second code
        fake.push(fake.message("ping", fake.dm_chat(1), user_id=1))  # listed: answered
        await fake.wait_sent(2, timeout=20)
        assert _to(fake, 1) == ["echo: ping"] and len(_to(fake, 5)) == 1
        assert "echo: hello?" not in _to(fake, 5)

        listed = await sb(home, "pairing", "list")
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"pending\s+telegram\s+5\s+Eve\s+{code}\s+expires ", listed.stdout)
        wrong = await sb(home, "pairing", "approve", "ZZZZ-ZZZZ")
        assert wrong.returncode == 1
        approved = await sb(home, "pairing", "approve", code.lower().replace("-", ""))
        assert approved.returncode == 0, approved.stderr
        assert "approved telegram user 5 (Eve): they can talk to the agent now" in approved.stdout
        used = await sb(home, "pairing", "approve", code)
        assert used.returncode == 1
        assert used.stderr.replace(code, "ZZZZ-ZZZZ") == wrong.stderr  # used, unknown: alike
        await _until_answered(fake, 5, "am I in?")
    finally:
        await _stop(proc)
    proc = await _daemon(home)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        await _until_answered(fake, 5, "still in after a restart")
        rows = json.loads((await sb(home, "pairing", "list", "--json")).stdout)
        assert [(r["platform"], r["user_id"], r["state"]) for r in rows] == [
            ("telegram", "5", "approved")
        ]
        revoked = await sb(home, "pairing", "revoke", "5")
        assert revoked.returncode == 0 and "revoked telegram user 5" in revoked.stdout
        assert (await sb(home, "pairing", "revoke", "telegram:5")).returncode == 1
        assert json.loads((await sb(home, "pairing", "list", "--json")).stdout) == []
    finally:
        await _stop(proc)
        await fake.stop()


async def test_a_denied_code_is_used_up_and_refuse_mode_sends_no_code(tmp_path: Path) -> None:
    fake = FakeTelegram(token="4242:pair-token")
    await fake.start()
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(
        f"access:\n  unknown_dm: pair\nplatforms:\n  api:\n    port: {port}\n  telegram:\n"
        f"    enabled: true\n    allowed_users: [1]\n    base_url: {fake.base_url}\n"
    )
    (home / "switchboard.env").write_text(f"TELEGRAM_BOT_TOKEN={fake.token}\n")
    proc = await _daemon(home)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        group = fake.group_chat(-100555)
        fake.push(fake.message("@switchboard_bot hi all", group, user_id=6))  # groups: no code
        fake.push(fake.message("me too", fake.dm_chat(6), user_id=6))
        await fake.wait_sent(1, timeout=20)
        assert _to(fake, -100555) == []
        code = CODE.match(_to(fake, 6)[0]).group(1)  # type: ignore[union-attr]
        denied = await sb(home, "pairing", "deny", code)
        assert denied.returncode == 0 and "denied telegram user 6" in denied.stdout
        assert (await sb(home, "pairing", "approve", code)).returncode == 1
        assert json.loads((await sb(home, "pairing", "list", "--json")).stdout) == []
        assert "config" not in denied.stderr
        switched = await sb(home, "config", "set", "access.unknown_dm", "refuse")
        assert "applies live" in switched.stdout, switched.stdout + switched.stderr
        assert await _first_refused_user(fake) >= 7  # the reload reached the daemon
    finally:
        await _stop(proc)
        await fake.stop()


async def _first_refused_user(fake: FakeTelegram) -> int:
    """New users DM one each, until one is refused instead of given a code (the daemon
    takes the reload as a signal, a moment after `config set` returns)."""
    for user in range(7, 200):
        fake.push(fake.message("hi", fake.dm_chat(user), user_id=user))
        for _ in range(200):
            if answer := _to(fake, user):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"user {user} got no answer")
        if answer == ["Sorry, you are not authorised to use this bot."]:
            return user
        assert CODE.match(answer[0])
    raise AssertionError("refuse never applied")


def test_pairing_help_explains_the_flow(tmp_path: Path) -> None:
    shown = subprocess.run(
        switchboard(tmp_path, "pairing", "--help"),
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    ).stdout
    assert "access.unknown_dm: pair" in shown and "approve" in shown and "revoke" in shown


async def test_on_postgres_an_approval_from_another_home_reaches_the_running_replica(
    tmp_path: Path, pg_server: str
) -> None:
    """The daemon's home and the operator's are two machines sharing one database: the code
    the replica handed out is approved from the other, and the replica lets the user in."""
    from tests import pgserver

    schema = pgserver.fresh_schema(pg_server)
    dsn = pgserver.with_schema(pg_server, schema)
    fake = FakeTelegram(token="4242:pg-pair-token")
    await fake.start()
    replica, operator, port = tmp_path / "replica", tmp_path / "operator", free_port()
    for home in (replica, operator):
        home.mkdir()
        (home / "config.yaml").write_text(
            f"state:\n  backend: postgres\n  dsn_env: SB_PAIR_DSN\naccess:\n  unknown_dm: pair\n"
            f"platforms:\n  api:\n    port: {port}\n  telegram:\n    enabled: true\n"
            f"    base_url: {fake.base_url}\n"
        )
        (home / "switchboard.env").write_text(
            f"TELEGRAM_BOT_TOKEN={fake.token}\nSB_PAIR_DSN={dsn}\n"
        )
    proc = await _daemon(replica)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        fake.push(fake.message("hello from far away", fake.dm_chat(9), user_id=9))
        await fake.wait_sent(1, timeout=20)
        code = CODE.match(_to(fake, 9)[0]).group(1)  # type: ignore[union-attr]
        listed = await sb(operator, "pairing", "list")
        assert code in listed.stdout, listed.stdout + listed.stderr
        approved = await sb(operator, "pairing", "approve", code)
        assert approved.returncode == 0, approved.stderr
        await _until_answered(fake, 9, "in from the other side")
        assert not (operator / "state.db").exists() and not (replica / "state.db").exists()
    finally:
        await _stop(proc)
        await fake.stop()
        pgserver.drop_schema(pg_server, schema)
