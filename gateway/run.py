"""The daemon's run loop (`switchboard run`): the interpreter settled, start, READY to
systemd and its watchdog pinged, SIGHUP re-reads the config, SIGTERM or SIGINT drains and
stops."""

from __future__ import annotations

import asyncio
import logging
import signal

from gateway.app import Gateway
from gateway.ops import heap

log = logging.getLogger("gateway.app")  # the daemon's lifecycle logs under one name


def _reload_from_disk(gateway: Gateway) -> None:
    """SIGHUP: re-read the config file; a broken file is reported and ignored."""
    from gateway.config import load_config
    from gateway.errors import ConfigError
    from gateway.ops.envfile import environment

    gateway.notify("RELOADING=1")
    try:
        new = load_config(gateway.config.path, environment(gateway.home))
    except ConfigError as exc:
        log.error("reload refused, keeping the running configuration: %s", exc)
    else:
        restart = gateway.reload(new)
        log.info("configuration reloaded (allowlists, admins, reset policy, log level)")
        if restart:
            log.warning("these changes need a restart to take effect: %s", ", ".join(restart))
    gateway.notify("READY=1")


async def run_until_signalled(gateway: Gateway) -> None:
    """Start, tell systemd we are ready, ping its watchdog from the loop, wait for
    SIGTERM/SIGINT, drain, stop."""
    from gateway.ops.notify import watchdog, watchdog_interval

    heap.tune_interpreter()
    pauses = heap.Pauses()
    pauses.install()
    heap.watch(gateway.metrics, pauses)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, _reload_from_disk, gateway)
    dog: asyncio.Task[None] | None = None
    try:
        await gateway.start()
        log.debug("collector settled: %d objects frozen", heap.settle())
        gateway.notify(
            f"READY=1\nSTATUS=running ({', '.join(a.platform for a in gateway.adapters)})"
        )
        interval = watchdog_interval()
        if interval is not None:
            dog = asyncio.create_task(watchdog(interval), name="systemd.watchdog")
        await stop.wait()
        log.info("signal received; draining")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        if dog is not None:
            dog.cancel()
            await asyncio.gather(dog, return_exceptions=True)
        await gateway.stop()
        pauses.remove()
