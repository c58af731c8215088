"""gateway.shards.Receiver: one receiving connection among replicas, as shard 0 of a
one-shard ledger in a real PostgreSQL (two stores and control connections, as two replicas
would have), and without a ledger (one daemon). Claims are made by calling `sync`, as the
claim loop does every CLAIM_EVERY_S, so nothing here waits on a clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest

from gateway.adapters.email_imap import Place
from gateway.adapters.mattermost import MattermostAdapter
from gateway.adapters.qqbot import QQBotAdapter
from gateway.adapters.signal import CURSOR, SignalAdapter
from gateway.adapters.wecom import WeComAdapter
from gateway.errors import AdapterError
from gateway.messages import InboundMessage, OutboundMessage
from gateway.session_keys import SessionSource
from gateway.shards import PgShardLedger, Receiver
from gateway.vocab import ChatType
from gateway.wiring import StoreCursors
from state.pg.control import ControlLink, application_name
from state.pg.store import PgStore
from tests import pgserver
from tests.fakes import running, wait_for_count
from tests.fakes.imap import FakeImap
from tests.fakes.matrix import FakeMatrix
from tests.fakes.mattermost import DM, FakeMattermost
from tests.fakes.qqbot import ALICE as QQ_ALICE
from tests.fakes.qqbot import APP_ID as QQ_APP_ID
from tests.fakes.qqbot import FakeQQ
from tests.fakes.signal import ALICE as SIGNAL_ALICE
from tests.fakes.signal import BOT as SIGNAL_BOT
from tests.fakes.signal import FakeSignal, envelope
from tests.fakes.smtp import FakeSmtp
from tests.fakes.wecom import BOT_ID as WECOM_BOT
from tests.fakes.wecom import SECRET as WECOM_SECRET
from tests.fakes.wecom import FakeWeCom, text_message
from tests.gateway.test_email import US, mail, make_adapter
from tests.gateway.test_matrix import ALICE as MATRIX_ALICE
from tests.gateway.test_matrix import DM as MATRIX_DM
from tests.gateway.test_matrix import _adapter as matrix_adapter


class Loop:
    """What the receiver starts and stops: a list of what happened, in order."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen

    async def begin(self) -> None:
        self.seen.append(f"{self.name} begins")

    async def end(self) -> None:
        self.seen.append(f"{self.name} ends")


Made = tuple[Receiver, ControlLink]
Ledger = tuple[PgShardLedger, ControlLink]


class Pair:
    """Two adapters of one platform on the ledger, as two replicas would run them (their
    stores' cursors shared when `cursors`), started in order: what each emitted, by name."""

    def __init__(self, make: Callable[[], Any], platform: str, *, cursors: bool = True) -> None:
        self.make, self.platform, self.cursors = make, platform, cursors
        self.got: dict[str, list[str]] = {"a": [], "b": []}
        self.adapters: dict[str, Any] = {}
        self.links: dict[str, ControlLink] = {}
        self.stores: list[PgStore] = []

    async def start(self, ledger: Callable[[str, str], Awaitable[Ledger]]) -> tuple[Any, Any]:
        for name in ("a", "b"):
            adapter = self.adapters[name] = self.make()
            shards, self.links[name] = await ledger(name, self.platform)
            self.stores.append(shards.store)
            if self.cursors:
                adapter.use_cursors(StoreCursors(shards.store, self.platform))
            adapter.use_shards(shards)

            async def emit(msg: InboundMessage, name: str = name) -> None:
                self.got[name].append(msg.text)

            await adapter.start(emit)
        return self.adapters["a"], self.adapters["b"]

    async def stop(self) -> None:
        for adapter in self.adapters.values():
            await adapter.stop()


@pytest.fixture
def server(pg_server: str) -> str:
    return pg_server


@pytest.fixture
async def ledger(server: str) -> AsyncIterator[Callable[[str, str], Awaitable[Ledger]]]:
    """`await ledger(name, platform)`: a replica of its own (a store and an open control
    connection) on one fresh schema, and its ledger for `platform`."""
    schema = pgserver.fresh_schema(server)
    dsn = pgserver.with_schema(server, schema)
    made: list[tuple[PgStore, ControlLink]] = []

    async def make(name: str, platform: str) -> Ledger:
        store = await PgStore.open(dsn)
        link = store.control_link(f"{name}-{schema}")  # unique on a shared server
        made.append((store, link))
        await link.open()
        return PgShardLedger(store, link, platform), link

    try:
        yield make
    finally:
        for store, link in made:
            await link.close()
            await store.close()
        pgserver.drop_schema(server, schema)


@pytest.fixture
async def replica(
    ledger: Callable[[str, str], Awaitable[Ledger]],
) -> AsyncIterator[Callable[[str, list[str]], Awaitable[Made]]]:
    """`await replica(name, seen)`: a started Receiver for "matrix" on a replica of its own."""
    made: list[Receiver] = []

    async def make(name: str, seen: list[str]) -> Made:
        shards, link = await ledger(name, "matrix")
        loop = Loop(name, seen)
        receiver = Receiver("matrix", loop.begin, loop.end)
        receiver.use(shards)
        made.append(receiver)
        await receiver.start()
        return receiver, link

    try:
        yield make
    finally:
        for receiver in made:
            await receiver.stop()


async def _until_stored(
    cursors: StoreCursors, name: str, wanted: Callable[[str | None], bool]
) -> None:
    """Until an adapter's cursor in the shared store is as `wanted`."""
    async with asyncio.timeout(10):
        while not wanted(await cursors.get(name)):  # noqa: ASYNC110 (in the database)
            await asyncio.sleep(0.02)


def _cut_off(server: str, link: ControlLink) -> None:
    """What a SIGKILL, or a partition the keepalives noticed, does to a replica's lock."""
    with psycopg.connect(server, autocommit=True) as conn:
        # the timeout waits until the backend is gone (and its lock with it)
        conn.execute(
            "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application_name(link.name),),
        )


async def test_one_replica_receives_and_a_gone_ones_connection_is_taken(server, replica) -> None:
    seen: list[str] = []
    a, a_link = await replica("a", seen)
    b, _ = await replica("b", seen)
    await b.sync()  # asking again changes nothing while the owner lives
    assert seen == ["a begins"]
    assert (a.health(), b.health()) == (
        {"receiving": True, "receiver_epoch": 1},
        {"receiving": False, "receiver_epoch": None},
    )
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


@pytest.fixture
async def mattermost() -> AsyncIterator[FakeMattermost]:
    async with running(FakeMattermost()) as fake:
        yield fake


async def test_a_mattermost_replica_that_does_not_receive_still_sends_and_types(
    server, ledger, mattermost: FakeMattermost
) -> None:
    """Two adapters on the fake, as two replicas: one websocket; the other adapter posts,
    and shows typing through REST; it opens the websocket once the first is cut off, and
    the first, rejoined, closes its own."""
    pair = Pair(
        lambda: MattermostAdapter(mattermost.token, mattermost.url), "mattermost", cursors=False
    )
    got, links = pair.got, pair.links
    try:
        a, b = await pair.start(ledger)
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        assert mattermost.sockets() == 1
        await mattermost.say("hello", DM)
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        await b.send(OutboundMessage("mattermost", DM, "from b"))
        b.turn_started(InboundMessage(SessionSource("mattermost", DM, ChatType.DM), "x", "m1"))
        [typing] = await wait_for_count(
            lambda: [x for x in mattermost.actions if x["action"] == "rest_typing"], 1, 10, "typing"
        )
        assert typing["data"]["channel_id"] == DM
        assert [p["message"] for p in mattermost.bot_posts()] == ["from b"]
        assert got == {"a": ["hello"], "b": []}

        _cut_off(server, links["a"])
        await b._receiver.sync()
        assert b.health()["receiving"] is True
        await wait_for_count(lambda: list(range(mattermost.sockets())), 2, 10, "websockets")
        await links["a"].close()
        await links["a"].open()
        await a._receiver.sync()
        assert a.health()["receiving"] is False
        await wait_for_count(lambda: [] if mattermost.sockets() > 1 else [1], 1, 10, "one socket")
        await mattermost.say("again", DM)
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        assert got == {"a": ["hello"], "b": ["again"]}
    finally:
        await pair.stop()


async def test_a_wecom_replica_holds_the_bots_one_connection_and_only_it_sends(
    server, ledger
) -> None:
    """WeCom keeps one connection per bot and every send goes over it: one replica holds
    it; the other opens none (it would take the connection over) and cannot send; after a
    takeover the new holder receives and sends, and the old one, rejoined, stays off."""
    from gateway.adapters.base import Backoff

    fast = Backoff(initial_s=0.05, max_s=0.2)
    async with running(FakeWeCom()) as fake:
        pair = Pair(
            lambda: WeComAdapter(WECOM_BOT, WECOM_SECRET, url=fake.url, backoff=fast),
            "wecom",
            cursors=False,
        )
        got, links = pair.got, pair.links
        try:
            a, b = await pair.start(ledger)
            await fake.wait_connected(1)
            assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
            assert len(fake.sockets) == 1
            await fake.push(text_message("hello", msg_id="r1"))
            await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
            await a.send(OutboundMessage("wecom", "alice", "from a"))
            with pytest.raises(AdapterError, match="another replica holds"):
                await b.send(OutboundMessage("wecom", "alice", "from b"))

            _cut_off(server, links["a"])
            await b._receiver.sync()
            assert b.health()["receiving"] is True
            await fake.wait_connected(2)  # WeCom closed a's connection for b's
            await links["a"].close()
            await links["a"].open()
            await a._receiver.sync()
            assert a.health()["receiving"] is False and len(fake.subscribed) == 2
            await fake.push(text_message("again", msg_id="r2"))
            await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
            await b.send(OutboundMessage("wecom", "alice", "from b"))
            assert got == {"a": ["hello"], "b": ["again"]}
            assert [t for _, _, t in fake.sent()] == ["from a", "from b"]
        finally:
            await pair.stop()


@pytest.fixture
async def signal() -> AsyncIterator[FakeSignal]:
    async with running(FakeSignal()) as fake:
        yield fake


async def test_a_signal_replica_taking_over_listens_from_the_event_id_the_last_one_stored(
    server, ledger, signal: FakeSignal
) -> None:
    """The event id is a cursor in the shared store: a message that arrived while nobody
    listened is replayed to the new listener, and the one already taken is not."""
    pair = Pair(lambda: SignalAdapter(signal.url, SIGNAL_BOT), "signal")
    got, links, stores = pair.got, pair.links, pair.stores
    try:
        a, b = await pair.start(ledger)
        await signal.wait_connected(1)
        assert signal.last_event_ids == [None]  # one stream between the two
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        await signal.push(envelope("one"))
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        second = await signal.push(envelope("two"))
        cursors = StoreCursors(stores[0], "signal")
        await _until_stored(cursors, CURSOR, lambda v: v == second)  # once the gateway took it
        assert got["a"] == ["one", "two"]
        # a stops listening (as a SIGKILL would: its lock goes with its connection)
        await a.stop()
        await links["a"].close()
        await signal.push(envelope("in the gap"))
        await b._receiver.sync()
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        assert signal.last_event_ids == [None, second]
        assert got == {"a": ["one", "two"], "b": ["in the gap"]}
        await b.send(OutboundMessage("signal", SIGNAL_ALICE, "answer"))
        assert [m["message"] for m in signal.delivered()] == ["answer"]
    finally:
        await pair.stop()


@pytest.fixture
async def mailboxes() -> AsyncIterator[tuple[FakeImap, FakeSmtp]]:
    async with running(FakeImap(user=US)) as imap, running(FakeSmtp(user=US)) as smtp:
        yield imap, smtp


async def test_an_email_replica_taking_over_watches_from_the_uid_the_last_one_stored(
    server, ledger, mailboxes: tuple[FakeImap, FakeSmtp]
) -> None:
    """One IMAP login between two replicas; the next watcher starts after the last UID the
    first handled (kept in the shared store), so a mail that came while nobody watched is
    handed over and none twice."""
    imap, smtp = mailboxes
    pair = Pair(lambda: make_adapter(imap, smtp), "email")
    got, links, stores = pair.got, pair.links, pair.stores
    try:
        a, b = await pair.start(ledger)
        assert [user for user, _ok in imap.logins] == [US]  # b did not log in
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        uid = imap.deliver(mail("one"))
        await wait_for_count(lambda: got["a"], 1, 10, "mails on a")
        cursors = StoreCursors(stores[0], "email")
        await _until_stored(  # the place moves once the gateway took the mail
            cursors, a.watcher.cursor_name, lambda v: getattr(Place.loads(v), "uid", 0) == uid
        )
        await a.stop()
        await links["a"].close()
        imap.deliver(mail("in the gap"))
        await b._receiver.sync()
        await wait_for_count(lambda: got["b"], 1, 10, "mails on b")
        imap.deliver(mail("after"))
        await wait_for_count(lambda: got["b"], 2, 10, "mails on b")
        assert got == {"a": ["one"], "b": ["in the gap", "after"]}
        assert len(imap.logins) == 2
    finally:
        await pair.stop()


@pytest.fixture
async def matrix() -> AsyncIterator[FakeMatrix]:
    fake = FakeMatrix()
    await fake.start()
    fake.add_room(MATRIX_DM, {MATRIX_ALICE: "Alice"})
    fake.set_direct({MATRIX_ALICE: [MATRIX_DM]})
    try:
        yield fake
    finally:
        await fake.stop()


async def test_a_matrix_replica_taking_over_syncs_from_the_token_the_last_one_stored(
    server, ledger, matrix: FakeMatrix
) -> None:
    """Only the receiver syncs (the other's `since` stays unset); the next one goes on from
    the stored token: the message sent while nobody synced is emitted, the first is not
    emitted again."""
    pair = Pair(lambda: matrix_adapter(matrix), "matrix")
    got, links = pair.got, pair.links
    try:
        a, b = await pair.start(ledger)
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        await wait_for_count(lambda: [1] if a.health()["since"] else [], 1, 10, "a first sync")
        before = a.health()["since"]
        matrix.message(MATRIX_DM, MATRIX_ALICE, "one")
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        # `since` moves here once the batch's token is stored
        await wait_for_count(lambda: [1] if a.health()["since"] != before else [], 1, 10, "a token")
        await a.stop()
        await links["a"].close()
        matrix.message(MATRIX_DM, MATRIX_ALICE, "in the gap")
        await b._receiver.sync()
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        matrix.message(MATRIX_DM, MATRIX_ALICE, "after")
        await wait_for_count(lambda: got["b"], 2, 10, "messages on b")
        assert got == {"a": ["one"], "b": ["in the gap", "after"]}
    finally:
        await pair.stop()


@pytest.fixture
async def qq() -> AsyncIterator[FakeQQ]:
    async with running(FakeQQ()) as fake:
        yield fake


async def test_a_qqbot_replica_taking_over_resumes_the_session_the_last_one_stored(
    server, ledger, qq: FakeQQ
) -> None:
    """One gateway connection between two replicas; the next receiver resumes the session
    from the id and sequence number in the shared store, so QQ replays the message that
    came while nobody was connected, and not the one already taken."""
    pair = Pair(
        lambda: QQBotAdapter(QQ_APP_ID, qq.secret, api_base=qq.api_url, token_base=qq.token_url),
        "qqbot",
    )
    got, links = pair.got, pair.links
    try:
        a, b = await pair.start(ledger)
        await qq.wait_ready(1)
        assert len(qq.sockets) == 1  # b did not connect
        assert (a.health()["receiving"], b.health()["receiving"]) == (True, False)
        await qq.c2c("one")
        await wait_for_count(lambda: got["a"], 1, 10, "messages on a")
        await a.stop()
        await links["a"].close()
        gap = await qq.c2c("in the gap")
        await b._receiver.sync()
        await wait_for_count(lambda: got["b"], 1, 10, "messages on b")
        assert len(qq.identifies) == 1 and qq.resumes[-1]["session_id"] == "session-1"
        await qq.c2c("after")
        await wait_for_count(lambda: got["b"], 2, 10, "messages on b")
        assert got == {"a": ["one"], "b": ["in the gap", "after"]}
        await b.send(OutboundMessage("qqbot", QQ_ALICE, "answer", reply_to=gap))
        assert [(m["text"], m["msg_id"]) for m in qq.sent()] == [("answer", gap)]
    finally:
        await pair.stop()
