"""Stored replies sent again: the ones a crash left unconfirmed or a stop left held
(at start-up, and a dead replica's under its key's lease), and the apology for a message
too old to answer. A reply past the outbox's horizon expires instead (gateway.pipeline.
backlog holds and delivers what fails again).

The worker and recovery call it; it never starts a turn.
"""

from __future__ import annotations

import json
import logging

from gateway.adapters import idempotent_replies
from gateway.messages import InboundMessage, OutboxRef
from gateway.services import Services
from gateway.topology.base import Topology
from gateway.topology.leases import ReplyRow
from gateway.turns import APOLOGY, mark_reply, reply_key
from state import content_text

log = logging.getLogger("gateway.router")


def too_old_apology(text: str) -> str:
    """For a message a crash left unanswered longer than recovery.max_age_seconds."""
    quoted = " ".join(text.split())
    if len(quoted) > 60:
        quoted = quoted[:57] + "..."
    return (
        f'Sorry, your message "{quoted}" arrived while the gateway was restarting and '
        "is too old to answer now; please send it again if it still matters."
    )


class Outbox:
    """Sends the stored replies nobody confirmed (claimed first on replicas)."""

    def __init__(self, services: Services, topology: Topology) -> None:
        self.services = services
        self._topology = topology

    async def resend_unconfirmed(self) -> None:
        """Replies a crash left unconfirmed: 'ready' ones are sent now (at least once);
        'sending' ones may have reached the chat, so they are counted, logged and left
        (at most once), unless inbox.resend_unconfirmed_replies asks for at least once or
        the platform's adapter shows a reply sent again under its key once (exactly once)."""
        await self._topology.resend_unconfirmed(self.resend_row)

    async def resend_row(self, row: ReplyRow) -> None:
        """One unconfirmed reply (a row of unsent_replies' shape), claimed first on replicas.
        No turn of this process is sending it: one daemon reads them before any turn runs,
        and a replica gets a dead runner's under the key's lease and local lock. (A task
        here may still wait for the row it took, which a dead replica ran: skipping the
        reply for that let the key's next reply overtake it.)"""
        s = self.services
        inbox_id = int(row["id"])
        if not await self._topology.claim_reply(inbox_id):
            return  # another replica took this dead runner's reply: it sends it
        try:
            msg = InboundMessage.from_payload(json.loads(row["payload"]))
        except (ValueError, TypeError):
            await s.db.mark_reply(inbox_id, "failed")
            return
        safe = s.settings.resend_unconfirmed or idempotent_replies(msg.source.platform)
        if row["reply_state"] == "sending" and not safe:
            s.metrics.unsent.inc()
            log.warning(
                "inbox row %d: its reply may not have reached the chat (the daemon "
                "stopped while sending it); not sent again",
                inbox_id,
            )
            await s.db.mark_reply(inbox_id, "unconfirmed")
            return
        backlog = s.replies.backlog
        received = float(row.get("received_at") or 0.0) or msg.received_at or s.clock()
        src = msg.source
        if backlog is not None and s.clock() > backlog.reply_horizon(
            src.platform, received, received
        ):
            await backlog.expire_unsent(inbox_id, src.platform, src.chat_id)
            return
        text = content_text(row["content"]) or APOLOGY
        ref = await s.replies.reply(
            msg,
            row["session_id"],
            text,
            dedupe_key=reply_key(inbox_id),
            resend=True,
            inbox_id=inbox_id,
            due=received,
        )
        s.metrics.recovered.inc(outcome="reply_resent")
        if not isinstance(ref, OutboxRef):  # held or refused: the outbox's from here
            await mark_reply(s, inbox_id, ref)
