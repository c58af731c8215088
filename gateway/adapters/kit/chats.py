"""How a platform's chats take a handoff, and the credential check of an adapter that asks
its platform who it is: the `PlatformAdapter` members most adapters answer alike, as bases
an adapter names beside its capabilities (`class SmsAdapter(DirectOnly, AsksWhoami, ...)`),
before them: a capability Protocol named first would answer with its own empty stub
(Outbound's `open_outbound`).

- `NoThreads`: the platform opens no threads; a handoff lands in the home chat itself, a
  DM or a group as the adapter's `home_chat_type` says.
- `DirectOnly`: every chat is one-to-one, its id the user's (a phone number, a user id).
- `OpensThreads`: a handoff opens a thread in the home chat, addressed by the chat and the
  thread's id; `thread_chat_type` says what kind of chat holds it.
- `AsksWhoami`: `check_credentials` builds the adapter and asks `_whoami()`;
  `open_outbound` asks it too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from gateway.errors import AdapterError
from gateway.messages import ThreadRef
from gateway.session_keys import SessionSource
from gateway.vocab import ChatType


class _HomeChats(Protocol):
    platform: ClassVar[str]

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str: ...


class NoThreads:
    """The platform has no threads: `create_thread` opens none, and a handed-off session
    lives in the home chat itself, of the kind `home_chat_type` gives its id."""

    @classmethod
    def thread_source(cls: type[_HomeChats], thread: ThreadRef) -> SessionSource:
        return SessionSource(
            cls.platform, thread.chat_id, ChatType(cls.home_chat_type(thread.chat_id))
        )

    async def create_thread(self, chat_id: str, name: str) -> ThreadRef | None:
        return None


class DirectOnly(NoThreads):
    """Every chat is one-to-one with one user, and the chat's id is the user's: a home
    channel is a DM, and a handoff lands in that user's own chat."""

    platform: ClassVar[str]

    @classmethod
    def home_chat_type(cls, chat_id: str) -> str:
        return "dm"

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        return SessionSource(cls.platform, thread.chat_id, ChatType.DM, thread.chat_id)


class OpensThreads:
    """A handoff opens a thread in the home chat (the adapter's `create_thread`); a session
    there is the chat's id and the thread's, in a chat of kind `thread_chat_type`."""

    platform: ClassVar[str]
    thread_chat_type: ClassVar[ChatType]

    @classmethod
    def thread_source(cls, thread: ThreadRef) -> SessionSource:
        return SessionSource(
            cls.platform, thread.chat_id, cls.thread_chat_type, thread_id=thread.thread_id
        )


class _Whoami(Protocol):
    async def _whoami(self) -> str: ...

    async def stop(self) -> None: ...


class _BuiltFromConfig(Protocol):
    @classmethod
    def from_config(cls, settings: Any, secrets: Mapping[str, str]) -> Any: ...


async def ask_whoami(adapter: _Whoami) -> tuple[bool, str]:
    """`check_credentials` for an adapter whose `_whoami()` asks the platform who its
    credentials belong to (over its own HTTP session): (accepted, the name or why not).
    The adapter is stopped after, whatever the answer."""
    try:
        return True, await adapter._whoami()
    except AdapterError as exc:  # InvalidToken included
        return False, str(exc)
    finally:
        await adapter.stop()


class AsksWhoami:
    """`check_credentials` is the adapter built from the section asking `_whoami()`, the
    same question its `start` asks; `open_outbound` (`switchboard send` without a daemon,
    whose webhooks only the daemon serves) asks it too, so a refused credential or an
    unreachable platform fails it."""

    async def open_outbound(self: _Whoami) -> str:
        """Ready to send, receiving nothing: the name the platform gave."""
        return await self._whoami()

    @classmethod
    async def check_credentials(
        cls: type[_BuiltFromConfig], settings: Any, secrets: Mapping[str, str]
    ) -> tuple[bool, str]:
        return await ask_whoami(cls.from_config(settings, secrets))
