"""`switchboard sessions ...` as a person runs it: a subprocess on a real home, output and
exit codes, including while a daemon serves the same state.db."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from state import SessionDB
from tests.daemon import clean_env, free_port, switchboard

DAY = 86400


def sb(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, "sessions", *args),
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env=clean_env(COLUMNS="200"),
    )


@pytest.fixture
async def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    db = await SessionDB.open(h / "state.db")
    trip = await db.create_session(
        "20261101_100000_aaaaaaaa",
        source="telegram",
        title="trip plans",
        started_at=time.time() - 3 * DAY,
    )
    await db.append_messages(
        trip,
        [
            {
                "role": "user",
                "content": "plan a trip to kyoto please",
                "timestamp": time.time() - 3 * DAY,
            },
            {
                "role": "assistant",
                "content": "sure, kyoto in spring",
                "timestamp": time.time() - 3 * DAY,
            },
        ],
    )
    await db.fork_session(
        trip, "compression", new_id="20261101_110000_bbbbbbbb", end_reason="compression"
    )
    old = await db.create_session(
        "20250101_100000_cccccccc", source="cli", started_at=time.time() - 200 * DAY
    )
    await db.append_message(old, "user", "an old terminal chat", timestamp=time.time() - 200 * DAY)
    await db.end_session(old, "user_exit")
    await db.close()
    return h


@pytest.mark.slow
def test_list_shows_titles_relative_times_and_the_live_continuation(home: Path) -> None:
    out = sb(home, "list").stdout
    lines = out.splitlines()
    assert lines[0].split() == ["Title", "Preview", "Last", "Active", "ID"]
    # the live compression child stands for its chain; the ended root is folded into it
    assert any("trip plans #2" in ln and "20261101_110000_bbbbbbbb" in ln for ln in lines)
    assert "20261101_100000_aaaaaaaa" not in out
    unfolded = sb(home, "list", "--all").stdout
    assert any(
        "trip plans" in ln and "3d ago" in ln and "20261101_100000_aaaaaaaa" in ln
        for ln in unfolded.splitlines()
    )
    limited = sb(home, "list", "--limit", "1").stdout
    assert "more sessions exist (3 in all)" in limited
    rows = json.loads(sb(home, "list", "--json").stdout)
    assert {r["id"] for r in rows} == {"20261101_110000_bbbbbbbb", "20250101_100000_cccccccc"}
    browse = sb(home, "browse", stdin="\n")  # the numbered list, cancelled
    assert "20261101_110000_bbbbbbbb" in browse.stdout
    assert "20261101_100000_aaaaaaaa" not in browse.stdout


def test_list_without_titles_shows_the_source_column(tmp_path: Path) -> None:
    import asyncio

    async def make() -> None:
        db = await SessionDB.open(tmp_path / "h" / "state.db")
        sid = await db.create_session(source="discord")
        await db.append_message(sid, "user", "untitled chat")
        await db.close()

    asyncio.run(make())
    header = sb(tmp_path / "h", "list").stdout.splitlines()[0].split()
    assert header == ["Preview", "Last", "Active", "Src", "ID"]


@pytest.mark.slow
def test_show_resolves_titles_and_prefixes_and_says_not_found(home: Path) -> None:
    shown = sb(home, "show", "20261101_100000_aa")
    assert (
        shown.returncode == 0
        and "trip plans" in shown.stdout
        and "plan a trip to kyoto" in shown.stdout
    )
    assert "20261101_110000_bbbbbbbb" in shown.stdout  # the lineage tree shows the continuation
    assert (
        "trip plans #2" in sb(home, "show", "trip plans").stdout
    )  # a title means its newest lineage member
    missing = sb(home, "show", "no-such-session")
    assert missing.returncode == 1 and "not found" in missing.stderr
    assert sb(home, "show", "2026").returncode == 2  # ambiguous prefix


@pytest.mark.slow
def test_search_rename_delete_prune(home: Path) -> None:
    found = sb(home, "search", "kyoto", "--json")
    assert {h["session_id"] for h in json.loads(found.stdout)} == {"20261101_100000_aaaaaaaa"}
    assert ">>>kyoto<<<" in sb(home, "search", "kyoto").stdout
    assert sb(home, "search", "***").returncode == 2
    assert sb(home, "rename", "20250101", "old", "terminal", "work").returncode == 0
    assert "old terminal work" in sb(home, "list").stdout
    taken = sb(home, "rename", "20250101", "TRIP", "PLANS")
    assert taken.returncode == 1 and "already in use" in taken.stderr
    assert sb(home, "delete", "20250101").returncode == 2  # no tty, no --yes: refuse
    dry = sb(home, "prune", "--older-than", "90", "--dry-run")
    assert "1 ended session idle for more than 90 days would be pruned" in dry.stdout
    assert "pruned 1 session\n" in sb(home, "prune", "--older-than", "90", "--yes").stdout
    assert sb(home, "show", "20250101").returncode == 1
    # a live session: refused with one line and exit 3, as the dashboard refuses it (409)
    live = sb(home, "delete", "20261101_11", "--yes")
    assert live.returncode == 3 and live.stdout == ""
    assert live.stderr.strip().splitlines() == [
        "switchboard: 20261101_110000_bbbbbbbb is live; end it first (/new in its chat) or add --force"
    ]
    assert sb(home, "show", "20261101_11").returncode == 0
    forced = sb(home, "delete", "20261101_11", "--yes", "--force")
    assert forced.returncode == 0 and "deleted 20261101_110000_bbbbbbbb" in forced.stdout


@pytest.mark.slow
def test_export_import_round_trip_and_stats(home: Path, tmp_path: Path) -> None:
    dump = sb(home, "export", "-").stdout
    assert len(dump.splitlines()) == 3
    (tmp_path / "dump.jsonl").write_text(dump + "\nnot json\n")
    other = tmp_path / "other"
    first = sb(other, "import", str(tmp_path / "dump.jsonl"))
    # the good lines are imported; the bad one is named, counted and fails the command
    assert "imported 3 sessions, 3 messages; 0 already present" in first.stderr
    assert "line 5: not JSON" in first.stderr and first.returncode == 1
    assert "1 record could not be imported" in first.stderr
    (tmp_path / "dump.jsonl").write_text(dump)
    again = sb(other, "import", str(tmp_path / "dump.jsonl"))
    assert again.returncode == 0 and "imported 0 sessions" in again.stderr

    def without_message_ids(
        text: str,
    ) -> list[dict]:  # ids are local to a file; all else must match
        recs = [json.loads(line) for line in text.splitlines()]
        for rec in recs:
            for m in rec["messages"]:
                m.pop("id")
        return recs

    assert without_message_ids(sb(other, "export", "-").stdout) == without_message_ids(dump)
    stats = json.loads(sb(other, "stats", "--json").stdout)
    assert (stats["sessions"], stats["messages"]) == (3, 3)
    assert "optimized the search index and vacuumed" in sb(other, "optimize").stdout
    assert sb(other, "import", str(tmp_path / "missing.jsonl")).returncode == 1


@pytest.mark.slow
def test_commands_work_while_the_daemon_runs(home: Path) -> None:
    port = free_port()
    (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
    daemon = subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        assert sb(home, "rename", "20250101", "renamed", "live").returncode == 0
        assert "renamed live" in sb(home, "list").stdout
        assert len(sb(home, "export", "-").stdout.splitlines()) == 3
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


@pytest.mark.parametrize("days", ["-1", "-0.5", "nan", "inf", "soon"])
def test_prune_refuses_a_negative_or_meaningless_age_as_a_usage_error(
    home: Path, days: str
) -> None:
    done = sb(home, "prune", "--older-than", days, "--yes")
    assert done.returncode == 2
    assert "--older-than" in done.stderr and "pruned" not in done.stdout
    assert "20250101_100000_cccccccc" in sb(home, "list").stdout  # nothing was pruned
