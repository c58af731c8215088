"""Hermes Agent 0.19.0's own store tests, run against `state.hermes.compat`.

The test files come from the hermes-agent sdist at test time (tests/hermes_pkg.py, never
committed). A conftest written next to them makes `import hermes_state` give `state.hermes.compat`;
nothing else in them changes. They run in a subprocess pytest (their fixtures and module
state stay out of ours); outcomes come back through a JUnit XML report.

`python -m tests.state.hermes_suite` prints the counts and every failing test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.hermes_pkg import installed, sdist_tests
from tests.state.hermes_suite_lists import FILES, SKIP

ROOT = Path(__file__).resolve().parents[2]

_CONFTEST = '''"""Point Hermes's store tests at switchboard's facade."""
import sys

import state.hermes.compat

sys.modules["hermes_state"] = state.hermes.compat
# A few tests build messages with Hermes's own agent helpers: its package goes last on the
# path, so switchboard's modules keep their names.
sys.path.append({hermes!r})
'''


def materialise(workdir: Path) -> Path:
    """Copy the suite's files into workdir with the redirecting conftest."""
    src = sdist_tests()
    workdir.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (workdir / name).write_text((src / name).read_text(encoding="utf-8"), encoding="utf-8")
    conftest = _CONFTEST.format(hermes=str(installed()))
    (workdir / "conftest.py").write_text(conftest, encoding="utf-8")
    (workdir / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    return workdir


def run(workdir: Path, timeout_s: float = 1800) -> dict[str, str]:
    """{test id: "passed" | "failed" | "skipped"} for every collected test of FILES."""
    materialise(workdir)
    report = workdir / "report.xml"
    deselect = [arg for nodeid in SKIP for arg in ("--deselect", nodeid)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HERMES_HOME": str(workdir / "hermes-home")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *FILES,
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=no",
            "-o",
            "console_output_style=classic",
            f"--junitxml={report}",
            "--rootdir",
            str(workdir),
            "-c",
            str(workdir / "pytest.ini"),
            *deselect,
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if not report.exists():
        raise AssertionError(f"the Hermes suite did not run:\n{proc.stdout}\n{proc.stderr}")
    return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "")
        file_part, _, cls = module.partition(".")
        # classname is "test_hermes_state.TestX" (or just the module); name may carry [param]
        nodeid = f"{file_part}.py::" + (f"{cls}::" if cls else "") + case.get("name", "")
        if case.find("failure") is not None or case.find("error") is not None:
            out[nodeid] = "failed"
        elif case.find("skipped") is not None:
            out[nodeid] = "skipped"
        else:
            out[nodeid] = "passed"
    return out


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        got = run(Path(tmp) / "suite")
    failed = sorted(k for k, v in got.items() if v == "failed")
    passed = sum(v == "passed" for v in got.values())
    for name in failed:
        print("FAILED", name)
    print(f"passed {passed}, failed {len(failed)}, skipped by list {len(SKIP)}")


if __name__ == "__main__":
    main()
