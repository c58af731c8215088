"""The local HTTP API through the whole gateway (router, state.db, echo agent)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.app import Gateway
from gateway.config import load_config


async def _gateway(tmp_path: Path, extra: str = "", env: dict[str, str] | None = None) -> Gateway:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("platforms:\n  api:\n    port: 0\n" + extra)
    gw = Gateway(config=load_config(cfg, env or {}), home=tmp_path / "home")
    await gw.start()
    return gw


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = await _gateway(tmp_path)
    port = gateway.adapters[0].bound_port  # type: ignore[attr-defined]
    try:
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        await gateway.stop()


async def test_chat_completions_keeps_history_in_state_db(gw: tuple[Gateway, str]) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        for text in ("one", "two"):
            async with http.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "m",
                    "user": "alice",
                    "messages": [{"role": "user", "content": text}],
                },
            ) as resp:
                assert resp.status == 200
                body = await resp.json()
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "echo: two"}
        sid = body["switchboard"]["session_id"]
        assert body["switchboard"]["session_key"] == "agent:main:api:dm:alice"
        async with http.post(
            f"{url}/v1/chat/completions",
            headers={"X-Switchboard-Session": "bob"},
            json={"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
        ) as resp:
            other = await resp.json()
    assert other["switchboard"]["session_key"] == "agent:main:api:dm:bob"
    assert gateway.db is not None
    assert [m["content"] for m in await gateway.db.get_messages(sid)] == [
        "one",
        "echo: one",
        "two",
        "echo: two",
    ]


async def test_messages_endpoint_group_thread(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:
        payload = {
            "chat_id": "room",
            "chat_type": "group",
            "thread_id": "t1",
            "user_id": "u1",
            "user_name": "Ann",
            "text": "hi all",
        }
        async with http.post(f"{url}/v1/messages", json=payload) as resp:
            body = await resp.json()
    assert body["reply"] == "echo: [Ann] hi all"
    assert body["session_key"] == "agent:main:api:group:room:t=t1"


@pytest.mark.parametrize(
    "path, payload, status",
    [
        ("/v1/messages", b"not json", 400),
        ("/v1/messages", b"[1]", 400),
        ("/v1/messages", b'{"chat_id": "1"}', 400),
        ("/v1/messages", b'{"chat_id": "1", "text": "x", "chat_type": "galaxy"}', 400),
        ("/v1/messages", b'{"chat_id": {"a": 1}, "text": "x"}', 400),
        ("/v1/chat/completions", b'{"messages": []}', 400),
        ("/v1/chat/completions", b'{"messages": [{"role": "assistant", "content": "x"}]}', 400),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "user": 5}',
            400,
        ),
        ("/v1/nothing", b"{}", 404),
    ],
)
async def test_bad_requests_get_clear_errors(
    gw: tuple[Gateway, str], path: str, payload: bytes, status: int
) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=payload) as resp:
            assert resp.status == status
            if status == 400:
                assert (await resp.json())["error"]["message"]
    assert gateway.db is not None and await gateway.db.message_count() == 0


@pytest.mark.parametrize(
    "payload, message",
    [
        (b'{"text": "x"}', "chat_id is required"),
        (b'{"chat_id": null, "text": "x"}', "chat_id is required"),
        (
            b'{"chat_id": {"a": 1}, "text": "x"}',
            "chat_id must be a string or an integer, not an object",
        ),
        (
            b'{"chat_id": 1.5, "text": "x"}',
            "chat_id must be a string or an integer, not a decimal number",
        ),
        (
            b'{"chat_id": true, "text": "x"}',
            "chat_id must be a string or an integer, not a boolean",
        ),
        (b'{"chat_id": [1], "text": "x"}', "chat_id must be a string or an integer, not an array"),
        (b'{"chat_id": "  ", "text": "x"}', "chat_id must not be empty"),
        (
            b'{"chat_id": "1", "user_id": false, "text": "x"}',
            "user_id must be a string, not a boolean",
        ),
    ],
)
async def test_a_chat_id_of_the_wrong_type_is_named_as_such_not_as_missing(
    gw: tuple[Gateway, str], payload: bytes, message: str
) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/messages", data=payload) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"] == message
    assert gateway.db is not None and await gateway.db.message_count() == 0


async def test_health_and_metrics(gw: tuple[Gateway, str]) -> None:
    gateway, url = gw
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/messages", json={"chat_id": "1", "text": "x"}) as resp:
            assert resp.status == 200
            sid = (await resp.json())["session_id"]
        # The first exchange starts an automatic title in the background: a write that may
        # still be queued when the reply arrives. Let it land before reading the queue depth.
        assert gateway.db is not None
        for _ in range(500):
            session = await gateway.db.get_session(sid)
            if session is not None and session["title"]:
                break
            await asyncio.sleep(0.01)
        async with http.get(f"{url}/health") as resp:
            health = await resp.json()
        async with http.get(f"{url}/metrics") as resp:
            metrics = await resp.text()
    assert health["status"] == "ok" and health["adapters"]["api"]["state"] == "running"
    assert health["writer_queue_depth"] == 0 and health["sessions"] == 1
    assert 'switchboard_messages_in_total{platform="api"} 1' in metrics
    assert "switchboard_turn_seconds_count 1" in metrics
    assert "switchboard_writer_queue_depth 0" in metrics
    assert (
        "switchboard_writer_commit_ms_p99 " in metrics
        and "switchboard_writer_batch_size_p50 " in metrics
    )


async def test_a_bearer_key_is_enforced_when_configured(tmp_path: Path) -> None:
    gateway = await _gateway(tmp_path, "    key_env: API_KEY\n", {"API_KEY": "k-123456789"})
    url = f"http://127.0.0.1:{gateway.adapters[0].bound_port}"  # type: ignore[attr-defined]
    try:
        async with aiohttp.ClientSession() as http:
            for headers, status in (
                ({}, 401),
                ({"Authorization": "Bearer wrong"}, 401),
                ({"Authorization": "Bearer k-123456789"}, 200),
            ):
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": "1", "text": "x"}, headers=headers
                ) as resp:
                    assert resp.status == status
            async with http.get(f"{url}/health") as resp:  # health stays open for probes
                assert resp.status == 200
    finally:
        await gateway.stop()


async def test_a_second_gateway_on_the_same_home_is_refused(
    gw: tuple[Gateway, str], tmp_path: Path
) -> None:
    from gateway.errors import AlreadyRunning

    with pytest.raises(AlreadyRunning, match="already running"):
        await _gateway(tmp_path)


async def test_concurrent_clients_each_get_their_own_reply(gw: tuple[Gateway, str]) -> None:
    _, url = gw
    async with aiohttp.ClientSession() as http:

        async def one(i: int) -> str:
            async with http.post(
                f"{url}/v1/messages", json={"chat_id": str(i % 7), "text": f"m{i}"}
            ) as resp:
                return (await resp.json())["reply"]

        replies = await asyncio.gather(*(one(i) for i in range(60)))
    assert replies == [f"echo: m{i}" for i in range(60)]


async def test_a_background_result_comes_with_the_chats_next_answer_and_to_its_callback(
    gw: tuple[Gateway, str],
) -> None:
    """/background over the API: the answer says truthfully where the result arrives; the
    result is POSTed to the request's callback_url and comes, once, in the notices of
    that chat's next answer (never another chat's), on both endpoints."""
    from aiohttp import web

    _, url = gw
    posted: asyncio.Queue[dict[str, object]] = asyncio.Queue()

    async def hook(request: web.Request) -> web.Response:
        await posted.put(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    callback = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as http:

            async def message(chat: str, text: str, **more: str) -> dict[str, object]:
                async with http.post(
                    f"{url}/v1/messages", json={"chat_id": chat, "text": text, **more}
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    return dict(await resp.json())

            started = await message("a", "/background sum it up", callback_url=callback)
            assert started["reply"] == (
                "Started background job bg1; its result comes in the notices of this chat's "
                "next answer (and to the request's callback_url, if it gave one)."
            )
            assert started["notices"] == []  # the result never rides on its own request
            delivered = await asyncio.wait_for(posted.get(), 60)  # only catches a hang
            result = "Background job bg1 finished:\necho: sum it up"
            assert delivered["text"] == result and delivered["chat_id"] == "a"
            assert delivered["session_id"] == started["session_id"]
            assert (await message("b", "hello"))["notices"] == []  # another chat's
            assert (await message("a", "next"))["notices"] == [result]
            assert (await message("a", "after"))["notices"] == []  # delivered once
            async with http.post(
                f"{url}/v1/chat/completions",
                json={
                    "user": "c",
                    "callback_url": callback,
                    "messages": [{"role": "user", "content": "/background again"}],
                },
            ) as resp:
                assert resp.status == 200
            assert (await asyncio.wait_for(posted.get(), 60))["text"] == (
                "Background job bg2 finished:\necho: again"
            )
            async with http.post(
                f"{url}/v1/chat/completions",
                json={"user": "c", "messages": [{"role": "user", "content": "so?"}]},
            ) as resp:
                body = await resp.json()
            assert body["switchboard"]["notices"] == ["Background job bg2 finished:\necho: again"]
            async with http.post(
                f"{url}/v1/messages",
                json={"chat_id": "a", "text": "x", "callback_url": "ftp://nope"},
            ) as resp:
                assert resp.status == 400
                assert "callback_url must be an http:// or https:// URL" in await resp.text()
    finally:
        await runner.cleanup()
