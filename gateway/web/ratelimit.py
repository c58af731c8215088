"""A bounded limiter of failed sign-ins per client address.

After `max_failures` wrong keys within `window_s`, the address is refused (HTTP 429 with
Retry-After) until its oldest failure leaves the window, whatever key it sends next: a
correct key must not be the way to tell a lucky guess. A success forgets the address.
Memory is bounded: at most `max_clients` addresses with at most `max_failures` times each;
past that the least recently seen address is forgotten (an attacker rotating through
that many addresses gains one fresh window per address, no more).

IPv6 clients are keyed by their /64, the smallest block a host usually gets; behind a
reverse proxy every client shares the proxy's address, so the limit is then global.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable


def client_key(remote: str | None) -> str:
    """The address a limit applies to: IPv4 as is, IPv6 by /64, anything else verbatim."""
    if not remote:
        return "?"
    try:
        addr = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is None:
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr.ipv4_mapped or addr) if isinstance(addr, ipaddress.IPv6Address) else str(addr)


class FailureLimiter:
    def __init__(
        self,
        max_failures: int = 10,
        window_s: float = 300.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        self.max_clients = max_clients
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def retry_after(self, key: str) -> int | None:
        """Whole seconds until `key` may try again, or None if it may now."""
        now = self._clock()
        times = self._recent(key, now)
        if times is None or len(times) < self.max_failures:
            return None
        return max(1, math.ceil(times[0] + self.window_s - now))

    def failed(self, key: str) -> None:
        now = self._clock()
        times = self._recent(key, now)
        if times is None:
            times = self._failures[key] = deque(maxlen=self.max_failures)
        times.append(now)
        self._failures.move_to_end(key)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, key: str) -> None:
        self._failures.pop(key, None)
