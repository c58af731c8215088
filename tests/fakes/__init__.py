"""Loopback fakes of the platform APIs, driven by the real client libraries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

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
