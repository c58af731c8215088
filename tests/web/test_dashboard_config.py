"""The dashboard: config keys (documented in config.example.yaml, each one working) and
the dashboard served by a real in-process gateway."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import ConfigError, load_config, schema
from gateway.web.app import settings_from
from tests.conftest import ROOT


def _cfg(tmp_path: Path, text: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_config(p, env or {})


def test_the_example_documents_every_dashboard_key_with_its_default() -> None:
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())["dashboard"]
    section = schema()["dashboard"]
    assert isinstance(section, dict) and set(example) == set(section)
    for name, spec in section.items():
        assert example[name] == spec.default, name


def test_settings_follow_the_config(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        "dashboard:\n  key_env: DASH_KEY\n  session_hours: 2\n  secure_cookie: true\n"
        "  prices: {m1: {input: 1.5, output: 3}}\n",
        {"DASH_KEY": "k-123456"},
    )
    s = settings_from(cfg)
    assert s is not None
    assert (s.key, s.session_hours, s.secure_cookie, dict(s.prices)) == (
        "k-123456",
        2.0,
        True,
        {"m1": (1.5, 3.0)},
    )
    # without its own key, the api server's key signs in
    s = settings_from(
        _cfg(tmp_path, "platforms:\n  api:\n    key_env: API_KEY\n", {"API_KEY": "a-123456"})
    )
    assert s is not None and s.key == "a-123456"
    assert settings_from(_cfg(tmp_path, "dashboard:\n  enabled: false\n")) is None
    assert settings_from(_cfg(tmp_path, "platforms:\n  api:\n    enabled: false\n")) is None
    assert settings_from(load_config(None, {})) == settings_from(
        load_config(None, {})
    )  # loopback, no key
    assert settings_from(load_config(None, {})).key is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "text, env, key, phrase",
    [
        ("dashboard:\n  key_env: DASH_KEY\n", {}, "dashboard.key_env", "DASH_KEY is not set"),
        ("dashboard:\n  prices: {m: 3}\n", {}, "dashboard.prices", "input"),
        ("dashboard:\n  prices: {m: {input: -1}}\n", {}, "dashboard.prices", "m.input"),
        ("dashboard:\n  prices: {m: {inptu: 1}}\n", {}, "dashboard.prices", "m:"),
        ("dashboard:\n  session_hours: 0\n", {}, "dashboard.session_hours", "between"),
        ("dashboard:\n  enable: true\n", {}, "dashboard.enable", "unknown key"),
    ],
)
def test_dashboard_config_errors_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], key: str, phrase: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, text, env)
    assert err.value.key == key and phrase in str(err.value)


async def test_the_daemon_serves_the_dashboard_beside_its_api(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path, "platforms:\n  api:\n    port: 0\n    key_env: API_KEY\n", {"API_KEY": "a-123456"}
    )
    gw = Gateway(config=cfg, home=tmp_path / "home")
    await gw.start()
    try:
        base = f"http://127.0.0.1:{gw.adapters[0].bound_port}"  # type: ignore[attr-defined]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
            async with http.post(
                f"{base}/v1/messages",
                json={"chat_id": "c1", "text": "hello dashboard"},
                headers={"Authorization": "Bearer a-123456"},
            ) as resp:
                sid = (await resp.json())["session_id"]
            async with http.get(f"{base}/api/sessions") as resp:
                assert resp.status == 401
            async with http.post(
                f"{base}/ui/login", data={"key": "a-123456"}, headers={"Origin": base}
            ) as resp:
                assert resp.status == 200
            async with http.get(f"{base}/api/sessions") as resp:
                assert [r["id"] for r in (await resp.json())["sessions"]] == [sid]
            async with http.get(f"{base}/api/sessions/{sid}") as resp:
                assert (await resp.json())["session"]["live"] is True  # bound in the index
            async with http.get(f"{base}/api/health") as resp:
                assert (await resp.json())["adapters"]["api"]["state"] == "running"
            async with http.get(f"{base}/ui/static/app.css") as resp:
                assert resp.status == 200 and resp.content_type == "text/css"
    finally:
        await gw.stop()


async def test_off_loopback_without_a_key_there_is_no_dashboard(tmp_path: Path) -> None:
    # the api server itself needs a key off loopback, so this is the dashboard's own switch
    cfg = _cfg(
        tmp_path,
        "platforms:\n  api:\n    host: 0.0.0.0\n    port: 0\n    key_env: API_KEY\n",
        {"API_KEY": "a-123456"},
    )
    assert settings_from(cfg) is not None
    data = {**cfg.data}
    no_key = type(cfg)(data=data, secrets={}, path=None)
    assert settings_from(no_key) is None
