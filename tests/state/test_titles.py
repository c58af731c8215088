"""Title rules: cleaning, length, case-insensitive uniqueness, lineage numbering."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from state import SessionDB, Store, TitleEmpty, TitleTaken, TitleTooLong
from state.titles import MAX_TITLE_LENGTH, clean_title, split_lineage, title_key


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        ("  my   project  ", "my project"),
        ("tab\tand\nnewline", "tab and newline"),
        ("zero\u200bwidth\u200d joiner", "zerowidth joiner"),
        ("bidi \u202eevil\u202c override", "bidi evil override"),
        ("isolate \u2066x\u2069", "isolate x"),
        ("bell\x07 and null\x00", "bell and null"),
        ("emoji 🎉 kept", "emoji 🎉 kept"),
        ("中文标题 and café", "中文标题 and café"),
        ("\ufeffBOM first", "BOM first"),
        ("", ""),
        ("\u200b\u200b", ""),
    ],
)
def test_clean_title(raw: str, cleaned: str) -> None:
    assert clean_title(raw) == cleaned


@pytest.mark.parametrize(
    "title, base, number",
    [
        ("my project", "my project", 1),
        ("my project #2", "my project", 2),
        ("my project #10", "my project", 10),
        ("issue #abc", "issue #abc", 1),  # only a numeric suffix is a lineage number
        ("#3", "#3", 1),
        ("x #0", "x #0", 1),
        ("a #2 #3", "a #2", 3),
    ],
)
def test_split_lineage(title: str, base: str, number: int) -> None:
    assert split_lineage(title) == (base, number)


@given(st.text(max_size=300))
def test_cleaned_titles_have_no_invisible_or_control_characters(raw: str) -> None:
    out = clean_title(raw)
    assert out == out.strip()
    assert "  " not in out
    assert not any(ch in out for ch in "\u200b\u200d\u202e\u2066\x00\x07\n\t")


async def test_set_title_rules(store: Store) -> None:
    a = await store.create_session(source="telegram")
    b = await store.create_session(source="telegram")
    assert await store.set_session_title(a, "  Launch   Plan ") == "Launch Plan"
    with pytest.raises(TitleTaken):
        await store.set_session_title(b, "launch plan")  # case-insensitive
    with pytest.raises(TitleTaken):
        await store.set_session_title(b, "LAUNCH\u200b PLAN")  # invisible chars do not help
    assert await store.set_session_title(a, "launch plan") == "launch plan"  # own title, new case
    with pytest.raises(TitleTooLong) as too_long:
        await store.set_session_title(b, "x" * (MAX_TITLE_LENGTH + 1))
    assert "101" in str(too_long.value)
    assert await store.set_session_title(b, "y" * MAX_TITLE_LENGTH) == "y" * MAX_TITLE_LENGTH
    with pytest.raises(TitleEmpty):
        await store.set_session_title(b, "\u200b\u202e")
    assert await store.set_session_title(b, None) is None
    assert await store.get_session_title(b) is None
    assert await store.set_session_title(b, "Ünïcödé 标题 🎉") == "Ünïcödé 标题 🎉"
    with pytest.raises(TitleTaken):
        await store.set_session_title(a, "ÜNÏCÖDÉ 标题 🎉")
    assert (await store.get_session_by_title("ünïcödé 标题 🎉") or {}).get("id") == b


async def test_lineage_titles_number_and_resolve_to_the_newest(store: Store) -> None:
    root = await store.create_session(source="telegram", title="my project")
    assert await store.get_next_title_in_lineage("my project") == "my project #2"
    c2 = await store.fork_session(root, "compression", end_reason="compression")
    c3 = await store.fork_session(c2, "compression", end_reason="compression")
    assert await store.get_session_title(c2) == "my project #2"
    assert await store.get_session_title(c3) == "my project #3"
    assert await store.get_next_title_in_lineage("my project #2") == "my project #4"
    assert await store.resolve_session_by_title("my project") == c3
    assert await store.resolve_session_by_title("MY PROJECT") == c3
    assert await store.resolve_session_by_title("my project #2") == c2
    assert await store.resolve_session_by_title("my project #9") is None
    assert await store.resolve_session_by_title("nothing") is None
    # an unrelated title that merely starts the same way is not in the lineage
    other = await store.create_session(source="telegram", title="my project notes")
    assert await store.resolve_session_by_title("my project") == c3
    assert await store.resolve_session_by_title("my project notes") == other
    # a title with LIKE wildcards is matched literally
    pct = await store.create_session(source="telegram", title="100% done")
    await store.create_session(source="telegram", title="100X done #2")
    assert await store.resolve_session_by_title("100% done") == pct


def test_title_key_folds_case_across_scripts() -> None:
    assert title_key("STRASSE") == title_key("straße")
    assert title_key("ΣΊΣΥΦΟΣ") == title_key("σίσυφος")


async def test_automatic_titles_number_a_long_lineage_and_skip_foreign_titles(
    db: SessionDB,
) -> None:
    """Sixty sessions wanting the same title get "hello", "hello #2" ... in order; a
    "hello #61" written by another program (no lineage columns) is skipped, not reused."""
    sids = [await db.create_session(source="api") for _ in range(61)]
    titles = [await db.set_title_if_unset(s, "hello") for s in sids[:60]]
    assert titles == ["hello"] + [f"hello #{n}" for n in range(2, 61)]
    foreign = await db.create_session(source="api")
    await db.writer.submit(
        lambda c: c.execute(
            "UPDATE sessions SET title = 'hello #61', title_key = 'hello #61' WHERE id = ?",
            (foreign,),
        )
    )
    assert await db.set_title_if_unset(sids[60], "hello") == "hello #62"
    assert await db.resolve_session_by_title("hello") == sids[60]
    assert await db.set_title_if_unset(sids[0], "other") is None  # never overwrites
