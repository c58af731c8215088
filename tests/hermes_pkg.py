"""The real Hermes Agent package, fetched from the package registry at test time (never
committed): its wheel for running Hermes's own SessionDB, its sdist for Hermes's store tests.

Both go to a cache directory shared between runs (`$XDG_CACHE_HOME/switchboard-tests` or
`~/.cache/switchboard-tests`), filled once under a file lock. Hermes's dependencies are not
installed: its store module needs only the standard library and a few of its own modules;
its gateway's session store (sessions.json, `/sethome`'s .env) needs the three packages of
`GATEWAY_DEPS`, installed beside it when a test asks for them.
Hermes code runs in a subprocess with the install on PYTHONPATH, because the package has
top-level modules (`gateway`, `agent`, `tools`) whose names clash with switchboard's.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any

HERMES_VERSION = "0.19.0"
_REQ = f"hermes-agent=={HERMES_VERSION}"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(base) / "switchboard-tests"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")


def _locked(name: str) -> Any:
    lock = open(cache_root() / f"{name}.lock", "w")  # noqa: SIM115 - held until closed
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock


def installed() -> Path:
    """A directory holding hermes-agent (no dependencies), for PYTHONPATH."""
    target = cache_root() / f"hermes-agent-{HERMES_VERSION}"
    with _locked("install"):
        if not (target / "hermes_state.py").is_file():
            partial = target.with_name(target.name + ".partial")
            _pip("install", "--no-deps", "--target", str(partial), _REQ)
            partial.rename(target)
    return target


GATEWAY_DEPS = ("requests", "pyyaml", "python-dotenv")


def gateway_deps() -> Path:
    """A directory holding what Hermes's gateway.session imports beyond the stdlib."""
    target = cache_root() / f"hermes-agent-{HERMES_VERSION}-gateway-deps"
    with _locked("gateway-deps"):
        if not (target / "requests").is_dir():
            partial = target.with_name(target.name + ".partial")
            _pip("install", "--target", str(partial), *GATEWAY_DEPS)
            partial.rename(target)
    return target


def sdist_tests() -> Path:
    """The `tests` directory of the hermes-agent sdist, unpacked."""
    root = cache_root() / f"hermes-agent-{HERMES_VERSION}-sdist"
    tests = root / "tests"
    with _locked("sdist"):
        if not (tests / "test_hermes_state.py").is_file():
            download = cache_root() / "downloads"
            _pip("download", "--no-deps", "--no-binary", ":all:", "-d", str(download), _REQ)
            archive = next(download.glob(f"hermes_agent-{HERMES_VERSION}.tar.gz"))
            with tarfile.open(archive) as tar:
                members = [
                    m
                    for m in tar.getmembers()
                    if "/tests/test_hermes_state" in m.name and m.name.endswith(".py")
                ]
                for m in members:
                    m.name = "tests/" + Path(m.name).name
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.11.4+
                tar.extractall(root, members=members, **safe)
    return tests


_PRELUDE = """
import json, sqlite3, sys
from pathlib import Path
import hermes_state
def _version():
    c = sqlite3.connect(sys.argv[1])
    try:
        return [r[0] for r in c.execute("SELECT version FROM schema_version")]
    except sqlite3.Error:
        return None
    finally:
        c.close()
version_before = _version()
rebuilds = []
_orig = hermes_state.SessionDB._rebuild_fts_indexes
def _counting(*a, **k):
    rebuilds.append(1)
    return _orig(*a, **k)
hermes_state.SessionDB._rebuild_fts_indexes = staticmethod(_counting)
db = hermes_state.SessionDB(Path(sys.argv[1]))
out = None
"""


def run_hermes(db_path: Path, code: str, home: Path | None = None, gateway: bool = False) -> Any:
    """Run `code` against Hermes's own SessionDB `db` on db_path, in a subprocess; returns
    {out: the JSON value of `out`, rebuilds: Hermes's trigger-repair index rebuilds,
    version_before/after: its schema_version rows (a number below its own means Hermes
    replays its migrations, the v11 one dropping and refilling its whole index)}.
    `gateway`: Hermes's gateway modules are importable too (GATEWAY_DEPS on the path)."""
    script = (
        _PRELUDE
        + textwrap.dedent(code)
        + "\ndb.close()\nprint(json.dumps({'out': out, 'rebuilds': len(rebuilds), "
        "'version_before': version_before, 'version_after': _version()}))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(installed())] + ([str(gateway_deps())] if gateway else [])
        ),
        "HERMES_HOME": str(home or db_path.parent / "hermes-home"),
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, str(db_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=db_path.parent,
        timeout=300,
    )
    if proc.returncode != 0:
        raise AssertionError(f"Hermes side failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
