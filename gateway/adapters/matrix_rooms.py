"""What the Matrix adapter knows about rooms between two syncs: which rooms are DMs (the
bot's `m.direct`, or exactly two joined members), who is in a room and their names, the
room's name, who sent an event, and the threads the bot takes part in.

Kept in memory and learnt from /sync; what a sync did not say (a room's members after a
restart, the sender of an older event) is asked of the homeserver once, through the two
callables the adapter passes in. Bounded tables; nothing here is needed for correctness
across restarts, only for asking less.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.adapters.matrix_events import RoomView, direct_rooms

REMEMBERED = 10_000  # event senders and thread roots kept

JoinedMembers = Callable[[str], Awaitable[Mapping[str, Any]]]  # room -> /joined_members body
EventSender = Callable[[str, str], Awaitable[str | None]]  # room, event -> sender (None: unknown)


class Rooms:
    def __init__(self, me: str, joined_members: JoinedMembers, event_sender: EventSender) -> None:
        self.me = me
        self._joined_members = joined_members
        self._event_sender = event_sender
        self.direct: set[str] = set()
        self._members: dict[str, dict[str, str]] = {}  # room -> joined user -> display name
        self._names: dict[str, str] = {}
        self._senders: OrderedDict[str, str] = OrderedDict()  # event id -> sender ("" unknown)
        self.bot_threads: OrderedDict[str, None] = OrderedDict()  # roots the bot is in

    # --- learnt from /sync --------------------------------------------------------------

    def set_direct(self, content: Mapping[str, Any]) -> None:
        self.direct = direct_rooms(content)

    def on_state(self, room_id: str, ev: Mapping[str, Any]) -> None:
        """A state event (room name, membership) from a sync's state or timeline."""
        content = ev.get("content") if isinstance(ev.get("content"), Mapping) else {}
        assert isinstance(content, Mapping)
        if ev.get("type") == "m.room.name" and isinstance(content.get("name"), str):
            self._names[room_id] = content["name"]
        elif ev.get("type") == "m.room.member" and room_id in self._members:
            user = ev.get("state_key")
            if not isinstance(user, str):
                return
            if content.get("membership") == "join":
                self._members[room_id][user] = str(content.get("displayname") or "")
            else:
                self._members[room_id].pop(user, None)

    def forget(self, room_id: str) -> None:
        """The bot left (or was removed from) the room."""
        self._members.pop(room_id, None)

    def sent(self, event_id: str, sender: str) -> None:
        _remember(self._senders, event_id, sender)

    def bot_in_thread(self, root: str) -> None:
        _remember(self.bot_threads, root, None)

    def sender(self, event_id: str | None) -> str | None:
        return self._senders.get(event_id) or None if event_id else None

    # --- asked when needed --------------------------------------------------------------

    def is_dm(self, room_id: str) -> bool:
        """From what is known now (no request)."""
        return room_id in self.direct or len(self._members.get(room_id, {})) == 2

    async def view(self, room_id: str) -> RoomView:
        if room_id not in self._members:
            body = await self._joined_members(room_id)
            joined = body.get("joined") if isinstance(body, Mapping) else None
            self._members[room_id] = {
                str(uid): str((info if isinstance(info, Mapping) else {}).get("display_name") or "")
                for uid, info in (joined if isinstance(joined, Mapping) else {}).items()
            }
        return RoomView(
            room_id, self.is_dm(room_id), self._names.get(room_id), self._members[room_id]
        )

    async def is_bot_event(self, room_id: str, event_id: str) -> bool:
        """Whether the bot sent `event_id` or is in the thread it roots."""
        if event_id in self.bot_threads:
            return True
        if event_id not in self._senders:
            self.sent(event_id, await self._event_sender(room_id, event_id) or "")
        return self._senders.get(event_id) == self.me


def _remember(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    if len(table) > REMEMBERED:
        table.popitem(last=False)
