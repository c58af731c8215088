"""What a coordinator of several replicas adds to `Coordinator`: key leases carrying a
`Fence`, the open inbox rows a lease holder runs, the takeover of orphaned rows and the
leader flag. gateway/topology/cluster.py implements it on PostgreSQL; gateway.topology.replicated
is the pipeline's view of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.index import IndexEntry
from gateway.topology.coordinator import Coordinator
from state import BeginPlan, Fence, Release

# An open inbox row and an unconfirmed reply as the store hands them over: the fields of
# state.records' InboxEntry and UnsentReply (the store's plain reads give them as dicts)
InboxRow = Mapping[str, Any]
ReplyRow = Mapping[str, Any]

# How a reset is worded for its chat: (the key's entry, the end reason, the old session's
# row with `id`, `title`, `message_count`) -> the notice, or None when its policy says none.
ResetNotice = Callable[[IndexEntry, str, Mapping[str, Any]], str | None]


@dataclass
class Lease:
    """A session key held across replicas: its fence, the key's open inbox rows when it was
    taken (id order), its dead runners' unconfirmed replies, and the rows answered under it
    that another replica took (so that replica is woken to answer its caller)."""

    fence: Fence
    open: list[InboxRow]
    answered: list[tuple[int, int]] = field(default_factory=list)  # (origin, inbox id)
    # replies of the key committed by a replica that died before confirming them sent (the
    # shape of orphaned_replies): the holder sends them before running `open`, so a chat's
    # replies keep their order across a takeover
    unsent: list[ReplyRow] = field(default_factory=list)
    freed: bool = False  # freed with a turn's last write (HandBack), not when left


@dataclass(frozen=True)
class HandBack:
    """How the last turn under a lease frees it with its reply's commit (end_turn's
    `release`) rather than with a write of its own after the send: `plan()` is what that
    commit writes (the route as left, the rows answered for other replicas), `done()` is
    called once it committed. Only for a reply that no other reply of its chat can
    overtake (gateway.adapters.replies_in_request) and with nothing after the send that
    needs the lease (an automatic compression)."""

    plan: Callable[[], Release]
    done: Callable[[], None]


Stored = tuple[int, list[dict[str, Any]]]  # a turn begun in its accept: message id, history


class SharedCoordinator(Coordinator, Protocol):
    """A coordinator for several replicas sharing one store."""

    @property
    def me(self) -> int:
        """This replica's incarnation (what its inbox rows and leases name)."""
        ...

    @property
    def leading(self) -> bool:
        """Whether this replica runs the leader-only work (the reset sweep, pruning)."""
        ...

    async def accept(
        self,
        key: str,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        lease: bool,
        begin: BeginPlan | None = None,
    ) -> tuple[int, str, bool, Stored | None]:
        """Commit an inbound message for `key` (inbox id, state, new, begun); with `lease`,
        the key's lease may come with the commit, for `lease(key, inbox_id)` to adopt, and
        with `begin` (the user's message, the history's length, where it may begin) the
        turn's begin too: `begun` is then begin_turn's result, else None."""
        ...

    def lease(
        self, key: str, inbox_id: int | None = None
    ) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """Hold `key` here and across replicas; None when `inbox_id` was answered
        elsewhere while waiting."""
        ...

    def lease_now(self, key: str) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """`lease` without waiting: None when work here or another live replica holds it."""
        ...

    def hand_back(self, lease: Lease, answered: Sequence[tuple[int, int]] = ()) -> HandBack:
        """For the last row run under `lease`: how its reply's commit frees the lease
        (`answered`: that row's origin and id, when another replica took it)."""
        ...

    async def row_open(self, inbox_id: int) -> bool:
        """Is this inbox row still received/started (nobody answered or dropped it)?"""
        ...

    async def holds(self, fence: Fence) -> bool:
        """Is the lease `fence` names still this replica's (a read)? True when the store
        cannot tell (the reply goes, as it would without the question)."""
        ...

    async def orphaned_inbound(self) -> Sequence[InboxRow]:
        """Open inbox rows no live replica works on (the takeover scan)."""
        ...

    async def orphaned_replies(self) -> Sequence[ReplyRow]:
        """Unconfirmed replies whose turn ran on a replica that is gone."""
        ...

    async def claim_reply(self, inbox_id: int) -> bool:
        """Take one of those replies for this replica to send; False when another live
        replica took it first."""
        ...

    async def sync_jobs(self) -> None:
        """Refresh other replicas' live jobs (before a reset sweep)."""
        ...

    def use_reset_notice(self, notice: ResetNotice) -> None:
        """How to word the notice of a reset whose replica died before writing the key's
        route back, found when the key is next leased (the Resetter's wording)."""
        ...
