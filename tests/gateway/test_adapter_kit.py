"""The adapter kit on its own: typing loops, the webhook's acknowledge-after-commit, the
whoami start and the chats bases, driven on a real event loop with recording callbacks (the platform side)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import pytest

from gateway.adapters import adapter_class, names
from gateway.adapters.kit import chats
from gateway.adapters.kit.chats import AsksWhoami, DirectOnly, NoThreads, OpensThreads
from gateway.adapters.kit.lifecycle import start_whoami
from gateway.adapters.kit.typing import TypingLoops
from gateway.adapters.kit.webhook import WebhookReplies, api_server_off, committed, taking
from gateway.errors import AdapterError, InvalidToken, NotAccepted
from gateway.messages import InboundMessage, ThreadRef
from gateway.session_keys import SessionSource
from gateway.vocab import AdapterState, ChatType
from tests.fakes import wait_for_count

log = logging.getLogger("tests.kit")


async def _until(check: Callable[[], bool], what: str) -> None:
    await wait_for_count(lambda: [True] if check() else [], 1, 5.0, what)


def _msg(n: int) -> InboundMessage:
    return InboundMessage(SessionSource("kit", "c1", ChatType.DM, "u1"), f"m{n}", str(n))


async def test_a_typing_loop_renews_until_stopped_and_is_withdrawn_once() -> None:
    shown: list[str] = []
    withdrawn: list[str] = []

    async def show(chat: str) -> None:
        shown.append(chat)

    async def withdraw(chat: str) -> None:
        withdrawn.append(chat)

    loops: TypingLoops[str] = TypingLoops("kit.typing", show, every_s=0.01, withdraw=withdraw)
    loops.start("c1")
    loops.start("c1")  # a second turn in the same chat keeps the one loop
    await _until(lambda: len(shown) >= 3, "renewed")
    assert "c1" in loops and len(loops) == 1
    loops.stop("c1")
    await _until(lambda: withdrawn == ["c1"], "withdrawn")
    assert "c1" not in loops
    loops.stop("c1")  # nothing runs there: no second withdrawal
    await loops.close()
    assert withdrawn == ["c1"]


async def test_a_failing_typing_call_is_never_an_error_and_the_loop_goes_on() -> None:
    calls: list[str] = []

    async def show(chat: str) -> None:
        calls.append(chat)
        raise AdapterError("the platform said no")

    loops: TypingLoops[str] = TypingLoops("kit.typing", show, every_s=0.01)
    loops.start("c1")
    await _until(lambda: len(calls) >= 3, "retried after failures")
    assert "c1" in loops
    await loops.close()
    assert "c1" not in loops


async def test_a_typing_loop_ends_by_itself_when_the_connection_is_gone() -> None:
    alive = True
    shown: list[str] = []

    async def show(chat: str) -> None:
        shown.append(chat)

    loops: TypingLoops[str] = TypingLoops("kit.typing", show, every_s=0.01, alive=lambda: alive)
    loops.start("c1")
    await _until(lambda: bool(shown), "shown")
    alive = False
    await _until(lambda: "c1" not in loops, "the loop ended on its own")


def _recording(
    refuse_at: int | None,
) -> tuple[list[str], Callable[[InboundMessage], Awaitable[None]]]:
    got: list[str] = []

    async def emit(msg: InboundMessage) -> None:
        if msg.platform_message_id == str(refuse_at):
            raise NotAccepted("the store is away")
        got.append(msg.text)

    return got, emit


async def test_a_webhook_delivery_is_committed_in_order_and_skips_nothing_messages() -> None:
    got, emit = _recording(None)
    assert await committed(emit, [_msg(1), None, _msg(2)])
    assert got == ["m1", "m2"]


async def test_a_webhook_delivery_stops_at_the_first_message_not_stored() -> None:
    got, emit = _recording(2)
    assert not await committed(emit, [_msg(1), _msg(2), _msg(3)])
    assert got == ["m1"]  # the rest comes with the platform's next delivery


async def test_a_stopped_adapter_takes_nothing_and_refuses_with_503() -> None:
    _got, emit = _recording(None)
    assert taking(emit, AdapterState.RUNNING) is emit
    assert taking(emit, AdapterState.STOPPED) is None
    assert taking(None, AdapterState.RUNNING) is None
    text, as_json = WebhookReplies(), WebhookReplies("error", deliver_again="send it again")
    assert (text.stopped().status, text.stopped().text) == (503, "not running")
    assert (as_json.again().status, as_json.again().text) == (503, '{"error": "send it again"}')


class _Adapter:
    platform = "kit"

    def __init__(self) -> None:
        self.state: str = AdapterState.STOPPED
        self.last_error: str | None = None


async def test_a_refused_credential_fails_the_adapter_and_an_unreachable_platform_does_not() -> (
    None
):
    async def refuse() -> str:
        raise InvalidToken("401")

    async def away() -> str:
        raise AdapterError("connection refused")

    adapter = _Adapter()
    with pytest.raises(InvalidToken, match="^kitcloud rejected the api key$"):
        await start_whoami(
            adapter,
            refuse,
            by="kitcloud",
            credential="api key",
            refused_as="bad key",
            unreachable="no answer",
            log=log,
        )
    assert adapter.state == "failed: bad key"

    adapter = _Adapter()
    name = await start_whoami(
        adapter,
        away,
        by="kitcloud",
        credential="api key",
        refused_as="bad key",
        unreachable="no answer",
        log=log,
    )
    assert name is None
    assert (adapter.state, adapter.last_error) == (AdapterState.RUNNING, "connection refused")


async def test_typing_counted_per_turn_is_withdrawn_only_when_the_last_turn_ends() -> None:
    shown: list[str] = []
    withdrawn: list[str] = []

    async def show(room: str) -> None:
        shown.append(room)

    async def withdraw(room: str) -> None:
        withdrawn.append(room)

    loops: TypingLoops[str] = TypingLoops(
        "kit.typing", show, every_s=0.01, withdraw=withdraw, per_turn=True
    )
    loops.start("r1")
    loops.start("r1")  # two turns of one room
    await _until(lambda: bool(shown), "shown")
    loops.stop("r1")
    assert "r1" in loops and withdrawn == []  # the other turn still runs
    loops.stop("r1")
    await _until(lambda: withdrawn == ["r1"], "withdrawn with the last turn")
    assert "r1" not in loops
    await loops.close()


def test_a_webhook_platform_asks_for_the_api_server_only_while_it_is_off() -> None:
    assert api_server_off("kit", True) == []
    [problem] = api_server_off("kit", False)
    assert (problem.key, problem.problem) == (
        "platforms.kit.enabled",
        "the webhook is served by the api server: enable platforms.api",
    )
    [problem] = api_server_off("kit", False, key="mode", served="callback mode is")
    assert (problem.key, problem.problem) == (
        "platforms.kit.mode",
        "callback mode is served by the api server: enable platforms.api",
    )


class _Whoami(AsksWhoami):
    """A platform whose whoami answers `name`, or raises `error`; counts its stops."""

    def __init__(self, name: str = "", error: AdapterError | None = None) -> None:
        self.name, self.error, self.stops = name, error, 0

    @classmethod
    def from_config(cls, settings: object, secrets: Mapping[str, str]) -> _Whoami:
        return cls(secrets.get("name", ""), InvalidToken("refused") if not secrets else None)

    async def _whoami(self) -> str:
        if self.error is not None:
            raise self.error
        return self.name

    async def stop(self) -> None:
        self.stops += 1


async def test_the_chats_bases_address_a_handoff_as_their_kind_of_chat_says() -> None:
    class Direct(DirectOnly):
        platform = "kit"

    class Homes(NoThreads):
        platform = "kit"

        @classmethod
        def home_chat_type(cls, chat_id: str) -> str:
            return "group" if chat_id.startswith("g") else "dm"

    class Threads(OpensThreads):
        platform = "kit"
        thread_chat_type = ChatType.CHANNEL

    assert Direct.home_chat_type("+1555") == "dm"
    assert Direct.thread_source(ThreadRef("kit", "+1555", "+1555")) == SessionSource(
        "kit", "+1555", ChatType.DM, "+1555"
    )
    assert await Direct().create_thread("+1555", "plan") is None
    assert Homes.thread_source(ThreadRef("kit", "g1", "g1")) == SessionSource(
        "kit", "g1", ChatType.GROUP
    )
    assert Homes.thread_source(ThreadRef("kit", "u1", "u1")) == SessionSource(
        "kit", "u1", ChatType.DM
    )
    assert Threads.thread_source(ThreadRef("kit", "c1", "t9")) == SessionSource(
        "kit", "c1", ChatType.CHANNEL, thread_id="t9"
    )


async def test_the_whoami_check_answers_the_name_or_why_not_and_stops_the_adapter() -> None:
    assert await _Whoami.check_credentials(None, {"name": "Ann's bot"}) == (True, "Ann's bot")
    assert await _Whoami.check_credentials(None, {}) == (False, "refused")
    adapter = _Whoami("Ann's bot")
    assert await adapter.open_outbound() == "Ann's bot"
    assert await chats.ask_whoami(adapter) == (True, "Ann's bot") and adapter.stops == 1


@pytest.mark.parametrize("platform", names())
def test_a_chats_base_is_named_before_the_capabilities_whose_stubs_it_would_lose_to(
    platform: str,
) -> None:
    """A capability Protocol named first would answer with its empty stub (Outbound's
    open_outbound returns None): what a chats base gives, the adapter or the base answers."""
    cls = adapter_class(platform)
    for base in (NoThreads, DirectOnly, OpensThreads, AsksWhoami):
        if not issubclass(cls, base):
            continue
        for member in vars(base):
            if member.startswith("__"):
                continue
            owner = next(k for k in cls.__mro__ if member in vars(k))
            assert owner is cls or owner.__module__ == chats.__name__, (platform, member, owner)
