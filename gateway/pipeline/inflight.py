"""The in-flight bookkeeping the pipeline's parts share: the inbox rows running in this
process, the turns accepted but not yet queued on their key's lock, the messages held
until start-up recovery has run and the rows a crash left, read before intake.

Intake, the worker and recovery each hold the one `InFlight`; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.messages import InboundMessage
from gateway.topology.leases import InboxRow


class InFlight:
    """The per-message collections (plain sets and dicts: read on every message)."""

    __slots__ = ("crashed", "done_here", "held", "max_age_s", "pending", "running")

    def __init__(self) -> None:
        self.running: set[int] = set()  # inbox ids whose turn runs in this process
        self.done_here: set[int] = set()  # rows another local task's lease ran for it
        # key -> turns accepted but not yet queued on the key's lock (see Worker.run)
        self.pending: dict[str, int] = {}
        # inbox id -> message taken while start-up recovery has not run yet (None: not held)
        self.held: dict[int, InboundMessage] | None = None
        self.crashed: Sequence[InboxRow] | None = None  # open rows read before intake
        self.max_age_s: float | None = None  # recovery.max_age_seconds, once recovery ran

    def pend(self, k: str) -> None:
        self.pending[k] = self.pending.get(k, 0) + 1

    def unpend(self, k: str) -> None:
        left = self.pending[k] - 1
        if left:
            self.pending[k] = left
        else:
            del self.pending[k]
