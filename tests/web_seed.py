"""A small state.db for the dashboard tests: three platforms, a lineage with every child
kind, a tool call, a long message, hostile strings, an empty ended session, tokens."""

from __future__ import annotations

from dataclasses import dataclass

from state import Store

DAY = 86400.0
HOSTILE_TITLE = '"><img src=x onerror=alert(1)>'
SCRIPT_TEXT = "<script>window.__pwned = 1</script> needle hostile"
RTL_TEXT = "invoice \u202egpj.exe needle rtl"


@dataclass(frozen=True)
class Seeded:
    root: str
    compressed: str
    compressed2: str
    branch: str
    reset: str
    hostile: str
    discord: str
    slack: str
    empty: str
    tool_msg: int
    rtl_msg: int


async def seed(db: Store, now: float) -> Seeded:
    t0 = now - 3 * DAY
    root = await db.create_session(
        "20250101_000000_aaaa0001",
        "telegram",
        model="gpt-4o-mini",
        title="project alpha",
        started_at=t0,
        chat_id="100",
        chat_type="dm",
        user_id="u1",
        session_key="agent:main:telegram:dm:100",
    )
    await db.append_message(root, "user", "how do I deploy the alpha server", timestamp=t0 + 10)
    await db.append_message(root, "assistant", "run the deploy script", timestamp=t0 + 20)
    await db.update_token_counts(root, input_tokens=1_000_000, output_tokens=500_000)
    compressed = await db.fork_session(root, "compression", end_reason="compression")
    await db.append_message(compressed, "user", "summary please", timestamp=t0 + 3600)
    compressed2 = await db.fork_session(compressed, "compression", end_reason="compression")
    await db.append_message(compressed2, "user", "still compressing", timestamp=t0 + 7200)
    # a branch of the ended root answers a chat of its own: one live session per key
    branch = await db.fork_session(
        root,
        "branch",
        title="alpha experiment",
        chat_id="101",
        session_key="agent:main:telegram:dm:101",
    )
    await db.append_message(branch, "user", "try another way", timestamp=t0 + 9000)
    reset = await db.fork_session(compressed2, "reset", end_reason="session_reset")
    await db.update_session(reset, handoff_state="completed", handoff_platform="discord")
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "session_search", "arguments": '{"query": "alpha"}'},
    }
    await db.append_message(reset, "assistant", None, tool_calls=[call], timestamp=now - DAY)
    tool_msg = await db.append_message(
        reset,
        "tool",
        '{"hits": 3}',
        tool_name="session_search",
        tool_call_id="c1",
        timestamp=now - DAY + 1,
    )
    await db.append_message(
        reset, "assistant", "long answer " + "word " * 800, timestamp=now - DAY + 2
    )
    hostile = await db.create_session(
        "20250102_000000_bbbb0002",
        "telegram",
        title=HOSTILE_TITLE,
        started_at=now - 2 * DAY,
        chat_id="200",
        chat_type="group",
        user_id="u2",
    )
    await db.append_message(hostile, "user", SCRIPT_TEXT, timestamp=now - 2 * DAY + 5)
    rtl_msg = await db.append_message(hostile, "assistant", RTL_TEXT, timestamp=now - 2 * DAY + 6)
    discord = await db.create_session(
        "20250103_000000_cccc0003",
        "discord",
        model="claude-x",
        started_at=now - DAY / 2,
        chat_id="300",
        chat_type="group",
        user_id="u3",
    )
    await db.append_message(discord, "user", "discord chatter needle", timestamp=now - DAY / 2 + 1)
    await db.update_token_counts(discord, input_tokens=2000, output_tokens=1000)
    slack = await db.create_session(
        "20250104_000000_dddd0004",
        "slack",
        title="slack standup",
        started_at=now - 10 * DAY,
        chat_id="400",
        chat_type="channel",
        user_id="u4",
    )
    await db.append_message(slack, "user", "standup notes", timestamp=now - 10 * DAY + 1)
    await db.end_session(slack, "idle", now=now - 9 * DAY)
    empty = await db.create_session(
        "20250105_000000_eeee0005",
        "telegram",
        started_at=now - 5 * DAY,
        chat_id="500",
        chat_type="dm",
    )
    await db.end_session(empty, "session_reset", now=now - 5 * DAY + 60)
    return Seeded(
        root,
        compressed,
        compressed2,
        branch,
        reset,
        hostile,
        discord,
        slack,
        empty,
        tool_msg,
        rtl_msg,
    )
