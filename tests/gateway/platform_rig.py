"""What the platform tests share: the platform's fake as a fixture, a daemon with one platform
enabled against that fake, the URL its api server serves a webhook at, its adapter and a session's stored
messages; an adapter's webhook served without a daemon over a store that can be down; and
the problems a config section is refused with."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gateway.adapters.api import ApiAdapter
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted
from gateway.messages import InboundMessage
from tests.fakes import running

A = TypeVar("A")
F = TypeVar("F")


def fake_fixture(make: Callable[[], F]) -> Any:
    """The `fake` fixture of a platform's tests: `make()`'s fake, started for the test and
    stopped after it (`fake = fake_fixture(FakeTwilio)` in the test module)."""

    @pytest.fixture
    async def fake() -> AsyncIterator[F]:
        async with running(make()) as server:
            yield server

    return fake


def platform_daemon(
    tmp_path: Path, platform: str, keys: str, env: Mapping[str, str], *, api: bool = False
) -> Gateway:
    """A daemon (not started) at tmp_path/home whose config.yaml enables `platform` for every
    user, with `keys` the section's further lines (each indented four spaces). With `api`
    the api server listens on a free loopback port (it serves the platform's webhooks);
    without, it is off."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "platforms:\n  api:\n"
        + ("    port: 0\n" if api else "    enabled: false\n")
        + f"  {platform}:\n    enabled: true\n    allow_all_users: true\n{keys}"
    )
    return Gateway(config=load_config(cfg, dict(env)), home=tmp_path / "home")


def webhook_url(gateway: Gateway, path: str) -> str:
    """Where the running daemon's api server serves `path`."""
    api = next(a for a in gateway.adapters if isinstance(a, ApiAdapter))
    return f"http://127.0.0.1:{api.bound_port}{path}"


def adapter_of(gateway: Gateway, cls: type[A]) -> A:
    """The daemon's adapter of class `cls`."""
    return next(a for a in gateway.adapters if isinstance(a, cls))


async def stored(gateway: Gateway, key: str) -> list[str]:
    """The contents of the session `key`'s messages in the daemon's store, oldest first."""
    assert gateway.index is not None and gateway.db is not None
    entry = gateway.index.get(key)
    assert entry is not None, key
    return [m["content"] for m in await gateway.db.get_messages(entry.session_id)]


@dataclass
class StoreDown:
    """The core's emit over a store that is down until `up` is set: a message handed over
    while it is down raises NotAccepted (the adapter must not acknowledge it); `seen` holds
    the messages taken once it is up."""

    up: bool = False
    seen: list[InboundMessage] = field(default_factory=list)

    async def emit(self, msg: InboundMessage) -> None:
        if not self.up:
            raise NotAccepted("the store is down")
        self.seen.append(msg)


@contextlib.asynccontextmanager
async def webhook_alone(
    adapter: Any, path: str, emit: Callable[[InboundMessage], Awaitable[None]]
) -> AsyncIterator[str]:
    """`adapter` started on `emit`, its routes served by an api server of its own on a free
    loopback port, without a daemon: the URL of `path` there. Both stop after the block."""
    server = ApiAdapter(port=0, routes=dict(adapter.routes()))
    await server.start(emit)
    await adapter.start(emit)
    try:
        yield f"http://127.0.0.1:{server.bound_port}{path}"
    finally:
        await adapter.stop()
        await server.stop()


def config_problems(tmp_path: Path, section: str, env: Mapping[str, str]) -> dict[str, str]:
    """The problems a config of `section` (the lines below `platforms:`) is refused with,
    by key (empty when it loads); a key refused twice has both problems, joined by "; "."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n" + section)
    try:
        load_config(cfg, dict(env))
    except ConfigError as exc:
        found: dict[str, str] = {}
        for e in exc.all():  # a refused value also counts as missing: keep both problems
            found[e.key] = f"{found[e.key]}; {e.problem}" if e.key in found else e.problem
        return found
    return {}
