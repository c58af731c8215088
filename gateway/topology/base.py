"""What the pipeline asks of a topology (`Topology`: accept, lease, orphans, the resend of
unconfirmed replies), what a key's lease holds (`KeyLease`) and what a turn holds while it
runs (`TurnLease`). On one daemon the lease is the in-process key lock, which nothing can
take away (`LOCAL_LEASE`: no fence, always held); on replicas it is the key's lease on
PostgreSQL, whose fence every turn write carries and which a stalled process may lose
(gateway.topology.cluster)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from gateway.index import RouteIndex
from gateway.shards import ShardLedger
from gateway.topology.coordinator import Coordinator
from gateway.topology.leases import HandBack, InboxRow, ReplyRow, ResetNotice, Stored
from state import BeginPlan, Fence

if TYPE_CHECKING:
    from gateway.messages import InboundMessage
    from gateway.session_keys import SessionKey


class TurnLease:
    """The lease one inbox row's turn runs under (see the module docstring)."""

    __slots__ = ("_ask", "begun", "fence", "freed", "hand_back")

    def __init__(
        self,
        fence: Fence | None = None,
        ask: Callable[[], Awaitable[bool]] | None = None,
        begun: Stored | None = None,
    ) -> None:
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


# one unconfirmed reply (a row of unsent_replies' shape) -> sent again, or left
ResendRow = Callable[[ReplyRow], Awaitable[None]]
# asked by `accept` only where the lease can come with the commit: a turn's begin within
# its accept's commit (state.BeginPlan: the user's message, the history's length and where
# it may begin, gateway.pipeline.intake.begins_in)
PlanBegin = Callable[["InboundMessage", "SessionKey"], "BeginPlan | None"]


class KeyLease(Protocol):
    """A session key held for its rows: the fence its writes carry (None: one daemon's
    in-process lock, which nothing takes away), the key's open inbox rows to run in id
    order, and a dead runner's unconfirmed replies to send before them."""

    @property
    def fence(self) -> Fence | None: ...

    @property
    def open(self) -> list[InboxRow]: ...

    @property
    def unsent(self) -> Sequence[ReplyRow]: ...


class Topology(Protocol):
    """Where a key's work may run (see the module docstring): the pipeline's only view of
    one daemon or several replicas."""

    @property
    def index(self) -> RouteIndex: ...

    @property
    def coordinator(self) -> Coordinator: ...

    @property
    def ages_under_lease(self) -> bool:
        """Is a recovered row's age judged under its key's lease (another replica may
        answer it meanwhile), rather than at the recovery scan?"""
        ...

    async def accept(
        self, k: str, key: SessionKey, msg: InboundMessage, *, lease: bool, begin: PlanBegin
    ) -> tuple[int, str, bool, Stored | None]:
        """Commit an inbound message for key `k` to the inbox: (inbox id, state, new,
        begun). With `lease`, the key's lease may come with the commit (replicas) and the
        turn's begin too, as `begin` plans it: `begun` is then begin_turn's result (the
        message's id and the history), else None."""
        ...

    def try_lock(self, k: str) -> Callable[[], None] | None:
        """Take the key now, without waiting, when nobody holds or awaits it: its release,
        else None (always None where taking it means waiting on a database)."""
        ...

    def lease(
        self, k: str, inbox_id: int
    ) -> contextlib.AbstractAsyncContextManager[KeyLease | None]:
        """Hold the key for inbox row `inbox_id` and the key's other open rows; None when
        that row was answered elsewhere while waiting."""
        ...

    def turn_lease(
        self, lease: KeyLease, row: InboxRow, last: bool, stored: Stored | None
    ) -> TurnLease:
        """What one row's turn carries under `lease` (`last`: the last row it runs, whose
        reply's commit may free it; `stored`: the row's turn began in its accept)."""
        ...

    def ran(self, lease: KeyLease, row: InboxRow) -> None:
        """`row` was answered under `lease` (replicas wake the replica that took it)."""
        ...

    async def row_open(self, inbox_id: int) -> bool:
        """Is this inbox row still received/started (nobody answered or dropped it)?"""
        ...

    def use_reset_notice(self, notice: ResetNotice) -> None:
        """How a reset whose process died before announcing it is worded, when found."""
        ...

    def shards(self, platform: str) -> ShardLedger | None:
        """Who runs which of a platform's long-lived connections (None: this process runs
        them all)."""
        ...

    async def startup_rows(self) -> Sequence[InboxRow] | None:
        """The open inbox rows a crash left, read before intake starts (None: they are
        read by `orphans` instead)."""
        ...

    async def orphans(self, read_early: Sequence[InboxRow] | None) -> Sequence[InboxRow]:
        """The rows recovery runs again, in the order it runs them."""
        ...

    async def resend_unconfirmed(self, resend: ResendRow) -> None:
        """Hand every reply a crash (or a dead replica) left unconfirmed to `resend`, each
        while no new turn of its key can send in between."""
        ...

    async def claim_reply(self, inbox_id: int) -> bool:
        """May this process send that unconfirmed reply (no other replica took it)?"""
        ...
