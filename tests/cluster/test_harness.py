"""The cluster harness on one replica, which PostgreSQL supports today: the balancer, the
redelivering senders, the workload and every check, through SIGKILLs of the only replica
(the balancer answers 502 while it is down; the senders deliver again). It is also the
baseline the multi-replica runs are compared with."""

from __future__ import annotations

import os

import aiohttp

from tests.cluster.balancer import Balancer
from tests.cluster.chaos import Chaos, under_chaos
from tests.cluster.checks import check_finished
from tests.cluster.conftest import StartCluster
from tests.cluster.workload import Workload
from tests.daemon import free_port
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

SEED = int(os.environ.get("SWITCHBOARD_CRASH_SEED", "20261201"))


async def test_the_balancer_skips_a_refusing_backend_and_reports_a_cut_request() -> None:
    from aiohttp import web

    hits: list[str] = []

    async def ok(request: web.Request) -> web.Response:
        hits.append(request.path_qs)
        return web.json_response({"got": (await request.read()).decode()}, headers={"X-Mine": "1"})

    app = web.Application()
    app.router.add_post("/{tail:.*}", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    live = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused
    backends = [dead, live]
    balancer = Balancer(lambda: backends)
    await balancer.start()
    try:
        async with aiohttp.ClientSession() as http:
            for n in range(4):
                async with http.post(f"{balancer.url}/x?n={n}", data=b"body") as resp:
                    assert resp.status == 200 and resp.headers["X-Mine"] == "1"
                    assert await resp.json() == {"got": "body"}
            backends.clear()
            async with http.post(f"{balancer.url}/x") as resp:
                assert resp.status == 502
    finally:
        await balancer.stop()
        await runner.cleanup()
    assert hits == [f"/x?n={n}" for n in range(4)]  # each forwarded once, none lost
    assert balancer.sent == {live: 4} and balancer.failed == 1


async def test_one_replica_on_postgres_loses_nothing_through_kills(
    start_cluster: StartCluster, telegram: FakeTelegram, slack: FakeSlack
) -> None:
    cluster, balancer = await start_cluster(1)
    work = Workload(
        balancer.url, keys=6, messages=200, telegram=telegram, slack=slack, deadline_s=90, seed=SEED
    )
    chaos = Chaos(cluster, kills=4, seed=SEED, interval_s=(0.8, 2.0))
    await under_chaos(work, chaos)
    problems = await check_finished(cluster, work)
    assert problems == [], "\n".join(problems)
    figures = work.figures()
    print(f"\ncluster harness, 1 replica: {chaos.done} kills, {figures}")
    # the load ran throughout (a shared 2-core machine may run it slowly: no rate asserted)
    assert chaos.done == 4 and figures["acknowledged"] == figures["messages"] >= 20
    assert figures["not_2xx"] > 0  # the kills really cut deliveries, which came again
