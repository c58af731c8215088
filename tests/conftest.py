from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway import event_loops
from state import SessionDB
from tests import pgserver

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
# The loop the tests run on: the daemon's default (runtime.event_loop: auto), or
# SWITCHBOARD_TEST_LOOP=asyncio|uvloop. Daemons the tests start choose by their config.
TEST_LOOP = os.environ.get("SWITCHBOARD_TEST_LOOP", "auto")
_LOOP = event_loops.loop_factory(TEST_LOOP)


if _LOOP is not None:

    def pytest_asyncio_loop_factories(
        config: pytest.Config, item: pytest.Item
    ) -> dict[str, object]:
        return {"uvloop": _LOOP}


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SessionDB]:
    store = await SessionDB.open(tmp_path / "state.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A PostgreSQL server for the session (tests/pgserver.py finds one, or starts a
    private cluster, stopped at the end)."""
    dsn, private = pgserver.find_server(pgserver.server_candidates())
    try:
        yield dsn
    finally:
        if private is not None:
            private.stop()


@pytest.fixture
def python_exe() -> str:
    return sys.executable


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="the long reliability variant: 100 random SIGKILLs instead of 20, and four rounds "
        "of fault-point kills per platform instead of one",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long"):
        os.environ.setdefault("SWITCHBOARD_KILL_POINTS", "100")
        os.environ.setdefault("SWITCHBOARD_FAULT_ROUNDS", "4")


# Folders and modules whose every test is `slow` (`pytest -m "not slow"` leaves them out;
# CI runs them): replicas on PostgreSQL killed and stalled, the soak, the real browser, and
# the daemon subprocesses crashed at fault points or run under load, Hermes homes imported
# into both stores. Single slow tests
# elsewhere carry `@pytest.mark.slow` themselves.
SLOW_PATHS = (
    "tests/cluster/",
    "tests/test_soak.py",
    "tests/web/test_dashboard_browser.py",
    "tests/reliability/test_crash.py",
    "tests/reliability/test_fault_chains.py",
    "tests/reliability/test_fault_points.py",
    "tests/reliability/test_outbox_telegram.py",
    "tests/reliability/test_outbox_exactly_once.py",
    "tests/reliability/test_contention.py",
    "tests/reliability/test_scale.py",
    "tests/state/test_import_from_hermes.py",
)
NOT_SLOW = ("tests/cluster/test_compose.py",)  # reads deploy/compose's files; starts nothing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [p for p in SLOW_PATHS + NOT_SLOW if not (ROOT / p).exists()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py names paths that do not exist: {missing}")
    for item in items:
        path = item.path.relative_to(ROOT).as_posix()
        if path.startswith(SLOW_PATHS) and not path.startswith(NOT_SLOW):
            item.add_marker(pytest.mark.slow)


STUCK_AFTER_S = 120.0  # no test here needs this long; past it, say where every task waits


@pytest.fixture(autouse=True)
async def _report_a_stuck_test(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """A test still running after STUCK_AFTER_S prints the stack of every asyncio task, so
    a hang in CI names the await it hangs on instead of only timing out (pytest-timeout
    then fails it)."""
    import asyncio
    import io

    def report() -> None:
        out = io.StringIO()
        print(
            f"\n--- {request.node.nodeid} still running after {STUCK_AFTER_S:.0f}s; tasks:",
            file=out,
        )
        for task in asyncio.all_tasks():
            task.print_stack(limit=12, file=out)
        sys.stderr.write(out.getvalue())

    handle = asyncio.get_running_loop().call_later(STUCK_AFTER_S, report)
    try:
        yield
    finally:
        handle.cancel()
