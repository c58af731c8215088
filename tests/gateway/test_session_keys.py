"""Session keys: the table in docs/architecture.md as cases, round trips and no accidental sharing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.session_keys import KeySettings, SessionSource, build_key, parse_key

PER_USER = KeySettings()
SHARED = KeySettings(group_sessions_per_user=False)
THREAD_PER_USER = KeySettings(thread_sessions_per_user=True)


@pytest.mark.parametrize(
    "source, settings, key",
    [
        (SessionSource("telegram", "42", "dm", "42"), PER_USER, "agent:main:telegram:dm:42"),
        (
            SessionSource("telegram", "-100111", "group", "7"),
            PER_USER,
            "agent:main:telegram:group:-100111:7",
        ),
        (
            SessionSource("telegram", "-100111", "group", "7"),
            SHARED,
            "agent:main:telegram:group:-100111",
        ),
        (
            SessionSource("telegram", "-100111", "group", None),
            PER_USER,
            "agent:main:telegram:group:-100111",
        ),
        (
            SessionSource("telegram", "-100222", "group", "7", thread_id="77"),
            PER_USER,
            "agent:main:telegram:group:-100222:t=77",
        ),
        (
            SessionSource("telegram", "-100222", "group", "7", thread_id="77"),
            THREAD_PER_USER,
            "agent:main:telegram:group:-100222:t=77:7",
        ),
        (
            SessionSource("discord", "555", "thread", "9", thread_id="555"),
            PER_USER,
            "agent:main:discord:group:555:t=555",
        ),
        (
            SessionSource("slack", "C01", "channel", "U1"),
            PER_USER,
            "agent:main:slack:channel:C01:U1",
        ),
        (SessionSource("slack", "C01", "channel", "U1"), SHARED, "agent:main:slack:channel:C01:U1"),
        (SessionSource("slack", "C01", "channel", None), PER_USER, "agent:main:slack:channel:C01"),
        (SessionSource("api", "a:b%c", "dm", "x"), PER_USER, "agent:main:api:dm:a%3Ab%25c"),
        (SessionSource("api", "g", "group", "t=5"), PER_USER, "agent:main:api:group:g:t%3D5"),
    ],
)
def test_key_table(source: SessionSource, settings: KeySettings, key: str) -> None:
    built = build_key(source, settings)
    assert built.format() == key
    assert parse_key(key) == built


def test_shared_sessions_are_marked_shared() -> None:
    assert build_key(SessionSource("telegram", "g", "group", "1"), SHARED).shared
    assert build_key(SessionSource("telegram", "g", "group", "1", thread_id="5")).shared
    assert not build_key(SessionSource("telegram", "g", "group", "1")).shared
    assert not build_key(SessionSource("telegram", "1", "dm", "1")).shared


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "agent:main",
        "agent:main:x:dm",
        "agent:main:x:dm:1:2",
        "agent:main:x:zone:1",
        "other:main:x:dm:1",
        "agent:main:x:group:1:a:b",
    ],
)
def test_parse_rejects_malformed_keys(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_key(bad)


ids = st.text(min_size=1, max_size=12)
sources = st.builds(
    SessionSource,
    platform=st.sampled_from(["telegram", "discord", "slack", "api"]),
    chat_id=ids,
    chat_type=st.sampled_from(["dm", "group", "channel", "thread"]),
    user_id=st.none() | ids,
    thread_id=st.none() | ids,
)
settings_st = st.builds(KeySettings, st.booleans(), st.booleans())


@given(sources, settings_st)
def test_format_parse_round_trip(source: SessionSource, settings: KeySettings) -> None:
    key = build_key(source, settings)
    assert parse_key(key.format()) == key


@given(sources, sources, settings_st)
def test_different_sources_share_a_key_only_when_the_rules_say_so(
    a: SessionSource, b: SessionSource, settings: KeySettings
) -> None:
    ka, kb = build_key(a, settings), build_key(b, settings)
    if ka.format() != kb.format():
        return
    # Same key: same platform and chat, and the rules made them share.
    assert (a.platform, a.chat_id) == (b.platform, b.chat_id)
    scope = lambda s: (
        "dm" if s.chat_type == "dm" else ("channel" if s.chat_type == "channel" else "group")
    )  # noqa: E731
    assert scope(a) == scope(b)
    if a.chat_type == "dm":
        return
    assert a.thread_id == b.thread_id
    if a.user_id != b.user_id:
        # people share only in a shared room / thread, or when a user id is missing
        assert ka.user_id is None
