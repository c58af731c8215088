"""Deployment files: the systemd unit `switchboard service install` writes (and systemd's
own verifier, where the tool exists), and the Dockerfile/compose file's required parts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_service_install_writes_a_unit_for_this_installation(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "unit").mkdir()
    target = tmp_path / "unit" / "switchboard.service"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "--home",
            str(home),
            "service",
            "install",
            "--user",
            "--output",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    # a unit outside the manager's search path is enabled by its path
    assert "systemctl --user daemon-reload" in proc.stdout
    assert f"systemctl --user enable --now {target}\n" in proc.stdout
    unit = target.read_text()
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        f"ExecStart={sys.executable} -m gateway --home {home} run",
        "WantedBy=default.target",
    ):
        assert line in unit.splitlines(), line


def install(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "service", "install", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.slow
def test_the_printed_commands_fit_the_scope_and_the_place(tmp_path: Path) -> None:
    """--system prints root's systemctl, never `systemctl --user`; a
    custom --output is enabled by its path; a missing --output folder is refused, not made."""
    home = tmp_path / "home"
    home.mkdir()
    system = install(home, "--system", "--output", str(tmp_path / "s.service"))
    assert system.returncode == 0, system.stderr
    assert "--user" not in system.stdout
    assert f"sudo systemctl enable --now {tmp_path / 's.service'}\n" in system.stdout
    assert "journalctl -u s.service -f" in system.stdout  # the unit is named after its file
    missing = install(home, "--output", str(tmp_path / "no" / "such" / "u.service"))
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.strip() == (
        f"switchboard: --output: the folder {tmp_path / 'no' / 'such'} does not exist; create it first"
    )
    assert not (tmp_path / "no").exists()
    home_after = install(
        home, "--user", "--output", str(tmp_path / "u.service"), "--home", str(home)
    )
    assert home_after.returncode == 0, home_after.stderr  # global options after the subcommand


@pytest.mark.slow
def test_paths_with_dot_dot_print_plainly_and_the_log_command_names_the_written_unit(
    tmp_path: Path,
) -> None:
    (tmp_path / "x" / "sb").mkdir(parents=True)
    (tmp_path / "h1").mkdir()
    work = tmp_path / "x" / "sb"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "--home",
            "../../h1",
            "service",
            "install",
            "--output",
            "../unit.service",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=work,
    )
    assert proc.returncode == 0, proc.stderr
    assert ".." not in proc.stdout, proc.stdout
    unit = tmp_path / "x" / "unit.service"
    assert proc.stdout.startswith(f"wrote {unit}\n")
    assert f"systemctl --user enable --now {unit}\n" in proc.stdout
    assert "journalctl --user -u unit.service -f" in proc.stdout
    assert f"(tokens go in {tmp_path / 'h1' / 'switchboard.env'}," in proc.stdout
    text = unit.read_text()
    assert ".." not in text and f"--home {tmp_path / 'h1'} run" in text


@pytest.mark.slow
def test_the_user_manager_folder_is_created_and_enabled_by_name(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "service", "install"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "xdg" / "systemd" / "user" / "switchboard.service").is_file()
    assert "systemctl --user enable --now switchboard.service\n" in proc.stdout


@pytest.mark.slow
def test_a_bad_config_refuses_to_install(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text("agent:\n  backend: nope\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "--home",
            str(home),
            "service",
            "install",
            "--output",
            str(tmp_path / "u.service"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 78 and "agent.backend" in proc.stderr
    assert not (tmp_path / "u.service").exists()


def test_the_system_unit_is_sandboxed_but_can_write_its_home() -> None:
    unit = (ROOT / "deploy" / "systemd" / "switchboard.service").read_text().splitlines()
    for line in (
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/switchboard",
        "NoNewPrivileges=true",
        "PrivateTmp=true",
        "RestartPreventExitStatus=78",
        "WantedBy=multi-user.target",
    ):
        assert line in unit, line


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    from gateway.ops.service import render_unit

    home = tmp_path / "home"
    home.mkdir()
    unit = tmp_path / "switchboard.service"
    unit.write_text(render_unit(python=sys.executable, home=home, config=None, user=False))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_dockerfile_has_what_a_long_running_service_needs() -> None:
    lines = [
        ln.strip() for ln in (ROOT / "deploy" / "docker" / "Dockerfile").read_text().splitlines()
    ]
    instructions = [
        ln.split()[0]
        for ln in lines
        if ln and not ln.startswith("#") and not ln.startswith(("&&", "CMD python"))
    ]
    assert lines[[i for i, ln in enumerate(lines) if ln.startswith("FROM")][0]].startswith(
        "FROM python:3.11-slim"
    )
    assert any(ln.startswith("USER ") and "root" not in ln for ln in lines)
    assert 'VOLUME ["/data"]' in lines and "ENV PYTHONDONTWRITEBYTECODE=1 \\" in lines
    assert any(ln.startswith("HEALTHCHECK") for ln in lines) and any(
        "/health" in ln for ln in lines
    )
    assert "STOPSIGNAL SIGTERM" in lines and 'CMD ["run"]' in lines
    assert instructions.index("USER") > instructions.index(
        "RUN"
    )  # installs as root, runs as the user


def test_compose_file_keeps_state_on_a_volume_and_restarts() -> None:
    doc = yaml.safe_load((ROOT / "deploy" / "docker" / "compose.yaml").read_text())
    svc = doc["services"]["switchboard"]
    assert svc["restart"] == "unless-stopped" and svc["env_file"] == "switchboard.env"
    assert "switchboard-data:/data" in svc["volumes"] and "switchboard-data" in doc["volumes"]
    assert svc["stop_grace_period"] == "30s"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)
def test_systemd_accepts_the_nightly_backup_timer_and_its_service(tmp_path: Path) -> None:
    folder = ROOT / "deploy" / "systemd"
    for name in ("switchboard-backup.service", "switchboard-backup.timer"):
        text = (
            (folder / name).read_text().replace("/opt/switchboard/venv/bin/python", sys.executable)
        )
        (tmp_path / name).write_text(text)
    proc = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            str(tmp_path / "switchboard-backup.timer"),
            str(tmp_path / "switchboard-backup.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    service = (folder / "switchboard-backup.service").read_text()
    assert "gateway --home /var/lib/switchboard backup" in service
