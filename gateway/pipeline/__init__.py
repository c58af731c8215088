"""The message pipeline: intake, the per-key worker, recovery, the outbox resend and the
in-flight bookkeeping they share. `Router` (gateway.pipeline.intake) is its face."""

from gateway.pipeline.intake import REFUSAL, Router
from gateway.pipeline.worker import STORAGE_APOLOGY, UNSTORABLE_APOLOGY
from gateway.services import AccessRules, RouterSettings, Sender, TurnEvents
from gateway.turns import APOLOGY

__all__ = [
    "APOLOGY",
    "REFUSAL",
    "STORAGE_APOLOGY",
    "UNSTORABLE_APOLOGY",
    "AccessRules",
    "Router",
    "RouterSettings",
    "Sender",
    "TurnEvents",
]
