"""Search beside Hermes Agent 0.19.0's store on the same corpus and queries. Prints figures;
asserts nothing.

  python bench/hermes_search_bench.py [--messages 15000] [--queries 40] [--rounds 3]
                                      [--dsn DSN | --no-postgres]
  python bench/hermes_search_bench.py --callgrind   # instructions per query instead

Both stores get the same messages (English-like chat text on a dense vocabulary, 5% CJK, in
sessions of 50) through their own append call, each in a fresh file in its own subprocess
(Hermes from the registry, installed into the test cache by tests/hermes_pkg.py). Then the
same queries of each kind run through `search_messages(query, limit=20)`: Hermes's own, and
switchboard's through its Hermes-compatible facade (the same call and answer shape, with
the neighbouring messages), through the native store the gateway uses, and through the
PostgreSQL store on a fresh database of the server `--dsn` names (its own append call, then
`VACUUM ANALYZE messages`, which autovacuum, on by default, does to a table after that many
inserts: the planner's statistics and visibility map a user's server has; the server's CPU
for each query is added to the client's, read from the backend's /proc entry, so the
figure is the whole work of a query on this machine). Each kind's queries run
twice to warm the caches, with a pause of 0.2 s (2 s under callgrind) between the two passes (in which the native
store's read of the side index's words, started by the first search on its own thread,
finishes: without it some warm-up searches are planned without the words and the measured
ones with them, their statements' text built again), then once measured as CPU time (time.process_time: the
store's work in this process, which other work on the machine disturbs less than it does a
wall clock); a kind's figure is the median per query, then the median over rounds. On a
table this size the PostgreSQL store keeps a term's document count for 30 s and adds the
rows written since (state/pg/slices.py), so a measured query finds the counts its warm-up
left, as a search does soon after another with the same words. The rounds alternate the programs, since this machine's speed
drifts from one minute to the next.

`--callgrind` counts instructions instead of time: Hermes's store and the native store each
run their queries under `valgrind --tool=callgrind`, the counters zeroed before each
measured query and dumped after it (callgrind_control), and a kind's figure is the median
over its queries. The machine's load does not move it, so it compares two builds exactly;
what it leaves out is the kernel's share (page reads, locks) and how fast the processor
runs each side's instructions. The native store's budget for a search on the event loop's
thread (state/sqlite/readers.py) is lifted for it (a thousandfold), as valgrind runs a
program 50 to 100 times slower: with the budget as it is a search would outlast it under
valgrind and run again on a reader thread, counted twice.

Query kinds: two common words (a dense vocabulary: thousands of rows match each word), two
rarer words, a two-word phrase, a three-character CJK run (Hermes's trigram index path), a
two-character CJK run (its LIKE fallback).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import COMMON, TextGen  # noqa: E402
from bench.instructions import total_ir  # noqa: E402
from state.textindex import is_cjk  # noqa: E402
from tests.cluster.harness import drop_database, fresh_database  # noqa: E402
from tests.hermes_pkg import installed  # noqa: E402

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"

KINDS = ("two common words", "two words", "phrase", "cjk 3-char", "cjk 2-char")

BUILD = """
import json, sys
from pathlib import Path
from {module} import SessionDB
path, corpus = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
db = SessionDB(path)
for i, text in enumerate(corpus["texts"]):
    sid = f"s{{i // 50}}"
    if i % 50 == 0:
        db.create_session(sid, "cli")
    db.append_message(sid, "user" if i % 2 == 0 else "assistant", text)
db.close()
"""

QUERY_COMPAT = """
import json, statistics, sys, time
from pathlib import Path
from {module} import SessionDB
path, corpus = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
db = SessionDB(path)
out, hits = {{}}, {{}}
for kind, queries in corpus["queries"].items():
    for warm in range(2):  # the warm-up twice, a pause between (see the docstring)
        for q in queries:
            db.search_messages(q, limit=20)
        time.sleep(0.2 * (1 - warm))
    times, found = [], 0
    for q in queries:
        t = time.process_time()
        found += len(db.search_messages(q, limit=20))
        times.append(time.process_time() - t)
    out[kind] = statistics.median(times)
    hits[kind] = found / len(queries)
db.close()
print(json.dumps({{"times": out, "hits": hits}}))
"""

QUERY_NATIVE = """
import asyncio, json, statistics, sys, time
from pathlib import Path
from state import SessionDB

async def main():
    path, corpus = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    db = await SessionDB.open(path)
    out, hits = {}, {}
    for kind, queries in corpus["queries"].items():
        for warm in range(2):  # the warm-up twice, a pause between (see the docstring)
            for q in queries:
                await db.search_messages(q, limit=20)
            await asyncio.sleep(0.2 * (1 - warm))
        times, found = [], 0
        for q in queries:
            t = time.process_time()
            found += len(await db.search_messages(q, limit=20))
            times.append(time.process_time() - t)
        out[kind] = statistics.median(times)
        hits[kind] = found / len(queries)
    await db.close()
    print(json.dumps({"times": out, "hits": hits}))

asyncio.run(main())
"""


BUILD_PG = """
import asyncio, json, sys
from pathlib import Path
import psycopg
from state.pg.store import PgStore

async def main():
    dsn, corpus = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    db = await PgStore.open(dsn)
    for i, text in enumerate(corpus["texts"]):
        sid = f"s{i // 50}"
        if i % 50 == 0:
            await db.create_session(sid, "cli")
        await db.append_message(sid, "user" if i % 2 == 0 else "assistant", text)
    await db.close()
    # what autovacuum (on by default) does to a table after this many inserts
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE messages")

asyncio.run(main())
"""

QUERY_PG = """
import asyncio, json, os, statistics, sys, time
from pathlib import Path
from state.pg.store import PgStore

TICK = os.sysconf("SC_CLK_TCK")

def backends(dsn):
    import psycopg
    with psycopg.connect(dsn) as conn:
        me = conn.info.backend_pid
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s",
            (me,),
        ).fetchall()
    return [r[0] for r in rows]

def server_cpu(pids):
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read().rpartition(")")[2].split()
            total += (int(f[11]) + int(f[12])) / TICK
        except OSError:
            pass
    return total

async def main():
    dsn, corpus = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    db = await PgStore.open(dsn)
    pids = backends(dsn)
    out, hits = {}, {}
    for kind, queries in corpus["queries"].items():
        for warm in range(2):  # the warm-up twice, a pause between (see the docstring)
            for q in queries:
                await db.search_messages(q, limit=20)
            await asyncio.sleep(0.2 * (1 - warm))
        # the server's ticks are coarse (10 ms): its CPU is read over the kind's queries
        # and shared out by the client's time per query
        times, found = [], 0
        server = server_cpu(pids)
        for q in queries:
            t = time.process_time()
            found += len(await db.search_messages(q, limit=20))
            times.append(time.process_time() - t)
        server = server_cpu(pids) - server
        share = server / max(sum(times), 1e-9)
        out[kind] = statistics.median(times) * (1 + share)
        hits[kind] = found / len(queries)
    await db.close()
    print(json.dumps({"times": out, "hits": hits}))

asyncio.run(main())
"""


CALLGRIND_QUERY = """
import asyncio, json, sys
from pathlib import Path

async def main():
    path, corpus, kind = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()), sys.argv[3]
    if sys.argv[4] == "native":
        import state.sqlite.readers as readers
        from state import SessionDB
        readers.INLINE_BUDGET_S *= 1000
        readers.INLINE_WALL_S *= 1000
        db = await SessionDB.open(path)
        search = db.search_messages
    else:
        from hermes_state import SessionDB
        hermes = SessionDB(path)
        async def search(q, limit):
            return hermes.search_messages(q, limit=limit)
    queries = corpus["queries"][kind]
    for warm in range(2):  # the warm-up twice, a pause between (see the docstring)
        for q in queries:
            await search(q, limit=20)
        await asyncio.sleep(2.0 * (1 - warm))  # valgrind runs the reading thread slowly
    print("ready", flush=True)
    for q in queries:  # the parent zeroes the counters before each and dumps them after
        sys.stdin.readline()
        await search(q, limit=20)
        print("done", flush=True)
    sys.stdin.readline()

asyncio.run(main())
"""


def corpus(n: int, per_kind: int, seed: int = 11) -> dict[str, object]:
    gen = TextGen()
    rng = random.Random(seed)
    texts = [
        gen.cjk() if rng.random() < 0.05 else gen.english("user" if i % 2 == 0 else "assistant")
        for i in range(n)
    ]
    common = COMMON[:60]
    queries: dict[str, list[str]] = {k: [] for k in KINDS}
    while any(len(v) < per_kind for v in queries.values()):
        text = rng.choice(texts)
        runs = [r for r in "".join(ch if is_cjk(ch) else " " for ch in text).split() if len(r) >= 3]
        if runs:
            run = max(runs, key=len)
            i = rng.randrange(0, len(run) - 2)
            for kind, size in (("cjk 3-char", 3), ("cjk 2-char", 2)):
                if len(queries[kind]) < per_kind:
                    queries[kind].append(run[i : i + size])
            continue
        words = [w.strip(".,?!").lower() for w in text.split() if w.strip(".,?!").isalpha()]
        rare = [w for w in words if w not in COMMON]
        if len(queries["two common words"]) < per_kind:
            queries["two common words"].append(" ".join(rng.sample(common, 2)))
        if len(rare) >= 2 and len(queries["two words"]) < per_kind:
            queries["two words"].append(" ".join(rng.sample(rare, 2)))
        if len(words) >= 3 and len(queries["phrase"]) < per_kind:
            i = rng.randrange(0, len(words) - 1)
            queries["phrase"].append(f'"{words[i]} {words[i + 1]}"')
    return {"texts": texts, "queries": queries}


def _run(
    script: str, pythonpath: str, where: str, data: str, home: Path
) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "HERMES_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-c", script, where, data],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, dict[str, float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=15_000)
    ap.add_argument("--queries", type=int, default=40, help="per kind")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--dsn",
        default=os.environ.get("SWITCHBOARD_PG_DSN", DEFAULT_DSN),
        help="the PostgreSQL server for the PostgreSQL store's column (a fresh database on it)",
    )
    ap.add_argument("--no-postgres", action="store_true", help="leave the PostgreSQL column out")
    ap.add_argument(
        "--callgrind",
        action="store_true",
        help="instructions per query under callgrind (Hermes and the native store) instead",
    )
    args = ap.parse_args()
    if args.callgrind:
        with tempfile.TemporaryDirectory() as d:
            callgrind(args, str(installed()), Path(d))
        return
    hermes = str(installed())
    programs = {
        "Hermes 0.19.0": ("hermes_state", hermes, QUERY_COMPAT.format(module="hermes_state")),
        "switchboard (Hermes API)": (
            "state.hermes.compat",
            str(ROOT),
            QUERY_COMPAT.format(module="state.hermes.compat"),
        ),
        "switchboard (native)": ("state.hermes.compat", str(ROOT), QUERY_NATIVE),
    }
    pg: tuple[str, str] | None = None
    if not args.no_postgres:
        pg = fresh_database(args.dsn)
        programs["switchboard (PostgreSQL)"] = ("postgres", str(ROOT), QUERY_PG)
    results: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in programs}
    try:
        with tempfile.TemporaryDirectory() as d:
            run_rounds(args, programs, results, hermes, pg, Path(d))
    finally:
        if pg is not None:
            drop_database(args.dsn, pg[0])
    report(args, programs, results)


def run_rounds(
    args: argparse.Namespace,
    programs: dict[str, tuple[str, str, str]],
    results: dict[str, list[dict[str, dict[str, float]]]],
    hermes: str,
    pg: tuple[str, str] | None,
    tmp: Path,
) -> None:
    data = tmp / "corpus.json"
    data.write_text(json.dumps(corpus(args.messages, args.queries)))
    built: dict[str, Path] = {}
    for module, path in (("hermes_state", hermes), ("state.hermes.compat", str(ROOT))):
        db = tmp / f"{module}.db"
        subprocess.run(
            [sys.executable, "-c", BUILD.format(module=module), str(db), str(data)],
            env={**os.environ, "PYTHONPATH": path, "HERMES_HOME": str(tmp)},
            check=True,
        )
        built[module] = db
    where = {module: str(db) for module, db in built.items()}
    if pg is not None:
        subprocess.run(
            [sys.executable, "-c", BUILD_PG, pg[1], str(data)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=True,
        )
        where["postgres"] = pg[1]
    for _ in range(args.rounds):
        for name, (module, path, script) in programs.items():
            results[name].append(_run(script, path, where[module], str(data), tmp))


def callgrind(args: argparse.Namespace, hermes: str, tmp: Path) -> None:
    data = tmp / "corpus.json"
    data.write_text(json.dumps(corpus(args.messages, args.queries)))
    sides = {
        "Hermes 0.19.0": ("hermes_state", hermes),
        "native": ("state.hermes.compat", str(ROOT)),
    }
    files = {}
    for name, (module, path) in sides.items():
        files[name] = tmp / f"{module}.db"
        subprocess.run(
            [sys.executable, "-c", BUILD.format(module=module), str(files[name]), str(data)],
            env={**os.environ, "PYTHONPATH": path, "HERMES_HOME": str(tmp)},
            check=True,
        )
    print(
        f"{args.messages} messages, {args.queries} queries per kind: instructions per query "
        "under callgrind (median over the kind's queries; in brackets the quartiles)"
    )
    print(f"{'query kind':<18}{'Hermes 0.19.0':>30}{'switchboard (native)':>30}{'ratio':>8}")
    for kind in KINDS:
        medians, cells = [], []
        for name, (_module, path) in sides.items():
            counts = _counted(tmp, files[name], data, kind, name == "native", path)
            q1, med, q3 = statistics.quantiles(counts, n=4)
            medians.append(med)
            cells.append(f"{med / 1e6:.3f} M ({q1 / 1e6:.2f}-{q3 / 1e6:.2f})")
        print(
            f"{kind:<18}" + "".join(f"{c:>30}" for c in cells) + f"{medians[1] / medians[0]:>8.2f}"
        )
    print("ratio: the native store's instructions per query over Hermes's")


def _counted(tmp: Path, db: Path, data: Path, kind: str, native: bool, path: str) -> list[int]:
    """Each query's instructions, one callgrind run of the store's program over the kind."""
    out = tmp / f"cg-{kind.replace(' ', '-')}-{'native' if native else 'hermes'}"
    env = {**os.environ, "PYTHONPATH": path, "HERMES_HOME": str(tmp)}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", sys.executable]
    cmd += ["-c", CALLGRIND_QUERY, str(db), str(data), kind, "native" if native else "hermes"]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline().startswith("ready"), "the query program did not start"
    for _ in json.loads(data.read_text())["queries"][kind]:
        _control("-z", proc.pid)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().startswith("done"), "a query did not finish"
        _control("-d", proc.pid)
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait()
    dumps = sorted(tmp.glob(f"{out.name}.{proc.pid}.*"), key=lambda f: int(f.suffix[1:]))
    return [total_ir(dump) for dump in dumps]


def _control(flag: str, pid: int) -> None:
    """callgrind_control `flag` (-z: zero the counters, -d: dump them) on a program."""
    subprocess.run(
        ["callgrind_control", flag, str(pid)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def report(
    args: argparse.Namespace,
    programs: dict[str, tuple[str, str, str]],
    results: dict[str, list[dict[str, dict[str, float]]]],
) -> None:
    print(
        f"{args.messages} messages, {args.queries} queries per kind, CPU time per query "
        f"(median of {args.rounds} rounds; in brackets the spread over rounds and the mean "
        "hits per query)"
    )
    names = list(programs)
    print(f"{'query kind':<18}" + "".join(f"{n:>34}" for n in names) + f"{'ratio':>10}")
    for kind in KINDS:
        cells, medians = [], []
        for name in names:
            values = [r["times"][kind] * 1000 for r in results[name]]
            med = statistics.median(values)
            medians.append(med)
            hits = results[name][0]["hits"][kind]
            cells.append(f"{med:8.2f} ms ({min(values):.2f}-{max(values):.2f}, {hits:4.1f})")
        ratios = "".join(f"{m / medians[0]:>10.2f}" for m in medians[2:])
        print(f"{kind:<18}" + "".join(f"{c:>34}" for c in cells) + ratios)
    print(
        "ratio: switchboard's native search time over Hermes's (1.00 = the same time)"
        + (
            "; then the PostgreSQL store's (client and server CPU) over Hermes's"
            if len(names) > 3
            else ""
        )
    )


if __name__ == "__main__":
    main()
