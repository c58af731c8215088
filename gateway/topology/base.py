"""What a turn holds while it runs: its key's lease. On one daemon that is the in-process
key lock, which nothing can take away (`LOCAL_LEASE`: no fence, always held); on replicas
it is the key's lease on PostgreSQL, whose fence every turn write carries and which a
stalled process may lose (gateway.cluster)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.leases import HandBack
from state import Fence


class TurnLease:
    """The lease one inbox row's turn runs under (see the module docstring)."""

    __slots__ = ("_ask", "begun", "fence", "freed", "hand_back")

    def __init__(
        self, fence: Fence | None = None, ask: Callable[[], Awaitable[bool]] | None = None,
        begun: tuple[int, list[dict[str, Any]]] | None = None,
    ) -> None:  # fmt: skip
        self.fence = fence  # what the turn's writes carry (None: nothing can take the key)
        self._ask = ask  # reads whether the lease still holds
        # the message was stored in the accept's commit (its id and the history)
        self.begun = begun
        # the lease may be freed with the reply's commit (the last row under it)
        self.hand_back: HandBack | None = None
        self.freed = False  # freed on purpose with the reply's commit: nothing to ask

    @property
    def asks(self) -> bool:
        """Must a late reply ask whether the lease still holds before it goes?"""
        return self.fence is not None and not self.freed and self._ask is not None

    async def holds(self) -> bool:
        """Is the lease still this process's (a read)? Always true for the local lock."""
        return True if self._ask is None else await self._ask()


LOCAL_LEASE = TurnLease()  # one daemon: the key's in-process lock (never changed)
