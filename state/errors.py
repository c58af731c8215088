"""Typed errors raised by the state package.

Every error carries a short human message that the gateway may show as-is; callers
match on the class, never on the text.
"""

from __future__ import annotations


class StateError(Exception):
    """Base class for everything the store raises on purpose."""


class DatabaseError(StateError):
    """The database file cannot be used (not a database, corrupt, unreadable)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StoreUnavailable(DatabaseError):
    """The database server could not be reached, or went away during the operation: it
    was not applied, or (at COMMIT) its outcome is unknown. The same operation may succeed
    once the server is back; nothing about the input is wrong."""


class SchemaTooNew(DatabaseError):
    """The file was written by a newer switchboard than this one."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        super().__init__(
            path,
            f"schema version {found} was written by a newer switchboard; "
            f"this version supports up to {supported}. Upgrade switchboard to open it.",
        )
        self.found = found
        self.supported = supported


class UnstorableData(StateError):
    """The database refused a value it can never hold (PostgreSQL's data exceptions, such
    as a NUL in text): the same write fails every time, so it is not a busy or broken
    store and nobody should be asked to send it again."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: cannot store this value: {reason}")
        self.where = where
        self.reason = reason


class DatabaseBusy(StateError):
    """Another process held the write lock for longer than the retry budget."""


class WriterClosed(StateError):
    """A write was submitted after the store was closed."""


class LeaseLost(StateError):
    """A fenced write found its session key's lease taken over (this process stalled past
    a takeover, or lost its control connection): nothing of the write was applied."""

    def __init__(self, key: str, epoch: int) -> None:
        super().__init__(f"the lease on {key} (epoch {epoch}) was taken over")
        self.key = key
        self.epoch = epoch


class SessionNotFound(StateError):
    def __init__(self, ref: str) -> None:
        super().__init__(f"session not found: {ref}")
        self.ref = ref


class AmbiguousSession(StateError):
    def __init__(self, ref: str, candidates: list[str]) -> None:
        shown = ", ".join(candidates[:5])
        super().__init__(f"'{ref}' matches several sessions: {shown}")
        self.ref = ref
        self.candidates = candidates


class SessionExists(StateError):
    def __init__(self, session_id: str) -> None:
        super().__init__(f"session already exists: {session_id}")
        self.session_id = session_id


class LiveSessionExists(StateError):
    """A session key already has a live session (a store that enforces one per key)."""

    def __init__(self, session_key: str) -> None:
        super().__init__(f"session key {session_key} already has a live session")
        self.session_key = session_key


class TitleError(StateError):
    """A title was refused; the message says why in words fit for a chat."""


class TitleTooLong(TitleError):
    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"title is too long ({length} characters, at most {limit})")
        self.length = length
        self.limit = limit


class TitleEmpty(TitleError):
    def __init__(self) -> None:
        super().__init__("title is empty after removing control and invisible characters")


class TitleTaken(TitleError):
    def __init__(self, title: str, owner: str) -> None:
        super().__init__(f"title '{title}' is already in use by session {owner}")
        self.title = title
        self.owner = owner


class QueryError(StateError):
    """A search query that cannot be run; the message explains why."""


class UnknownBackend(StateError):
    """`state.backend` names a store this switchboard does not have (a config error)."""

    exit_code = 78  # the CLI's EXIT_CONFIG: systemd must not restart into the same error

    def __init__(self, backend: object, known: tuple[str, ...]) -> None:
        super().__init__(
            f"state.backend: unknown store backend {backend!r} (known: {', '.join(known)})"
        )
        self.key = "state.backend"
        self.backend = backend


class StoreConfigError(StateError):
    """The `state` section cannot open its store (a config error, exit 78): `key` names
    the setting to fix."""

    exit_code = 78

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem
