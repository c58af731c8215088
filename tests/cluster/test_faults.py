"""Named faults on three replicas behind the balancer, each under load and checked with
the run's promises (tests/cluster/checks.py):

- a replica stalls (SIGSTOP) while it holds chats, is cut off from the database as a
  partition would cut it, the others take its chats over, and it wakes (SIGCONT): its late
  commits must fail their fence, so nothing is answered twice or out of order;
- the leader is SIGKILLed in the middle of an idle-reset sweep: the next leader finishes
  it, and every key is reset exactly once (one ended session, one notice);
- 20 terminal handoffs requested at once are each claimed by exactly one replica;
- a replica dies with a Slack reply committed and not sent: the replica that takes the
  chat's key over sends it before the chat's next reply;
- a replica stalls there instead and wakes after the takeover: it sends nothing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from gateway.turns import RECHECK_AFTER_S
from state import open_store
from tests.cluster.checks import check_finished
from tests.cluster.conftest import StartCluster
from tests.cluster.harness import (
    Cluster,
    Replica,
    cut_off,
    leaders,
    live_sessions_per_key,
    replica_core_missing,
    until,
)
from tests.cluster.workload import Workload
from tests.fakes.slack import FakeSlack, event, signed
from tests.fakes.telegram import FakeTelegram

pytestmark = pytest.mark.skipif(
    replica_core_missing() is not None, reason=replica_core_missing() or ""
)


async def test_a_stalled_replica_cut_off_and_woken_answers_nothing_twice(
    start_cluster: StartCluster, telegram: FakeTelegram, slack: FakeSlack
) -> None:
    cluster, balancer = await start_cluster(3)
    work = Workload(
        balancer.url, keys=6, messages=10_000, telegram=telegram, slack=slack, deadline_s=60, seed=7
    )
    load = asyncio.create_task(work.run())
    try:
        for victim in (cluster.replicas[0], cluster.replicas[2]):
            await asyncio.sleep(2.0)
            victim.pause()  # mid-load: it holds some chats' leases, maybe mid-turn
            await asyncio.sleep(0.5)
            assert cut_off(cluster.dsn, victim.name) == 1
            await asyncio.sleep(3.0)  # the others take its chats over and answer them
            victim.resume()
        await asyncio.sleep(2.0)
    finally:
        work.finish()
        await load
    for r in cluster.replicas:  # a replica that gave up after waking is started again
        if not r.running:
            await r.start()
    problems = await check_finished(cluster, work)
    assert problems == [], "\n".join(problems)
    assert work.figures()["acknowledged"] == work.figures()["messages"] > 50


async def _leader(http: aiohttp.ClientSession, cluster: Cluster) -> Replica | None:
    found = await leaders(http, cluster.live())
    assert len(found) <= 1, f"two leaders: {[r.name for r in found]}"
    return found[0] if found else None


async def test_the_leader_killed_mid_sweep_leaves_every_key_reset_once(
    start_cluster: StartCluster,
) -> None:
    keys = 150
    cluster, balancer = await start_cluster(
        3, session_reset={"mode": "idle", "idle_minutes": 60, "sweep_seconds": 1, "notify": True}
    )
    async with aiohttp.ClientSession() as http:

        async def say(k: int, text: str) -> dict:
            for _ in range(50):
                async with http.post(
                    f"{balancer.url}/v1/messages",
                    json={"chat_id": f"idle{k}", "text": text},
                    headers={"Idempotency-Key": f"{text}-{k}"},
                ) as resp:
                    if resp.status == 200:
                        return await resp.json()
                await asyncio.sleep(0.2)
            raise AssertionError(f"idle{k}: {text} was never answered")

        first = await asyncio.gather(*(say(k, "before") for k in range(keys)))
        sessions = {r["session_key"]: r["session_id"] for r in first}
        await asyncio.sleep(1.5)  # activity written back
        leader = await _leader(http, cluster)  # the sweeper, to be killed
        assert leader is not None
        with cluster.connect() as conn:
            # two hours idle, as far as every replica can tell (routes and sessions)
            conn.execute("UPDATE sessions SET last_active = last_active - 7200")
            conn.execute("UPDATE session_routes SET updated_at = updated_at - 7200")

            def resets() -> int:
                row = conn.execute(
                    "SELECT count(*) FROM sessions WHERE end_reason = 'idle'"
                ).fetchone()
                return int(row[0]) if row else 0

            def unwritten() -> int:
                """Resets committed whose route was not written back yet (it still names
                the ended session): a kill now loses the route's write, notice included."""
                row = conn.execute(
                    "SELECT count(*) FROM session_routes r JOIN sessions s "
                    "ON s.id = r.session_id WHERE s.end_reason = 'idle'"
                ).fetchone()
                return int(row[0]) if row else 0

            # killed inside such a window when a poll catches one, else after a few resets
            await until(lambda: unwritten() > 0 or resets() >= 5, timeout=30, every=0.002)
            await leader.kill()
            done_then, caught = resets(), unwritten()
            assert done_then < keys, "the sweep ended before the leader could be killed"
            await leader.start()
            await until(lambda: resets() >= keys, timeout=60, every=0.1)
            await asyncio.sleep(2.5)  # more sweeps: none may reset anything again
            ended = Counter(
                str(r[0])
                for r in conn.execute("SELECT session_key FROM sessions WHERE end_reason = 'idle'")
            )
            live = live_sessions_per_key(cluster.dsn)
        assert set(ended) == set(sessions) and set(ended.values()) == {1}
        assert set(live.values()) <= {1}
        after = await asyncio.gather(*(say(k, "after") for k in range(keys)))
    assert all(r["session_id"] != sessions[r["session_key"]] for r in after)  # fresh sessions
    told = Counter(r["session_key"] for r in after for n in r["notices"] if "inactivity" in n)
    # told exactly once, by whichever replica took the message: also a key the killed leader
    # reset and died before writing its route back (the next lease derives the notice from
    # the reset's commit, gateway/topology/routes.py)
    twice = sorted(k for k in sessions if told[k] > 1)
    assert twice == [], f"{len(twice)} key(s) told more than once: {twice[:5]}"
    untold = sorted(k for k in sessions if told[k] == 0)
    assert untold == [], f"{len(untold)} key(s) reset but never told: {untold[:5]}"
    assert cluster.tracebacks() == []
    print(
        f"\nleader killed after {done_then} of {keys} idle resets ({caught} not written "
        "back); the next leader did the rest"
    )


async def test_twenty_handoffs_requested_at_once_are_each_claimed_once(
    start_cluster: StartCluster, telegram: FakeTelegram, tmp_path: Path
) -> None:
    telegram.forum_chats.add(-1009000)  # the replicas' home_channel: threads are topics
    cluster, _ = await start_cluster(3)
    store = await open_store({"backend": "postgres", "dsn": cluster.dsn}, tmp_path / "terminal")
    try:
        sids = []
        for n in range(20):
            sid = await store.create_session(source="cli", title=f"terminal work {n}")
            await store.append_message(sid, "user", f"notes {n}")
            sids.append(sid)
        asked = await asyncio.gather(*(store.request_handoff(sid, "telegram") for sid in sids))
        assert all(asked)

        async def states() -> Counter[str]:
            rows = [await store.require_session(s) for s in sids]
            return Counter(str(row.get("handoff_state")) for row in rows)

        for _ in range(600):
            if (await states())["completed"] == 20:
                break
            await asyncio.sleep(0.1)
        assert await states() == {"completed": 20}
        live = {s["id"]: s["session_key"] for s in await store.live_sessions_by_key()}
    finally:
        await store.close()
    topics = [p["name"] for p in telegram.sent("createForumTopic")]
    assert sorted(topics) == sorted(f"terminal work {n}" for n in range(20))  # one thread each
    confirmations = [m for m in telegram.sent() if str(m["text"]).startswith("Continuing here")]
    assert len(confirmations) == 20
    assert all(live.get(s, "").startswith("agent:main:telegram:") for s in sids)
    assert len({live[s] for s in sids}) == 20  # each bound to a thread of its own
    assert cluster.tracebacks() == []


def _slack_event(text: str, n: int) -> tuple[bytes, dict[str, str]]:
    ts = f"1600000000.{n:06d}"
    ev = {
        "type": "message",
        "channel": "D00001",
        "user": "U00001",
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": "im",
    }
    return signed(event(ev, event_id=f"EvOrder{n}"))


async def test_a_replica_stalled_between_its_replys_commit_and_send_withholds_it(
    start_cluster: StartCluster, slack: FakeSlack
) -> None:
    """r0 stalls (SIGSTOP, its own fault point) with a Slack reply committed and not sent,
    is cut off, and r1 takes the chat over: r1 sends r0's reply, then the next one. When
    r0 wakes, the lease it committed under is gone, so it sends nothing (sent then, the
    reply would reach the chat twice, and after the newer one)."""
    cluster, _ = await start_cluster(2, start=False)
    r0, r1 = cluster.replicas
    await r0.start(
        extra_env={"SWITCHBOARD_FAULT": "after_reply_commit", "SWITCHBOARD_FAULT_SIGNAL": "STOP"}
    )
    await r1.start()
    async with aiohttp.ClientSession() as http:
        body, headers = _slack_event("first", 1)
        async with http.post(f"{r0.url}/slack/events", data=body, headers=headers) as resp:
            assert resp.status == 200
        assert r0.proc is not None
        await until(lambda: _state(r0.proc) == "T", timeout=20)  # stopped after the commit
        r0.paused = True
        # a takeover needs the server to have seen r0 gone: after seconds of silence (the
        # control connection's keepalives), never within RECHECK_AFTER_S of the stall
        await asyncio.sleep(2 * RECHECK_AFTER_S)
        assert cut_off(cluster.dsn, r0.name) == 1
        body, headers = _slack_event("second", 2)
        async with http.post(f"{r1.url}/slack/events", data=body, headers=headers) as resp:
            assert resp.status == 200
        posts = await slack.wait_posted(2, timeout=20)
        r0.resume()
        await until(
            lambda: "was taken over during inbox row" in r0.log_text() or len(slack.posted()) > 2,
            timeout=20,
        )  # withheld, or sent late
    await asyncio.sleep(0.5)  # a late post would have reached the fake by now
    assert [p["text"] for p in slack.posted()] == ["echo: first", "echo: second"]
    assert [p["text"] for p in posts] == ["echo: first", "echo: second"]


def _state(proc: asyncio.subprocess.Process | None) -> str:
    """The process's state letter from /proc (R, S, T: stopped, ...)."""
    assert proc is not None
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


async def test_a_dead_runners_reply_goes_out_before_its_chats_next_one(
    start_cluster: StartCluster, slack: FakeSlack
) -> None:
    """r0 dies (its own fault point) with a Slack reply committed and not sent; the chat's
    next message reaches r1, which takes the key's lease over from the dead r0 and sends the
    orphaned reply before answering (the takeover scan, up to a second later, would have
    sent it after: replies crossing in the chat)."""
    cluster, _ = await start_cluster(2, start=False)
    r0, r1 = cluster.replicas
    await r0.start(extra_env={"SWITCHBOARD_FAULT": "after_reply_commit"})
    await r1.start()

    async with aiohttp.ClientSession() as http:
        body, headers = _slack_event("first", 1)
        async with http.post(f"{r0.url}/slack/events", data=body, headers=headers) as resp:
            assert resp.status == 200  # acknowledged after the inbox commit, before the turn
        assert r0.proc is not None
        assert await asyncio.wait_for(r0.proc.wait(), 30) == -9  # killed after the reply's commit
        assert slack.posted() == []
        body, headers = _slack_event("second", 2)
        async with http.post(f"{r1.url}/slack/events", data=body, headers=headers) as resp:
            assert resp.status == 200
        posts = await slack.wait_posted(2, timeout=20)
    assert [p["text"] for p in posts] == ["echo: first", "echo: second"]
    await r0.start()  # back without the fault, so the cluster stops cleanly
