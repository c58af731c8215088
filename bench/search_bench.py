"""Search benchmarks. Prints figures; asserts nothing.

  python bench/search_bench.py           # 1,000,000 messages / 100,000 sessions (5% CJK)
  python bench/search_bench.py --quick   # 100,000 / 10,000

1. Query latency p50/p99 (through SessionDB.search_messages, limit 20, relevance) for single
   words, two words, phrases, prefixes, CJK 2- and 4-character queries.
2. Append rate with the search indexes on, as a ratio to the same rows with no FTS at all;
   and on an English-only corpus, with CJK support against without it.
3. Index size as a fraction of the text it indexes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import TextGen, corpus_db, pct  # noqa: E402
from state import SessionDB  # noqa: E402
from state.sqlite import messages, schema  # noqa: E402
from state.sqlite.sessions import insert_session  # noqa: E402
from state.textindex import is_cjk  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def sample_queries(path: Path, n: int, seed: int = 1) -> dict[str, list[str]]:
    rng = random.Random(seed)
    conn = sqlite3.connect(path)
    top = conn.execute("SELECT MAX(id) FROM messages").fetchone()[0]
    common = set(TextGen().vocab[:100])
    out: dict[str, list[str]] = {
        k: []
        for k in (
            "word",
            "common word",
            "two words",
            "phrase",
            "prefix",
            "cjk 2-char",
            "cjk 4-char",
        )
    }
    while any(len(v) < n for v in out.values()):
        (content,) = conn.execute(
            "SELECT content FROM messages WHERE id = ?", (rng.randint(1, top),)
        ).fetchone()
        runs = [
            r for r in "".join(ch if is_cjk(ch) else " " for ch in content).split() if len(r) >= 4
        ]
        if runs:
            cjk = max(runs, key=len)  # a contiguous run, as it appears in the message
            i = rng.randrange(0, len(cjk) - 3)
            if len(out["cjk 2-char"]) < n:
                out["cjk 2-char"].append(cjk[i : i + 2])
            if len(out["cjk 4-char"]) < n:
                out["cjk 4-char"].append(cjk[i : i + 4])
            continue
        words = [w.strip(".?!").lower() for w in content.split()]
        rare = [w for w in words if w not in common and len(w) > 3]
        if len(out["common word"]) < n:
            out["common word"].append(rng.choice(words))
        if rare and len(out["word"]) < n:
            out["word"].append(rng.choice(rare))
        if len(rare) >= 2 and len(out["two words"]) < n:
            out["two words"].append(" ".join(rng.sample(rare, 2)))
        if len(words) >= 3 and len(out["phrase"]) < n:
            i = rng.randrange(0, len(words) - 1)
            out["phrase"].append(f'"{words[i]} {words[i + 1]}"')
        if rare and len(out["prefix"]) < n:
            out["prefix"].append(rng.choice(rare)[:4] + "*")
    conn.close()
    return out


async def query_latency(path: Path, queries: dict[str, list[str]]) -> None:
    """Each kind's queries run twice: the first pass reads the index pages they need from
    disk into the OS cache (printed as `cold`), the second is the measured one."""
    db = await SessionDB.open(path)
    try:
        await db.search_messages("warmup")
        for kind, qs in queries.items():
            cold = []
            for q in qs:
                t = time.perf_counter()
                await db.search_messages(q, limit=20)
                cold.append((time.perf_counter() - t) * 1000)
            times = []
            empty = 0
            for q in qs:
                t = time.perf_counter()
                hits = await db.search_messages(q, limit=20)
                times.append((time.perf_counter() - t) * 1000)
                empty += not hits
            target = "CJK p50 <= 25 ms" if kind.startswith("cjk") else "p50 <= 10, p99 <= 50 ms"
            print(
                f"  {kind:<12} p50 {pct(times, 0.5):7.2f} ms   p99 {pct(times, 0.99):7.2f} ms   "
                f"({len(qs)} queries, {empty} empty; cold pass p50 {pct(cold, 0.5):.1f}, "
                f"p99 {pct(cold, 0.99):.1f})  target {target}"
            )
    finally:
        await db.close()


def _fresh(path: Path, fts: bool, aux: bool = True) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    schema.migrate(conn, str(path))
    if not fts:
        for trig in ("messages_fts_insert", "messages_fts_delete", "messages_fts_update"):
            conn.execute(f"DROP TRIGGER {trig}")
    for i in range(200):
        insert_session(conn, {"id": f"s{i}", "source": "api"})
    return conn


def append_rate(path: Path, texts: list[str], fts: bool, aux: bool) -> float:
    conn = _fresh(path, fts)
    saved = messages.aux_row
    if not aux:
        messages.aux_row = lambda *_a: None  # type: ignore[assignment]
    try:
        t = time.perf_counter()
        for i in range(0, len(texts), 200):
            conn.execute("BEGIN IMMEDIATE")
            messages.append_many(
                conn,
                [
                    (f"s{j % 200}", ({"role": "user", "content": texts[j]},))
                    for j in range(i, min(i + 200, len(texts)))
                ],
            )
            conn.execute("COMMIT")
        return len(texts) / (time.perf_counter() - t)
    finally:
        messages.aux_row = saved
        conn.close()


def index_size(path: Path) -> None:
    conn = sqlite3.connect(path)
    sizes = dict(
        conn.execute(
            "SELECT CASE WHEN name LIKE 'messages_fts%' THEN 'main FTS' "
            "WHEN name LIKE 'messages_aux%' THEN 'CJK/emoji side index' ELSE 'other' END, SUM(pgsize) "
            "FROM dbstat GROUP BY 1"
        ).fetchall()
    )
    text = conn.execute("SELECT SUM(LENGTH(CAST(content AS BLOB))) FROM messages").fetchone()[0]
    conn.close()
    fts = sizes.get("main FTS", 0) + sizes.get("CJK/emoji side index", 0)
    print(
        f"  message text {text / 1e6:.1f} MB; main FTS {sizes.get('main FTS', 0) / 1e6:.1f} MB; "
        f"side index (table + FTS) {sizes.get('CJK/emoji side index', 0) / 1e6:.1f} MB"
    )
    print(f"  indexes / text = {fts / text:.2f}  (target <= 1.5)")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--queries-only", action="store_true", help="only the latency figures")
    args = ap.parse_args()
    sessions, n_messages = (10_000, 100_000) if args.quick else (100_000, 1_000_000)
    path = corpus_db(OUT, sessions, n_messages, 0.05)
    print(
        f"switchboard search bench — {n_messages:,} messages in {sessions:,} sessions (5% CJK), SQLite {sqlite3.sqlite_version}"
    )
    print("\n1. query latency (limit 20, relevance with recency)")
    await query_latency(path, sample_queries(path, 200))
    if args.queries_only:
        return

    gen = TextGen(21)
    n = 20_000 if args.quick else 100_000
    mixed = [gen.cjk() if gen.rng.random() < 0.05 else gen.english("user") for _ in range(n)]
    english = [gen.english("user") for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        on = append_rate(d / "a.db", mixed, fts=True, aux=True)
        off = append_rate(d / "b.db", mixed, fts=False, aux=False)
        en_cjk = append_rate(d / "c.db", english, fts=True, aux=True)
        en_plain = append_rate(d / "d.db", english, fts=True, aux=False)
    print(f"\n2. append rate, {n:,} rows in batches of 200 (the writer's merged path)")
    print(f"  5% CJK corpus, search indexes on : {on:,.0f} rows/s")
    print(f"  same rows, no FTS at all         : {off:,.0f} rows/s   ratio {on / off:.2f}")
    print(f"  English-only, CJK support on     : {en_cjk:,.0f} rows/s")
    print(
        f"  English-only, CJK support off    : {en_plain:,.0f} rows/s   ratio {en_cjk / en_plain:.2f}"
    )
    print("\n3. index size")
    index_size(path)


if __name__ == "__main__":
    asyncio.run(main())
