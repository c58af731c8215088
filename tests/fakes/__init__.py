"""Loopback fakes of the platform APIs, driven by the real client libraries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from gateway.messages import LATE_SEND_S, SEND_BY, SetOutLate

T = TypeVar("T")


async def wait_for_count(read: Callable[[], list[T]], n: int, timeout: float, what: str) -> list[T]:
    """Poll `read()` until it holds at least `n` items; a bounded wait for every fake."""
    deadline = time.monotonic() + timeout
    while len(items := read()) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"expected {n} {what}, saw {items}")
        await asyncio.sleep(0.01)
    return items


@contextlib.asynccontextmanager
async def running(fake: Any) -> AsyncIterator[Any]:
    """A platform fake, started for the block and stopped after it whatever happened."""
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


@contextlib.asynccontextmanager
async def started(adapter: Any) -> AsyncIterator[Any]:
    """An adapter, started for the block (inbound messages ignored) and stopped after it."""

    async def ignore(_msg: Any) -> None:
        return None

    await adapter.start(ignore)
    try:
        yield adapter
    finally:
        await adapter.stop()


# The SEND_BY of a send that does not stand still: far enough ahead that no load on the
# machine running the tests makes it late (the on-time cases check that a send before its
# limit goes, not how soon; a CI run once took more than LATE_SEND_S to connect one).
ON_TIME_S = 30.0


async def send_standing_still(send: Callable[[], Awaitable[Any]], *, stall: bool) -> bool:
    """Run an adapter's `send()` as a replica's turn does: with `stall`, SEND_BY LATE_SEND_S
    ahead and the whole process standing still (as under SIGSTOP) once the send has begun
    and its request waits to connect (a fake with keep_alive off); without, SEND_BY
    ON_TIME_S ahead. True when the send went, False when it stopped unsent (SetOutLate)."""
    limit = SEND_BY.set(time.monotonic() + (LATE_SEND_S if stall else ON_TIME_S))
    try:
        sending = asyncio.ensure_future(send())
        await asyncio.sleep(0)  # the send has begun: its request waits for a connection
        if stall:
            time.sleep(LATE_SEND_S + 0.1)  # noqa: ASYNC251  (the process stands still)
        try:
            await sending
        except SetOutLate:
            return False
        return True
    finally:
        SEND_BY.reset(limit)


async def stalled_then_on_time(
    send: Callable[[], Awaitable[Any]], seen: Callable[[], list[Any]]
) -> None:
    """A reply (`send` sends "once") standing still on its way out, then on time: stalled,
    it stops unsent (SetOutLate) and `seen()`, what the fake received, stays empty; on
    time it goes, and `seen()` is ["once"]."""
    for stall in (True, False):
        went = await send_standing_still(send, stall=stall)
        assert went is not stall, "stalled, yet it went" if stall else "on time, yet it stopped"
        assert seen() == ([] if stall else ["once"])


def connection_closer(fake: Any) -> Any:
    """An aiohttp middleware for a fake whose `keep_alive` is False: every answer closes its
    connection, so the client's next call connects (send_standing_still needs a send that
    waits for its connection)."""

    @web.middleware
    async def closing(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        if not fake.keep_alive:
            response.force_close()
        return response

    return closing


# --- failure injection on a fake's send path ------------------------------------------

# What an Outage can do to one send request: a status ("502", "503", "500"), "429:<s>"
# (rate limited, retry after s seconds), "403" (refused for good), "reset" (the connection
# closes without an answer) or "timeout:<s>" (no answer for s seconds, then a 504).
Failure = str
# (status, retry-after seconds or None, the request) -> the platform's own error answer
ErrorBody = Callable[[int, "float | None", web.Request], Awaitable[web.StreamResponse]]
# is this request a send? (a bool, or awaited for one that reads the body)
IsSend = Callable[[web.Request], "bool | Awaitable[bool]"]


async def json_error(
    status: int, retry_after: float | None, _request: web.Request
) -> web.StreamResponse:
    """A plain JSON error with a Retry-After header on 429 (most HTTP platforms)."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    body = {"error": f"injected {status}", "message": f"injected {status}", "code": status}
    if retry_after is not None:
        body["retry_after"] = retry_after
    return web.json_response(body, status=status, headers=headers)


class Outage:
    """The failure-injection switch every platform fake carries (`fake.outage`): `fail(*f)`
    scripts the next send requests' failures, one each; `down(f)` fails every send with `f`
    until `up()`. `failed` counts the requests it failed. A fake installs `middleware`,
    saying which requests are sends and how its platform words an error."""

    def __init__(self) -> None:
        self.script: list[Failure] = []
        self.mode: Failure | None = None
        self.failed = 0

    def fail(self, *failures: Failure) -> None:
        self.script.extend(failures)

    def down(self, failure: Failure = "502") -> None:
        self.mode = failure

    def up(self) -> None:
        self.mode, self.script = None, []

    def take(self) -> Failure | None:
        if self.script:
            return self.script.pop(0)
        return self.mode

    async def answer(self, request: web.Request, body: ErrorBody) -> web.StreamResponse | None:
        """The injected failure for this send request, or None to let it through."""
        failure = self.take()
        if failure is None:
            return None
        self.failed += 1
        kind, _, arg = failure.partition(":")
        if kind == "reset":
            if request.transport is not None:
                request.transport.abort()  # the client sees the connection drop unanswered
            return web.Response(status=500)
        if kind == "timeout":
            await asyncio.sleep(float(arg or 30))
            return await body(504, None, request)
        status = int(kind)
        return await body(status, float(arg or 1) if status == 429 else None, request)

    def middleware(self, is_send: IsSend, body: ErrorBody = json_error) -> Any:
        """An aiohttp middleware failing the requests `is_send` picks as scripted."""
        outage = self

        @web.middleware
        async def injecting(request: web.Request, handler: Any) -> web.StreamResponse:
            if outage.script or outage.mode:
                picked = is_send(request)
                if not isinstance(picked, bool):
                    picked = await picked
                failed = await outage.answer(request, body) if picked else None
                if failed is not None:
                    return failed
            response: web.StreamResponse = await handler(request)
            return response

        return injecting
