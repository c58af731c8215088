"""`switchboard backup` and `restore` on a large home: time (wall and CPU of the command),
the archive's size, and the restore, each the median of a few runs with their spread.

    python bench/backup_bench.py                       # 100,000 sessions, 1,000,000 messages
    python bench/backup_bench.py --messages 100000 --sessions 10000 --runs 3

The corpus is bench/corpus.py's (built once and cached under bench/out/). Each run copies
it into a fresh home, so every backup reads the same file from the page cache.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.corpus import corpus_db  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


def _timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the child, its stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def _spread(values: list[float], unit: str, fmt: str = ".2f") -> str:
    return (
        f"median {statistics.median(values):{fmt}} {unit} "
        f"(min {min(values):{fmt}}, max {max(values):{fmt}}, n={len(values)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    corpus = corpus_db(OUT, args.sessions, args.messages, 0.05)
    cli = [sys.executable, "-m", "gateway"]
    backup_wall, backup_cpu, restore_wall, restore_cpu, sizes = [], [], [], [], []
    with tempfile.TemporaryDirectory(prefix="backup-bench-", dir=OUT) as tmp:
        for run in range(args.runs):
            home, restored = Path(tmp) / f"home{run}", Path(tmp) / f"restored{run}"
            home.mkdir()
            shutil.copyfile(corpus, home / "state.db")
            archive = Path(tmp) / f"b{run}.tar.gz"
            wall, cpu, out = _timed([*cli, "--home", str(home), "backup", str(archive)])
            backup_wall.append(wall)
            backup_cpu.append(cpu)
            sizes.append(archive.stat().st_size / 1e6)
            if run == 0:
                print(out.rstrip())
            wall, cpu, _ = _timed([*cli, "--home", str(restored), "restore", str(archive)])
            restore_wall.append(wall)
            restore_cpu.append(cpu)
            shutil.rmtree(home)
            shutil.rmtree(restored)
            archive.unlink()
    db_mb = corpus.stat().st_size / 1e6
    print(
        f"home: {args.sessions:,} sessions, {args.messages:,} messages, state.db {db_mb:,.0f} MB; "
        f"{os.cpu_count()} cores"
    )
    print(f"backup:  wall {_spread(backup_wall, 's')}; CPU {_spread(backup_cpu, 's')}")
    print(
        f"archive: {_spread(sizes, 'MB', '.0f')} ({statistics.median(sizes) / db_mb:.0%} of state.db)"
    )
    print(f"restore: wall {_spread(restore_wall, 's')}; CPU {_spread(restore_cpu, 's')}")


if __name__ == "__main__":
    main()
