"""`switchboard insights`: the dashboard's figures in the terminal, run as a
real subprocess against a real state.db, and against a home whose config puts the store on
PostgreSQL (the same seeded figures)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.insights import sparkline
from state import SessionDB, open_store
from tests import pgserver
from tests.web_seed import seed

PRICES = "dashboard:\n  prices: {gpt-4o-mini: {input: 0.15, output: 0.6}}\n"
DSN_ENV = "SB_INSIGHTS_DSN"


@dataclass
class Home:
    path: Path
    env: dict[str, str]  # the variables the command runs with (a PostgreSQL home's DSN)


@pytest.fixture(params=["sqlite", "postgres"])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Home]:
    path = tmp_path / "home"
    path.mkdir()
    if request.param == "sqlite":
        asyncio.run(_seeded(SessionDB.open(path / "state.db")))
        (path / "config.yaml").write_text(PRICES)
        yield Home(path, dict(os.environ))
        return
    server = request.getfixturevalue("pg_server")
    schema = pgserver.fresh_schema(server)
    dsn = pgserver.with_schema(server, schema)
    asyncio.run(_seeded(open_store({"backend": "postgres", "dsn": dsn}, path)))
    (path / "config.yaml").write_text(
        f"state:\n  backend: postgres\n  dsn_env: {DSN_ENV}\n{PRICES}"
    )
    try:
        yield Home(path, {**os.environ, DSN_ENV: dsn})
    finally:
        pgserver.drop_schema(server, schema)


async def _seeded(opening: Any) -> None:
    db = await opening
    try:
        await seed(db, time.time())
    finally:
        await db.close()


def _run(
    home: Home, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home.path), "insights", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=home.env if env is None else env,
    )


def test_sparkline_scales_to_the_largest_value() -> None:
    assert sparkline([0, 1, 4, 8]) == " ▁▄█"
    assert sparkline([0, 0]) == "  "
    assert sparkline([]) == ""


@pytest.mark.slow
def test_insights_json_has_the_dashboards_figures(home: Home) -> None:
    done = _run(home, "--days", "30", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["messages"] == 12 and data["days"] == 30 and len(data["per_day"]) == 31
    assert data["cost"] == {"estimated_usd": 0.45, "unpriced_models": ["claude-x"]}
    assert data["top_tools"] == [{"tool": "session_search", "calls": 1}]
    only = json.loads(_run(home, "--days", "5", "--source", "slack", "--json").stdout)
    assert only["messages"] == 0 and only["source"] == "slack"


@pytest.mark.slow
def test_insights_tables_and_sparklines(home: Home) -> None:
    done = _run(home, "--days", "30")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for phrase in (
        "messages per day",
        "estimated cost",
        "$0.45",
        "session_search",
        "busiest hours",
        "telegram",
        "how sessions ended",
        "no price configured (dashboard.prices) for: claude-x",
    ):
        assert phrase in out, phrase
    assert any(ch in out for ch in "▁▂▃▄▅▆▇█")


def test_insights_refuses_a_bad_period(home: Home) -> None:
    done = _run(home, "--days", "0")
    assert done.returncode == 2 and "--days" in done.stderr


@pytest.mark.parametrize("home", ["postgres"], indirect=True)
def test_insights_on_postgres_reads_the_database_and_needs_its_dsn(home: Home) -> None:
    """A home on PostgreSQL: the figures come from the database (above), no state.db is
    made beside the config, and without the DSN variable the command exits 78 naming the
    key that names it."""
    assert _run(home, "--json").returncode == 0
    assert not (home.path / "state.db").exists()
    unset = _run(home, "--json", env={k: v for k, v in home.env.items() if k != DSN_ENV})
    assert unset.returncode == 78 and "state.dsn_env" in unset.stderr, unset.stderr


async def _with_recorded_costs(opening: Any) -> None:
    """A priced model's tokens, a model whose sessions recorded their own cost (as a Hermes
    home does), and a model with neither."""
    db = await opening
    now = time.time()
    try:
        priced = await db.create_session(
            source="telegram", model="gpt-4o-mini", started_at=now - 60
        )
        await db.append_message(priced, "user", "hello", timestamp=now - 50)
        await db.update_token_counts(priced, input_tokens=2000, output_tokens=1000)
        recorded = await db.create_session(
            source="cli", model="imported-model", started_at=now - 40
        )
        await db.append_message(recorded, "user", "hi", timestamp=now - 30)
        await db.update_token_counts(
            recorded, input_tokens=500, output_tokens=500, estimated_cost_usd=0.0012
        )
        neither = await db.create_session(source="discord", model="claude-x", started_at=now - 20)
        await db.append_message(neither, "user", "hey", timestamp=now - 10)
        await db.update_token_counts(neither, input_tokens=10, output_tokens=10)
    finally:
        await db.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sessions_stats_and_insights_print_the_same_cost(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    path = tmp_path / "home"
    path.mkdir()
    env = dict(os.environ)
    if backend == "sqlite":
        asyncio.run(_with_recorded_costs(SessionDB.open(path / "state.db")))
        (path / "config.yaml").write_text(PRICES)
    else:
        server = request.getfixturevalue("pg_server")
        schema = pgserver.fresh_schema(server)
        request.addfinalizer(lambda: pgserver.drop_schema(server, schema))
        env[DSN_ENV] = pgserver.with_schema(server, schema)
        asyncio.run(
            _with_recorded_costs(open_store({"backend": "postgres", "dsn": env[DSN_ENV]}, path))
        )
        (path / "config.yaml").write_text(
            f"state:\n  backend: postgres\n  dsn_env: {DSN_ENV}\n{PRICES}"
        )

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(path), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    # 2000 in and 1000 out at 0.15 and 0.6 per million, plus the 0.0012 another recorded
    expected = {"estimated_usd": 0.0021, "unpriced_models": ["claude-x"]}
    assert json.loads(run("insights", "--json"))["cost"] == expected
    assert json.loads(run("sessions", "stats", "--json"))["cost"] == expected
    for out in (run("insights"), run("sessions", "stats")):
        assert "estimated cost" in out and "$0.0021" in out, out
        assert "no price configured (dashboard.prices) for: claude-x" in out, out


def test_the_cost_needs_only_the_prices_from_the_config(tmp_path: Path) -> None:
    """A terminal command reads `dashboard.prices` without the platform secrets the daemon
    needs; a bad price still exits 78 naming its key."""
    path = tmp_path / "home"
    path.mkdir()
    asyncio.run(_with_recorded_costs(SessionDB.open(path / "state.db")))
    config = path / "config.yaml"
    env = {k: v for k, v in os.environ.items() if k != "TELEGRAM_BOT_TOKEN"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(path), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )

    config.write_text(PRICES + "platforms:\n  telegram:\n    enabled: true\n")
    for args in (("sessions", "stats"), ("insights",)):
        done = run(*args)
        assert done.returncode == 0 and "$0.0021" in done.stdout, done.stderr
    config.write_text("dashboard:\n  prices: {gpt-4o-mini: {input: -1}}\n")
    refused = run("sessions", "stats")
    assert refused.returncode == 78 and "dashboard.prices" in refused.stderr, refused.stderr
