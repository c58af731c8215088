"""Which event loop `switchboard run` runs on (`runtime.event_loop`).

uvloop (libuv under asyncio's interface, kept by MagicStack) is the
default where it is installed: it is a dependency on Linux and macOS, and has no Windows
build. Measured with `bench/cluster_bench.py`'s load, three rounds alternated with the same
code on asyncio's loop (docs/benchmarks.md): the daemon's CPU per message
0.39-0.40 ms against 0.42-0.43 on one PostgreSQL replica and 0.86-0.87 against 0.92-0.96 on
three, and 3-5% more messages a second. `asyncio` is there for a platform library that
misbehaves on uvloop. The test suite runs on the daemon's default (SWITCHBOARD_TEST_LOOP=asyncio
runs it on asyncio's loop; both pass).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from importlib.util import find_spec
from typing import Any


def has_uvloop() -> bool:
    return find_spec("uvloop") is not None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for `choice` (auto | uvloop | asyncio); None: asyncio's own loop."""
    if choice == "asyncio" or (choice == "auto" and not has_uvloop()):
        return None
    import uvloop

    return uvloop.new_event_loop


def running() -> str | None:
    """The running loop's kind, as /health names it: uvloop or asyncio (None: no loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, None], choice: str) -> None:
    """Run `main` to its end on the loop `choice` names."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        runner.run(main)
