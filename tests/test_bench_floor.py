"""bench/instructions.py --floor end to end: bench/floor.py answers in the daemon's place
(its /health names its pid, as the daemon's does, for the bench's start-up check) and the
bench prints its CPU per message. The figures themselves are not checked (no timing)."""

from __future__ import annotations

import pytest

from tests.daemon import run_bench


@pytest.mark.parametrize("floor", ["http", "sqlite"])
def test_the_floor_runs_in_the_daemons_place_and_its_figure_is_printed(floor: str) -> None:
    proc = run_bench(
        "instructions.py",
        "--only",
        "cpu",
        "--floor",
        floor,
        "--cpu-messages",
        "60",
        "--rounds",
        "1",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"bench/floor.py --floor {floor} in the daemon's place" in proc.stdout
    assert "CPU ms per answered message via api, daemon: median " in proc.stdout, proc.stdout
