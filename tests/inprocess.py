"""An in-process gateway whose Telegram adapter talks to the loopback FakeTelegram."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gateway.app import Gateway
from gateway.config import load_config
from tests.fakes.telegram import FakeTelegram


@contextlib.asynccontextmanager
async def gateway_with_telegram(
    tmp_path: Path, telegram: str, api: str = "enabled: false"
) -> AsyncIterator[tuple[Gateway, FakeTelegram]]:
    """`telegram` and `api` are one `key: value` line each for those platform sections
    (the Telegram section is enabled and pointed at the fake)."""
    fake = FakeTelegram()
    await fake.start()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"platforms:\n  api:\n    {api}\n  telegram:\n    enabled: true\n"
        f"    {telegram}\n    base_url: {fake.base_url}\n"
    )
    gateway = Gateway(
        config=load_config(cfg, {"TELEGRAM_BOT_TOKEN": fake.token}), home=tmp_path / "home"
    )
    try:
        await gateway.start()
        yield gateway, fake
    finally:
        await gateway.stop()
        await fake.stop()
