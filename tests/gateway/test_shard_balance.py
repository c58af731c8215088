"""Balancing a platform's shards among replicas: the decision (`state.pg.shards.plan`, a
pure function, run here over many replica counts as the replicas' claim rounds would run
it) and the ledger's claim and release against a real PostgreSQL (two replicas' stores
and control connections on one fresh schema)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest

from gateway.shards import Claim
from state.pg.shards import HANDOVERS_PER_ROUND, Plan, plan, quota
from tests.gateway.test_receiver import Ledger, ledger, server  # noqa: F401  (fixtures)

FOUR = range(4)


def test_quota_splits_the_shards_with_the_earlier_members_taking_the_remainder() -> None:
    assert [quota(4, [7, 9, 12], m) for m in (7, 9, 12)] == [2, 1, 1]
    assert [quota(4, [7, 9], m) for m in (7, 9)] == [2, 2]
    assert [quota(1, [3, 5], m) for m in (3, 5)] == [1, 0]


def test_a_replica_alone_takes_every_shard_and_a_joiner_gets_half_handed_over() -> None:
    assert plan(4, 1, [1], {}) == Plan([0, 1, 2, 3], 0)
    everything = dict.fromkeys(FOUR, 1)
    assert plan(4, 2, [1, 2], everything) == Plan([], 0)  # nothing free to take
    assert plan(4, 1, [1, 2], everything) == Plan([], 2)
    released = {0: 1, 1: 1}
    # the shards released lately wait for the replica under its quota: the one that let
    # them go does not take them back
    assert plan(4, 1, [1, 2], released, reserved={2, 3}) == Plan([], 0)
    assert plan(4, 2, [1, 2], released, reserved={2, 3}) == Plan([2, 3], 0)


def test_a_gone_replicas_shards_are_taken_by_anyone_under_the_ceiling() -> None:
    # r1 holds 2 of 4 among three: ceil is 2, so r1 takes none of the free ones
    assert plan(4, 1, [1, 2, 3], {0: 1, 1: 1}) == Plan([], 0)
    assert plan(4, 3, [1, 2, 3], {0: 1, 1: 1}) == Plan([2, 3], 0)  # up to 2 (ceil), not 1


def test_a_share_within_the_fair_range_is_left_alone() -> None:
    # r2 holds one over its quota, but nobody holds fewer than floor(4 / 3): no move
    assert plan(4, 2, [1, 2, 3], {0: 1, 1: 2, 2: 2, 3: 3}) == Plan([], 0)
    # r3 holds none: r2 (over its quota) gives one, r1 (at its quota) none
    two_two = {0: 1, 1: 1, 2: 2, 3: 2}
    assert plan(4, 2, [1, 2, 3], two_two) == Plan([], 1)
    assert plan(4, 1, [1, 2, 3], two_two) == Plan([], 0)


def test_nothing_is_given_up_while_a_shard_has_no_owner_and_a_few_a_round() -> None:
    assert plan(4, 1, [1, 2], {0: 1, 1: 1, 2: 1}) == Plan([], 0)
    assert plan(16, 1, [1, 2], dict.fromkeys(range(16), 1)).give == HANDOVERS_PER_ROUND


def test_one_shard_never_moves_between_live_replicas() -> None:
    """The Receiver's ledger: whoever holds shard 0 keeps it; a free one is anyone's."""
    for members in ([1, 2], [1, 2, 3]):
        for holder in members:
            for me in members:
                assert plan(1, me, members, {0: holder}) == Plan([], 0)
            assert plan(1, members[-1], members, {}) == Plan([0], 0)


def _rounds(count: int, members: list[int], owners: dict[int, int], rng: random.Random) -> int:
    """Claim rounds (each member in a random order, giving the highest ids, a released
    shard kept for a round) until every member holds between floor and ceil and a further
    three rounds move nothing; the rounds it took."""
    lo, hi = count // len(members), -(-count // len(members))
    reserved: dict[int, int] = {}  # shard -> the round it was released in
    gave: dict[int, int] = {}  # shard -> the member that released it last
    opened: dict[int, int] = dict.fromkeys(owners, -1)  # shard -> round taken
    quiet = 0
    for n in range(200):
        moved = False
        for me in rng.sample(members, len(members)):
            kept = {s for s, r in reserved.items() if r >= n - 1}
            decided = plan(count, me, members, owners, kept)
            for s in decided.take:
                assert s not in owners  # never taken from a live owner
                assert s not in kept or gave[s] != me  # nor taken back by who let it go
                owners[s], opened[s] = me, n
                reserved.pop(s, None)
            mine = sorted((s for s, o in owners.items() if o == me and opened[s] < n), reverse=True)
            for s in mine[: decided.give]:
                del owners[s]
                reserved[s], gave[s] = n, me
            moved |= bool(decided.take or decided.give)
        held = [sum(1 for o in owners.values() if o == m) for m in members]
        settled = len(owners) == count and all(lo <= h <= hi for h in held)
        quiet = quiet + 1 if settled and not moved else 0
        if quiet == 3:
            return n
    raise AssertionError(f"never settled: {count} shards, {members}, {owners}")


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
def test_replicas_joining_and_leaving_settle_on_fair_shares(count: int) -> None:
    rng = random.Random(count)
    for joined in range(1, 6):
        members = [1]
        owners = dict.fromkeys(range(count), 1)  # the first replica up took them all
        members += list(range(2, joined + 1))
        _rounds(count, members, owners, rng)
        if joined > 1:  # one leaves (its shards are free), a new one joins
            gone = rng.choice(members)
            members.remove(gone)
            owners = {s: o for s, o in owners.items() if o != gone}
            _rounds(count, members, owners, rng)
            members.append(max(members) + 100)
            _rounds(count, members, owners, rng)


# --- the ledger in PostgreSQL -----------------------------------------------------------------


async def test_the_ledger_hands_over_half_to_a_replica_that_joins(
    ledger: Callable[[str, str], Awaitable[Ledger]],  # noqa: F811
) -> None:
    (a, _), (b, b_link) = await ledger("a", "discord"), await ledger("b", "discord")
    first = await a.claim(4)
    assert sorted(first.owned) == [0, 1, 2, 3] and first.give == 0
    assert await b.claim(4) == Claim({}, 0)  # b is now a member, with nothing free
    told = await a.claim(4)
    assert told == Claim(first.owned, 2)
    # a released shard at an old epoch is not released
    await a.release(4, {0: first.owned[0] + 1})
    assert sorted((await a.claim(4)).owned) == [0, 1, 2, 3]
    await a.release(4, {3: first.owned[3], 2: first.owned[2]})
    assert await a.claim(4) == Claim({0: first.owned[0], 1: first.owned[1]}, 0)
    taken = await b.claim(4)
    assert taken == Claim({2: first.owned[2] + 1, 3: first.owned[3] + 1}, 0)
    for _ in range(2):  # settled
        assert (await a.claim(4)).give == 0 and (await b.claim(4)) == taken
    # b's replica goes: a takes its shards back at its next claim once the server has ended
    # b's session (closing the connection does not wait for the backend to exit)
    await b_link.close()
    for _ in range(200):
        back = await a.claim(4)
        if len(back.owned) == 4:
            break
        await asyncio.sleep(0.05)
    assert sorted(back.owned) == [0, 1, 2, 3] and back.give == 0


async def test_a_receivers_one_shard_stays_with_its_holder(
    ledger: Callable[[str, str], Awaitable[Ledger]],  # noqa: F811
) -> None:
    (a, _), (b, _) = await ledger("a", "matrix"), await ledger("b", "matrix")
    (c, c_link) = await ledger("c", "matrix")
    assert (await c.claim(1)).owned.keys() == {0}
    for _ in range(2):
        assert await a.claim(1) == Claim({}, 0) and await b.claim(1) == Claim({}, 0)
        assert (await c.claim(1)).give == 0
    await c_link.close()
    assert (await b.claim(1)).owned.keys() == {0}  # the first to ask after c went
    assert await a.claim(1) == Claim({}, 0)
