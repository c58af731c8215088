"""`switchboard backup` and `restore` as an operator runs them: real daemons, real
subprocesses, real state.db files. A backup taken under load is a consistent snapshot, a
restored home continues each chat's live session, and what cannot be restored is refused."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import tarfile
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.ops.backups import archive_name
from gateway.ops.doctor import backup_check
from state.sqlite import schema
from tests.daemon import clean_env, free_port, switchboard, wait_healthy


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        switchboard(home, *args), capture_output=True, text=True, env=clean_env(), timeout=120
    )


def _start(home: Path, port: int | None = None) -> subprocess.Popen[str]:
    """A daemon on `home`; with `port`, on a fresh config that puts its API there."""
    home.mkdir(parents=True, exist_ok=True)
    if port is not None:
        (home / "config.yaml").write_text(f"platforms:\n  api:\n    port: {port}\n")
    return subprocess.Popen(
        switchboard(home, "run"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


async def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 30) == 0


async def _say(http: aiohttp.ClientSession, url: str, chat: str, text: str) -> dict[str, str]:
    async with http.post(f"{url}/v1/messages", json={"chat_id": chat, "text": text}) as resp:
        assert resp.status == 200
        body: dict[str, str] = await resp.json()
        return body


def _unpack(archive: Path, into: Path) -> dict[str, object]:
    with tarfile.open(archive, "r:gz") as tar:
        # the "data" filter where this Python has it (3.11.4 and later; Debian 12 has 3.11.2)
        tar.extractall(into, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    manifest: dict[str, object] = json.loads((into / "manifest.json").read_text())
    return manifest


def _messages(db: Path) -> dict[str, list[tuple[str, str]]]:
    conn = sqlite3.connect(db)
    try:
        out: dict[str, list[tuple[str, str]]] = {}
        for sid, role, content in conn.execute(
            "SELECT session_id, role, content FROM messages ORDER BY id"
        ):
            out.setdefault(sid, []).append((role, content))
        return out
    finally:
        conn.close()


async def test_a_restored_home_continues_each_chats_live_session(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(home, port)
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            before = {
                c: (await _say(http, url, c, f"first from {c}"))["session_id"]
                for c in ("alice", "bob")
            }
            await _say(http, url, "alice", "/title Trip to Kyoto")
            done = await asyncio.to_thread(_cli, home, "backup", str(tmp_path / "b.tar.gz"))
        await _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done.returncode == 0, done.stderr
    assert "3 messages" not in done.stdout and "2 sessions (2 live)" in done.stdout
    assert (tmp_path / "b.tar.gz").stat().st_mode & 0o777 == 0o600

    restored = tmp_path / "restored"
    back = await asyncio.to_thread(_cli, restored, "restore", str(tmp_path / "b.tar.gz"))
    assert back.returncode == 0, back.stderr
    assert "2 entries, written from state.db" in back.stdout
    index = json.loads((restored / "sessions" / "sessions.json").read_text())
    assert {e["session_id"] for e in index.values()} == set(before.values())

    proc = _start(restored)  # on the restored config: the same port
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            after = {c: await _say(http, url, c, f"again from {c}") for c in ("alice", "bob")}
        await _stop(proc)
        log = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert {c: a["session_id"] for c, a in after.items()} == before
    assert after["alice"]["reply"] == "echo: again from alice"
    assert "behind state.db" not in log and "missing session" not in log
    shown = await asyncio.to_thread(_cli, restored, "sessions", "show", "Trip to Kyoto")
    assert shown.returncode == 0 and "first from alice" in shown.stdout
    status = await asyncio.to_thread(_cli, home, "status", "--json")
    last = json.loads(status.stdout)["store"]["last_backup"]
    assert last["file"] == str(tmp_path / "b.tar.gz") and last["kind"] == "backup"


@pytest.mark.slow
async def test_backups_taken_under_load_are_consistent_snapshots(tmp_path: Path) -> None:
    home, port = tmp_path / "home", free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(home, port)
    archives = [tmp_path / f"b{i}.tar.gz" for i in range(3)]
    try:
        await wait_healthy(url, proc)
        async with aiohttp.ClientSession() as http:
            stop = asyncio.Event()

            async def chat(c: int) -> None:  # about 20 messages/s over 8 chats
                i = 0
                while not stop.is_set():
                    await _say(http, url, f"chat{c}", f"token{c}x{i} from chat {c}")
                    i += 1
                    await asyncio.sleep(0.4)

            load = [asyncio.create_task(chat(c)) for c in range(8)]
            await asyncio.sleep(1.0)
            for archive in archives:
                done = await asyncio.to_thread(_cli, home, "backup", str(archive))
                assert done.returncode == 0, done.stderr
                await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*load)
        await _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    final = _messages(home / "state.db")
    sizes = []
    for n, archive in enumerate(archives):
        into = tmp_path / f"unpacked{n}"
        manifest = _unpack(archive, into)
        taken = _messages(into / "state.db")
        # every session's messages are a prefix of what the daemon went on to write
        for sid, rows in taken.items():
            assert final[sid][: len(rows)] == rows
        assert manifest["messages"] == sum(map(len, taken.values()))
        conn = sqlite3.connect(into / "state.db")
        try:
            # the search index holds exactly the snapshot's messages
            conn.execute(
                f"INSERT INTO {schema.FTS_TABLE}({schema.FTS_TABLE}, rank) "
                "VALUES ('integrity-check', 1)"
            )
            newest = max(
                (r for rows in taken.values() for r in rows if r[0] == "user"),
                key=lambda r: (len(r[1]), r[1]),
            )
            token = newest[1].split()[0]
            hits = conn.execute(
                f"SELECT count(*) FROM {schema.FTS_TABLE} WHERE {schema.FTS_TABLE} MATCH ?",
                (f'"{token}"',),
            ).fetchone()[0]
            assert hits >= 1
        finally:
            conn.close()
        sizes.append(manifest["messages"])
    assert sizes == sorted(sizes) and sizes[0] > 0


@pytest.mark.parametrize("version", [9, 11])
async def test_a_backup_of_an_older_schema_restores_at_the_current_one(
    tmp_path: Path, version: int
) -> None:
    home = tmp_path / "old"
    home.mkdir()
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    schema.migrate(conn, str(home / "state.db"), target=version)
    now = time.time() - 60
    origin = json.dumps({"platform": "api", "chat_id": "carol", "chat_type": "dm"})
    conn.execute(
        "INSERT INTO sessions(id, source, started_at, session_key, chat_id, chat_type, "
        "origin_json, last_active) VALUES ('20260101_000000_aaaaaaaa', 'api', ?, "
        "'agent:main:api:dm:carol', 'carol', 'dm', ?, ?)",
        (now, origin, now),
    )
    conn.executemany(
        "INSERT INTO messages(session_id, role, content, timestamp) VALUES "
        "('20260101_000000_aaaaaaaa', ?, ?, ?)",
        [("user", "an old question", now), ("assistant", "an old answer", now + 1)],
    )
    conn.close()
    done = await asyncio.to_thread(_cli, home, "backup", str(tmp_path / "old.tar.gz"))
    assert done.returncode == 0, done.stderr
    assert f"schema {version}," in done.stdout
    back = await asyncio.to_thread(_cli, tmp_path / "new", "restore", str(tmp_path / "old.tar.gz"))
    assert back.returncode == 0, back.stderr
    assert f"schema {schema.LATEST}," in back.stdout and "1 sessions (1 live)" in back.stdout

    port = free_port()
    proc = _start(tmp_path / "new", port)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", proc)
        async with aiohttp.ClientSession() as http:
            answer = await _say(http, f"http://127.0.0.1:{port}", "carol", "a new question")
        await _stop(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answer["session_id"] == "20260101_000000_aaaaaaaa"
    searched = await asyncio.to_thread(_cli, tmp_path / "new", "sessions", "search", "old")
    assert "20260101_000000_aaaaaaaa" in searched.stdout


def _home_with_a_message(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    conn = sqlite3.connect(home / "state.db", isolation_level=None)
    schema.migrate(conn, str(home / "state.db"))
    conn.execute("INSERT INTO sessions(id, source, started_at) VALUES ('s1', 'api', 1.0)")
    conn.execute(
        "INSERT INTO messages(session_id, role, content, timestamp) "
        "VALUES ('s1', 'user', 'hello', 1.0)"
    )
    conn.close()
    return home


def test_restore_refuses_a_home_that_is_not_empty_and_an_altered_archive(tmp_path: Path) -> None:
    home = _home_with_a_message(tmp_path)
    assert _cli(home, "backup", str(tmp_path / "b.tar.gz")).returncode == 0
    taken = _cli(tmp_path / "home", "restore", str(tmp_path / "b.tar.gz"))
    assert taken.returncode == 1 and "is not empty" in taken.stderr

    # an archive whose state.db was changed after the manifest was written
    _unpack(tmp_path / "b.tar.gz", tmp_path / "x")
    with sqlite3.connect(tmp_path / "x" / "state.db") as conn:
        conn.execute("UPDATE messages SET content = 'forged'")
    with tarfile.open(tmp_path / "forged.tar.gz", "w:gz") as tar:
        for name in ("manifest.json", "state.db", "sessions/sessions.json"):
            tar.add(tmp_path / "x" / name, arcname=name)
    forged = _cli(tmp_path / "fresh", "restore", str(tmp_path / "forged.tar.gz"))
    assert forged.returncode == 1 and "does not match its checksum" in forged.stderr
    assert not (tmp_path / "fresh" / "state.db").exists()

    (tmp_path / "junk.tar.gz").write_bytes(b"not an archive")
    junk = _cli(tmp_path / "fresh2", "restore", str(tmp_path / "junk.tar.gz"))
    assert junk.returncode == 1 and "is not a switchboard backup" in junk.stderr


def test_a_directory_keeps_the_newest_backups_and_doctor_reads_their_age(tmp_path: Path) -> None:
    home = _home_with_a_message(tmp_path)
    shelf = tmp_path / "shelf"
    (home / "config.yaml").write_text(f"backup:\n  directory: {shelf}\n  keep: 2\n")
    for _ in range(3):
        done = _cli(home, "backup")
        assert done.returncode == 0, done.stderr
    kept = sorted(p.name for p in shelf.iterdir())
    assert len(kept) == 2 and all(n.startswith("switchboard-") for n in kept)
    assert "removed older backup" in done.stdout

    fresh = backup_check(str(shelf), max_age_hours=26)
    assert fresh.ok and "h old (2 kept)" in fresh.detail
    stale = backup_check(str(shelf), max_age_hours=26, now=time.time() + 27 * 3600)
    assert not stale.ok and not stale.warn and "backup.max_age_hours" in stale.detail
    none = backup_check(str(tmp_path / "empty"), max_age_hours=26)
    assert none.warn and "none yet" in none.detail
    doctor = _cli(home, "doctor", "--offline")
    assert "[ok  ] backup: newest switchboard-" in doctor.stdout


def test_a_postgres_home_is_shown_how_to_use_pg_dump(tmp_path: Path) -> None:
    home = tmp_path / "pg"
    home.mkdir()
    (home / "config.yaml").write_text("state:\n  backend: postgres\n")
    done = _cli(home, "backup", str(tmp_path / "b.tar.gz"))
    assert done.returncode == 1 and "pg_dump --format=custom" in done.stderr
    assert not (tmp_path / "b.tar.gz").exists()


def test_archive_names_sort_by_time() -> None:
    names = [archive_name(t) for t in (1.0e9, 1.5e9, 1.7e9)]
    assert names == sorted(names) and names[0] == "switchboard-20010909T014640Z.tar.gz"
