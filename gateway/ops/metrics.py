"""In-process metrics rendered as Prometheus text: counters, gauges and histograms."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels
    )
    return "{" + inner + "}"


class Counter:
    def __init__(self, name: str, help_: str) -> None:
        self.name, self.help = name, help_
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def inc(self, amount: float = 1, **labels: str) -> None:
        key = tuple(labels.items()) if len(labels) < 2 else tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0) + amount

    def total(self) -> float:
        return sum(self.values.values())

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        lines += [f"{self.name}{_labels(k)} {v:g}" for k, v in sorted(self.values.items())] or [
            f"{self.name} 0"
        ]
        return lines


class Gauge:
    """A value read when rendered; kind "counter" for one that only grows (a total kept
    elsewhere, such as the writer's commit count)."""

    def __init__(
        self, name: str, help_: str, read: Callable[[], float], kind: str = "gauge"
    ) -> None:
        self.name, self.help, self.read, self.kind = name, help_, read, kind

    def render(self) -> list[str]:
        return [
            f"# HELP {self.name} {self.help}",
            f"# TYPE {self.name} {self.kind}",
            f"{self.name} {self.read():g}",
        ]


class LabelledGauge:
    """A gauge per value of one label, read when rendered: `read` returns {value: number}
    (set by the part that knows, e.g. the outbox's held items per platform)."""

    def __init__(self, name: str, help_: str, label: str) -> None:
        self.name, self.help, self.label = name, help_, label
        self.read: Callable[[], Mapping[str, float]] = dict

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        values = self.read()
        lines += [
            f"{self.name}{_labels(((self.label, k),))} {v:g}" for k, v in sorted(values.items())
        ]
        return lines if values else [*lines, f"{self.name} 0"]


class Histogram:
    def __init__(self, name: str, help_: str, buckets: tuple[float, ...]) -> None:
        self.name, self.help, self.buckets = name, help_, buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {running}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines += [f"{self.name}_sum {self.sum:g}", f"{self.name}_count {self.count}"]
        return lines


class Metrics:
    def __init__(self) -> None:
        self.messages_in = Counter("switchboard_messages_in_total", "Inbound messages by platform")
        self.messages_out = Counter(
            "switchboard_messages_out_total", "Outbound messages by platform"
        )
        self.turns = Counter("switchboard_turns_total", "Agent turns by outcome")
        self.errors = Counter("switchboard_errors_total", "Errors by kind")
        self.dropped = Counter(
            "switchboard_inbound_dropped_total", "Inbound messages not answered, by reason"
        )
        self.resets = Counter("switchboard_resets_total", "Session resets by reason")
        self.handoffs = Counter("switchboard_handoffs_total", "Handoffs by outcome")
        self.unsent = Counter(
            "switchboard_unsent_replies_total",
            "Replies a crash left unconfirmed and not sent again (at most once)",
        )
        self.recovered = Counter(
            "switchboard_recovered_turns_total",
            "Turns a crash left unfinished, at start-up: rerun or apologised",
        )
        self.turn_latency = Histogram(
            "switchboard_turn_seconds",
            "Inbound to reply latency",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.outbox_pending = LabelledGauge(
            "switchboard_outbox_pending",
            "Replies and sends held in the outbox for delivery, by platform",
            "platform",
        )
        self.outbox_delivered = Counter(
            "switchboard_outbox_delivered_total", "Held replies and sends delivered, by platform"
        )
        self.outbox_expired = Counter(
            "switchboard_outbox_expired_total",
            "Held replies and sends that expired undelivered, by platform",
        )
        self.outbox_refused = Counter(
            "switchboard_outbox_refused_total",
            "Replies and sends the platform refused for good, by platform",
        )
        self.gauges: list[Gauge] = []
        self.last_error: str | None = None  # the latest failure handling a message (/health)

    def gauge(self, name: str, help_: str, read: Callable[[], float], kind: str = "gauge") -> None:
        self.gauges.append(Gauge(name, help_, read, kind))

    def render(self) -> str:
        lines: list[str] = []
        every: tuple[Counter | LabelledGauge | Histogram | Gauge, ...] = (
            self.messages_in,
            self.messages_out,
            self.turns,
            self.errors,
            self.dropped,
            self.resets,
            self.handoffs,
            self.recovered,
            self.unsent,
            self.outbox_pending,
            self.outbox_delivered,
            self.outbox_expired,
            self.outbox_refused,
            self.turn_latency,
            *self.gauges,
        )
        for metric in every:
            lines += metric.render()
        return "\n".join(lines) + "\n"
