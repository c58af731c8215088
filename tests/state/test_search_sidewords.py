"""A search for words the side index (CJK/emoji messages) lacks leaves it out: what it
finds stays what the side index would have given, also after the side index changes."""

from __future__ import annotations

from pathlib import Path

from state import SessionDB
from state.sqlite import sidewords


async def _found(db: SessionDB, query: str) -> set[str]:
    return {h["session_id"] for h in await db.search_messages(query)}


async def test_words_inside_cjk_text_are_found_with_the_side_words_kept(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        plain = await db.create_session(source="cli")
        glued = await db.create_session(source="cli")
        await db.append_message(plain, "user", "alpha and gamma in plain words")
        # unicode61 keeps `beta服务` as one token: only the side index finds `beta`
        await db.append_message(glued, "user", "修改beta服务端的配置 alpha")
        kept = sidewords.read(str(db.path))
        assert kept is not None and "beta" in kept.words and "gamma" not in kept.words
        assert await _found(db, "beta") == {glued}
        assert await _found(db, "alpha beta") == {glued}
        assert await _found(db, "gamma") == {plain}  # the side index left out
        assert await _found(db, "alpha") == {plain, glued}
        assert await _found(db, '"plain words"') == {plain}
    finally:
        await db.close()


async def test_a_changed_side_index_is_looked_up_again(tmp_path: Path) -> None:
    db = await SessionDB.open(tmp_path / "state.db")
    try:
        first = await db.create_session(source="cli")
        await db.append_message(first, "user", "東京タワー alpha")
        await db.append_message(first, "user", "delta in plain words")
        kept = sidewords.read(str(db.path))
        assert kept is not None and "delta" not in kept.words
        assert await _found(db, "delta") == {first}
        later = await db.create_session(source="cli")
        # the kept words lack `delta`: the side index's new state says they are stale
        await db.append_message(later, "user", "delta東京に行きました")
        assert await _found(db, "delta") == {first, later}
        assert sidewords.known(str(db.path)) != kept
        fresh = sidewords.read(str(db.path))
        assert fresh is not None and "delta" in fresh.words
        assert await _found(db, "delta") == {first, later}
    finally:
        await db.close()


def test_required_words_are_the_plain_words_every_hit_holds() -> None:
    from state import query as q

    assert sidewords.required(q.parse("alpha Beta")) == frozenset({"alpha", "beta"})
    assert sidewords.required(q.parse('"don\'t stop" now')) == frozenset(
        {"don", "t", "stop", "now"}
    )
    assert sidewords.required(q.parse("alpha OR beta")) is None
    assert sidewords.required(q.parse("alpha NOT beta")) == frozenset({"alpha"})
    assert sidewords.required(q.parse("alph*")) is None
    assert sidewords.required(q.parse("café")) is None
    assert sidewords.required(q.parse("東京 alpha")) == frozenset({"alpha"})


async def test_a_cjk_search_keeps_only_what_its_filters_keep(tmp_path: Path) -> None:
    """A window no bm25() scores is read with each row's filters as a column: rows the
    filters drop count in its size and never reach the page."""
    from state import SessionFilter

    db = await SessionDB.open(tmp_path / "state.db")
    try:
        tg = await db.create_session(source="telegram")
        cli = await db.create_session(source="cli")
        for sid in (tg, cli):
            await db.append_message(sid, "user", "東京タワーに行きました")
            await db.append_message(sid, "assistant", "東京は楽しい")
        assert await _found(db, "東京") == {tg, cli}
        assert await _found(db, '"東京タワー"') == {tg, cli}
        hits = await db.search_messages("東京", sources=["telegram"])
        assert {h["session_id"] for h in hits} == {tg} and len(hits) == 2
        hits = await db.search_messages("東京", roles=["assistant"])
        assert {h["role"] for h in hits} == {"assistant"} and len(hits) == 2
        hits = await db.search_messages("東京", scope=SessionFilter(source="cli"))
        assert {h["session_id"] for h in hits} == {cli}
        assert await db.search_messages("東京", exclude_sources=["telegram", "cli"]) == []
    finally:
        await db.close()
