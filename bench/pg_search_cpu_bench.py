"""Where a PostgreSQL search's CPU goes: the client's and the server's apart, per query kind,
on bench/hermes_search_bench.py's corpus and queries. Prints figures; asserts nothing.

  python bench/pg_search_cpu_bench.py [--messages 15000] [--queries 40] [--passes 20]
                                      [--rounds 2] [--dsn DSN] [--against DIR]

The corpus goes into a fresh database on the server `--dsn` names, through the store's own
append call, then `VACUUM ANALYZE messages` (what autovacuum does to a table after that many
inserts). Each round runs two programs, alternated, each on a store of its own with one
reader connection: `kept`, the store as it is (the read pool keeps `plan_cache_mode` per
statement: a search of whole indexes runs on PostgreSQL's generic plan from its first run),
and `server's choice`, the same store with the read pool's plan mode left to the server's
setting (`auto`: PostgreSQL picks a prepared statement's generic or custom plans from the
costs of its first five runs). Each kind runs in a program of its own, so the first runs of
its statements' shapes (two-word queries share one) are its own queries, as on a connection
whose first searches were of that kind. `--against DIR` adds a third program, `against`: the
store of another checkout (a `git worktree` of an earlier commit, say) on the same database,
alternated with the two, to compare two builds. Each program's queries run twice to warm the
caches, then `--passes` times measured: the client's CPU (time.process_time) and the
server's (the backends' utime + stime from /proc, read over the kind's passes), per search,
the mean over the measured searches; the figure is the median over rounds, the rounds' range
in brackets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.hermes_search_bench import BUILD_PG, KINDS, corpus  # noqa: E402
from tests.cluster.harness import drop_database, fresh_database  # noqa: E402

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
PROGRAMS = {"kept": "kept", "server's choice": "server"}

QUERIES = """
import json, sys, time
from pathlib import Path
import uvloop
from bench.loops import backend_pids, cpu_s
from state.pg import db
from state.pg.store import PgStore

dsn, data, passes, mode, kind = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if mode == "server":  # the read pool's plan mode left to the server's setting
    async def configure(conn):
        db.binary_lists(conn)
        db.go_direct(conn)
    db.configure = configure

def server_cpu(pids):  # a backend of the program before may still be closing when listed
    return sum(cpu_s(pid) for pid in pids)

async def main():
    store = await PgStore.open(dsn, readers=1)
    pids = backend_pids(dsn)
    queries = data["queries"][kind]
    for _ in range(2):
        for q in queries:
            await store.search_messages(q, limit=20)
    server, client = server_cpu(pids), time.process_time()
    for _ in range(passes):
        for q in queries:
            await store.search_messages(q, limit=20)
    n = passes * len(queries)
    await store.close()
    print(json.dumps(((time.process_time() - client) / n, (server_cpu(pids) - server) / n)))

uvloop.run(main())
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=15_000)
    ap.add_argument("--queries", type=int, default=40, help="per kind")
    ap.add_argument("--passes", type=int, default=20, help="measured passes over each kind")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dsn", default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN))
    ap.add_argument(
        "--against",
        metavar="DIR",
        type=Path,
        help="another checkout whose store runs as a third program, `against`",
    )
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    programs = {name: (mode, ROOT) for name, mode in PROGRAMS.items()}
    if args.against is not None:
        programs["against"] = ("kept", args.against.resolve())
    name, dsn = fresh_database(args.dsn)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "corpus.json"
            data.write_text(json.dumps(corpus(args.messages, args.queries)))
            subprocess.run([sys.executable, "-c", BUILD_PG, dsn, str(data)], env=env, check=True)
            got: dict[tuple[str, str], list[list[float]]] = {
                (p, k): [] for p in programs for k in KINDS
            }
            for _ in range(args.rounds):
                for kind in KINDS:
                    for program, (mode, tree) in programs.items():
                        argv = [QUERIES, dsn, str(data), str(args.passes), mode, kind]
                        proc = subprocess.run(
                            [sys.executable, "-c", *argv],
                            env={**env, "PYTHONPATH": str(tree)},
                            cwd=tree,
                            capture_output=True,
                            text=True,
                            check=True,
                        )
                        got[program, kind].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        drop_database(args.dsn, name)
    print(
        f"PostgreSQL search CPU per query, ms: {args.messages:,} messages, {args.queries} "
        f"queries per kind, {args.passes} measured passes, median of {args.rounds} rounds "
        "(range); client + server"
    )
    print(f"{'query kind':<18}" + "".join(f"{p:>44}" for p in programs))
    for kind in KINDS:
        cells = []
        for program in programs:
            client = [1e3 * r[0] for r in got[program, kind]]
            server = [1e3 * r[1] for r in got[program, kind]]
            cells.append(
                f"{statistics.median(client):.3f} ({min(client):.3f}-{max(client):.3f}) + "
                f"{statistics.median(server):.3f} ({min(server):.3f}-{max(server):.3f})"
            )
        print(f"{kind:<18}" + "".join(f"{c:>44}" for c in cells))


if __name__ == "__main__":
    main()
