"""bench/soak.py end to end: a short soak against the real daemon exits 0 and
prints its figure rows and summary. The figures themselves are not checked (no timing)."""

from __future__ import annotations

from tests.daemon import run_bench


def test_a_short_soak_prints_its_figures() -> None:
    proc = run_bench("soak.py", "--minutes", "0.2", "--rate", "50")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| min |"))
    width = header.count("|")
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert rows, proc.stdout
    assert all(row.count("|") == width for row in rows), rows
    for start in (
        "summary: 600 messages sent",
        "drain: ",
        "rss: ",
        "fds: ",
        "wal: ",
        "daemon exit code after SIGTERM: ",
    ):
        assert any(line.startswith(start) for line in lines), (start, proc.stdout)
