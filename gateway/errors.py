"""Typed gateway errors, mapped once at the boundary (CLI exit codes, chat phrases).

    GatewayError (exit 1)
    ├── ConfigError (exit 78: names the key path)
    │   ├── ConfigErrors   several problems found in one pass
    │   └── PortInUse      the HTTP API's port is taken (platforms.api.port)
    ├── AlreadyRunning     a second daemon on the same home
    ├── AgentError         the agent backend failed
    ├── AdapterError       a platform call failed after retries
    │   ├── InvalidToken   the platform refused our credentials
    │   ├── RetryAfter     rate limited: wait `seconds`, then retry (never drop)
    │   ├── TransientError a network or server problem worth retrying
    │   │   └── NotAccepted  an inbound message could not be committed: do not ack it
    │   └── PlatformRefused the platform refused a send for good (exit 77)
    ├── PlatformUnreachable a one-off send that could not reach the platform (exit 69)
    ├── NothingToCompress  /compress on a session too short to summarise
    └── NoHomeChannel      /handoff to a platform with no home channel

The store's errors (`state.StateError` and below) are drawn in `state/__init__.py`.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_IN_USE = 3  # a command that would harm what is in use (a live session); --force overrides
EXIT_UNREACHABLE = 69  # `switchboard send`: the platform could not be reached (try later)
EXIT_RESTART = 75
EXIT_REFUSED = 77  # `switchboard send`: the platform refused (token, chat, permission)
EXIT_CONFIG = 78


class GatewayError(Exception):
    exit_code = EXIT_FAILURE


class ConfigError(GatewayError):
    """A configuration problem; the message names the key path and a hint."""

    exit_code = EXIT_CONFIG

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem

    def all(self) -> list[ConfigError]:
        """Every problem this error stands for (one, unless it is a ConfigErrors)."""
        return [self]


class ConfigErrors(ConfigError):
    """Several configuration problems found in one pass; the first names `key`."""

    def __init__(self, errors: list[ConfigError]) -> None:
        super().__init__(errors[0].key, errors[0].problem)
        self.args = ("\n".join(str(e) for e in errors),)
        self.errors = list(errors)

    def all(self) -> list[ConfigError]:
        return list(self.errors)


class AlreadyRunning(GatewayError):
    def __init__(self, home: str, pid: str) -> None:
        super().__init__(
            f"another switchboard daemon (pid {pid or '?'}) is already running on {home}"
        )


class PortInUse(ConfigError):
    """The HTTP API's port is taken; a restart would only fail again, so it exits 78 like a
    config error and names the key that changes it."""

    def __init__(self, port: object, host: object) -> None:
        super().__init__(
            "platforms.api.port",
            f"port {port} on {host} is already in use by "
            "another program; stop it or choose another port",
        )


class AgentError(GatewayError):
    """The agent backend failed; the chat gets a fixed apology, the log gets the cause."""


class AdapterError(GatewayError):
    """A platform call failed after retries."""


class InvalidToken(AdapterError):
    """The platform refused our credentials: retrying will not help."""


class RetryAfter(AdapterError):
    """Raised by a platform call that was rate limited; carries the wait in seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"rate limited for {seconds:.1f}s")
        self.seconds = seconds


class TransientError(AdapterError):
    """A network or server problem worth retrying."""


class NotAccepted(TransientError):
    """The gateway could not commit an inbound message (the store refused or is shutting
    down). An adapter that sees this must not acknowledge the message to its platform, so
    the platform delivers it again: a webhook answers 503, a stream does not advance its
    cursor. `reason` is "storage" (the store refused) or "shutting_down"."""

    def __init__(self, message: str, reason: str = "storage") -> None:
        super().__init__(message)
        self.reason = reason


class PlatformRefused(AdapterError):
    """The platform answered no to a send (the chat is gone, the bot was blocked or
    removed, a 400 for the text, a permission): sending the same again will not help. The
    outbox records it with its reason and never retries it; `switchboard send` exits 77."""

    exit_code = EXIT_REFUSED


class PlatformUnreachable(GatewayError):
    """`switchboard send`: the platform (or the daemon) could not be reached, or kept
    failing until the time ran out: worth trying again later."""

    exit_code = EXIT_UNREACHABLE


class NothingToCompress(GatewayError):
    """The session is too short to summarise anything."""


class NoHomeChannel(GatewayError):
    """A handoff to a platform that has no home channel (neither /sethome nor config)."""

    def __init__(self, platform: str) -> None:
        super().__init__(
            f"{platform} has no home channel; send /sethome in the chat that should receive "
            f"handoffs (or set platforms.{platform}.home_channel)"
        )
        self.platform = platform


# What the outbox does after a failed send (send_failure)
SEND_TRANSIENT = "transient"  # kept and tried again with backoff, until it expires
SEND_RETRY_AFTER = "retry_after"  # kept; the platform said when to try again
SEND_REFUSED = "refused"  # recorded with its reason, never tried again


def send_failure(exc: BaseException) -> tuple[str, float]:
    """How a failed send is treated, and the wait the platform asked for (retry_after).

    The typed errors say it: RetryAfter, TransientError (5xx, resets, timeouts) and
    InvalidToken (the credentials may be restored: the reply waits for them) and
    PlatformUnreachable are kept;
    PlatformRefused and any other AdapterError are refusals. An untyped error is read along
    its causes: a network error (OSError, a timeout, aiohttp's connection errors) or an HTTP
    status of 5xx is transient, 429 is a retry-after; anything else is a refusal (a bug in
    a send does not heal by waiting)."""
    if isinstance(exc, RetryAfter):
        return SEND_RETRY_AFTER, exc.seconds
    if isinstance(exc, (TransientError, InvalidToken, PlatformUnreachable)):
        return SEND_TRANSIENT, 0.0
    if isinstance(exc, GatewayError):
        return SEND_REFUSED, 0.0
    import aiohttp

    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, RetryAfter):
            return SEND_RETRY_AFTER, cause.seconds
        if isinstance(cause, (TransientError, OSError, TimeoutError)):
            return SEND_TRANSIENT, 0.0
        if isinstance(cause, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)):
            return SEND_TRANSIENT, 0.0
        status = getattr(cause, "status", None)
        if isinstance(status, int) and status >= 500:
            return SEND_TRANSIENT, 0.0
        if status == 429:
            return SEND_RETRY_AFTER, 1.0
        cause = cause.__cause__ or cause.__context__
    return SEND_REFUSED, 0.0
