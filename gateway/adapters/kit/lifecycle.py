"""What an adapter reports to /health and how a webhook adapter starts: its state and last
error, and the start that asks the platform who the credentials belong to. Retries of a
failed start belong to `gateway.adapters.base.SupervisedStart`."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.errors import AdapterError, InvalidToken
from gateway.vocab import AdapterState


def failed(why: str) -> str:
    """The state text of an adapter that could not start."""
    return f"{AdapterState.FAILED}: {why}"


class Reports(Protocol):
    """The two fields /health shows of every adapter, and its platform (a class
    attribute of each adapter, only read here)."""

    @property
    def platform(self) -> str: ...

    state: str
    last_error: str | None


def refused(
    adapter: Reports,
    exc: BaseException,
    *,
    by: str,
    credential: str,
    refused_as: str = "invalid token",
    log: logging.Logger,
    detail: bool = False,
) -> InvalidToken:
    """`by` refused the adapter's `credential`: the adapter is failed(`refused_as`), one
    ERROR line says so, and the InvalidToken to raise (from `exc`) is returned; it names
    the credential (and, with `detail`, what the platform said)."""
    adapter.state = failed(refused_as)
    log.error("%s refused the %s; the adapter is stopped (%s)", by, credential, exc)
    return InvalidToken(f"{by} rejected the {credential}" + (f" ({exc})" if detail else ""))


async def start_whoami(
    adapter: Reports,
    whoami: Callable[[], Awaitable[str]],
    *,
    by: str,
    credential: str,
    refused_as: str,
    unreachable: str,
    log: logging.Logger,
) -> str | None:
    """Start an adapter whose platform posts to our webhooks: ask `by` (the platform's
    service) who the `credential` belongs to. Refused: the adapter's state becomes
    failed(`refused_as`) and InvalidToken is raised (it stops). Unreachable: noted as the
    last error with `unreachable` in the log, and the adapter runs anyway (webhooks still
    arrive, sends retry). Returns the name the platform gave, or None."""
    found: str | None = None
    try:
        found = await whoami()
    except InvalidToken as exc:
        raise refused(
            adapter, exc, by=by, credential=credential, refused_as=refused_as, log=log
        ) from exc
    except AdapterError as exc:
        adapter.last_error = str(exc)
        log.warning("%s: %s: %s", adapter.platform, unreachable, exc)
    adapter.state = AdapterState.RUNNING
    return found
