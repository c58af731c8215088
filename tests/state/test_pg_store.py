"""What only the PostgreSQL store has to show: choosing it in config, the constraints that
replace the single writer's checks (two stores on one database stand for two processes),
the atomic /handoff claim under READ COMMITTED, the missing Maintenance capability, and the
private cluster the tests start when no server answers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.config import load_config
from gateway.errors import ConfigError
from state import (
    ChildKind,
    EndReason,
    Fence,
    Maintenance,
    StateError,
    Store,
    TitleTaken,
    open_store,
)
from state.errors import LiveSessionExists, StoreConfigError
from state.pg import inbox as pg_inbox
from state.pg import routing as pg_routing
from state.pg.cluster import route_fields
from state.pg.store import PgStore
from tests import pgserver


@pytest.fixture
async def schema_dsn(pg_dsn: str) -> AsyncIterator[str]:
    name = pgserver.fresh_schema(pg_dsn)
    try:
        yield pgserver.with_schema(pg_dsn, name)
    finally:
        pgserver.drop_schema(pg_dsn, name)


@pytest.fixture
async def two(schema_dsn: str) -> AsyncIterator[tuple[Store, Store]]:
    """Two stores (two writers, two pools) on one database: two daemons."""
    a = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    b = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


# --- choosing the backend -------------------------------------------------------------------


def test_postgres_needs_its_dsn_variable_set_and_valid(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("state:\n  backend: postgres\n  dsn_env: SB_TEST_DSN\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert err.value.key == "state.dsn_env" and "SB_TEST_DSN is not set" in str(err.value)
    assert err.value.exit_code == 78
    with pytest.raises(ConfigError) as err:
        load_config(path, {"SB_TEST_DSN": "host=127.0.0.1 port"})
    assert err.value.key == "state.dsn_env" and "not hold a valid PostgreSQL DSN" in str(err.value)
    cfg = load_config(path, {"SB_TEST_DSN": "postgresql://sb@127.0.0.1/sb"})
    assert (cfg.state.backend, cfg.state.dsn_env) == ("postgres", "SB_TEST_DSN")
    assert load_config(None, {}).state.dsn_env == "SWITCHBOARD_PG_DSN"
    path.write_text("state:\n  dsn_env: not a name\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, {})
    assert err.value.key == "state.dsn_env"


@pytest.mark.slow
def test_check_config_exits_78_naming_state_dsn_env(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: postgres\n  dsn_env: SB_UNSET_DSN\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "check-config"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78
    assert "state.dsn_env" in proc.stderr and "Traceback" not in proc.stderr


async def test_open_store_refuses_a_missing_or_bad_dsn_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError) as err:
        await open_store({"backend": "postgres", "dsn_env": "SB_SURELY_UNSET_DSN"}, tmp_path)
    assert err.value.key == "state.dsn_env" and err.value.exit_code == 78
    assert "SB_SURELY_UNSET_DSN" in str(err.value)
    with pytest.raises(StoreConfigError):
        await open_store({"backend": "postgres", "dsn": "host=127.0.0.1 port"}, tmp_path)


async def test_an_unreachable_server_is_a_database_error_without_the_password(
    tmp_path: Path,
) -> None:
    dsn = f"host=127.0.0.1 port={pgserver.free_port()} user=u password=hunter2 connect_timeout=2"
    with pytest.raises(StateError) as err:
        await open_store({"backend": "postgres", "dsn": dsn}, tmp_path)
    assert "cannot connect" in str(err.value) and "hunter2" not in str(err.value)


async def test_the_postgres_store_reports_no_maintenance_capability(schema_dsn: str) -> None:
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    try:
        assert isinstance(store, PgStore) and store.backend == "postgres"
        assert not isinstance(store, Maintenance)
        assert not hasattr(store, "checkpoint") and not hasattr(store, "vacuum")
    finally:
        await store.close()


async def test_a_database_from_a_newer_switchboard_is_refused(schema_dsn: str) -> None:
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    await store.set_meta("switchboard.schema_version", "999")
    await store.close()
    with pytest.raises(StateError) as err:
        await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    assert "999" in str(err.value)


# --- constraints, not one writer ----------------------------------------------------------


async def test_a_title_in_any_case_is_won_by_exactly_one_of_two_daemons(
    two: tuple[Store, Store],
) -> None:
    a, b = two
    ids = [await a.create_session(source="api") for _ in range(10)]
    results = await asyncio.gather(
        *(
            s.set_session_title(sid, "Plan" if i % 2 else "PLAN")
            for i, (s, sid) in enumerate(zip([a, b] * 5, ids, strict=True))
        ),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, str)]
    assert len(won) == 1 and all(isinstance(r, TitleTaken) for r in results if r not in won)
    auto = await asyncio.gather(
        *(s.set_title_if_unset(sid, "plan") for s, sid in zip([b, a] * 5, ids, strict=True))
    )
    titles = [t for t in auto if t is not None]
    assert len(titles) == 9 and len({t.casefold() for t in titles}) == 9  # numbered, unique


async def test_a_session_key_has_one_live_session_whoever_creates_it(
    two: tuple[Store, Store],
) -> None:
    a, b = two
    results = await asyncio.gather(
        *(s.create_session(source="telegram", session_key="tg:dm:1") for s in (a, b, a, b)),
        return_exceptions=True,
    )
    live = [r for r in results if isinstance(r, str)]
    assert len(live) == 1
    assert all(isinstance(r, LiveSessionExists) for r in results if r not in live)
    assert await b.newest_live_session_by_key() == {"tg:dm:1": live[0]}
    # ending frees the key; a reset forks (ending the parent first) under the same key
    child = await a.fork_session(live[0], "reset", end_reason="idle")
    assert await b.newest_live_session_by_key() == {"tg:dm:1": child}
    with pytest.raises(LiveSessionExists):
        await b.reopen_session(live[0])  # the key is the child's now


async def test_a_platform_message_is_stored_once_across_daemons(two: tuple[Store, Store]) -> None:
    a, b = two
    sid = await a.create_session(source="telegram", chat_id="42")
    msg = {"role": "user", "content": "hello", "platform_message_id": "7"}
    got = await asyncio.gather(
        *(s.append_messages(sid, [msg], dedupe=("telegram", "42")) for s in (a, b, a, b))
    )
    assert sorted(len(ids) for ids in got) == [0, 0, 0, 1]
    assert await a.message_count(sid) == 1 and (await b.require_session(sid))["message_count"] == 1
    assert await b.has_platform_message("telegram", "42", "7") is True
    assert await b.has_platform_message("telegram", "43", "7") is False
    await a.clear_messages(sid)
    assert await b.has_platform_message("telegram", "42", "7") is False


# --- the /handoff claim under READ COMMITTED ---------------------------------------------

_NAIVE_CLAIM = (
    "UPDATE sessions SET handoff_state = 'running', handoff_updated_at = %s WHERE id = ("
    "SELECT id FROM sessions WHERE handoff_state = 'pending' AND handoff_platform = ANY(%s) "
    "ORDER BY handoff_updated_at LIMIT 1) RETURNING id, handoff_platform"
)


async def _race(dsn: str, claim: object) -> list[object]:
    """Claimer A claims inside an open transaction; claimer B starts its claim and waits on
    A's row lock; then A commits. Returns both results."""
    first = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    second = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:
        pid = second.info.backend_pid
        await first.execute("BEGIN")
        got_a = await claim(first)  # type: ignore[operator]
        task = asyncio.create_task(claim(second))  # type: ignore[operator]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
            await pgserver.until_waiting_on_a_lock(watch, pid, task)  # B waits for A's lock
        await first.execute("COMMIT")
        return [got_a, await asyncio.wait_for(task, 10)]
    finally:
        await first.close()
        await second.close()


async def test_two_concurrent_claimers_get_one_claim(schema_dsn: str) -> None:
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    try:
        sid = await store.create_session(source="cli")
        await store.request_handoff(sid, "telegram", now=100.0)

        async def claim(conn: psycopg.AsyncConnection) -> object:
            return await pg_routing.claim_handoff(conn, ["telegram"], 101.0)

        assert await _race(schema_dsn, claim) == [{"id": sid, "platform": "telegram"}, None]
        assert (await store.require_session(sid))["handoff_state"] == "running"

        # the same race with the plain `WHERE id = (SELECT ... LIMIT 1)` claims it twice
        await store.finish_handoff(sid, None)
        await store.request_handoff(sid, "telegram", now=200.0)

        async def naive(conn: psycopg.AsyncConnection) -> object:
            cur = await conn.execute(_NAIVE_CLAIM, (201.0, ["telegram"]))
            return await cur.fetchall()

        a, b = await _race(schema_dsn, naive)
        assert a == b == [(sid, "telegram")]
    finally:
        await store.close()


async def test_many_claimers_on_two_daemons_take_each_handoff_once(
    two: tuple[Store, Store],
) -> None:
    a, b = two
    ids = [await a.create_session(source="cli") for _ in range(12)]
    for i, sid in enumerate(ids):
        await b.request_handoff(sid, "slack", now=1000.0 + i)
    claims = await asyncio.gather(*(s.claim_handoff(["slack"]) for s in [a, b] * 10))
    taken = [c["id"] for c in claims if c is not None]
    assert sorted(taken) == sorted(ids)  # each once, and none left behind


# --- the inbox across daemons ---------------------------------------------------------------


async def test_a_redelivery_racing_the_first_delivery_gets_the_first_row(schema_dsn: str) -> None:
    """The second accept waits on the first's uncommitted row; once that commits, it reads
    the row back (a statement of its own, so it sees the commit) instead of finding none."""
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    try:

        async def accept(conn: psycopg.AsyncConnection) -> object:
            return await pg_inbox.accept(conn, "telegram", "c1", "m1", "{}", 1.0)

        first, second = await _race(schema_dsn, accept)
        assert isinstance(first, tuple) and first[1:] == ("received", True)
        assert second == (first[0], "received", False)
        assert await store.inbox_counts() == {"received": 1}

        # two daemons re-running the same turn: the second waits on the row, then finds
        # the message the first stored
        sid = await store.create_session(source="telegram", chat_id="c1")
        msg = {"role": "user", "content": "hi", "platform_message_id": "m1"}

        async def begin(conn: psycopg.AsyncConnection) -> object:
            return await pg_inbox.begin_turn(conn, first[0], sid, msg, None)

        a, b = await _race(schema_dsn, begin)
        assert a == b and isinstance(a, tuple) and a[1] == [{"role": "user", "content": "hi"}]
        assert await store.message_count(sid) == 1
    finally:
        await store.close()


async def test_two_daemons_take_a_redelivered_message_once(two: tuple[Store, Store]) -> None:
    a, b = two
    got = await asyncio.gather(
        *(s.accept_inbound("slack", "C1", "1700.01", {"n": i}) for i, s in enumerate([a, b] * 4))
    )
    assert len({rid for rid, _, _ in got}) == 1 and sum(new for _, _, new in got) == 1
    rid = got[0][0]
    sid = await a.create_session(source="slack", chat_id="C1")
    msg = {"role": "user", "content": "once", "platform_message_id": "1700.01"}
    begun = await asyncio.gather(*(s.begin_turn(rid, sid, msg) for s in (a, b, a, b)))
    assert len({mid for mid, _ in begun}) == 1 and await b.message_count(sid) == 1
    await b.end_turn(rid, sid, [{"role": "assistant", "content": "done"}])
    assert await a.accept_inbound("slack", "C1", "1700.01", {}) == (rid, "answered", False)


async def test_a_schema_1_database_gains_the_inbox_keeping_its_sessions(schema_dsn: str) -> None:
    old = await PgStore.open(schema_dsn, schema_target=1)
    sid = await old.create_session(source="cli", title="kept")
    assert await old.schema_version() == 1
    await old.close()
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, ".")
    try:
        assert await store.schema_version() == store.latest_schema_version() == 8
        assert (await store.require_session(sid))["title"] == "kept"
        assert (await store.accept_inbound("api", "1", "m", {}))[2] is True
    finally:
        await store.close()


async def test_a_schema_5_databases_shards_keep_their_owners_and_epochs(schema_dsn: str) -> None:
    """Schema 6 adds the shard members and a shard's release time: rows claimed before
    keep their owner and epoch, and claims go on from them."""
    old = await PgStore.open(schema_dsn, schema_target=5)
    async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO platform_shards (platform, shard_count, shard_id, owner, "
            "epoch) VALUES ('discord', 2, 0, 77, 4), ('discord', 2, 1, NULL, 0)"
        )
    await old.close()
    store = await PgStore.open(schema_dsn)
    try:
        # incarnation 77 holds no lock: both shards are free, epochs go on from theirs
        assert await store.claim_shards("discord", 2, 5, 0, 3.0) == ({0: 5, 1: 1}, 0)
    finally:
        await store.close()


async def test_a_schema_6_databases_leases_hold_and_its_routes_update_in_place(
    schema_dsn: str,
) -> None:
    """Schema 7 drops the index on the lease's owner (so a take and a release are HOT
    updates) and leaves room on the routes' pages: a lease taken before keeps its owner and
    epoch, its fence holds, and its release frees it."""
    old = await PgStore.open(schema_dsn, schema_target=6)
    taken = await old.take_lease("k", 1, 0)
    assert taken is not None
    fence = Fence("k", 1, int(taken["lease_epoch"]))
    await old.close()
    store = await PgStore.open(schema_dsn)
    try:
        assert await store.schema_version() == store.latest_schema_version() == 8
        assert await store.lease_holds(fence)
        assert await store.take_lease("k", 2, 0) is not None  # incarnation 1 holds no lock
        assert not await store.lease_holds(fence)
        async with await psycopg.AsyncConnection.connect(schema_dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'session_routes' "
                "AND schemaname = current_schema()"
            )
            assert [r[0] for r in await cur.fetchall()] == ["session_routes_pkey"]
            cur = await conn.execute(
                "SELECT reloptions FROM pg_class WHERE oid = 'session_routes'::regclass"
            )
            assert (await cur.fetchone()) == (["fillfactor=80"],)
    finally:
        await store.close()


async def test_a_lease_shows_a_reset_committed_after_its_route_was_written(
    schema_dsn: str,
) -> None:
    """The take reports what the gateway needs to announce a reset whose replica died before
    writing the route back: the route's session's end reason, title and message count, and
    the live session's parent, kind and message count."""
    store = await PgStore.open(schema_dsn)
    try:
        old = await store.create_session(source="api", session_key="k", title="trip plans")
        await store.append_message(old, "user", "hello")
        taken = await store.take_lease("k", 1, 0)
        assert taken is not None
        fence = Fence("k", 1, int(taken["lease_epoch"]))
        route = route_fields(old, {}, None, "api", "dm", 1.0, 2.0, None, None)
        assert await store.release_lease(fence, route)
        child = await store.fork_session(old, ChildKind.RESET, end_reason=EndReason.IDLE)
        row = await store.take_lease("k", 1, 0)
        assert row is not None and row["session_id"] == old and row["pending_notice"] is None
        assert row["route_ended"] is not None and row["route_end_reason"] == "idle"
        assert (row["route_title"], row["route_messages"]) == ("trip plans", 1)
        live = (row["live_id"], row["live_parent"], row["live_kind"], row["live_messages"])
        assert live == (child, old, "reset", 0)
    finally:
        await store.close()


# --- the private cluster ---------------------------------------------------------------------


@pytest.mark.slow
async def test_a_private_cluster_starts_when_no_server_answers(tmp_path: Path) -> None:
    silent = (
        f"host=127.0.0.1 port={pgserver.free_port()} user=postgres dbname=test connect_timeout=2"
    )
    dsn, cluster = await asyncio.to_thread(pgserver.find_server, [silent])
    assert cluster is not None and dsn != silent
    try:
        store = await open_store({"backend": "postgres", "dsn": dsn}, tmp_path)
        try:
            sid = await store.create_session(source="api", title="on a private cluster")
            await store.append_message(sid, "user", "durable hello")
            assert [h["session_id"] for h in await store.search_messages("durable")] == [sid]
        finally:
            await store.close()
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW fsync").fetchone() == ("on",)
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
    finally:
        await asyncio.to_thread(cluster.stop)
    assert not pgserver.answers(dsn)
    assert not cluster.dir.exists()


# --- the daemon on PostgreSQL -----------------------------------------------------------------


async def test_the_daemon_runs_turns_on_postgres(schema_dsn: str, tmp_path: Path) -> None:
    """`state.backend: postgres` end to end: the HTTP API, the router, resets, a title and
    a search, with the DSN coming from the variable `state.dsn_env` names."""
    import aiohttp

    from gateway.app import Gateway

    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "state:\n  backend: postgres\n  dsn_env: SB_E2E_DSN\nplatforms:\n  api:\n    port: 0\n"
    )
    gateway = Gateway(config=load_config(cfg, {"SB_E2E_DSN": schema_dsn}), home=tmp_path / "home")
    await gateway.start()
    try:
        assert gateway.db is not None and gateway.db.backend == "postgres"
        url = f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]
        async with aiohttp.ClientSession() as http:
            replies = []
            for text in (
                "hello postgres",
                "/title Deploy notes",
                "/new",
                "second 会话",
                "hello postgres",
            ):
                payload = {"chat_id": "42", "text": text, "message_id": f"m-{len(replies)}"}
                async with http.post(f"{url}/v1/messages", json=payload) as resp:
                    assert resp.status == 200
                    replies.append(await resp.json())
            async with http.post(
                f"{url}/v1/messages", json={"chat_id": "42", "text": "again", "message_id": "m-0"}
            ) as resp:
                duplicate = await resp.json()
        assert replies[0]["reply"] == "echo: hello postgres"
        assert duplicate["duplicate"] is True
        first, second = replies[0]["session_id"], replies[3]["session_id"]
        assert first != second and replies[3]["reply"] == "echo: second 会话"
        db = gateway.db
        assert (await db.require_session(first))["title"] == "Deploy notes"
        assert (await db.require_session(first))["end_reason"] is not None
        assert await db.newest_live_session_by_key() == {replies[3]["session_key"]: second}
        hits = await db.search_messages("会话")
        assert {h["session_id"] for h in hits} == {second}
        assert await db.has_platform_message("api", "42", "m-0") is True
        async with aiohttp.ClientSession() as http:  # the dashboard's API on the same store
            async with http.get(f"{url}/api/sessions?children=1") as resp:
                listed = {r["id"] for r in (await resp.json())["sessions"]}
            async with http.get(f"{url}/api/insights?days=1") as resp:
                figures = await resp.json()
        assert {first, second} <= listed
        assert figures["messages"] >= 6  # three turns: three messages and three replies
        # every delivery has its inbox row, closed: three turns and two commands answered
        assert await db.inbox_counts() == {"answered": 5}
        assert await db.open_inbound() == []
    finally:
        await gateway.stop()


@pytest.mark.slow
async def test_a_state_db_moves_to_postgres_by_export_and_import(
    schema_dsn: str, tmp_path: Path
) -> None:
    """A gateway's history moves from SQLite to PostgreSQL with `sessions export` on the
    old home and `sessions import` on the new one: every session comes over as it was
    (titles, lineage, tokens, keys; message ids are the new store's), a second import
    changes nothing, and the daemon on the new home continues each chat in its live
    session (adopted by its key) instead of starting another."""
    import aiohttp

    from gateway.app import Gateway

    async def say(config: Path, home: Path, env: dict[str, str], texts: list[str]) -> list[Any]:
        gateway = Gateway(config=load_config(config, env), home=home)
        await gateway.start()
        try:
            url = f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]
            out = []
            async with aiohttp.ClientSession() as http:
                for text in texts:
                    payload = {"chat_id": "7", "text": text}
                    async with http.post(f"{url}/v1/messages", json=payload) as resp:
                        assert resp.status == 200
                        out.append(await resp.json())
            return out
        finally:
            await gateway.stop()

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    (old / "config.yaml").write_text("platforms:\n  api:\n    port: 0\n")
    (new / "config.yaml").write_text(
        "state:\n  backend: postgres\n  dsn_env: SB_MOVE_DSN\nplatforms:\n  api:\n    port: 0\n"
    )
    before = await say(
        old / "config.yaml", old, {}, ["first", "/title moving day", "/branch", "on the branch"]
    )
    env = {**os.environ, "SB_MOVE_DSN": schema_dsn}

    def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(home), "sessions", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done

    def records(path: Path) -> dict[str, Any]:
        """Each exported session by id, its messages without their ids (each store numbers
        its own)."""
        out = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            rec["messages"] = [{k: v for k, v in m.items() if k != "id"} for m in rec["messages"]]
            out[rec["session"]["id"]] = rec
        return out

    cli(old, "export", str(tmp_path / "old.jsonl"))
    moved = records(tmp_path / "old.jsonl")
    messages = sum(len(r["messages"]) for r in moved.values())
    assert len(moved) == 2 and messages >= 4  # the chat's first session and its branch
    done = cli(new, "import", str(tmp_path / "old.jsonl"))
    assert f"imported 2 sessions, {messages} messages; 0 already present" in done.stderr
    again = cli(new, "import", str(tmp_path / "old.jsonl"))
    assert "imported 0 sessions, 0 messages; 2 already present" in again.stderr
    cli(new, "export", str(tmp_path / "new.jsonl"))
    assert records(tmp_path / "new.jsonl") == moved
    assert moved[before[0]["session_id"]]["session"]["title"] == "moving day"
    after = await say(new / "config.yaml", new, {"SB_MOVE_DSN": schema_dsn}, ["still here"])
    assert after[0]["reply"] == "echo: still here"
    assert after[0]["session_id"] == before[-1]["session_id"]  # the branch: the chat's live one


async def test_doctor_checks_a_postgres_home(schema_dsn: str, tmp_path: Path) -> None:
    from gateway.ops.doctor import run_doctor

    home = tmp_path / "home"
    home.mkdir()
    cfg = home / "config.yaml"
    cfg.write_text(
        "state:\n  backend: postgres\n  dsn_env: SB_DOC_DSN\ndashboard:\n  enabled: false\n"
    )
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, home)
    stray = await store.create_session(source="api", parent_session_id="20200101_000000_deadbeef")
    await store.close()
    checks = await run_doctor(
        home,
        load_config(cfg, {"SB_DOC_DSN": schema_dsn}),
        None,
        fix=True,
        full=False,
        check_platforms=False,
    )
    by_name = {c.name: c for c in checks}
    assert by_name["PostgreSQL"].ok and by_name["schema"].ok
    replication = by_name["PostgreSQL replication"]
    assert replication.ok and "round trip" in replication.detail
    assert "primary, no standbys" in replication.detail  # the test server streams to none
    assert by_name["lineage"].ok and "cleared 1" in by_name["lineage"].detail
    assert "state.db integrity" not in by_name and "WAL size" not in by_name
    assert not (home / "state.db").exists()
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, home)
    assert (await store.require_session(stray))["parent_session_id"] is None
    await store.close()
    dead = f"host=127.0.0.1 port={pgserver.free_port()} user=u password=hunter2 connect_timeout=2"
    checks = await run_doctor(
        home,
        load_config(cfg, {"SB_DOC_DSN": dead}),
        None,
        fix=False,
        full=False,
        check_platforms=False,
    )
    failed = [c for c in checks if not c.ok]
    assert [c.name for c in failed] == ["PostgreSQL"] and "hunter2" not in failed[0].detail


@pytest.mark.slow
async def test_switchboard_sessions_works_on_a_postgres_home(
    schema_dsn: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: postgres\n  dsn_env: SB_CLI_DSN\n")
    store = await open_store({"backend": "postgres", "dsn": schema_dsn}, home)
    sid = await store.create_session(source="telegram", title="Deploy notes")
    await store.append_message(sid, "user", "the blue-green deploy went fine")
    await store.close()
    env = {**os.environ, "SB_CLI_DSN": schema_dsn}

    def cli(*args: str, env: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "--home", str(home), "sessions", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [sid]
    found = cli("search", "blue-green")
    assert found.returncode == 0 and sid in found.stdout
    stats = cli("stats")
    assert stats.returncode == 0 and "postgres database" in stats.stdout
    renamed = cli("rename", sid, "Rollout notes")
    assert renamed.returncode == 0, renamed.stderr
    optimize = cli("optimize")
    assert optimize.returncode == 2 and "SQLite's" in optimize.stderr
    assert not (home / "state.db").exists()
    unset = cli("list", env={k: v for k, v in env.items() if k != "SB_CLI_DSN"})
    assert unset.returncode == 78 and "state.dsn_env" in unset.stderr


async def test_one_commits_begins_and_ends_update_their_rows_in_one_statement(
    schema_dsn: str,
) -> None:
    """A batch that begins one turn and ends another (inbox.turn_writes_many, one update for
    both kinds): the begun row started with its message and runner, the ended one answered
    with its reply in the outbox, neither touching the other's columns."""
    store = await PgStore.open(schema_dsn)
    try:
        sid = await store.create_session("s1", "telegram", chat_id="1")
        done, _s, _n = await store.accept_inbound("telegram", "1", "m1", {"text": "a"})
        await store.begin_turn(done, sid, {"role": "user", "content": "a"})
        nxt, _s, _n = await store.accept_inbound("telegram", "1", "m2", {"text": "b"})
        await store.finish_inbound(nxt, "received", "kept")  # a reason the begin must keep
        async with await psycopg.AsyncConnection.connect(schema_dsn) as conn:
            got = await pg_inbox.turn_writes_many(
                conn,
                [
                    (pg_inbox.BEGIN, (nxt, sid, {"role": "user", "content": "b"}, None)),
                    (
                        pg_inbox.END,
                        (done, sid, [{"role": "assistant", "content": "A"}], None, "ready"),
                    ),
                ],
                runners=[7, None],
            )
            await conn.commit()
        (begun_mid, history), ended = got
        assert [m["content"] for m in history] == ["a", "b"] and len(ended) == 1
        async with await psycopg.AsyncConnection.connect(schema_dsn) as conn:
            cur = await conn.execute(
                "SELECT id, state, session_id, message_id, runner, reason, reply_state, "
                "reply_message_id FROM inbox ORDER BY id"
            )
            rows = {r[0]: r[1:] for r in await cur.fetchall()}
        assert rows[nxt] == ("started", sid, begun_mid, 7, "kept", None, None)
        state, session, message, runner, reason, reply_state, reply_mid = rows[done]
        assert (state, session, reason, reply_state, reply_mid) == (
            "answered",
            sid,
            None,
            "ready",
            ended[0],
        )
        assert message is not None and runner is None
    finally:
        await store.close()
