"""`switchboard service install`: a systemd unit for this installation (this interpreter,
this home, this config), written for the user manager or the system, with the commands to
enable it. The unit's exit-code policy matches the CLI: 78 (bad config) stops restarts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gateway.errors import GatewayError

UNIT_NAME = "switchboard.service"


def render_unit(
    *,
    python: str,
    home: Path,
    config: Path | None,
    user: bool,
    drain_s: float = 10.0,
    env_file: Path | None = None,
) -> str:
    config_arg = f" --config {config}" if config else ""
    env_file = env_file or home / "switchboard.env"
    sandbox = [
        "NoNewPrivileges=true",
        "PrivateTmp=true",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        f"ReadWritePaths={home}",
        "ProtectKernelTunables=true",
        "ProtectControlGroups=true",
        "RestrictSUIDSGID=true",
        "LockPersonality=true",
    ]
    if user:  # a user manager cannot set up most namespaces; keep what works unprivileged
        sandbox = ["NoNewPrivileges=true"]
    lines = [
        "[Unit]",
        "Description=switchboard: a gateway daemon for AI agents on chat platforms",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={python} -m gateway --home {home}{config_arg} run",
        f"Environment=SWITCHBOARD_HOME={home}",
        f"EnvironmentFile=-{env_file}",
        "Restart=on-failure",
        "RestartSec=5",
        "RestartPreventExitStatus=78",
        "WatchdogSec=30",
        "TimeoutStartSec=60",
        "KillSignal=SIGTERM",
        f"TimeoutStopSec={int(drain_s) + 20}",
        *sandbox,
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
        "",
    ]
    return "\n".join(lines)


def unit_path(user: bool) -> Path:
    if user:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return base / "systemd" / "user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def next_steps(path: Path, *, user: bool, custom: bool, home: Path) -> str:
    """The commands that take the unit written at `path` into service. A unit outside the
    manager's search path is enabled by its full path (systemctl links it in) and is then
    known by its file's name."""
    ctl = "systemctl --user" if user else "sudo systemctl"
    unit = str(_plain(path)) if custom else UNIT_NAME
    return "\n".join(
        [
            f"{ctl} daemon-reload",
            f"{ctl} enable --now {unit}",
            f"journalctl {'--user ' if user else ''}-u {path.name if custom else UNIT_NAME} -f",
            f"(tokens go in {_plain(home) / 'switchboard.env'}, one NAME=value per line, mode 600)",
        ]
    )


def _plain(path: Path) -> Path:
    """`path` absolute with `.` and `..` gone, resolved as the system resolves it (a `..`
    after a symlink leads where the link points, not back up the path as written)."""
    return path.expanduser().resolve()


def install(
    *, home: Path, config: Path | None, user: bool, drain_s: float, target: Path | None = None
) -> tuple[Path, str]:
    """Write the unit; returns its path and the commands to run next.

    The manager's own folder is created when missing (a fresh account has none); a folder
    named with --output must exist, so that a typo does not quietly make a new tree.
    """
    if target is not None and not target.parent.is_dir():
        raise GatewayError(f"--output: the folder {target.parent} does not exist; create it first")
    path = target or unit_path(user)
    unit = render_unit(
        python=sys.executable,
        home=_plain(home),
        config=_plain(config) if config else None,
        user=user,
        drain_s=drain_s,
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(unit)
    except OSError as exc:
        raise GatewayError(f"cannot write {path}: {exc.strerror}") from None
    return _plain(path), next_steps(path, user=user, custom=target is not None, home=home)
