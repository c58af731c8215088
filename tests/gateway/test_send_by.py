"""SEND_BY in an adapter's aiohttp session (gateway.adapters.base.send_by_trace): a reply
whose request would leave after its turn's SEND_BY stops unsent, wherever the process
stood still on the way out, up to the socket's write. Real aiohttp against a loopback
server that counts what reaches it. And stop_task, which ends an adapter's loops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.adapters.base import Backoff, call_with_retry, send_by_trace, stop_task
from gateway.errors import TransientError
from gateway.messages import LATE_SEND_S, SEND_BY, SetOutLate
from tests.fakes import ON_TIME_S


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[bytes]]]:
    """A loopback server keeping every request body that reached it."""
    got: list[bytes] = []

    async def post(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/send", post)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/send", got
    finally:
        await runner.cleanup()


def standing_still_at(event: str) -> aiohttp.TraceConfig:
    """A trace whose `event` hook stands the whole process still (as SIGSTOP would) past
    LATE_SEND_S: at that point of a request's way out, and nowhere else."""
    trace = aiohttp.TraceConfig()

    async def stall(*_args: Any) -> None:
        time.sleep(LATE_SEND_S + 0.1)  # noqa: ASYNC251  (the process stands still)

    getattr(trace, event).append(stall)
    return trace


async def _send(
    url: str,
    *traces: aiohttp.TraceConfig,
    reuse: bool,
    tries: list[int],
    budget: float = LATE_SEND_S,
) -> None:
    """One reply's request, as a replica's turn sends it: SEND_BY `budget` ahead (LATE_SEND_S
    as a turn sets it; tests.fakes.ON_TIME_S for a request that must go however loaded the
    machine), through call_with_retry with a connection error taken for a transient one, as
    the adapters do (`reuse`: on a connection an earlier request left open, else on a new
    one). `tries` gets one item per attempt."""
    async with aiohttp.ClientSession(trace_configs=[send_by_trace(), *traces]) as http:
        if reuse:
            async with http.post(url, data=b"warm-up") as r:
                await r.read()

        async def attempt() -> None:
            tries.append(1)
            try:
                async with http.post(url, json={"text": "once"}) as r:
                    await r.read()
            except aiohttp.ClientError as exc:
                raise TransientError(str(exc)) from exc

        limit = SEND_BY.set(time.monotonic() + budget)
        try:
            await call_with_retry(attempt, backoff=Backoff(initial_s=0.01))
        finally:
            SEND_BY.reset(limit)


@pytest.mark.parametrize("reuse", [False, True], ids=["new connection", "kept-alive"])
@pytest.mark.parametrize("event", ["on_request_start", "on_request_headers_sent"])
async def test_a_request_that_stood_still_before_its_body_was_written_stops_unsent(
    server: tuple[str, list[bytes]], event: str, reuse: bool
) -> None:
    """Standing still before the connection is had, or after it (the headers are
    buffered: aiohttp writes them with the body, from a task that runs an event-loop pass
    later), the request finds its SEND_BY passed before anything is written: nothing
    reaches the server. In the second case aiohttp wraps the SetOutLate in a connection
    error; it comes out as itself all the same, not retried (a retry would find the
    SEND_BY passed too, but only after a backoff). Before the body's own check, the
    second case went out."""
    url, got = server
    tries: list[int] = []
    with pytest.raises(SetOutLate):
        await _send(url, standing_still_at(event), reuse=reuse, tries=tries)
    assert [b for b in got if b != b"warm-up"] == []
    assert len(tries) == 1


@pytest.mark.parametrize("reuse", [False, True], ids=["new connection", "kept-alive"])
async def test_a_request_on_time_goes_once(server: tuple[str, list[bytes]], reuse: bool) -> None:
    url, got = server
    tries: list[int] = []
    await _send(url, reuse=reuse, tries=tries, budget=ON_TIME_S)
    assert len(tries) == 1
    assert [b for b in got if b != b"warm-up"] == [b'{"text": "once"}']


async def test_without_send_by_a_request_is_never_stopped(server: tuple[str, list[bytes]]) -> None:
    """Tasks that set no SEND_BY (one daemon, an adapter's own polling) are not checked,
    however long the process stood still."""
    url, got = server
    async with aiohttp.ClientSession(
        trace_configs=[send_by_trace(), standing_still_at("on_request_headers_sent")]
    ) as http:
        async with http.post(url, data=b"polled") as r:
            assert r.status == 200
    assert got == [b"polled"]


@pytest.mark.slow
async def test_stop_task_ends_a_loop_that_swallowed_its_cancel() -> None:
    """An adapter's loop whose cancel was swallowed on its way (Python 3.11's
    asyncio.wait_for returns an inner result that completed as the cancel came) goes on
    into its next long wait; stop_task cancels it again until it has ended, instead of
    waiting with it (seen: the email adapter's IDLE loop, poll_s an hour, hung a test run)."""
    swallowed = 0

    async def loop() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)  # the next IDLE, an hour long
            except asyncio.CancelledError:
                if swallowed == 2:
                    raise
                swallowed += 1  # as wait_for on 3.11 may: the loop goes on

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)  # the loop is in its wait
    stopping = asyncio.ensure_future(stop_task(task))
    try:  # a guard of 10 s, so that a stop that waits with the loop fails instead of hanging
        done, _ = await asyncio.wait({stopping}, timeout=10)
        assert stopping in done, "stop_task waited with a loop that swallowed its cancel"
        assert task.done() and swallowed == 2
    finally:
        stopping.cancel()
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
