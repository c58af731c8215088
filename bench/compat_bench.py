"""state.hermes.compat against Hermes Agent 0.19.0's own SessionDB on the same sequential work.
Prints figures side by side; asserts nothing.

  python bench/compat_bench.py [--rounds 3] [--n 2000]

Each program runs in its own subprocess (Hermes from the registry, installed into the test
cache by tests/hermes_pkg.py) doing, on a fresh file: open it (all migrations), N appends,
N get_session reads, N get_messages reads of a 20-message session, N/10 searches. Times are
per call, median of the rounds; the rounds alternate the programs (this machine's speed
drifts from one minute to the next).
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

from tests.hermes_pkg import installed  # noqa: E402

WORK = """
import json, sys, time
from pathlib import Path
from {module} import SessionDB
path, n = Path(sys.argv[1]), int(sys.argv[2])
out = {{}}
t = time.perf_counter(); db = SessionDB(path); out["open (new file)"] = time.perf_counter() - t
db.create_session("s1", "cli")
t = time.perf_counter()
for i in range(n):
    db.append_message("s1", "user" if i % 2 == 0 else "assistant", f"message {{i}} about deploys")
out["append_message"] = (time.perf_counter() - t) / n
db.create_session("s2", "cli")
for i in range(20):
    db.append_message("s2", "user", f"short {{i}}")
t = time.perf_counter()
for _ in range(n):
    db.get_session("s1")
out["get_session"] = (time.perf_counter() - t) / n
t = time.perf_counter()
for _ in range(n):
    db.get_messages("s2")
out["get_messages (20)"] = (time.perf_counter() - t) / n
t = time.perf_counter()
for _ in range(max(1, n // 10)):
    db.search_messages("deploys", limit=20)
out["search_messages"] = (time.perf_counter() - t) / max(1, n // 10)
db.close()
print(json.dumps(out))
"""


def _run(module: str, pythonpath: str, n: int, tmp: Path, tag: str) -> dict[str, float]:
    db = tmp / f"{tag}.db"
    env = {**os.environ, "PYTHONPATH": pythonpath, "HERMES_HOME": str(tmp / "hermes-home")}
    proc = subprocess.run(
        [sys.executable, "-c", WORK.format(module=module), str(db), str(n)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        check=True,
    )
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    hermes_path = str(installed())
    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for r in range(args.rounds):
            ours.append(_run("state.hermes.compat", str(ROOT), args.n, tmp, f"sb{r}"))
            theirs.append(_run("hermes_state", hermes_path, args.n, tmp, f"h{r}"))
    print(f"{'operation':<22}{'switchboard':>14}{'Hermes 0.19.0':>16}{'ratio':>8}")
    for key in ours[0]:
        a = statistics.median(x[key] for x in ours) * 1000
        b = statistics.median(x[key] for x in theirs) * 1000
        print(f"{key:<22}{a:>11.3f} ms{b:>13.3f} ms{a / b:>8.2f}")


if __name__ == "__main__":
    main()
