"""SessionSource -> session key. This module is the only place keys are built or parsed.

Keys (docs/architecture.md): `agent:main:<platform>:dm:<chat_id>`,
`agent:main:<platform>:group:<chat_id>[:<user_id>]`, `...:channel:<chat_id>[:<user_id>]`.
A thread slot is written `t=<thread_id>` (`...:group:<chat_id>:t=<thread_id>[:<user_id>]`) so a
thread can never be mistaken for a user; ids are percent-encoded where they contain `%`, `:`
or `=`, so any id round-trips and no user id can look like a thread slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.vocab import ChatType
from state import storable

CHAT_TYPES: tuple[str, ...] = tuple(ChatType)


def as_chat_type(value: object) -> ChatType:
    """`value` as a ChatType; a ValueError naming the choices if it is none of them."""
    if value not in CHAT_TYPES:
        raise ValueError(f"chat_type must be one of {', '.join(CHAT_TYPES)}")
    return ChatType(value)


PREFIX = "agent:main"
_PLATFORM_TEXT = ("chat_id", "user_id", "user_name", "chat_name", "thread_id")


@dataclass(frozen=True)
class SessionSource:
    platform: str
    chat_id: str
    chat_type: ChatType = ChatType.DM
    user_id: str | None = None
    user_name: str | None = None
    chat_name: str | None = None
    thread_id: str | None = None

    def __post_init__(self) -> None:
        if type(self.chat_type) is not ChatType:  # stored sources carry the plain string
            object.__setattr__(self, "chat_type", as_chat_type(self.chat_type))
        if not self.platform or not self.chat_id:
            raise ValueError("platform and chat_id are required")
        for name in _PLATFORM_TEXT:  # what a platform sent: kept storable (state/text.py)
            value = getattr(self, name)
            if value is not None:
                clean, replaced = storable(value)
                if replaced:
                    object.__setattr__(self, name, clean)

    def as_dict(self) -> dict[str, str | None]:
        return {
            "platform": self.platform,
            "chat_id": self.chat_id,
            "chat_type": self.chat_type,
            "user_id": self.user_id,
            "user_name": self.user_name,
            "chat_name": self.chat_name,
            "thread_id": self.thread_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> SessionSource:
        def s(name: str) -> str | None:
            v = data.get(name)
            return None if v is None else str(v)

        return cls(
            platform=str(data["platform"]),
            chat_id=str(data["chat_id"]),
            chat_type=as_chat_type(str(data.get("chat_type") or ChatType.DM)),
            user_id=s("user_id"),
            user_name=s("user_name"),
            chat_name=s("chat_name"),
            thread_id=s("thread_id"),
        )


@dataclass(frozen=True)
class KeySettings:
    group_sessions_per_user: bool = True
    thread_sessions_per_user: bool = False


@dataclass(frozen=True)
class SessionKey:
    """A parsed key. `scope` is the chat kind in the key: dm, group or channel."""

    def __str__(self) -> str:
        return self.format()

    platform: str
    scope: str
    chat_id: str
    thread_id: str | None = None
    user_id: str | None = None

    def format(self) -> str:
        """The key's text, built once per key (a message's path asks for it several times)."""
        text: str | None = self.__dict__.get("_text")
        if text is None:
            parts = [PREFIX, _enc(self.platform), self.scope, _enc(self.chat_id)]
            if self.scope != "dm":
                if self.thread_id is not None:
                    parts.append("t=" + _enc(self.thread_id))
                if self.user_id is not None:
                    parts.append(_enc(self.user_id))
            text = ":".join(parts)
            object.__setattr__(self, "_text", text)  # not a field: eq, hash and repr ignore it
        return text

    @property
    def shared(self) -> bool:
        """True when several people talk in this session (prefix their names)."""
        return self.scope != "dm" and self.user_id is None


def _enc(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A").replace("=", "%3D")


def _dec(part: str) -> str:
    return part.replace("%3D", "=").replace("%3A", ":").replace("%25", "%")


def build_key(source: SessionSource, settings: KeySettings | None = None) -> SessionKey:
    """The one function that decides which session a message belongs to."""
    cfg = settings or KeySettings()
    if source.chat_type == ChatType.DM:
        return SessionKey(source.platform, "dm", source.chat_id)
    scope = "channel" if source.chat_type == ChatType.CHANNEL else "group"
    user = source.user_id or None
    if source.thread_id is not None:
        # a thread/topic is shared by everyone in it unless configured per user
        per_user = cfg.thread_sessions_per_user and user is not None
        return SessionKey(
            source.platform, scope, source.chat_id, source.thread_id, user if per_user else None
        )
    per_user = user is not None and (scope == "channel" or cfg.group_sessions_per_user)
    return SessionKey(source.platform, scope, source.chat_id, None, user if per_user else None)


def parse_key(text: str) -> SessionKey:
    parts = text.split(":")
    if len(parts) < 5 or ":".join(parts[:2]) != PREFIX:
        raise ValueError(f"not a session key: {text!r}")
    platform, scope, chat = _dec(parts[2]), parts[3], _dec(parts[4])
    if scope == "dm":
        if len(parts) != 5:
            raise ValueError(f"not a session key: {text!r}")
        return SessionKey(platform, "dm", chat)
    if scope not in ("group", "channel"):
        raise ValueError(f"unknown key scope {scope!r}")
    rest = parts[5:]
    thread = user = None
    if rest and rest[0].startswith("t="):
        thread = _dec(rest.pop(0)[2:])
    if rest:
        raw_user = rest.pop(0)
        if "=" in raw_user or not raw_user:  # encoded ids never hold a bare "="
            raise ValueError(f"not a session key: {text!r}")
        user = _dec(raw_user)
    if rest:
        raise ValueError(f"not a session key: {text!r}")
    return SessionKey(platform, scope, chat, thread, user)
