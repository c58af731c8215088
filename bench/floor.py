"""The floor under `bench/instructions.py`'s CPU figure: the least a Python daemon on the
same libraries can do for one answered message, run in the bench's place of the gateway
(`bench/instructions.py --floor http|sqlite|postgres`).

`http`: read the POST /v1/chat/completions body, parse it, send one compact JSON request
with the chat's whole conversation so far (kept in memory, as the daemon sends its history
window) to the model through one pooled aiohttp client session, parse its answer, answer
the chat completion. No store, no session, no validation beyond what the parse does.

`sqlite`: the same, plus the least a durable store does: the user's message is committed
before the model is called and the reply after it, both as rows of one table with one index
on (chat, id), in WAL mode with synchronous=NORMAL, through one writer thread that commits
whatever has queued (group commit, no linger).

`postgres`: the same two rows in one PostgreSQL table (the database in $SWITCHBOARD_PG_DSN),
written by one task on the event loop through one psycopg asyncio connection: each pass
inserts whatever has queued with one `executemany` and commits (two round trips).

Started as `python bench/floor.py --home DIR run` (the daemon's own argument shape): it reads
DIR/config.yaml for the api port, the model's base_url and `floor` (the mode), answers
GET /health, and stops on SIGTERM. It runs on the daemon's default loop (uvloop where
installed) with the daemon's collector settings (gateway/ops/heap.py), so the two differ
only in what each does per message."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml
from aiohttp import web

if TYPE_CHECKING:
    import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway import event_loops  # noqa: E402
from gateway.ops import heap  # noqa: E402

Op = tuple[str, str, str, asyncio.Future[None]]


class Writer:
    """One thread, one connection: each pass commits every queued insert at once."""

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.q: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, chat TEXT NOT NULL,"
            " role TEXT NOT NULL, content TEXT NOT NULL, ts REAL NOT NULL)"
        )
        self.conn.execute("CREATE INDEX IF NOT EXISTS by_chat ON messages (chat, id)")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def add(self, chat: str, role: str, content: str) -> asyncio.Future[None]:
        fut = self.loop.create_future()
        self.q.put((chat, role, content, fut))
        return fut

    def _run(self) -> None:
        while True:
            first = self.q.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    op = self.q.get_nowait()
                except queue.Empty:
                    break
                if op is None:
                    self.q.put(None)
                    break
                batch.append(op)
            now = time.time()
            self.conn.execute("BEGIN")
            self.conn.executemany(
                "INSERT INTO messages (chat, role, content, ts) VALUES (?, ?, ?, ?)",
                [(c, r, t, now) for c, r, t, _ in batch],
            )
            self.conn.execute("COMMIT")
            self.loop.call_soon_threadsafe(_settle, [f for *_, f in batch])

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        self.conn.close()


class PgWriter:
    """One task, one connection: each pass inserts every queued row and commits."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.q: asyncio.Queue[Op] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, dsn: str) -> PgWriter:
        import psycopg  # the postgres extra: only this mode needs it

        conn = await psycopg.AsyncConnection.connect(dsn)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS messages (id BIGSERIAL PRIMARY KEY, chat TEXT NOT NULL,"
            " role TEXT NOT NULL, content TEXT NOT NULL, ts DOUBLE PRECISION NOT NULL)"
        )
        await conn.execute("CREATE INDEX IF NOT EXISTS by_chat ON messages (chat, id)")
        await conn.commit()
        writer = cls(conn)
        writer.task = asyncio.create_task(writer._run())
        return writer

    def add(self, chat: str, role: str, content: str) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        self.q.put_nowait((chat, role, content, fut))
        return fut

    async def _run(self) -> None:
        while True:
            batch = [await self.q.get()]
            while not self.q.empty():
                batch.append(self.q.get_nowait())
            now = time.time()
            async with self.conn.cursor() as cur:
                await cur.executemany(
                    "INSERT INTO messages (chat, role, content, ts) VALUES (%s, %s, %s, %s)",
                    [(c, r, t, now) for c, r, t, _ in batch],
                )
            await self.conn.commit()
            _settle([f for *_, f in batch])

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        await self.conn.close()


def _settle(futures: list[asyncio.Future[None]]) -> None:
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


async def serve(home: Path) -> None:
    cfg = yaml.safe_load((home / "config.yaml").read_text())
    port = cfg["platforms"]["api"]["port"]
    model = cfg["agent"]["openai"]
    url = model["base_url"].rstrip("/") + "/chat/completions"
    mode = cfg.get("floor", "http")
    loop = asyncio.get_running_loop()
    writer: Writer | PgWriter | None = None
    if mode == "sqlite":
        writer = Writer(home / "floor.db", loop)
    elif mode == "postgres":
        writer = await PgWriter.open(os.environ["SWITCHBOARD_PG_DSN"])
    http = aiohttp.ClientSession()
    histories: dict[str, list[dict[str, str]]] = {}
    key = os.environ.get(model.get("api_key_env", "OPENAI_API_KEY"), "")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    async def chat(request: web.Request) -> web.Response:
        body: dict[str, Any] = json.loads(await request.read())
        text = body["messages"][-1]["content"]
        chat_id = str(body.get("user", ""))
        if writer is not None:
            await writer.add(chat_id, "user", text)
        history = histories.setdefault(chat_id, [])
        history.append({"role": "user", "content": text})
        payload = json.dumps(
            {"model": model["model"], "messages": history}, separators=(",", ":")
        ).encode()
        async with http.post(url, data=payload, headers=headers) as resp:
            answer = json.loads(await resp.read())
        reply = answer["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": reply})
        if writer is not None:
            await writer.add(chat_id, "assistant", reply)
        out = {
            "id": "chatcmpl-floor",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
        }
        return web.Response(
            body=json.dumps(out, separators=(",", ":")).encode(),
            content_type="application/json",
        )

    async def health(request: web.Request) -> web.Response:
        # the pid, as the daemon's /health says it: tests/daemon.py's wait_healthy checks
        # that the process answering is the one it started
        return web.json_response({"status": "ok", "pid": os.getpid()})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    heap.settle()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    await http.close()
    if isinstance(writer, PgWriter):
        await writer.close()
    elif writer is not None:
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("command", choices=["run"])
    args = parser.parse_args()
    event_loops.run(serve(args.home), "auto")


if __name__ == "__main__":
    main()
