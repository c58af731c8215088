"""A turn's writes under its key's lease, on several replicas: the accept that takes an
idle key (`accept_take`), the fenced begin, end and finish (each only while the lease's
owner and epoch hold, state/pg/cluster.py's fences), and the writer's merged run of them
(`turns_many`: one fence check, one append and one release per batch).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import AsyncConnection

from ..errors import DatabaseError, LeaseLost
from ..records import Accepted, BeginPlan, Fence, InboxEntry, Release
from ..rows import payload_of
from . import cluster, db, inbox
from .dispatch import Dispatch
from .writer import register_batched, register_merged


class AcceptTake(NamedTuple):
    """accept_take's arguments, as the writer hands a batch of them to turns_many: the
    first seven are inbox.accept's."""

    platform: str
    chat_id: str
    pmid: str | None
    payload: str
    now: float
    key: str
    me: int
    space: int
    begin: BeginPlan | None


# turn_write_fenced's arguments
FencedWrite = tuple[Fence, str, "inbox.Begin | inbox.End", "Release | None"]


async def accept_take(
    conn: AsyncConnection,
    platform: str,
    chat_id: str,
    pmid: str | None,
    payload: str,
    now: float,
    key: str,
    me: int,
    space: int,
    begin: BeginPlan | None = None,
) -> Accepted:
    """`inbox.accept` for replica `me` and, when the row is new, `take_lease` on its key in
    the same transaction: (inbox id, state, new, the take's route or None, begun). The
    message's turn then starts under the lease without a write of its own to take it. With
    `begin`, when its test names a session for the taken route, the turn's begin too (the
    message stored in that session, the row started, the history read: `begun`, as
    begin_turn returns it), so the turn waits for one commit less."""
    call = AcceptTake(platform, chat_id, pmid, payload, now, key, me, space, begin)
    return (await turns_many(conn, [call], ()))[0][0]


@functools.cache
def _accepts_taking(release: bool) -> str:
    """One statement for a batch's accepts and the takes of the keys of the rows that went
    in (and, with `release`, the batch's lease releases, whose keys no accept here takes):
    three of a batch's round trips in one. Each row says what it is: 0 an accept's drawn
    id and whether its row went in (as inbox._ACCEPTED), 1 a route released, 2 a route
    taken (as _TAKE's, after four columns), 3 a wake-up sent. The keys' open rows are
    read by a statement of their own, sent with it (_OPEN_AND_UNSENT says why). A mixed
    batch commits in 8 round trips instead of 10; its CPU, alternated with the three
    statements this replaces (docs/benchmarks.md), moved less than the runs' spread."""
    pad = ", NULL" * (cluster.TAKEN_WIDTH - 1)
    keys = "ARRAY(SELECT DISTINCT session_key FROM ins WHERE session_key IS NOT NULL)"
    parts = [
        f"SELECT 2 AS kind, NULL::bigint AS n, NULL::bigint AS drawn, NULL::boolean AS fresh, "
        f"{cluster.TAKEN_COLUMNS}{cluster.TAKEN_FROM}",
        f"SELECT 0, ids.n, ids.i, ins.id IS NOT NULL, NULL{pad} "
        "FROM ids LEFT JOIN ins ON ins.id = ids.i",
    ]
    if release:
        parts.append(f"SELECT 1, NULL, NULL, NULL, session_key{pad} FROM rel")
        parts.append(f"SELECT 3, NULL, NULL, NULL, NULL{pad} {cluster.NOTIFY}")
    ctes = ([cluster.RELEASE_CTES] if release else []) + [
        inbox.ACCEPT_CTES,
        cluster._take_ctes(keys),
    ]
    return f"WITH {', '.join(ctes)}\n" + "\nUNION ALL ".join(parts)


async def _accept_take_release(
    conn: AsyncConnection,
    accepts: Sequence[AcceptTake],
    frees: Sequence[tuple[Fence, Mapping[str, Any] | None, Sequence[tuple[int, int]]]],
) -> tuple[list[tuple[int, str, bool]], dict[int, dict[str, Any] | None], list[bool]]:
    """The accepts (one replica's: one `me`, one `space`), the takes of the keys of the rows
    that went in and the releases `frees`, in one statement (_accepts_taking): the accepts'
    results, the route each new row's call took (the first call of each key) and whether
    each release freed its lease."""
    me, space = accepts[0].me, accepts[0].space
    params = inbox.accept_params([c[:7] for c in accepts])
    params.update(me=me, space=space)
    if frees:
        params.update(cluster.release_params(frees))
    drawn: dict[int, tuple[int, bool]] = {}
    found: dict[str, dict[str, Any]] = {}
    freed: set[str] = set()
    # the keys' open rows read in the same round trip, for every key an accept may take
    rows, opened = await db.rows_then(
        conn,
        (_accepts_taking(bool(frees)), params),
        cluster.open_read(sorted({c.key for c in accepts}), space),
    )
    for row in rows:
        kind = row.pop("kind")
        if kind == 0:
            drawn[int(row["n"])] = (int(row["drawn"]), bool(row["fresh"]))
        elif kind == 1:
            freed.add(str(row["session_key"]))
        elif kind == 2:
            for name in ("n", "drawn", "fresh"):
                del row[name]
            found[str(row["session_key"])] = row
    accepted = await inbox.accept_many(
        conn, [c[:7] for c in accepts], [drawn[n] for n in range(1, len(accepts) + 1)]
    )
    routes = cluster.with_open(found, opened)
    route_of: dict[int, dict[str, Any] | None] = {}
    for i, (_id, _state, new) in enumerate(accepted):
        if new:  # a key's route goes to its first call; a later one's turn takes it later
            route_of[i] = routes.pop(accepts[i].key, None)
    return accepted, route_of, [f[0].session_key in freed for f in frees]


async def turns_many(
    conn: AsyncConnection,
    accepts: Sequence[AcceptTake],
    fenced: Sequence[FencedWrite],
) -> tuple[list[Accepted], list[Any]]:
    """A batch's accept_take and turn_write_fenced calls at once, so the turns they begin
    and end share one append and one inbox update of each kind: the fences checked, the
    rows accepted and their keys taken, the begins and the fenced writes, then the leases
    those writes free (or, when every one frees its lease, those freed first instead of
    the check: in the accepts' statement when there are accepts, _accepts_taking, else
    sent ahead of the append in its round trip, inbox.turn_writes_after). (The
    accepts' takes only meet keys no fence here holds: a replica takes a key in an
    accept only while no work of its own holds it.)"""
    frees = [(c[0], *c[3]) for c in fenced if c[3] is not None]
    # every fenced write frees its lease (the HTTP API's turns): the release is the fence
    # check, done first (its row locks hold to the commit as FOR SHARE's would): one
    # statement less, and none with accepts, whose statement releases too. A lease lost
    # fails the batch, as the check would.
    free_first = bool(fenced) and len(frees) == len(fenced)
    if fenced and not free_first:
        await cluster.check_fences(conn, [c[0] for c in fenced])
    route_of: dict[int, dict[str, Any] | None] = {}
    freed: list[bool] = []
    # without accepts, the releases go with the append, in its round trip: a lease lost
    # is found when both have run, and fails the batch all the same
    ahead = cluster.release_statement(frees) if free_first and not accepts else None
    if accepts and len({(c.me, c.space) for c in accepts}) == 1:
        accepted, route_of, freed = await _accept_take_release(
            conn, accepts, frees if free_first else ()
        )
    else:
        if free_first and ahead is None:
            freed = await cluster.release_leases_many(conn, frees)
        accepted = await inbox.accept_many(conn, [c[:7] for c in accepts]) if accepts else []
        fresh = [i for i, (_id, _state, new) in enumerate(accepted) if new]
        calls = [(accepts[i].key, accepts[i].me, accepts[i].space) for i in fresh]
        routes = await cluster.take_leases_many(conn, calls) if fresh else []
        route_of = dict(zip(fresh, routes, strict=True))
    if free_first and ahead is None:
        _lost(fenced, freed)
    begins: list[tuple[int, inbox.Begin]] = []
    for i, route in route_of.items():
        plan = accepts[i].begin
        if route is None or plan is None:
            continue
        message, last, begins_in = plan
        sid = begins_in(route, accepted[i][0])
        if sid is not None:
            begins.append((i, (accepted[i][0], sid, dict(message), last)))
    writes: list[tuple[str, inbox.Begin | inbox.End]] = [(c[1], c[2]) for c in fenced]
    writes += [(inbox.BEGIN, b) for _i, b in begins]
    runners = [c[0].owner for c in fenced] + [accepts[i].me for i, _b in begins]
    released, got = (
        await inbox.turn_writes_after(
            conn, ahead, writes, runners=runners, inserted=[b[0] for _i, b in begins]
        )
        if writes
        else ([], [])
    )
    if ahead is not None:
        _lost(fenced, cluster.freed_of(frees, released))
    begun = {i: g for (i, _b), g in zip(begins, got[len(fenced) :], strict=True)}
    if frees and not free_first:  # the fences hold (checked above, rows locked): all freed
        await cluster.release_leases_many(conn, frees)
    done = [Accepted(*a, route_of.get(i), begun.get(i)) for i, a in enumerate(accepted)]
    return done, got[: len(fenced)]


def _lost(fenced: Sequence[FencedWrite], freed: Sequence[bool]) -> None:
    """LeaseLost for the first fenced write whose release found its lease gone."""
    lost = next((c[0] for c, ok in zip(fenced, freed, strict=True) if not ok), None)
    if lost is not None:
        raise LeaseLost(lost.session_key, lost.epoch)


async def turns_merged(
    conn: AsyncConnection, items: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> list[Any]:
    """The writer's merged run of accept_take and turn_write_fenced calls (turns_many)."""
    accepts = [AcceptTake(*args) for fn, args in items if fn is accept_take]
    fenced = [_fenced_args(*args) for fn, args in items if fn is not accept_take]
    done, wrote = await turns_many(conn, accepts, fenced)
    a, w = iter(done), iter(wrote)
    return [next(a) if fn is accept_take else next(w) for fn, _args in items]


# --- fenced forms of the turn's writes (state/pg/inbox.py's, after check_fence) ----------


async def turn_write_fenced(
    conn: AsyncConnection,
    fence: Fence,
    kind: str,
    call: inbox.Begin | inbox.End,
    release: Release | None = None,
) -> Any:
    """inbox.begin_turn (kind BEGIN) or inbox.end_turn (END) while `fence` holds, and with
    `release` the lease freed in the same commit. One function for all, so the writer
    merges a batch's begins, ends and such releases (and its accept_takes, turns_many)
    into one fence check, one append and one release. One lost fence fails the batch; the
    writer then redoes it one call at a time. Each begun row records its runner (whose
    turn started it)."""
    return (await turns_many(conn, (), [(fence, kind, call, release)]))[1][0]


def _fenced_args(
    fence: Fence, kind: str, call: inbox.Begin | inbox.End, release: Release | None = None
) -> FencedWrite:
    return fence, kind, call, release


# A turn's writes (under its key's lease; what they depend on committed before they were
# queued) and the accepts that take an idle key (a key no work of this replica holds) go
# first in their batch, merged into one run (turns_many)
register_merged((turn_write_fenced, accept_take), turns_merged, place=-1)


async def finish_fenced(
    conn: AsyncConnection, fence: Fence, inbox_id: int, state: str, reason: str | None
) -> None:
    await finish_fenced_many(conn, [(fence, inbox_id, state, reason)])


async def finish_fenced_many(
    conn: AsyncConnection, calls: Sequence[tuple[Fence, int, str, str | None]]
) -> list[None]:
    await cluster.check_fences(conn, [c[0] for c in calls])
    return await inbox.finish_many(conn, [c[1:] for c in calls])


register_batched(finish_fenced, finish_fenced_many)


class InboxOps(Dispatch):
    """PgStore's inbox: messages committed before the ack, and their turns (fenced on replicas)."""

    async def accept_inbound(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str | None = None,
        replica: int | None = None,
    ) -> tuple[int, str, bool]:
        """Commit an inbound message before its platform is acknowledged: (inbox id, state,
        whether it is new). A platform id taken before returns that row, storing nothing.
        Any failure is a DatabaseError, so the gateway can refuse the message cleanly.
        Replicas record the message's session key and which replica took it."""
        try:
            return await self._write(
                inbox.accept,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_key,
                replica,
            )
        except psycopg.Error as exc:  # e.g. a NUL in an id, which PostgreSQL text refuses
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def accept_and_take(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        *,
        session_key: str,
        me: int,
        space: int,
        begin: BeginPlan | None = None,
    ) -> Accepted:
        """`accept_inbound` for replica `me` and, when the row is new, `take_lease` on
        `session_key` in one transaction: (inbox id, state, new, the route as take_lease
        returns it, or None when the row is not new or a live replica holds the key, and
        the turn's begin when `begin` asked for it and its test allowed it)."""
        try:
            return await self._write(
                accept_take,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_key,
                me,
                space,
                begin,
            )
        except psycopg.Error as exc:
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def accept_and_begin(
        self,
        platform: str,
        chat_id: str,
        platform_message_id: str | None,
        payload: object,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
    ) -> tuple[int, str, bool, tuple[int, list[dict[str, Any]]] | None]:
        """`accept_inbound` and, when the row is new, `begin_turn` in one transaction."""
        try:
            return await self._write(
                inbox.accept_begin,
                platform,
                chat_id,
                platform_message_id,
                payload_of(payload),
                time.time(),
                session_id,
                dict(message),
                last,
            )
        except psycopg.Error as exc:
            raise DatabaseError(self.where, f"the inbox refused the message: {exc}") from exc

    async def begin_turn(
        self,
        inbox_id: int,
        session_id: str,
        message: Mapping[str, Any],
        *,
        last: int | None = None,
        fence: Fence | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """The user's message into its session (once), the row `started`, and the newest
        `last` messages up to it in OpenAI chat format: (the message's id, the history).
        With a fence: only while that lease holds (else LeaseLost, nothing written)."""
        if fence is not None:
            return await self._write(
                turn_write_fenced,
                fence,
                inbox.BEGIN,
                (inbox_id, session_id, dict(message), last),
                None,
            )
        return await self._write(inbox.begin_turn, inbox_id, session_id, dict(message), last)

    async def end_turn(
        self,
        inbox_id: int,
        session_id: str,
        batch: Iterable[Mapping[str, Any]],
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        reply_state: str = "ready",
        fence: Fence | None = None,
        release: Release | None = None,
    ) -> list[int]:
        """The reply into the session, the row `answered` and the reply in the outbox as
        `reply_state`, in one transaction; with a fence, only while that lease holds, and
        with `release` (the route as left, the rows answered for other replicas) the lease
        freed in the same commit, as release_lease would."""
        tokens = None
        if input_tokens or output_tokens:
            tokens = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        if fence is not None:
            return await self._write(
                turn_write_fenced,
                fence,
                inbox.END,
                (inbox_id, session_id, list(batch), tokens, reply_state),
                release,
            )
        if release is not None:
            raise ValueError("a lease can only be freed by a fenced write")
        return await self._write(
            inbox.end_turn, inbox_id, session_id, list(batch), tokens, reply_state
        )

    async def finish_inbound(
        self, inbox_id: int, state: str, reason: str | None = None, *, fence: Fence | None = None
    ) -> None:
        """Close an inbox row without an agent reply (a command answered, or dropped)."""
        if fence is not None:
            await self._write(finish_fenced, fence, inbox_id, state, reason)
            return
        await self._write(inbox.finish, inbox_id, state, reason)

    async def open_inbound(self) -> list[InboxEntry]:
        """Rows a crash left `received`/`started`, oldest first."""
        return await self._read(inbox.open_rows)

    async def inbox_counts(self) -> dict[str, int]:
        return await self._read(inbox.counts)

    async def prune_inbox(self, older_than: float) -> int:
        """Forget closed inbox rows last touched before `older_than` (never a message)."""
        return await self._write(inbox.prune, older_than)
