"""The SQLite store alone under a turn's writes: CPU, context switches and commits per turn.
Prints figures; asserts nothing.

  python bench/writer_bench.py [--turns 4000] [--in-flight 8] [--chats 500]
                               [--commit-linger-ms 1] [--rounds 3] [--statements]

Each turn is the two writes the pipeline makes for a message to an idle key:
`accept_and_begin` (the inbox row and the user's message, with the history up to it) and
`end_turn` (the reply, the row answered), for chat i % chats, `--in-flight` turns at once
on one event loop, in a fresh file per round after a warm-up of a quarter of the turns.
Per turn: the process's CPU (both threads: the event loop and the writer), its voluntary
and involuntary context switches (from /proc, every thread), and the commits. The figures
isolate the writer's hand-offs from the HTTP and agent work around them in a daemon.

`--statements` also times every statement the writer's connection runs (its thread's CPU
from before `execute` to its return, cursor reads after that not included) over the
measured turns of every round, and prints them by statement, largest first: where the
store's share of a turn goes. The timing itself costs about 15-20 µs of CPU per turn (two
reads of the thread's clock per statement, each a system call), which the CPU figure of
such a run includes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from state.sqlite.settings import WriterConfig  # noqa: E402
from state.sqlite.store import SessionDB  # noqa: E402
from state.sqlite.windows import WriterConnection  # noqa: E402

# --statements: thread CPU (ns) and runs by statement, while `timing[0]` is set.
STATEMENTS: collections.defaultdict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
timing = [False]


def time_statements() -> None:
    """Wrap the writer connection's execute and executemany to add into STATEMENTS."""
    execute, executemany = WriterConnection.execute, WriterConnection.executemany

    def timed(run: Any, prefix: str) -> Any:
        def wrapper(self: WriterConnection, sql: str, *args: Any) -> Any:
            if not timing[0]:
                return run(self, sql, *args)
            t0 = time.thread_time_ns()
            try:
                return run(self, sql, *args)
            finally:
                entry = STATEMENTS[prefix + " ".join(sql.split())]
                entry[0] += time.thread_time_ns() - t0
                entry[1] += 1

        return wrapper

    WriterConnection.execute = timed(execute, "")  # type: ignore[method-assign]
    WriterConnection.executemany = timed(executemany, "(executemany) ")  # type: ignore[method-assign]


def print_statements(turns: int, top: int = 16) -> None:
    total = sum(ns for ns, _ in STATEMENTS.values())
    print(f"statements: {total / turns / 1e3:.1f} µs of the writer thread's CPU per turn")
    for sql, (ns, runs) in sorted(STATEMENTS.items(), key=lambda kv: -kv[1][0])[:top]:
        shown = re.sub(r"^(.{100}).+$", r"\1 ...", sql)
        print(
            f"  {ns / turns / 1e3:6.2f} µs/turn {ns / total:6.1%} {runs / turns:5.2f} runs/turn  {shown}"
        )


def switches() -> tuple[int, int]:
    """(voluntary, involuntary) context switches of every thread of this process so far."""
    vol = invol = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return vol, invol


async def one_round(args: argparse.Namespace, home: Path) -> tuple[float, float, float, float]:
    config = WriterConfig(commit_linger_s=args.commit_linger_ms / 1000)
    db = await SessionDB.open(home / "state.db", config=config)
    try:
        sessions = [await db.create_session(f"s{c}", "api") for c in range(args.chats)]

        async def turn(i: int) -> None:
            c = i % args.chats
            inbox_id, _state, _new, _begun = await db.accept_and_begin(
                "api",
                f"chat{c}",
                f"req-{i}",
                {"text": "What is the answer to my question?"},
                sessions[c],
                {"role": "user", "content": "What is the answer to my question?"},
                last=40,
            )
            reply = {"role": "assistant", "content": "Here is a short answer to your question."}
            await db.end_turn(inbox_id, sessions[c], [reply], input_tokens=10, output_tokens=5)

        async def run(start: int, n: int) -> None:
            todo = iter(range(start, start + n))

            async def lane() -> None:
                for i in todo:
                    await turn(i)

            await asyncio.gather(*(lane() for _ in range(args.in_flight)))

        warm = args.turns // 4
        await run(0, warm)
        vol0, invol0 = switches()
        commits0, cpu0 = db.writer.stats.batches, time.process_time()
        timing[0] = args.statements
        await run(warm, args.turns)
        timing[0] = False
        cpu = (time.process_time() - cpu0) / args.turns
        vol1, invol1 = switches()
        commits = (db.writer.stats.batches - commits0) / args.turns
        return cpu, (vol1 - vol0) / args.turns, (invol1 - invol0) / args.turns, commits
    finally:
        await db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=4000, help="measured turns per round (4000)")
    ap.add_argument("--in-flight", type=int, default=8, help="turns at once (8)")
    ap.add_argument("--chats", type=int, default=500, help="sessions the turns go to (500)")
    ap.add_argument("--commit-linger-ms", type=float, default=1.0, help="state.commit_linger_ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--statements", action="store_true", help="time the writer's statements (see above)"
    )
    args = ap.parse_args()
    if args.statements:
        time_statements()
    print(
        f"switchboard writer bench: {args.turns} turns, {args.in_flight} in flight, "
        f"{args.chats} chats, commit linger {args.commit_linger_ms:g} ms, {os.cpu_count()} cores"
    )
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="sb-writer-") as tmp:
            rounds.append(asyncio.run(one_round(args, Path(tmp))))
    for k, label in enumerate(
        ("CPU per turn (µs)", "voluntary switches per turn", "involuntary switches per turn")
    ):
        values = [r[k] * (1e6 if k == 0 else 1) for r in rounds]
        print(
            f"{label}: median {statistics.median(values):.2f}, "
            f"range {min(values):.2f}-{max(values):.2f}"
        )
    print(f"commits per turn: median {statistics.median(r[3] for r in rounds):.3f}")
    if args.statements:
        print_statements(args.turns * args.rounds)


if __name__ == "__main__":
    main()
