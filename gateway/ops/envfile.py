"""The home's secrets file, `<home>/switchboard.env`: one `NAME=value` a line, mode 0600,
read by the systemd unit (`EnvironmentFile=`) and the compose file (`env_file:`). The
config names the variables (`*_env` keys); this module reads and writes the file, and
gives the terminal commands the environment the daemon will see."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

FILE_NAME = "switchboard.env"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def path_of(home: Path) -> Path:
    return home / FILE_NAME


def read(path: Path) -> dict[str, str]:
    """The variables the file sets; a missing file sets none. Blank lines and `#` comments
    are skipped, an `export ` prefix and one pair of surrounding quotes are dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        name, value = name.strip(), value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        if _NAME.fullmatch(name):
            out[name] = value
    return out


def environment(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a terminal command checks the config against: the process's own,
    and for each variable it does not set, the home's secrets file (as the service has)."""
    env = dict(os.environ if base is None else base)
    for name, value in read(path_of(home)).items():
        env.setdefault(name, value)
    return env


def _quoted(value: str) -> str:
    plain = re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]*", value)
    return value if plain else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write(path: Path, values: Mapping[str, str]) -> None:
    """Set `values` in the file, keeping its other lines (comments included) in place; the
    file is created with mode 0600 and replaced atomically (a temp file beside it, then a
    rename), so a reader never sees half of it and a secret is never world-readable."""
    for name, value in values.items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        if "\n" in value or "\r" in value:
            raise ValueError(f"{name}: a secret cannot span lines")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = ["# secrets for switchboard (read by the service); keep this file mode 600"]
    todo = dict(values)
    for i, line in enumerate(lines):
        name = line.strip().removeprefix("export ").partition("=")[0].strip()
        if "=" in line and not line.lstrip().startswith("#") and name in todo:
            lines[i] = f"{name}={_quoted(todo.pop(name))}"
    lines += [f"{name}={_quoted(value)}" for name, value in todo.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
