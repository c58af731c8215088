from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from state import SessionDB

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[SessionDB]:
    store = await SessionDB.open(tmp_path / "state.db")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def python_exe() -> str:
    return sys.executable


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="the long reliability variant: 100 SIGKILL points instead of 20",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--long"):
        os.environ.setdefault("SWITCHBOARD_KILL_POINTS", "100")
