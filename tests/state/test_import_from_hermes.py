"""`switchboard import --from-hermes` on a Hermes home written by the real hermes-agent
0.19.0 package: everything arrives, a second run changes nothing, a dry run writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from state import SessionDB
from tests.hermes_pkg import run_hermes

_HERMES_HOME = """
db.create_session("root", "telegram", user_id="u1", model="m1")
db.append_message("root", "user", "first question about 部署")
db.append_message("root", "assistant", None, tool_calls=[{"id": "c1", "type": "function",
    "function": {"name": "web_lookup", "arguments": "{}"}}])
db.append_message("root", "tool", "lookup result", tool_name="web_lookup", tool_call_id="c1")
db.update_token_counts("root", input_tokens=120, output_tokens=30, model="m1",
                       billing_provider="p1", api_call_count=2, estimated_cost_usd=0.5)
db.set_session_title("root", "Deploy Plan")
db.end_session("root", "compression")
db.create_session("tip", "telegram", user_id="u1", parent_session_id="root")
db.append_message("tip", "user", [{"type": "text", "text": "see picture"},
                                  {"type": "image_url", "image_url": {"url": "x"}}])
db.set_session_title("tip", "Deploy Plan #2")
"""


def _cli(home: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "--home", str(home), "import", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


async def test_a_hermes_home_comes_over_once(tmp_path: Path) -> None:
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    run_hermes(hermes_home / "state.db", _HERMES_HOME, home=hermes_home)
    home = tmp_path / "switchboard"

    dry = _cli(home, "--from-hermes", str(hermes_home), "--dry-run")
    assert "would import 2 sessions, 4 messages, 2 titles" in dry
    db = await SessionDB.open(home / "state.db")
    assert await db.session_count() == 0
    await db.close()

    assert "imported 2 sessions, 4 messages, 2 titles" in _cli(home, "--from-hermes", str(hermes_home))
    again = _cli(home, "--from-hermes", str(hermes_home))
    assert "imported 0 sessions, 0 messages" in again and "2 already present" in again

    db = await SessionDB.open(home / "state.db")
    try:
        root = await db.require_session("root")
        assert (root["input_tokens"], root["output_tokens"], root["api_call_count"]) == (120, 30, 2)
        assert (root["title"], root["end_reason"], root["model"]) == ("Deploy Plan", "compression", "m1")
        assert await db.get_compression_tip("root") == "tip"
        msgs = await db.get_messages("root")
        assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
        assert msgs[1]["tool_calls"][0]["function"]["name"] == "web_lookup"
        assert (await db.get_messages("tip"))[0]["content"][1]["type"] == "image_url"
        assert [h["session_id"] for h in await db.search_messages("部署")] == ["root"]
        assert [h["session_id"] for h in await db.search_messages("web_lookup", roles=["tool"])]
        assert (await db.model_usage("root"))[0]["input_tokens"] == 120
        listed = {r["id"]: r for r in await db.list_sessions(include_children=True)}
        assert listed["root"]["preview"] == "first question about 部署"
        assert await db.message_count() == 4
    finally:
        await db.close()
