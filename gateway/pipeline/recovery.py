"""Recovery: at start-up, the replies and turns a crash left (read before intake, while
new messages are held), and on replicas the takeover scan of rows whose replica is gone.
Both run rows through the worker, in order, once each; one too old gets an apology.
"""

from __future__ import annotations

import json
import logging

from gateway.messages import InboundMessage
from gateway.pipeline.inflight import InFlight
from gateway.pipeline.outbox import Outbox, too_old_apology
from gateway.pipeline.worker import Worker
from gateway.services import Services
from gateway.topology.base import Topology
from state import DROPPED

log = logging.getLogger("gateway.router")


class Recovery:
    """The start-up and takeover scans (see the module docstring)."""

    def __init__(
        self,
        services: Services,
        flight: InFlight,
        worker: Worker,
        outbox: Outbox,
        topology: Topology,
    ) -> None:
        self.services = services
        self._flight = flight
        self._inflight = flight.running
        self._worker = worker
        self._outbox = outbox
        self._topology = topology

    async def hold_until_recovered(self) -> None:
        """Called before the adapters start: messages they hand over are committed (and so
        acknowledged) at once, but their turns wait until `recover` has sent the replies and
        queued the turns a crash left, so a chat's replies come in the order of its messages
        (a new message's reply never overtakes an older one's resend or re-run). The rows a
        crash left are read now, before intake: a row read later could be one this process
        just took, whose turn the hold runs (it would run twice)."""
        if self._flight.held is None:
            self._flight.held = {}
            self._flight.crashed = await self._topology.startup_rows()

    async def recover(self, max_age_s: float) -> tuple[int, int]:
        """Send the replies a crash left unconfirmed, then run again, in order, the turns it
        left unfinished (once each; one older than `max_age_s` gets a short apology naming
        it instead), then the turns of messages taken meanwhile (held). Returns (re-run,
        apologised)."""
        try:
            await self._outbox.resend_unconfirmed()
            return await self._rerun_open(max_age_s)
        finally:
            held, self._flight.held = self._flight.held or {}, None
            for inbox_id in sorted(held):  # taken after the open rows were read: newer
                self._worker.run(held[inbox_id], inbox_id)

    async def _rerun_open(self, max_age_s: float) -> tuple[int, int]:
        s = self.services
        self._flight.max_age_s = max_age_s
        rerun = apologised = 0
        crashed, self._flight.crashed = self._flight.crashed, None
        rows = await self._topology.orphans(crashed)
        for row in rows:
            inbox_id = int(row["id"])
            if self._flight.held is not None and self._flight.held.pop(inbox_id, None) is not None:
                self._inflight.discard(inbox_id)  # taken again while held: run it from here
            if inbox_id in self._inflight:
                continue
            try:
                msg = InboundMessage.from_payload(json.loads(row["payload"]))
            except (ValueError, TypeError) as exc:
                log.error("inbox row %d cannot be read (%s); dropped", inbox_id, exc)
                await s.db.finish_inbound(inbox_id, DROPPED, "unreadable")
                continue
            if (
                not self._topology.ages_under_lease
                and s.clock() - float(row["received_at"]) > max_age_s
            ):
                # (else decided under the key's lease, in Worker._run_row)
                await s.replies.reply(msg, row["session_id"], too_old_apology(msg.text))
                await s.db.finish_inbound(inbox_id, DROPPED, "too_old")
                s.metrics.recovered.inc(outcome="apologised")
                apologised += 1
                continue
            if msg.platform_message_id is not None:
                s.coordinator.remember(
                    (msg.source.platform, msg.source.chat_id, msg.platform_message_id)
                )
            s.metrics.recovered.inc(outcome="rerun")
            self._worker.run(msg, inbox_id)
            rerun += 1
        if rerun or apologised:
            log.warning(
                "recovered %d interrupted turn(s); %d too old, apologised for", rerun, apologised
            )
        return rerun, apologised
