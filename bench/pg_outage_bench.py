"""The PostgreSQL server goes away under load: how the daemons answer while it is down, and
how soon they answer again once it is back.

    python bench/pg_outage_bench.py                          # 1 and 2 replicas, stop and crash
    python bench/pg_outage_bench.py --replicas 2 --fault crash --down 5

A private PostgreSQL cluster (tests/pgserver.py) serves N `switchboard run` replicas; 20
chats send 40 messages/s in all through the HTTP API with message ids, delivering again on
anything but a 200 (tests/cluster/outage.py). After 4 s the server is stopped
(`pg_ctl stop -m fast`) or its postmaster is SIGKILLed (crash recovery on the next start),
and started again after --down seconds. Printed per run: the answers while it was down
(status and how long the slowest took), the seconds from its return to the first 200, and
the end state (messages stored twice, missing, or answered other than once).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import pgserver  # noqa: E402
from tests.cluster import outage  # noqa: E402
from tests.cluster.harness import Cluster, Platforms  # noqa: E402


async def one(replicas: int, fault: str, down_s: float) -> str:
    server = pgserver.start_cluster()
    try:
        with tempfile.TemporaryDirectory(prefix="pg-outage-") as tmp:
            cluster = Cluster(Path(tmp), server.dsn, replicas, Platforms())
            try:
                await cluster.start()
                go_down = server.down if fault == "stop" else server.crash
                run = await outage.run(
                    cluster.urls,
                    lambda: asyncio.to_thread(go_down),
                    lambda: asyncio.to_thread(server.up),
                    down_s=down_s,
                )
                users, replies = outage.stored(cluster.dsn)
            finally:
                await cluster.close()
    finally:
        server.stop()
    during = run.during()
    slowest = max((a.took_s for a in during), default=0.0)
    back = run.first_answer_after_back()
    twice = sum(1 for n in users.values() if n > 1)
    acked = [m for m in run.messages if m.acked]
    missing = sum(1 for m in acked if users[m.text] == 0)
    not_once = sum(1 for m in acked if len(replies.get(m.text, [])) != 1)
    elsewhere = sum(1 for a in run.attempts() if a.code == "answered_elsewhere")
    apologies = sum(1 for m in acked if m.error)
    return (
        f"{replicas} replica(s), {fault}, down {down_s:.0f} s: {len(run.messages)} messages; "
        f"while down {len(during)} answers {dict(outage.Counter(f'{a.status}' for a in during))}, "
        f"slowest {slowest:.1f} s; first 200 {back if back is None else f'{back:.1f}'} s after "
        f"the server was back; stored twice {twice}, acknowledged but missing {missing}, "
        f"not answered once {not_once}, 409 answered_elsewhere {elsewhere}, "
        f"apologies {apologies}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--replicas", type=int, choices=(1, 2, 3), action="append")
    ap.add_argument("--fault", choices=("stop", "crash"), action="append")
    ap.add_argument("--down", type=float, default=5.0, help="seconds the server stays away")
    args = ap.parse_args()
    for replicas in args.replicas or [1, 2]:
        for fault in args.fault or ["stop", "crash"]:
            print(asyncio.run(one(replicas, fault, args.down)), flush=True)


if __name__ == "__main__":
    main()
