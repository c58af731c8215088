"""The store contract suite: one `store` fixture, parametrised over every backend.

A test that takes `store` (or `open_test_store`) is part of the contract: it uses only
`state.Store` and runs once per entry of BACKENDS, so a new backend (PostgreSQL) adds its
name here and to `state.api.BACKENDS` and gets every behaviour test for free. Tests that take
the SQLite `db` fixture (tests/conftest.py) or open `SessionDB` themselves check SQLite
internals and stay SQLite-only; tests/state/README.md lists which files are which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from state import Store, open_store

BACKENDS = ["sqlite"]

OpenStore = Callable[..., Awaitable[Store]]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_test_store(backend: str, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens empty stores of the backend under test (one per `name`); all are closed after
    the test, so a test may close one early to reopen its data."""
    opened: list[Store] = []

    async def _open(name: str = "main") -> Store:
        store = await open_store({"backend": backend}, tmp_path / name)
        opened.append(store)
        return store

    try:
        yield _open
    finally:
        for store in opened:
            await store.close()


@pytest.fixture
async def store(open_test_store: OpenStore) -> Store:
    return await open_test_store()
