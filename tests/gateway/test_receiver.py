"""gateway.shards.Receiver: one receiving connection among replicas, as shard 0 of a
one-shard ledger in a real PostgreSQL (two stores and control connections, as two replicas
would have), and without a ledger (one daemon). Claims are made by calling `sync`, as the
claim loop does every CLAIM_EVERY_S, so nothing here waits on a clock."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import psycopg
import pytest

from gateway.shards import PgShardLedger, Receiver
from state.pg.control import ControlLink, application_name
from state.pg.store import PgStore
from tests import pgserver


class Loop:
    """What the receiver starts and stops: a list of what happened, in order."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    async def begin(self) -> None:
        self.seen.append(f"{self.name} begins")

    async def end(self) -> None:
        self.seen.append(f"{self.name} ends")


Made = tuple[Receiver, ControlLink]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    dsn, cluster = pgserver.find_server(pgserver.server_candidates())
    try:
        yield dsn
    finally:
        if cluster is not None:
            cluster.stop()


@pytest.fixture
async def replica(server: str) -> AsyncIterator[Callable[[str, list[str]], Awaitable[Made]]]:
    """`await replica(name, seen)`: a started Receiver for "matrix" on a replica of its own
    (a store and an open control connection) on one fresh schema."""
    schema = pgserver.fresh_schema(server)
    dsn = pgserver.with_schema(server, schema)
    made: list[tuple[PgStore, ControlLink, Receiver]] = []

    async def make(name: str, seen: list[str]) -> Made:
        store = await PgStore.open(dsn)
        link = store.control_link(f"{name}-{schema}")  # unique on a shared server
        await link.open()
        loop = Loop(name, seen)
        receiver = Receiver("matrix", loop.begin, loop.end)
        receiver.use(PgShardLedger(store, link, "matrix"))
        made.append((store, link, receiver))
        await receiver.start()
        return receiver, link

    try:
        yield make
    finally:
        for store, link, receiver in made:
            await receiver.stop()
            await link.close()
            await store.close()
        pgserver.drop_schema(server, schema)


def _cut_off(server: str, link: ControlLink) -> None:
    """What a SIGKILL, or a partition the keepalives noticed, does to a replica's lock."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = %s", (application_name(link.name),))  # fmt: skip


async def test_one_replica_receives_and_a_gone_ones_connection_is_taken(server, replica) -> None:
    seen: list[str] = []
    a, a_link = await replica("a", seen)
    b, _ = await replica("b", seen)
    await b.sync()  # asking again changes nothing while the owner lives
    assert seen == ["a begins"]
    assert (a.health(), b.health()) == (
        {"receiving": True, "receiver_epoch": 1}, {"receiving": False, "receiver_epoch": None}
    )  # fmt: skip
    _cut_off(server, a_link)
    await b.sync()
    assert seen == ["a begins", "b begins"]
    assert b.health() == {"receiving": True, "receiver_epoch": 2}
    # the cut-off replica rejoins as a new incarnation: the epoch moved, its loop stops,
    # and it does not take the connection back from a live owner
    await a_link.close()
    await a_link.open()
    await a.sync()
    assert seen == ["a begins", "b begins", "a ends"]
    assert a.health() == {"receiving": False, "receiver_epoch": None}
    await a.sync()
    assert seen == ["a begins", "b begins", "a ends"]


async def test_a_stopped_owner_leaves_the_connection_to_the_next(server, replica) -> None:
    seen: list[str] = []
    a, a_link = await replica("a", seen)
    b, _ = await replica("b", seen)
    await a.stop()
    assert seen == ["a begins", "a ends"]
    await b.sync()  # the row still names a's incarnation, and its lock is held
    assert seen == ["a begins", "a ends"]
    await a_link.close()  # the daemon's stop ends its control connection
    await b.sync()
    assert seen == ["a begins", "a ends", "b begins"]


async def test_without_a_ledger_it_receives_from_start_to_stop() -> None:
    seen: list[str] = []
    loop = Loop("one", seen)
    receiver = Receiver("signal", loop.begin, loop.end)
    await receiver.start()
    assert receiver.health() == {"receiving": True}
    await receiver.stop()
    assert seen == ["one begins", "one ends"]
    assert receiver.health() == {"receiving": False}
