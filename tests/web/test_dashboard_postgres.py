"""The dashboard on the PostgreSQL store: the same scenarios as test_dashboard_api.py
(listing filters and keyset paging, search, the lineage tree, insights and cost, export and
import, the operations) over the same seeded data, with the store in a schema of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from state import open_store
from tests import pgserver
from tests.state.conftest import pg_dsn  # noqa: F401  (the session's PostgreSQL server)
from tests.web import test_dashboard_api as scenarios
from tests.web.conftest import Site, start_site


@pytest.fixture
async def pg_site(pg_dsn: str, tmp_path: Path) -> AsyncIterator[Site]:  # noqa: F811
    schema = pgserver.fresh_schema(pg_dsn)
    store = await open_store(
        {"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, tmp_path
    )
    site, server = await start_site(tmp_path, store=store)
    try:
        yield site
    finally:
        await server.close()
        await store.close()
        pgserver.drop_schema(pg_dsn, schema)


SCENARIOS: list[Callable[[Site], Awaitable[None]]] = [
    scenarios.test_listing_filters_sort_and_keyset_paging,
    scenarios.test_search_uses_the_query_language_and_links_to_the_message,
    scenarios.test_session_page_shows_lineage_tree_folded_tools_and_collapsed_long_text,
    scenarios.test_insights_figures_and_cost,
    scenarios.test_hostile_titles_and_messages_reach_pages_only_as_text,
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("test_"))
async def test_dashboard_scenario_on_postgres(
    pg_site: Site, scenario: Callable[[Site], Awaitable[None]]
) -> None:
    await scenario(pg_site)


async def test_export_then_import_on_postgres(pg_site: Site, tmp_path: Path) -> None:
    await scenarios.test_export_then_import_through_the_api(pg_site, tmp_path)


async def test_operations_on_postgres(pg_dsn: str, tmp_path: Path) -> None:  # noqa: F811
    """Rename, a live session's delete refused, empty sessions and prune, on PostgreSQL."""
    schema = pgserver.fresh_schema(pg_dsn)
    store = await open_store(
        {"backend": "postgres", "dsn": pgserver.with_schema(pg_dsn, schema)}, tmp_path
    )
    site, server = await start_site(tmp_path, live={scenarios.LIVE_ONE}, store=store)
    try:
        await scenarios.rename_delete_live_refusal_prune_and_empty(site)
    finally:
        await server.close()
        await store.close()
        pgserver.drop_schema(pg_dsn, schema)
