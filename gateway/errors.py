"""Typed gateway errors, mapped once at the boundary (CLI exit codes, chat phrases)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_RESTART = 75
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
        super().__init__("platforms.api.port", f"port {port} on {host} is already in use by "
                         "another program; stop it or choose another port")  # fmt: skip


class AgentError(GatewayError):
    """The agent backend failed; the chat gets a fixed apology, the log gets the cause."""


class AdapterError(GatewayError):
    """A platform call failed after retries."""


class InvalidToken(AdapterError):
    """The platform refused our credentials: retrying will not help."""
