"""The PostgreSQL server goes away under load and comes back: stopped cleanly
(`pg_ctl stop -m fast`) or killed (SIGKILL, crash recovery on the next start), with one
daemon and with two replicas on a private server these tests own.

While it is away every daemon stays up and answers at once: 503 `storage_unavailable` with
`Retry-After` (never a 500, never a request held until the server returns; a Telegram
webhook delivery is refused the same way, so Telegram delivers it again). Once it is back
they answer again within seconds. At the end every acknowledged message is stored once with
one reply, each chat in the order it was sent, every redelivery of an answered id gets that
reply, and no lease is left held."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests import pgserver
from tests.cluster import outage
from tests.cluster.harness import TELEGRAM_SECRET, Cluster, Platforms, held_leases
from tests.fakes import running
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.slow


@pytest.fixture
def private_server() -> Iterator[pgserver.Cluster]:
    """A PostgreSQL server of this test's own: it is stopped and killed here."""
    server = pgserver.start_cluster()
    try:
        yield server
    finally:
        server.stop()


async def _webhook(
    http: aiohttp.ClientSession, url: str, update: dict[str, object]
) -> tuple[int, str | None, float]:
    began = time.monotonic()
    async with http.post(
        f"{url}/telegram/webhook",
        json=update,
        headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
    ) as resp:
        return resp.status, resp.headers.get("Retry-After"), time.monotonic() - began


@pytest.mark.parametrize(
    ("replicas", "fault"), [(1, "stop"), (1, "crash"), (2, "stop"), (2, "crash")]
)
async def test_the_database_going_away_costs_a_retry_and_nothing_else(
    private_server: pgserver.Cluster, tmp_path: Path, replicas: int, fault: str
) -> None:
    async with running(FakeTelegram()) as telegram:
        platforms = Platforms(telegram.base_url, None)
        cluster = Cluster(tmp_path, private_server.dsn, replicas, platforms)
        webhook: list[tuple[int, str | None, float]] = []
        try:
            await cluster.start()
            update = {
                "update_id": 9001,
                "message": telegram.message(
                    "while the database is away", telegram.dm_chat(41), user_id=41
                ),
            }
            go_down = private_server.down if fault == "stop" else private_server.crash

            async def fault_and_webhook() -> None:
                await asyncio.to_thread(go_down)
                async with aiohttp.ClientSession() as http:  # a platform's delivery meanwhile
                    webhook.append(await _webhook(http, cluster.urls[-1], update))

            run = await outage.run(
                cluster.urls,
                fault_and_webhook,
                lambda: asyncio.to_thread(private_server.up),
                before_s=2.0,
                down_s=4.0,
                after_s=4.0,
            )
            async with aiohttp.ClientSession() as http:
                # Telegram delivers the refused update again until it is taken: answered once
                for _ in range(100):
                    status, _, _ = await _webhook(http, cluster.urls[0], update)
                    if status == 200:
                        break
                    await asyncio.sleep(0.2)
                await _webhook(http, cluster.urls[-1], update)  # and once more, as it may
                replies = await telegram.wait_sent(1, timeout=20)
                # every answered id asked again: the same reply, from any replica
                again = {}
                for n, msg in enumerate(m for m in run.messages if m.acked):
                    async with http.post(
                        f"{cluster.urls[n % replicas]}/v1/messages",
                        json={"chat_id": msg.chat, "text": msg.text, "message_id": msg.mid},
                    ) as resp:
                        again[msg.mid] = (resp.status, (await resp.json()).get("reply"))
            await asyncio.sleep(1.0)
            users, stored_replies = outage.stored(cluster.dsn)
            leases = held_leases(cluster.dsn)
        finally:
            codes = await cluster.close()
    assert all(code == 0 for code in codes.values()), codes  # every daemon stayed up and drained
    assert cluster.tracebacks() == []

    # while the server was away: answered at once, "deliver again", never a 500
    during = run.during()
    assert during, "no message was sent while the server was away"
    assert {a.status for a in during} <= {200, 503, 409}
    refused = [a for a in during if a.status == 503]
    assert refused and all(a.code == "storage_unavailable" and a.retry_after for a in refused)
    assert max(a.took_s for a in during) < 2.5
    assert all(a.status != 500 for a in run.attempts())
    assert webhook and webhook[0][0] == 503 and webhook[0][1] and webhook[0][2] < 2.5
    # and back within seconds of its return
    back = run.first_answer_after_back()
    assert back is not None and back < 10.0

    acked = [m for m in run.messages if m.acked]
    assert len(acked) >= 20
    assert not any(a.code == "answered_elsewhere" for a in run.attempts())
    assert [m.mid for m in acked if m.error] == []  # no apology in place of a reply
    assert [m.mid for m in acked if m.reply != f"echo: {m.text}"] == []
    assert [m.mid for m in acked if users[m.text] != 1] == []  # stored once
    assert [m.mid for m in acked if stored_replies[m.text] != [f"echo: {m.text}"]] == []
    assert [
        mid
        for mid, (status, reply) in again.items()
        if status != 200 or reply is None or not reply.startswith("echo: ")
    ] == []
    for chat in {m.chat for m in acked}:  # each chat's messages stored in the order sent
        sent = [m.text for m in run.messages if m.chat == chat and users[m.text]]
        assert sent == sorted(sent, key=lambda t: int(t.split()[1]))
    assert [r["text"] for r in replies] == ["echo: while the database is away"]
    assert len(telegram.sent()) == 1
    assert leases == []
