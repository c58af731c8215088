"""The generic signed webhook through the whole daemon: requests signed from the documented
format (not with our code) POSTed to `/webhooks/<name>`, replies in the response body (sync)
or POSTed to a loopback callback receiver that verifies our signature (async, late replies,
handoffs); plus the pure signature check and body translation, and the webhook guide's curl +
openssl recipe run as a shell script."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.api import ApiAdapter
from gateway.adapters.base import Backoff
from gateway.adapters.webhook import Endpoint, WebhookAdapter
from gateway.adapters.webhook_wire import endpoints_problem, sign, to_inbound, verify
from gateway.app import Gateway
from gateway.config import load_config
from gateway.errors import ConfigError, NotAccepted
from gateway.handoff import HOME_KEY, handoff_from_terminal
from gateway.messages import InboundMessage
from tests.fakes import stalled_then_on_time, started
from tests.fakes.webhook_receiver import SECRET, CallbackReceiver, post_signed, signature
from tests.gateway.conftest import ScriptedAgent

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_SECRET = "fake-deploy-signing-secret"
ENV = {"WEBHOOK_CI_SECRET": SECRET, "WEBHOOK_DEPLOY_SECRET": DEPLOY_SECRET}
KEY = "agent:main:webhook:dm:ci%3Aann"


@pytest.fixture
async def receiver() -> AsyncIterator[CallbackReceiver]:
    server = CallbackReceiver()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def _section(callback: str, timeout: int = 10) -> str:
    return (
        "  webhook:\n    enabled: true\n    allow_all_users: true\n    endpoints:\n"
        f"      ci:\n        secret_env: WEBHOOK_CI_SECRET\n        reply_timeout_seconds: {timeout}\n"
        f"        callback_url: {callback}\n"
        f"      deploy:\n        secret_env: WEBHOOK_DEPLOY_SECRET\n        mode: async\n"
        f"        callback_url: {callback}\n"
    )


async def _gateway(tmp_path: Path, receiver: CallbackReceiver, timeout: int = 10) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n" + _section(receiver.url, timeout))
    agent = ScriptedAgent()
    agent.delay_on["slow"] = 2.0
    gateway = Gateway(config=load_config(cfg, ENV), home=tmp_path / "home", agent=agent)
    await gateway.start()
    return gateway


def _base(gateway: Gateway) -> str:
    api = next(a for a in gateway.adapters if a.platform == "api")
    return f"http://127.0.0.1:{api.bound_port}"  # type: ignore[attr-defined]


@pytest.fixture
async def gw(tmp_path: Path, receiver: CallbackReceiver) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = await _gateway(tmp_path, receiver)
    try:
        yield gateway, _base(gateway)
    finally:
        await gateway.stop()


def _msg(text: str, mid: str = "m-1", user: str = "ann", **more: str) -> dict[str, str]:
    return {"id": mid, "user": user, "text": text, **more}


async def _messages(gateway: Gateway, key: str) -> list[dict[str, Any]]:
    assert gateway.index is not None and gateway.db is not None
    entry = gateway.index.get(key)
    assert entry is not None, key
    return list(await gateway.db.get_messages_as_conversation(entry.session_id))


# --- signatures: forged, missing, malformed, stale, replayed ------------------------------


async def test_forged_missing_malformed_and_stale_requests_are_refused_and_never_stored(
    gw: tuple[Gateway, str], receiver: CallbackReceiver
) -> None:
    gateway, base = gw
    url, body = f"{base}/webhooks/ci", _msg("forged")
    now = int(time.time())
    cases = [
        ({"secret": "not-the-secret"}, 403),
        ({"secret": DEPLOY_SECRET}, 403),  # another endpoint's secret
        ({"secret": None}, 401),
        ({"header": "sha256=abc"}, 401),
        ({"header": f"t={now},v1="}, 401),
        ({"ts": now - 301}, 401),  # stale
        ({"ts": now + 400}, 401),  # from the future
        ({"header": signature(SECRET, now, b'{"id":"m-1","user":"ann","text":"other"}')}, 403),
    ]
    for kwargs, status in cases:
        got, answer = await post_signed(url, body, **kwargs)  # type: ignore[arg-type]
        assert (got, kwargs) == (status, kwargs) and answer["error"]
    assert gateway.index is not None and gateway.index.get(KEY) is None
    assert receiver.received == []
    webhook = next(a for a in gateway.adapters if isinstance(a, WebhookAdapter))
    assert webhook.health()["refused"] == len(cases)


async def test_a_replayed_request_is_answered_once(gw: tuple[Gateway, str]) -> None:
    gateway, base = gw
    url = f"{base}/webhooks/ci"
    ts = int(time.time())
    status, first = await post_signed(url, _msg("once please", mid="r-1"), ts=ts)
    assert (status, first["reply"], first["duplicate"]) == (200, "echo: once please", False)
    status, again = await post_signed(url, _msg("once please", mid="r-1"), ts=ts)  # the same bytes
    assert (status, again["reply"], again["duplicate"]) == (200, "echo: once please", True)
    status, resent = await post_signed(url, _msg("once please", mid="r-1"))  # signed anew
    assert (status, resent["duplicate"]) == (200, True)
    assert [m["content"] for m in await _messages(gateway, KEY)] == [
        "once please",
        "echo: once please",
    ]


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"{not json", "the body must be JSON"),
        (b"[1, 2]", "the body must be a JSON object"),
        (json.dumps({"user": "ann", "text": "x"}).encode(), "id must be a non-empty string"),
        (
            json.dumps({"id": "1", "user": "ann", "text": "  "}).encode(),
            "text must be a non-empty string",
        ),
        (json.dumps({"id": "1", "text": "x"}).encode(), "user must be a non-empty string"),
        (
            json.dumps({"id": "1", "user": "a", "text": "x", "thread": "t"}).encode(),
            "thread needs chat",
        ),
        (
            json.dumps({"id": "1", "user": "a", "text": "x", "room": "r"}).encode(),
            "unknown field 'room'",
        ),
        (json.dumps({"id": "1", "user": "a" * 201, "text": "x"}).encode(), "at most 200"),
        (
            json.dumps({"id": "1", "user": "a", "text": "a\x00b"}).encode(),
            "text contains U+0000 (NUL)",
        ),
        (b'{"id": "1", "user": "a\\ud800", "text": "x"}', "user contains a lone surrogate U+D800"),
    ],
)
async def test_bad_bodies_get_a_clear_400(gw: tuple[Gateway, str], raw: bytes, why: str) -> None:
    gateway, base = gw
    status, answer = await post_signed(f"{base}/webhooks/ci", None, raw=raw)
    assert status == 400 and why in answer["error"]
    assert gateway.index is not None and len(gateway.index) == 0


# --- sync mode ------------------------------------------------------------------------------


async def test_a_message_is_answered_in_the_response_body(gw: tuple[Gateway, str]) -> None:
    gateway, base = gw
    status, answer = await post_signed(f"{base}/webhooks/ci", _msg("hello **webhook**"))
    assert status == 200 and answer["reply"] == "echo: hello **webhook**"
    assert answer["session_id"] and answer["error"] is None and answer["notices"] == []
    assert gateway.index is not None and gateway.index.get(KEY) is not None


async def test_a_chat_in_a_group_keys_per_user_and_threads_share(gw: tuple[Gateway, str]) -> None:
    gateway, base = gw
    url = f"{base}/webhooks/ci"
    assert (await post_signed(url, _msg("a", mid="g-1", chat="ops")))[0] == 200
    assert (await post_signed(url, _msg("b", mid="g-2", chat="ops", thread="t9")))[0] == 200
    assert gateway.index is not None
    assert gateway.index.get("agent:main:webhook:group:ci%3Aops:ann") is not None
    assert gateway.index.get("agent:main:webhook:group:ci%3Aops:t=t9") is not None


async def test_a_chat_command_is_answered_by_the_core(gw: tuple[Gateway, str]) -> None:
    _, base = gw
    status, answer = await post_signed(f"{base}/webhooks/ci", _msg("/help", mid="c-1"))
    assert status == 200 and answer["reply"].startswith("Commands:") and "/help" in answer["reply"]


@pytest.mark.slow
async def test_a_slow_turn_answers_202_then_posts_the_reply_to_the_callback(
    tmp_path: Path, receiver: CallbackReceiver
) -> None:
    gateway = await _gateway(tmp_path, receiver, timeout=1)
    try:
        status, answer = await post_signed(
            f"{_base(gateway)}/webhooks/ci", _msg("slow one", mid="s-1")
        )
        assert status == 202 and answer["reply"] is None and "callback_url" in answer["detail"]
        [late] = await receiver.wait_replies(1)
        assert (late["chat_id"], late["reply_to"], late["text"]) == (
            "ci:ann",
            "s-1",
            "echo: slow one",
        )
        assert receiver.refused == []
        # a replay of it now gets the reply at once, from the same single turn
        url = f"{_base(gateway)}/webhooks/ci"
        status, again = await post_signed(url, _msg("slow one", mid="s-1"))
        assert (status, again["reply"], again["duplicate"]) == (200, "echo: slow one", True)
        assert len(await _messages(gateway, KEY)) == 2 and len(receiver.replies()) == 1
    finally:
        await gateway.stop()


# --- async mode and the callback ------------------------------------------------------------


async def test_async_mode_accepts_at_once_and_posts_a_signed_reply(
    gw: tuple[Gateway, str], receiver: CallbackReceiver
) -> None:
    gateway, base = gw
    receiver.secret = DEPLOY_SECRET
    status, answer = await post_signed(
        f"{base}/webhooks/deploy", _msg("ship it", mid="a-1", chat="prod"), secret=DEPLOY_SECRET
    )
    assert (status, answer) == (202, {"id": "a-1", "status": "accepted", "duplicate": False})
    [reply] = await receiver.wait_replies(1)
    assert reply["type"] == "reply" and reply["endpoint"] == "deploy"
    assert (reply["chat_id"], reply["chat"], reply["reply_to"], reply["text"]) == (
        "deploy:prod",
        "prod",
        "a-1",
        "echo: ship it",
    )
    assert receiver.refused == []  # our signature verified with the endpoint's secret
    status, again = await post_signed(
        f"{base}/webhooks/deploy", _msg("ship it", mid="a-1", chat="prod"), secret=DEPLOY_SECRET
    )
    assert (status, again["duplicate"]) == (202, True)


async def test_a_rate_limited_callback_is_waited_out(
    gw: tuple[Gateway, str], receiver: CallbackReceiver
) -> None:
    _, base = gw
    receiver.secret = DEPLOY_SECRET
    receiver.fail_next(429, {"Retry-After": "1"})
    receiver.fail_next(503)
    status, _ = await post_signed(
        f"{base}/webhooks/deploy", _msg("patience", mid="p-1"), secret=DEPLOY_SECRET
    )
    assert status == 202
    [reply] = await receiver.wait_replies(1, timeout=15)
    assert reply["text"] == "echo: patience" and receiver.failures == []


async def test_a_handoff_posts_to_the_endpoint_callback(
    gw: tuple[Gateway, str], receiver: CallbackReceiver
) -> None:
    gateway, _ = gw
    assert gateway.db is not None and gateway.handoffs is not None
    receiver.secret = DEPLOY_SECRET
    gateway.handoffs.poll_s = 0.05
    await gateway.db.set_meta(
        HOME_KEY.format("webhook"), json.dumps({"chat_id": "deploy:ops", "chat_type": "dm"})
    )
    sid = await gateway.db.create_session(source="cli", title="deploy plan")
    await gateway.db.append_messages(sid, [{"role": "user", "content": "we must migrate"}])
    ok, why = await asyncio.wait_for(
        handoff_from_terminal(gateway.db, sid, "webhook", enabled=True, poll_s=0.05), 30
    )
    assert ok, why
    [sent] = await receiver.wait_replies(1)
    assert (sent["endpoint"], sent["chat_id"], sent["reply_to"]) == ("deploy", "deploy:ops", None)
    assert sent["text"].startswith("Continuing here from the terminal (deploy plan).")
    assert gateway.index is not None and gateway.index.get("agent:main:webhook:dm:deploy%3Aops")


async def test_an_uncommitted_message_is_not_acknowledged(receiver: CallbackReceiver) -> None:
    """Inbox before ack: emit raising NotAccepted answers 503 in both modes; the retry runs."""
    adapter = WebhookAdapter(
        [Endpoint("ci", SECRET), Endpoint("deploy", SECRET, "async", receiver.url)]
    )
    server = ApiAdapter(port=0, routes=dict(adapter.routes()))
    store_up = False
    seen: list[InboundMessage] = []

    async def emit(msg: InboundMessage) -> None:
        if not store_up:
            raise NotAccepted("the store is down")
        seen.append(msg)

    await server.start(emit)
    await adapter.start(emit)
    try:
        base = f"http://127.0.0.1:{server.bound_port}/webhooks"
        assert (await post_signed(f"{base}/deploy", _msg("keep me", mid="n-1")))[0] == 503
        assert (await post_signed(f"{base}/ci", _msg("keep me too", mid="n-2")))[0] == 503
        store_up = True
        assert (await post_signed(f"{base}/deploy", _msg("keep me", mid="n-1")))[0] == 202
        assert [(m.source.chat_id, m.platform_message_id) for m in seen] == [("deploy:ann", "n-1")]
    finally:
        await adapter.stop()
        await server.stop()


async def test_a_callback_that_refuses_is_not_retried(receiver: CallbackReceiver) -> None:
    from gateway.errors import AdapterError
    from gateway.messages import OutboundMessage

    adapter = WebhookAdapter(
        [Endpoint("ci", "a-different-secret", "async", receiver.url)],
        backoff=Backoff(initial_s=0.01, max_s=0.05),
    )
    try:
        with pytest.raises(AdapterError, match=r"refused the POST \(401\)"):
            await adapter.send(OutboundMessage("webhook", "ci:ann", "x"))
        assert receiver.refused == ["bad signature"]
    finally:
        await adapter.stop()


async def test_a_webhook_reply_that_stood_still_on_its_way_out_stops_before_it_is_sent(
    receiver: CallbackReceiver,
) -> None:
    """Replicas: the process stands still (SIGSTOP, a stalled VM) after a callback reply's
    send began and before its POST left. Once the POST has its connection it finds its
    SEND_BY passed and stops unsent (SetOutLate), so the turn can ask its lease first
    (gateway/turns.py's send_checked). On time, it is POSTed once."""
    from gateway.messages import OutboundMessage

    adapter = WebhookAdapter([Endpoint("deploy", SECRET, "async", receiver.url)])

    receiver.keep_alive = False  # each POST connects: the send waits for its connection
    async with started(adapter):
        await stalled_then_on_time(
            lambda: adapter.send(OutboundMessage("webhook", "deploy:ann", "once")),
            lambda: [r["text"] for r in receiver.replies()],
        )


# --- the documented recipe, run as written ---------------------------------------------------


def _recipe() -> str:
    guide = (ROOT / "docs" / "platforms" / "webhook.md").read_text(encoding="utf-8")
    return (
        guide.split("<!-- webhook-signing-recipe -->", 1)[1]
        .split("```sh\n", 1)[1]
        .split("```", 1)[0]
    )


@pytest.mark.skipif(
    not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl"
)
async def test_the_documented_curl_and_openssl_recipe_verifies(gw: tuple[Gateway, str]) -> None:
    gateway, base = gw
    env = {**os.environ, "WEBHOOK_CI_SECRET": SECRET, "SWITCHBOARD_URL": base}
    out = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euc", _recipe()],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["reply"] == "echo: hello from curl" and answer["duplicate"] is False


# --- pure parts -----------------------------------------------------------------------------


def test_sign_matches_the_documented_format() -> None:
    assert sign(SECRET, 1_700_000_000, b'{"a":1}') == signature(SECRET, 1_700_000_000, b'{"a":1}')


@pytest.mark.parametrize(
    "header, now, status",
    [
        (None, 1000, 401),
        ("", 1000, 401),
        ("t=1000", 1000, 401),
        ("t=abc,v1=00", 1000, 401),
        ("t=1000,t=1001,v1=00", 1000, 401),
        ("SIGNED", 1000, 401),
        ("t=699,v1=00", 1000, 401),
        ("t=1000,v1=00", 1000, 403),
        (sign(SECRET, 1000, b"body"), 1300, None),
        (sign(SECRET, 1000, b"body"), 1301, 401),
        (sign(SECRET, 1000, b"body").upper().replace("T=", "t=").replace("V1=", "v1="), 1000, None),
        ("t=1000,v1=00," + sign(SECRET, 1000, b"body").split(",")[1], 1000, None),  # rotation
        (sign("other", 1000, b"body"), 1000, 403),
    ],
)
def test_verify(header: str | None, now: int, status: int | None) -> None:
    refusal = verify(SECRET, header, b"body", now, 300)
    assert (refusal.status if refusal else None) == status


def test_a_body_translates_into_the_endpoint_key_space() -> None:
    msg = to_inbound(
        "ci",
        {"id": 7, "user": "ann", "text": "hi", "chat": "ops", "thread": "t1", "user_name": "Ann"},
        1.5,
    )
    src = msg.source
    assert (
        src.platform,
        src.chat_id,
        src.chat_type,
        src.user_id,
        src.user_name,
        src.thread_id,
    ) == (
        "webhook",
        "ci:ops",
        "group",
        "ann",
        "Ann",
        "t1",
    )
    assert (msg.text, msg.platform_message_id, msg.received_at, msg.mentioned) == (
        "hi",
        "7",
        1.5,
        True,
    )
    assert to_inbound("ci", {"id": "x", "user": "bob", "text": "yo"}).source.chat_id == "ci:bob"


@pytest.mark.parametrize(
    "endpoints, phrase",
    [
        ({"CI!": {"secret_env": "S"}}, "endpoint names are 1-64"),
        ({"ci": {}}, "ci.secret_env: is required"),
        ({"ci": {"secret_env": "S", "mode": "later"}}, "ci.mode: must be sync or async"),
        ({"ci": {"secret_env": "S", "mode": "async"}}, "ci.callback_url: is required in async"),
        ({"ci": {"secret_env": "S", "callback_url": "<your-url>"}}, "must be an http(s) URL"),
        ({"ci": {"secret_env": "S", "reply_timeout_seconds": 0}}, "between 1 and 300"),
        ({"ci": {"secret_env": "S", "colour": "red"}}, "ci.colour: unknown key"),
        ({"ci": "S"}, "ci: must be a mapping"),
    ],
)
def test_endpoint_config_problems(endpoints: dict[str, Any], phrase: str) -> None:
    assert phrase in (endpoints_problem(endpoints) or "")


def test_the_section_checks_endpoints_and_their_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("platforms:\n" + _section("http://127.0.0.1:9/hook"))
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"WEBHOOK_CI_SECRET": SECRET})
    found = {e.key: e.problem for e in err.value.all()}
    assert list(found) == ["platforms.webhook.endpoints.deploy.secret_env"]
    assert found["platforms.webhook.endpoints.deploy.secret_env"].startswith(
        "WEBHOOK_DEPLOY_SECRET is not set"
    )
    cfg.write_text(
        "platforms:\n  api:\n    enabled: false\n  webhook:\n    enabled: true\n"
        "    allow_all_users: true\n    token_env: X\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {"X": "y"})
    found = {e.key: e.problem for e in err.value.all()}
    assert set(found) == {
        "platforms.webhook.enabled",
        "platforms.webhook.endpoints",
        "platforms.webhook.token_env",
    }
    config = load_config(_write(tmp_path, _section("http://127.0.0.1:9/hook")), ENV)
    assert config.platform_secrets("webhook") == {
        "endpoints.ci.secret_env": SECRET,
        "endpoints.deploy.secret_env": DEPLOY_SECRET,
    }


def _write(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "ok.yaml"
    path.write_text("platforms:\n" + section)
    return path
