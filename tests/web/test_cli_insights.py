"""`switchboard insights` (issue 21): the dashboard's figures in the terminal, run as a
real subprocess against a real state.db."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.cli.insights import sparkline
from state import SessionDB
from tests.web_seed import seed


@pytest.fixture
def home(tmp_path: Path) -> Path:
    async def build() -> None:
        db = await SessionDB.open(tmp_path / "home" / "state.db")
        await seed(db, time.time())
        await db.close()

    asyncio.run(build())
    (tmp_path / "home" / "config.yaml").write_text(
        "dashboard:\n  prices: {gpt-4o-mini: {input: 0.15, output: 0.6}}\n"
    )
    return tmp_path / "home"


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "insights", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_sparkline_scales_to_the_largest_value() -> None:
    assert sparkline([0, 1, 4, 8]) == " ▁▄█"
    assert sparkline([0, 0]) == "  "
    assert sparkline([]) == ""


def test_insights_json_has_the_dashboards_figures(home: Path) -> None:
    done = _run(home, "--days", "30", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["messages"] == 12 and data["days"] == 30 and len(data["per_day"]) == 31
    assert data["cost"] == {"estimated_usd": 0.45, "unpriced_models": ["claude-x"]}
    assert data["top_tools"] == [{"tool": "session_search", "calls": 1}]
    only = json.loads(_run(home, "--days", "5", "--source", "slack", "--json").stdout)
    assert only["messages"] == 0 and only["source"] == "slack"


def test_insights_tables_and_sparklines(home: Path) -> None:
    done = _run(home, "--days", "30")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for phrase in ("messages per day", "estimated cost", "$0.45", "session_search", "busiest hours",
                   "telegram", "how sessions ended", "no price configured (dashboard.prices) for: claude-x"):  # fmt: skip
        assert phrase in out, phrase
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")


def test_insights_refuses_a_bad_period(home: Path) -> None:
    done = _run(home, "--days", "0")
    assert done.returncode == 2 and "--days" in done.stderr
