"""The store contract suite: one `store` fixture, parametrised over every backend.

A test that takes `store` (or `open_test_store`) is part of the contract: it uses only
`state.Store` and runs once per entry of BACKENDS, so a new backend adds its name here and
to `state.api.BACKENDS` and gets every behaviour test for free. SQLite stores are files
under `tmp_path`; PostgreSQL stores are a schema of their own per test and name on the
server tests/pgserver.py finds (or starts). Tests that take the SQLite `db` fixture
(tests/conftest.py) or open `SessionDB` themselves check SQLite internals and stay
SQLite-only; tests/state/README.md lists which files are which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from state import Store, open_store
from tests import pgserver

BACKENDS = ["sqlite", "postgres"]

OpenStore = Callable[..., Awaitable[Store]]


@pytest.fixture(scope="session")
def pg_dsn(pg_server: str) -> str:
    return pg_server


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_test_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[OpenStore]:
    """Opens empty stores of the backend under test (one per `name`); all are closed after
    the test, so a test may close one early to reopen its data."""
    opened: list[Store] = []
    schemas: dict[str, str] = {}
    server = request.getfixturevalue("pg_dsn") if backend == "postgres" else ""

    async def _open(name: str = "main") -> Store:
        if backend == "postgres":
            if name not in schemas:
                schemas[name] = pgserver.fresh_schema(server)
            settings = {"backend": backend, "dsn": pgserver.with_schema(server, schemas[name])}
            store = await open_store(settings, tmp_path / name)
        else:
            store = await open_store({"backend": backend}, tmp_path / name)
        opened.append(store)
        return store

    try:
        yield _open
    finally:
        for store in opened:
            await store.close()
        for schema in schemas.values():
            pgserver.drop_schema(server, schema)


@pytest.fixture
async def store(open_test_store: OpenStore) -> Store:
    return await open_test_store()
