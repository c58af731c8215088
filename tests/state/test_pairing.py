"""DM pairing rows on every backend (the `store` fixture): a code per user within the
limits, single use, expiry, approvals that survive reopening the store, revocation."""

from __future__ import annotations

from state import Store
from state.sqlite.pairing import APPROVED, DENIED, TAKEN

LIMITS = {"ttl_s": 600.0, "user_interval_s": 60.0, "max_pending": 2}


async def test_a_user_gets_one_code_until_it_expires_and_the_interval_passes(store: Store) -> None:
    offer = store.pairing_offer
    assert await offer("telegram", "7", "Ann", "7", "AAAA1111", now=100, **LIMITS) == "AAAA1111"
    assert await offer("telegram", "7", "Ann", "7", "BBBB2222", now=101, **LIMITS) is None
    assert await offer("telegram", "7", "Ann", "7", "BBBB2222", now=699, **LIMITS) is None
    assert await offer("telegram", "7", "Ann", "7", "BBBB2222", now=701, **LIMITS) == "BBBB2222"
    assert await store.pairing_decide("AAAA1111", APPROVED, now=702) is None  # the old code


async def test_the_platform_limit_and_a_taken_code(store: Store) -> None:
    offer = store.pairing_offer
    assert await offer("telegram", "1", None, "1", "CODE0001", now=10, **LIMITS) == "CODE0001"
    assert await offer("telegram", "2", None, "2", "CODE0001", now=10, **LIMITS) == TAKEN
    assert await offer("telegram", "2", None, "2", "CODE0002", now=10, **LIMITS) == "CODE0002"
    assert await offer("telegram", "3", None, "3", "CODE0003", now=10, **LIMITS) is None
    assert await offer("slack", "3", None, "3", "CODE0003", now=10, **LIMITS) == "CODE0003"


async def test_a_code_works_once_and_not_after_it_expired(store: Store) -> None:
    offer, limits = store.pairing_offer, {**LIMITS, "max_pending": 3}
    for user, code in (("7", "APPROVE1"), ("8", "DENYME01"), ("9", "LATE0001")):
        assert (
            await offer(
                "telegram",
                user,
                "Ann" if user == "7" else None,
                f"{user}0",
                code,
                now=100,
                **limits,
            )
            == code
        )
    done = await store.pairing_decide("APPROVE1", APPROVED, now=200)
    assert done is not None and (
        done["platform"],
        done["user_id"],
        done["user_name"],
        done["chat_id"],
    ) == ("telegram", "7", "Ann", "70")
    assert await store.pairing_decide("APPROVE1", APPROVED, now=201) is None
    assert await store.pairing_decide("DENYME01", DENIED, now=201) is not None
    assert await store.pairing_decide("LATE0001", APPROVED, now=701) is None
    assert await store.pairing_approved("telegram", "7")
    assert not await store.pairing_approved("telegram", "8")
    assert not await store.pairing_approved("telegram", "9")
    listed = await store.pairing_list(now=300)
    assert [(r["user_id"], r["state"]) for r in listed] == [("7", "approved"), ("9", "pending")]
    assert await offer("telegram", "7", "Ann", "70", "AGAIN001", now=9999, **limits) is None


async def test_approvals_survive_reopening_and_revoke_ends_them(open_test_store: object) -> None:
    opener = open_test_store  # type: ignore[assignment]
    first: Store = await opener("home")  # type: ignore[operator]
    await first.pairing_offer("telegram", "7", "Ann", "7", "KEEPME01", now=100, **LIMITS)
    await first.pairing_decide("KEEPME01", APPROVED, now=101)
    await first.close()
    again: Store = await opener("home")  # type: ignore[operator]
    assert await again.pairing_approved("telegram", "7")
    assert await again.pairing_revoke("telegram", "7", now=200)
    assert not await again.pairing_revoke("telegram", "7", now=201)
    assert not await again.pairing_approved("telegram", "7")
    code = await again.pairing_offer("telegram", "7", "Ann", "7", "BACK0001", now=300, **LIMITS)
    assert code == "BACK0001"  # a revoked user may ask again
