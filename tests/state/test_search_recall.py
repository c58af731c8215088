"""Ranking quality on a labelled set, on every backend: a corpus where the messages each
query is after are known, buried among newer messages that hold only some of its words
and among filler. recall@k is the share of a query's relevant messages in its first k
hits; BM25 with recency must put them there, whether document frequency is counted (a
small store) or estimated from the newest matches (a big one; forced here)."""

from __future__ import annotations

import random
import time

import pytest

from state import Store, ranking

FILLER = (
    "the a to and of we it is for on with that this you can be will have update "
    "server build check send message today later thanks please note team call"
).split()

# topic -> (its query, words each relevant message holds, words distractors hold alone)
TOPICS = {
    "kafka": ("kafka OR rebalance", ("kafka", "rebalance"), ("kafka", "rebalance")),
    "tls": ("certificate OR expired", ("certificate", "expired"), ("certificate", "expired")),
    "dns": ("resolver OR timeout", ("resolver", "timeout"), ("timeout",)),
    "oom": ("memory OR killed OR pod", ("memory", "killed", "pod"), ("pod", "memory")),
    "phrase": ('"disk quota"', ("disk quota",), ("disk", "quota")),
    "prefix": ("migrat*", ("migration",), ()),
}
RELEVANT_PER_TOPIC = 6
DISTRACTORS_PER_TOPIC = 25
K = 10


def _filler(rnd: random.Random, n: int) -> str:
    return " ".join(rnd.choices(FILLER, k=n))


async def _seed(store: Store) -> dict[str, set[int]]:
    """The corpus; returns each topic's relevant message ids."""
    rnd = random.Random(3)
    now = time.time()
    sid = await store.create_session(source="api")
    rows: list[tuple[float, str, str | None]] = []
    for topic, (_query, words, alone) in TOPICS.items():
        for _ in range(RELEVANT_PER_TOPIC):  # up to ten days old
            text = f"{_filler(rnd, 4)} {' '.join(words)} {_filler(rnd, 6)}"
            rows.append((now - rnd.uniform(0, 10) * 86400, text, topic))
        for i in range(DISTRACTORS_PER_TOPIC if alone else 0):  # newer, one word each
            text = f"{_filler(rnd, 6)} {alone[i % len(alone)]} {_filler(rnd, 8)}"
            rows.append((now - rnd.uniform(0, 2) * 86400, text, None))
    for _ in range(400):
        rows.append((now - rnd.uniform(0, 30) * 86400, _filler(rnd, rnd.randint(5, 25)), None))
    rows.sort(key=lambda r: r[0])  # arrival order is time order
    relevant: dict[str, set[int]] = {t: set() for t in TOPICS}
    for ts, text, topic in rows:
        mid = await store.append_message(sid, "user", text, timestamp=ts)
        if topic is not None:
            relevant[topic].add(mid)
    return relevant


@pytest.mark.parametrize("exact", [True, False], ids=["counted-df", "estimated-df"])
async def test_relevant_messages_come_first(
    store: Store, exact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not exact:  # as on a store past the threshold: estimates, and the Python scoring
        monkeypatch.setattr(ranking, "EXACT_DF_BELOW", 0)
    relevant = await _seed(store)
    for topic, (query, _words, _alone) in TOPICS.items():
        hits = await store.search_messages(query, limit=K)
        found = {h["id"] for h in hits} & relevant[topic]
        assert len(found) / len(relevant[topic]) == 1.0, (topic, query, exact)
        # and they lead: every relevant message ranks above every distractor
        ranks = [h["id"] in relevant[topic] for h in hits]
        assert ranks[: len(relevant[topic])] == [True] * len(relevant[topic]), (topic, ranks)


async def test_recall_holds_on_pages_past_the_first(store: Store) -> None:
    relevant = await _seed(store)
    query = TOPICS["kafka"][0]
    first = await store.search_messages(query, limit=3)
    second = await store.search_messages(query, limit=3, offset=3)
    assert {h["id"] for h in first + second} == relevant["kafka"]
