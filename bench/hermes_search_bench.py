"""Search beside Hermes Agent 0.19.0's store on the same corpus and queries. Prints figures;
asserts nothing.

  python bench/hermes_search_bench.py [--messages 15000] [--queries 40] [--rounds 3]

Both stores get the same messages (English-like chat text on a dense vocabulary, 5% CJK, in
sessions of 50) through their own append call, each in a fresh file in its own subprocess
(Hermes from the registry, installed into the test cache by tests/hermes_pkg.py). Then the
same queries of each kind run through `search_messages(query, limit=20)`: Hermes's own, and
switchboard's through its Hermes-compatible facade (the same call and answer shape, with
the neighbouring messages) and through the native store the gateway uses. Each query runs
once to warm the page cache, then once measured as CPU time (time.process_time: the
store's work in this process, which other work on the machine disturbs less than it does a
wall clock); a kind's figure is the median per query, then the median over rounds. The rounds alternate the programs, since this machine's speed
drifts from one minute to the next.

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
from state.textindex import is_cjk  # noqa: E402
from tests.hermes_pkg import installed  # noqa: E402

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
    for q in queries:
        db.search_messages(q, limit=20)
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
        for q in queries:
            await db.search_messages(q, limit=20)
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


def _run(script: str, pythonpath: str, *args: str) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": pythonpath, "HERMES_HOME": str(Path(args[0]).parent)}
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
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
    args = ap.parse_args()
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
    results: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in programs}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
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
        for _ in range(args.rounds):
            for name, (module, path, script) in programs.items():
                results[name].append(_run(script, path, str(built[module]), str(data)))
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
        ratio = medians[2] / medians[0]
        print(f"{kind:<18}" + "".join(f"{c:>34}" for c in cells) + f"{ratio:>10.2f}")
    print("ratio: switchboard's native search time over Hermes's (1.00 = the same time)")


if __name__ == "__main__":
    main()
