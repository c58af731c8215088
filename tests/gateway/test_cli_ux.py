"""The command line's conventions: options in either position, help text on
every option, one-line errors instead of tracebacks, usage errors for impossible limits,
counts in sentences, progress counts when piped, full-width tables, a quiet fresh home."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.agent.echo import EchoAgent
from gateway.cli import build_parser
from gateway.reset.policy import ResetPolicy
from state import SessionDB
from state.sqlite.schema import migrate
from tests.daemon import clean_env, free_port, switchboard, wait_healthy

MANY = 400


def sb(
    home: Path, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env=clean_env(**env),
    )


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home with enough sessions that a JSON listing outgrows a pipe's buffer."""
    home = tmp_path_factory.mktemp("crowded") / "home"

    async def fill() -> None:
        db = await SessionDB.open(home / "state.db")
        for i in range(MANY):
            sid = await db.create_session(source="api", title=f"kyoto plan number {i}")
            await db.append_message(
                sid, "user", f"kyoto itinerary, day {i}, temples and gardens " * 4
            )
        await db.close()

    asyncio.run(fill())
    return home


def _walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{path} {name} (no summary)")
                if not child.description:
                    missing.append(f"{path} {name} (no description)")
                missing += _walk(child, f"{path} {name}")
        elif not action.help:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_subcommand_and_option_has_help_text() -> None:
    """Walks the whole argparse tree."""
    assert _walk(build_parser(), "switchboard") == []


def test_prune_help_shows_the_default_age(tmp_path: Path) -> None:
    shown = sb(tmp_path / "h", "sessions", "prune", "--help", COLUMNS="200").stdout
    assert "idle for more than DAYS days (default 90)" in shown


@pytest.mark.slow
def test_global_options_work_after_the_subcommand_and_there_is_a_version(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "c.yaml").write_text("agent:\n  backend: echo\n")
    module = [sys.executable, "-m", "gateway"]
    after = subprocess.run(
        [
            *module,
            "check-config",
            "--home",
            str(home),
            "--config",
            str(tmp_path / "c.yaml"),
            "--debug",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert after.returncode == 0, after.stderr
    assert f"config ok: {tmp_path / 'c.yaml'}" in after.stdout
    listed = subprocess.run(
        [*module, "sessions", "list", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert listed.returncode == 0 and "No sessions." in listed.stdout
    assert (home / "state.db").exists()
    run = subprocess.run(
        [*module, "run", "--home", str(home), "--config", str(tmp_path / "bad.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert run.returncode == 78 and "bad.yaml" in run.stderr  # parsed, then the missing file named
    version = sb(home, "--version")
    assert version.returncode == 0 and version.stdout.startswith("switchboard ")


def test_export_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    proc = sb(tmp_path / "h", "sessions", "export", str(tmp_path / "no" / "dir" / "x.jsonl"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"switchboard: cannot write {tmp_path / 'no' / 'dir' / 'x.jsonl'}: No such file or directory"
    )


@pytest.mark.parametrize(
    "args",
    [
        ("sessions", "list", "--json", "--limit", "1000"),
        ("sessions", "search", "kyoto", "--json", "--limit", "1000"),
    ],
)
def test_a_reader_that_stops_early_gets_no_traceback(crowded: Path, args: tuple[str, ...]) -> None:
    """`... | head -c 100`. The output is larger than a pipe's buffer, so
    the writer is still writing when the reader goes."""
    proc = subprocess.Popen(
        switchboard(crowded, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env()
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert len(proc.stdout.read(100)) == 100
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 1
    assert err == ""


@pytest.mark.slow
def test_a_taken_api_port_is_one_line_naming_the_port_and_the_key(tmp_path: Path) -> None:
    """A second daemon (another home) on a port already in use."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        home = tmp_path / "home"
        home.mkdir()
        (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
        proc = sb(home, "run")
    assert proc.returncode == 78
    errors = [ln for ln in proc.stderr.splitlines() if "switchboard:" in ln]
    assert errors == [
        f"switchboard: config error: platforms.api.port: port {port} on 127.0.0.1 "
        "is already in use by another program; stop it or choose another port"
    ]
    assert "Traceback" not in proc.stderr


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"

    async def make() -> None:
        db = await SessionDB.open(h / "state.db")
        sid = await db.create_session(
            "20261101_100000_aaaaaaaa", source="telegram", title="trip plans"
        )
        await db.append_messages(
            sid,
            [
                {"role": "user", "content": "plan a trip to kyoto"},
                {"role": "assistant", "content": "kyoto in spring"},
            ],
        )
        await db.close()

    asyncio.run(make())
    return h


def test_clearing_a_title_says_so(home: Path) -> None:
    proc = sb(home, "sessions", "rename", "20261101", "")
    assert proc.returncode == 0 and proc.stdout.strip() == "20261101_100000_aaaaaaaa: title cleared"
    assert "None" not in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("list", "--limit", "0"),
        ("list", "--limit", "-1"),
        ("search", "kyoto", "--limit", "0"),
        ("browse", "--limit", "0"),
    ],
)
def test_non_positive_limits_are_usage_errors(home: Path, args: tuple[str, ...]) -> None:
    proc = sb(home, "sessions", *args)
    assert proc.returncode == 2 and "--limit: must be 1 or more" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.slow
def test_counts_of_one_are_singular(home: Path) -> None:
    """Counts read "last 1 message" and "after 1 minute idle", never "1 messages"."""
    shown = sb(home, "sessions", "show", "trip plans", "--messages", "1").stdout
    assert "last 1 message:" in shown
    assert ResetPolicy(mode="idle", idle_minutes=1).describe() == "after 1 minute idle"
    assert ResetPolicy(mode="idle", idle_minutes=5).describe() == "after 5 minutes idle"
    stats = sb(home, "sessions", "stats").stdout
    assert stats.startswith("1 session (")


@pytest.mark.slow
def test_a_file_of_only_bad_lines_fails_with_a_count(home: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('not json\n{"half": \n[1, 2]\n')
    proc = sb(tmp_path / "other", "sessions", "import", str(bad))
    assert proc.returncode == 1
    assert "switchboard: 3 records could not be imported" in proc.stderr


@pytest.mark.slow
def test_import_reads_stdin_and_both_directions_report_a_count_when_piped(
    home: Path, tmp_path: Path
) -> None:
    """`import -` reads stdin; without a terminal the final count still shows."""
    exported = sb(home, "sessions", "export", "-")
    assert exported.returncode == 0 and len(exported.stdout.splitlines()) == 1
    assert exported.stderr.strip() == "exported 1 session"
    other = tmp_path / "other"
    imported = sb(other, "sessions", "import", "-", stdin=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    assert "imported 1 session, 2 messages; 0 already present" in imported.stderr
    assert "trip plans" in sb(other, "sessions", "list").stdout
    to_file = sb(home, "sessions", "export", str(tmp_path / "x.jsonl"))
    assert to_file.stderr.strip() == f"exported 1 session to {tmp_path / 'x.jsonl'}"


def test_piped_tables_keep_each_row_on_one_line(tmp_path: Path) -> None:
    """No 80-column wrapping when stdout is not a terminal."""
    title = "a rather long title about the migration of the billing service " + "x" * 30
    h = tmp_path / "h"

    async def make() -> str:
        db = await SessionDB.open(h / "state.db")
        sid = await db.create_session(source="api", title=title)
        await db.append_message(sid, "user", "what should we do about the billing migration plan?")
        await db.close()
        return sid

    sid = asyncio.run(make())
    lines = sb(h, "sessions", "list").stdout.splitlines()
    assert len(lines) == 2, lines  # the header and one row
    assert title in lines[1] and sid in lines[1]


@pytest.mark.slow
def test_a_fresh_home_logs_one_line_about_it(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
    proc = subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", proc))
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert err.count(f"created a new home at {home}") == 1
    assert "migrating" not in err and "sessions.json was missing" not in err


def test_an_older_database_still_logs_each_migration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        with caplog.at_level(logging.DEBUG, logger="state.schema"):
            migrate(conn, str(path), target=3)
        assert all(r.levelno == logging.DEBUG for r in caplog.records if "migrating" in r.message)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="state.schema"):
            migrate(conn, str(path))
        steps = [r for r in caplog.records if "migrating" in r.message]
        assert steps and all(r.levelno == logging.INFO for r in steps)
        assert f"migrating {path} to schema 4" in steps[0].message
    finally:
        conn.close()


async def test_echo_titles_use_each_word_once() -> None:
    """Never "Second topic cooking pasta second topic cooking"."""
    title = await EchoAgent().suggest_title(
        [
            {"role": "user", "content": "Second topic: cooking pasta"},
            {"role": "assistant", "content": "echo: Second topic: cooking pasta"},
        ]
    )
    assert title == "Second topic cooking pasta"
    mixed = await EchoAgent().suggest_title([{"role": "user", "content": "Tea TEA tea, green tea"}])
    assert mixed == "Tea green"
