"""bench/request_body_bench.py end to end on a small load: both ways of building a request
body decode to the same messages (the bench checks it) and a row is printed per window
length. The figures themselves are not checked (no timing)."""

from __future__ import annotations

from tests.daemon import run_bench


def test_the_request_body_bench_prints_a_row_per_window_length() -> None:
    proc = run_bench("request_body_bench.py", "--turns", "40", "--rounds", "1", "--sessions", "4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["10", "50", "200"], proc.stdout
    assert all(row.count("us") == 2 for row in rows), proc.stdout


def test_the_instructions_bench_warms_chats_up_with_longer_histories() -> None:
    proc = run_bench(
        "instructions.py",
        "--only",
        "cpu",
        "--cpu-messages",
        "24",
        "--warm-per-chat",
        "5",
        "--rounds",
        "1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[N=24 after a warm-up of 20, 4 chats" in proc.stdout, proc.stdout
