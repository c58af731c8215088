"""Adapters own their platform: the core names no platform, the registry
loads adapters lazily and finds third-party ones through the `switchboard.adapters` entry
point group, and each adapter checks its token through its own client library."""

from __future__ import annotations

import ast
import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import adapters
from gateway.adapters import base
from gateway.config import load_config
from gateway.errors import ConfigError
from gateway.handoff import configured_home
from gateway.ops.doctor import run_doctor
from tests.daemon import clean_env, free_port, switchboard, wait_healthy
from tests.fakes.bluebubbles import PASSWORD as BB_PASSWORD
from tests.fakes.bluebubbles import FakeBlueBubbles
from tests.fakes.dingtalk import ENV as DINGTALK_ENV
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.discord import FakeDiscord, restore_discord_globals
from tests.fakes.feishu import ENV as FEISHU_ENV
from tests.fakes.feishu import FakeFeishu
from tests.fakes.homeassistant import ENV as HOMEASSISTANT_ENV
from tests.fakes.homeassistant import FakeHomeAssistant
from tests.fakes.imap import FakeImap
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.qqbot import ENV as QQBOT_ENV
from tests.fakes.qqbot import FakeQQ
from tests.fakes.signal import BOT as SIGNAL_BOT
from tests.fakes.signal import VERSION as SIGNAL_CLI_VERSION
from tests.fakes.signal import FakeSignal
from tests.fakes.slack import FakeSlack
from tests.fakes.smtp import FakeSmtp
from tests.fakes.teams import APP_ID, PASSWORD, FakeTeams
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import ACCOUNT, AUTH_TOKEN, FROM, PUBLIC_URL, FakeTwilio
from tests.fakes.webhook_receiver import SECRET as WEBHOOK_SECRET
from tests.fakes.webhook_receiver import CallbackReceiver
from tests.fakes.wecom import ENV as WECOM_ENV
from tests.fakes.wecom import FakeWeCom
from tests.fakes.weixin import TOKEN as WEIXIN_TOKEN
from tests.fakes.weixin import FakeWeixin
from tests.fakes.whatsapp import PHONE_ID, TOKEN, FakeGraph

ROOT = Path(__file__).resolve().parents[2]
PLATFORM_NAMES = (
    "telegram",
    "discord",
    "slack",
    "signal",
    "matrix",
    "mattermost",
    "teams",
    "whatsapp",
    "sms",
    "email",
    "feishu",
    "dingtalk",
    "qqbot",
    "wecom",
    "bluebubbles",
    "webhook",
    "homeassistant",
    "weixin",
)
# "signal" is also the operating system's word (the stdlib module, SIGTERM handling, the
# core's turn signals), so for it the rule looks for the platform itself: the bare name as a
# string value, or names only the platform has
OWN_NAMES = {
    "signal": (
        "signal-cli",
        "signal_cli",
        "signalcli",
        "signal_rpc",
        "signal_text",
        "signaladapter",
        "adapters.signal",
    )
}


def _names_platform(text: str, value: bool) -> bool:
    low = text.lower()
    for name in PLATFORM_NAMES:
        if name in OWN_NAMES:
            if (value and low.strip() == name) or any(own in low for own in OWN_NAMES[name]):
                return True
        elif name in low:
            return True
    return False


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are module, class or function docstrings."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def platform_mentions(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant (docstrings aside; f-string parts included),
    identifier, attribute, argument, import or definition name that contains a platform name,
    case-insensitively. Comments are not code and docstrings may mention platforms."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    hits: list[tuple[int, str]] = []

    def check(node: ast.AST, text: str) -> None:
        if _names_platform(text, isinstance(node, ast.Constant)):
            hits.append((getattr(node, "lineno", 0), text))

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            check(node, node.value)
        elif isinstance(node, ast.Name):
            check(node, node.id)
        elif isinstance(node, ast.Attribute):
            check(node, node.attr)
        elif isinstance(node, ast.arg):
            check(node, node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            check(node, node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            check(node, node.name)
        elif isinstance(node, ast.alias):
            check(node, node.name + " " + (node.asname or ""))
        elif isinstance(node, ast.ImportFrom) and node.module:
            check(node, node.module)
    return hits


def test_the_rule_finds_platform_names_in_code_but_not_in_prose() -> None:
    code = textwrap.dedent('''
        """The slack module docstring may say Telegram."""
        # a comment about discord
        def f(x):
            """Discord here is fine too."""
            if x == "telegram":
                return f"{x} on Slack"
            return tg.discord_id
        import slack_sdk
        from telegram import Bot
        g(platform_mode="discord")
        import signal
        loop.add_signal_handler(signal.SIGTERM, stop)
        log.info("signal received")
        if platform == "signal":
            from gateway.adapters.signal import SignalAdapter
    ''')
    found = sorted(text for _line, text in platform_mentions(code))
    assert found == sorted(
        [
            "telegram",
            " on Slack",
            "discord_id",
            "slack_sdk ",
            "telegram",
            "discord",
            "signal",
            "gateway.adapters.signal",
            "SignalAdapter ",
        ]
    )


def test_the_core_names_no_platform() -> None:
    """Outside gateway/adapters/, no code (strings, names, imports) names a chat platform."""
    offenders = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if (ROOT / "gateway" / "adapters") in path.parents:
            continue
        for line, text in platform_mentions(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: {text!r}")
    assert offenders == []


@pytest.mark.slow
def test_config_and_registry_load_no_chat_library() -> None:
    """Validating a config with every platform enabled imports no platform library."""
    code = textwrap.dedent("""
        import sys
        from gateway import adapters
        from gateway.config import load_config
        from gateway.handoff import configured_home
        for name in adapters.names():
            adapters.adapter_class(name)
        env = {"TELEGRAM_BOT_TOKEN": "t", "DISCORD_BOT_TOKEN": "d", "SLACK_BOT_TOKEN": "s",
               "SLACK_SIGNING_SECRET": "x", "MATTERMOST_TOKEN": "m", "TEAMS_APP_ID": "a",
               "TEAMS_APP_PASSWORD": "p", "WHATSAPP_TOKEN": "w", "WHATSAPP_APP_SECRET": "w",
               "WHATSAPP_VERIFY_TOKEN": "w", "TWILIO_AUTH_TOKEN": "t", "EMAIL_PASSWORD": "p",
               "FEISHU_APP_SECRET": "f", "FEISHU_APP_ID": "cli_f", "FEISHU_ENCRYPT_KEY": "k",
               "FEISHU_VERIFICATION_TOKEN": "v", "DINGTALK_CLIENT_ID": "dingid",
               "DINGTALK_CLIENT_SECRET": "ds", "MATRIX_ACCESS_TOKEN": "m",
               "BLUEBUBBLES_PASSWORD": "b", "BLUEBUBBLES_WEBHOOK_SECRET": "b",
               "WEBHOOK_CI_SECRET": "w", "QQBOT_APP_ID": "1", "QQBOT_CLIENT_SECRET": "q",
               "HOMEASSISTANT_TOKEN": "h", "WECOM_BOT_ID": "aib", "WECOM_SECRET": "w",
               "WEIXIN_TOKEN": "wx"}
        required = {  # keys a section cannot do without
            "signal": "    account: '+15550000001'\\n",
            "matrix": "    homeserver: https://m.example.org\\n    user_id: '@b:m.example.org'\\n",
            "mattermost": "    url: https://chat.example.com\\n",
            "whatsapp": "    phone_number_id: '1'\\n",
            "sms": "    account_sid: AC0123456789abcdef0123456789abcdef\\n"
                   "    from_number: '+15550100000'\\n    webhook_url: https://h.example/sms\\n",
            "email": "    address: a@example.com\\n    imap_host: imap.example.com\\n"
                     "    smtp_host: smtp.example.com\\n",
            "bluebubbles": "    url: http://mac.example:1234\\n    bot_name: sb\\n",
            "webhook": "    endpoints:\\n      ci: {secret_env: WEBHOOK_CI_SECRET}\\n",
            "homeassistant": "    url: http://ha.example:8123\\n",
        }
        import pathlib, tempfile
        path = pathlib.Path(tempfile.mkdtemp()) / "c.yaml"
        path.write_text("platforms:\\n" + "".join(
            f"  {n}:\\n    enabled: true\\n    allow_all_users: true\\n{required.get(n, '')}"
            for n in adapters.names()))
        config = load_config(path, env)
        assert all(s.enabled for s in config.platforms.values())
        configured_home(adapters.names()[0], "42")
        libs = ("telegram", "discord", "slack_sdk", "slack_bolt", "mattermostautodriver", "jwt",
                "cryptography", "twilio", "aioimaplib", "aiosmtplib", "lark_oapi",
                "dingtalk_stream", "mautrix", "qrcode")
        print(sorted(m for m in sys.modules if m.split(".")[0] in libs))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=clean_env(),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- credentials, through each adapter's client library ------------------------------


async def _reach(tmp_path: Path, platform: str, fake_url: str, env: dict[str, str]) -> Any:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"platforms:\n  {platform}:\n    enabled: true\n    allow_all_users: true\n"
        f"    base_url: {fake_url}\n"
    )
    checks = await run_doctor(tmp_path / "home", load_config(cfg, env), None, fix=False, full=False)
    [reach] = [c for c in checks if c.name == f"{platform} reachable"]
    return reach


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_discord_token_with_discord_py(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, good: bool
) -> None:
    restore_discord_globals(monkeypatch)
    fake = FakeDiscord()
    await fake.start()
    try:
        token = fake.token if good else "wrong"
        reach = await _reach(tmp_path, "discord", fake.api, {"DISCORD_BOT_TOKEN": token})
    finally:
        await fake.stop()
    assert (reach.ok, reach.detail) == ((True, "switchboard") if good else (False, "HTTP 401"))
    assert any(path == "/users/@me" for _m, path, _b in fake.calls)


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_slack_token_with_slack_sdk(tmp_path: Path, good: bool) -> None:
    fake = FakeSlack(token="xoxb-good")
    await fake.start()
    try:
        env = {
            "SLACK_BOT_TOKEN": "xoxb-good" if good else "xoxb-bad",
            "SLACK_SIGNING_SECRET": "s3cr3t-x",
        }
        reach = await _reach(tmp_path, "slack", fake.base_url, env)
    finally:
        await fake.stop()
    assert (reach.ok, reach.detail) == ((True, "bot") if good else (False, "invalid_auth"))


@pytest.mark.parametrize("case", ["good", "single-account", "unregistered", "unreachable"])
async def test_doctor_asks_signal_cli_about_the_account(tmp_path: Path, case: str) -> None:
    fake = FakeSignal(multi_account=case != "single-account")
    if case == "unregistered":
        fake.accounts = ["+15559999999"]
    await fake.start()
    url = fake.url
    if case == "unreachable":
        await fake.stop()
        url = f"http://127.0.0.1:{free_port()}"
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  signal:\n    enabled: true\n    allow_all_users: true\n"
            f"    url: {url}\n    account: '{SIGNAL_BOT}'\n"
        )
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, {}), None, fix=False, full=False
        )
        [reach] = [c for c in checks if c.name == "signal reachable"]
    finally:
        await fake.stop()
    expected = {
        "good": (True, f"{SIGNAL_BOT} (signal-cli {SIGNAL_CLI_VERSION})"),
        "single-account": (
            True,
            f"{SIGNAL_BOT} (signal-cli {SIGNAL_CLI_VERSION}, single-account daemon)",
        ),
        "unregistered": (
            False,
            f"{SIGNAL_BOT} is not registered with signal-cli at {url} (it has: +15559999999)",
        ),
    }
    if case == "unreachable":
        assert not reach.ok and reach.detail.startswith(
            f"unreachable (signal-cli is not reachable at {url}"
        )
    else:
        assert (reach.ok, reach.detail) == expected[case]
    if case != "unreachable":
        assert [m for m, _p in fake.calls][:1] == ["version"]


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_matrix_token_with_mautrix(tmp_path: Path, good: bool) -> None:
    from tests.fakes.matrix import BOT, FakeMatrix

    fake = FakeMatrix()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  matrix:\n    enabled: true\n    allow_all_users: true\n"
            f"    homeserver: {fake.base_url}\n    user_id: '{BOT}'\n"
        )
        env = {"MATRIX_ACCESS_TOKEN": fake.token if good else "syt_revoked"}
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, env), None, fix=False, full=False
        )
        [reach] = [c for c in checks if c.name == "matrix reachable"]
    finally:
        await fake.stop()
    expected = (True, f"{BOT} (end-to-end encrypted rooms are not supported)")
    assert (reach.ok, reach.detail) == (expected if good else (False, "M_UNKNOWN_TOKEN"))
    assert fake.requests("whoami")  # asked through mautrix's whoami


async def test_an_unreachable_platform_is_a_failed_check(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    reach = await _reach(
        tmp_path, "telegram", f"http://127.0.0.1:{port}/bot", {"TELEGRAM_BOT_TOKEN": "1:x"}
    )
    assert not reach.ok and reach.detail.startswith("unreachable")


async def test_telegram_check_uses_get_me(tmp_path: Path) -> None:
    fake = FakeTelegram()
    await fake.start()
    try:
        reach = await _reach(
            tmp_path, "telegram", fake.base_url, {"TELEGRAM_BOT_TOKEN": fake.token}
        )
    finally:
        await fake.stop()
    assert reach.ok and reach.detail == "@switchboard_bot"


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_mattermost_token_with_mattermostautodriver(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeMattermost()
    await fake.start()
    try:
        token = fake.token if good else "revoked-token"
        reach = await _reach(tmp_path, "mattermost", fake.url, {"MATTERMOST_TOKEN": token})
    finally:
        await fake.stop()
    expected = (True, "@switchboard") if good else (False, "HTTP 401 (invalid or expired token)")
    assert (reach.ok, reach.detail) == expected
    assert [path for _verb, path, _body in fake.calls] == ["/users/me"]


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_teams_app_password_by_obtaining_a_token(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeTeams()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  teams:\n    enabled: true\n    allow_all_users: true\n"
            f"    token_url: {fake.token_url}\n"
        )
        env = {"TEAMS_APP_ID": APP_ID, "TEAMS_APP_PASSWORD": PASSWORD if good else "wrong"}
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, env), None, fix=False, full=False
        )
        [reach] = [c for c in checks if c.name == "teams reachable"]
    finally:
        await fake.stop()
    expected = (
        f"app {APP_ID}"
        if good
        else "the token endpoint refused the app id or password (invalid_client)"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [r["client_id"] for r in fake.token_requests()] == [APP_ID]


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_whatsapp_token_against_the_graph_api(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeGraph()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  whatsapp:\n    enabled: true\n    allow_all_users: true\n"
            f"    phone_number_id: '{PHONE_ID}'\n    base_url: {fake.base_url}\n"
        )
        env = {
            "WHATSAPP_TOKEN": TOKEN if good else "EAAG-bad",
            "WHATSAPP_APP_SECRET": "s-1",
            "WHATSAPP_VERIFY_TOKEN": "v-1",
        }
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, env), None, fix=False, full=False
        )
    finally:
        await fake.stop()
    [reach] = [c for c in checks if c.name == "whatsapp reachable"]
    assert reach.ok == good
    assert reach.detail == "Switchboard Test" if good else "access token (190)" in reach.detail
    assert fake.calls[0][:2] == ("GET", f"/v23.0/{PHONE_ID}")


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_twilio_credentials_with_the_twilio_library(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeTwilio()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  sms:\n    enabled: true\n    allow_all_users: true\n"
            f"    account_sid: {ACCOUNT}\n    from_number: '{FROM}'\n    webhook_url: {PUBLIC_URL}\n"
            f"    base_url: {fake.base_url}\n"
        )
        env = {"TWILIO_AUTH_TOKEN": AUTH_TOKEN if good else "wrong-token"}
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, env), None, fix=False, full=False
        )
    finally:
        await fake.stop()
    [reach] = [c for c in checks if c.name == "sms reachable"]
    assert reach.ok == good
    assert reach.detail == "Switchboard Test" if good else "credentials (20003)" in reach.detail
    assert fake.calls[0][:2] == ("GET", f"/2010-04-01/Accounts/{ACCOUNT}.json")


@pytest.mark.parametrize("bad", [None, "imap", "smtp"])
async def test_doctor_logs_in_to_imap_and_smtp_with_aioimaplib_and_aiosmtplib(
    tmp_path: Path, bad: str | None
) -> None:
    imap, smtp = FakeImap(), FakeSmtp()
    if bad == "imap":
        imap.password = "other"
    elif bad == "smtp":
        smtp.password = "other"
    await imap.start()
    await smtp.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            f"platforms:\n  email:\n    enabled: true\n    allow_all_users: true\n"
            f"    address: {imap.user}\n    imap_host: 127.0.0.1\n    imap_port: {imap.port}\n"
            f"    imap_tls: plain\n    smtp_host: 127.0.0.1\n    smtp_port: {smtp.port}\n"
            "    smtp_tls: plain\n"
        )
        config = load_config(cfg, {"EMAIL_PASSWORD": "s3cret-pw"})
        checks = await run_doctor(tmp_path / "home", config, None, fix=False, full=False)
    finally:
        await imap.stop()
        await smtp.stop()
    [reach] = [c for c in checks if c.name == "email reachable"]
    if bad is None:
        assert (reach.ok, reach.detail) == (True, f"{imap.user} (IMAP 127.0.0.1, SMTP 127.0.0.1)")
    else:
        assert not reach.ok and reach.detail.startswith(
            f"{bad.upper()} login refused for {imap.user}"
        )
    assert imap.logins  # asked through aioimaplib
    assert bool(smtp.auth_attempts) is (bad != "imap")  # SMTP is tried once IMAP said yes


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_feishu_credentials_by_getting_a_tenant_token(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeFeishu()
    await fake.start()
    try:
        env = {
            **FEISHU_ENV,
            "FEISHU_APP_SECRET": FEISHU_ENV["FEISHU_APP_SECRET"] if good else "wrong",
        }
        reach = await _reach(tmp_path, "feishu", fake.base_url, env)
    finally:
        await fake.stop()
    expected = (
        "switchboard" if good else "feishu refused the app credentials: app secret invalid (10014)"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [m for m, _ in fake.calls] == (["token", "bot"] if good else ["token"])


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_dingtalk_credentials_by_getting_an_access_token(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeDingTalk()
    await fake.start()
    try:
        env = {**DINGTALK_ENV, **({} if good else {"DINGTALK_CLIENT_SECRET": "wrong"})}
        reach = await _reach(tmp_path, "dingtalk", fake.base_url, env)
    finally:
        await fake.stop()
    expected = (
        "dingfakeclientid"
        if good
        else "dingtalk refused the client credentials: invalidClientSecret"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [m for m, _ in fake.calls] == ["token"]


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_a_home_assistant_token_by_authenticating_on_the_websocket(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeHomeAssistant()
    await fake.start()
    try:
        env = HOMEASSISTANT_ENV if good else {"HOMEASSISTANT_TOKEN": "wrong"}
        reach = await _reach(tmp_path, "homeassistant", fake.url, env)
    finally:
        await fake.stop()
    expected = (
        "Home (Home Assistant 2026.11.3) as Alice"
        if good
        else "home assistant refused the access token: Invalid access token"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert fake.auths == [good] and fake.subs == []
    asked = ["get_config", "auth/current_user"]
    assert [c["type"] for c in fake.commands] == (asked if good else [])


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_wecom_credentials_by_subscribing_once(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeWeCom()
    await fake.start()
    try:
        env = {**WECOM_ENV, **({} if good else {"WECOM_SECRET": "wrong"})}
        reach = await _reach(tmp_path, "wecom", fake.url, env)
    finally:
        await fake.stop()
    expected = "aibFAKEbot" if good else "wecom refused the bot id or secret: invalid secret"
    assert (reach.ok, reach.detail) == (good, expected)
    assert [c["cmd"] for c in fake.calls] == ["aibot_subscribe"]
    assert fake.subscribed == [] or fake.subscribed[0].closed  # closed after the check


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_the_weixin_bot_token_with_getconfig(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeWeixin()
    await fake.start()
    try:
        env = {"WEIXIN_TOKEN": WEIXIN_TOKEN if good else "wrong"}
        reach = await _reach(tmp_path, "weixin", fake.base_url, env)
    finally:
        await fake.stop()
    expected = (
        f"bot token accepted by {fake.base_url}"
        if good
        else "weixin refused the bot token: the session expired (-14 session timeout); "
        "log in again with `switchboard login weixin`"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [c for c, _ in fake.calls] == ["getconfig"] and fake.header_problems == []


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_the_bluebubbles_password_with_server_info(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeBlueBubbles()
    await fake.start()
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  bluebubbles:\n    enabled: true\n    allow_all_users: true\n"
            f"    url: {fake.base_url}\n    bot_name: sb\n"
        )
        env = {
            "BLUEBUBBLES_PASSWORD": BB_PASSWORD if good else "wrong",
            "BLUEBUBBLES_WEBHOOK_SECRET": "s-1",
        }
        checks = await run_doctor(
            tmp_path / "home", load_config(cfg, env), None, fix=False, full=False
        )
    finally:
        await fake.stop()
    [reach] = [c for c in checks if c.name == "bluebubbles reachable"]
    expected = (
        "bot@icloud.example (BlueBubbles 1.9.9)"
        if good
        else "bluebubbles refused the server password (401)"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [(m, p) for m, p, _b in fake.calls] == [("GET", "/api/v1/server/info")]


@pytest.mark.parametrize("case", ["good", "refused", "unreachable"])
async def test_doctor_lists_webhook_endpoints_and_pings_their_callbacks(
    tmp_path: Path, case: str
) -> None:
    receiver = CallbackReceiver(secret=WEBHOOK_SECRET if case == "good" else "another-secret")
    await receiver.start()
    url = receiver.url
    if case == "unreachable":
        await receiver.stop()
        url = f"http://127.0.0.1:{free_port()}/hook"
    try:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  webhook:\n    enabled: true\n    allow_all_users: true\n"
            "    endpoints:\n      ci:\n        secret_env: HOOK_SECRET\n"
            f"        mode: async\n        callback_url: {url}\n"
            "      form:\n        secret_env: HOOK_SECRET\n"
        )
        config = load_config(cfg, {"HOOK_SECRET": WEBHOOK_SECRET})
        checks = await run_doctor(tmp_path / "home", config, None, fix=False, full=False)
    finally:
        await receiver.stop()
    [reach] = [c for c in checks if c.name == "webhook reachable"]
    callback = {
        "good": "answers",
        "refused": ": the callback refused the POST (401)",
        "unreachable": ": the callback is unreachable (ClientConnectorError)",
    }[case]
    sep = " " if case == "good" else ""
    assert (reach.ok, reach.detail) == (
        case == "good",
        f"ci: async, callback {url}{sep}{callback}; form: sync, no callback",
    )
    if case == "good":
        assert [r["type"] for r in receiver.received] == ["ping"]


# --- a third-party adapter, installed as a package with an entry point ---------------

PLUGIN = '''
"""A tiny third-party adapter: says hello once it starts, and writes what it is sent
into a file named by its config section."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigError
from gateway.messages import InboundMessage, SentRef, ThreadRef
from gateway.sections import PlatformSettings, SecretNeed, in_range, setting
from gateway.session_keys import SessionSource


@dataclass(frozen=True)
class LoopSettings(PlatformSettings):
    outbox: str | None = setting(None)
    greetings: int = setting(1, in_range(1, 10))


class LoopAdapter:
    platform = "loopchat"
    settings = LoopSettings
    library_loggers = ("loopchat_lib",)

    def __init__(self, outbox, greetings, token):
        self.outbox, self.greetings, self.token = Path(outbox), greetings, token
        self.state = "stopped"
        self._hello = None

    @classmethod
    def secrets_needed(cls, settings):
        return [SecretNeed("token_env", "LOOPCHAT_TOKEN", "the loopchat token")]

    @classmethod
    def problems(cls, settings, api_enabled):
        if not settings.outbox:
            return [ConfigError("platforms.loopchat.outbox", "is required")]
        return []

    @classmethod
    def from_config(cls, settings, secrets):
        return cls(settings.outbox, settings.greetings, secrets["token_env"])

    def routes(self):
        return {}

    @classmethod
    async def check_credentials(cls, settings, secrets):
        ok = secrets.get("token_env") == "loop-good"
        return ok, "loopbot" if ok else "bad token"

    @classmethod
    def home_chat_type(cls, chat_id):
        return "dm" if chat_id.startswith("@") else "group"

    @classmethod
    def thread_source(cls, thread):
        return SessionSource(cls.platform, thread.thread_id, "thread", thread_id=thread.thread_id)

    async def start(self, emit):
        self.state = "running"
        self._hello = asyncio.create_task(self._greet(emit), name="loopchat.hello")

    async def _greet(self, emit):
        for i in range(self.greetings):
            source = SessionSource(self.platform, "room1", "dm", user_id="u1", user_name="ann")
            await emit(InboundMessage(source, f"hello {i}", platform_message_id=f"m{i}"))

    async def send(self, msg):
        with self.outbox.open("a") as f:
            f.write(json.dumps({"chat_id": msg.chat_id, "text": msg.text}) + "\\n")
        return SentRef(self.platform, msg.chat_id, ("1",))

    async def create_thread(self, chat_id, name):
        return ThreadRef(self.platform, chat_id, "t1", name)

    async def stop(self):
        if self._hello is not None:
            await asyncio.gather(self._hello, return_exceptions=True)
        self.state = "stopped"

    def health(self):
        return {"state": self.state}
'''


def install_plugin(site: Path) -> Path:
    """What `pip install` leaves behind: the module and a .dist-info whose
    entry_points.txt registers it in the `switchboard.adapters` group."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "switchboard_loopchat.py").write_text(PLUGIN)
    info = site / "switchboard_loopchat-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: switchboard-loopchat\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        "[switchboard.adapters]\nloopchat = switchboard_loopchat:LoopAdapter\n"
    )
    return site


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    site = install_plugin(tmp_path / "site")
    monkeypatch.syspath_prepend(str(site))
    adapters.rescan()
    yield site
    monkeypatch.undo()
    sys.modules.pop("switchboard_loopchat", None)
    adapters.rescan()


def test_an_installed_adapter_is_registered_after_the_built_ins(plugin: Path) -> None:
    assert adapters.names() == (*PLATFORM_NAMES, "loopchat")
    assert adapters.adapter_class("loopchat").__name__ == "LoopAdapter"
    with pytest.raises(adapters.AdapterNotFound, match="irc"):
        adapters.adapter_class("irc")


def test_an_installed_adapter_declares_and_validates_its_section(
    plugin: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  loopchat:\n    enabled: true\n    greetings: 99\n    colour: red\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    found = {e.key: e.problem for e in err.value.all()}
    assert set(found) == {
        "platforms.loopchat.greetings",
        "platforms.loopchat.colour",
        "platforms.loopchat.outbox",
        "platforms.loopchat.allowed_users",
        "platforms.loopchat.token_env",
    }
    assert found["platforms.loopchat.token_env"].startswith("LOOPCHAT_TOKEN is not set")
    assert found["platforms.loopchat.greetings"] == "must be between 1 and 10 (got 99)"
    cfg.write_text(
        "platforms:\n  loopchat:\n    enabled: true\n    outbox: /tmp/x\n    allow_all_users: true\n"
        "session_reset:\n  by_platform:\n    loopchat: {mode: idle}\n"
    )
    config = load_config(cfg, {"LOOPCHAT_TOKEN": "loop-good"})
    section = config.platforms["loopchat"]
    assert (section.enabled, section.greetings, section.require_mention) == (True, 1, True)
    assert config.platform_secrets("loopchat") == {"token_env": "loop-good"}
    assert configured_home("loopchat", "@ann") == {
        "chat_id": "@ann",
        "thread_id": None,
        "chat_type": "dm",
    }


async def test_doctor_asks_an_installed_adapter(plugin: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "platforms:\n  loopchat:\n    enabled: true\n    outbox: /tmp/x\n    allow_all_users: true\n"
    )
    for token, ok, detail in (("loop-good", True, "loopbot"), ("nope", False, "bad token")):
        checks = await run_doctor(
            tmp_path / "home",
            load_config(cfg, {"LOOPCHAT_TOKEN": token}),
            None,
            fix=False,
            full=False,
        )
        [reach] = [c for c in checks if c.name == "loopchat reachable"]
        assert (reach.ok, reach.detail) == (ok, detail)


def _run_daemon(home: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        switchboard(home, "run"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.slow
async def test_the_daemon_starts_an_installed_adapter_and_routes_through_it(tmp_path: Path) -> None:
    site = install_plugin(tmp_path / "site")
    home, port = tmp_path / "home", free_port()
    home.mkdir()
    outbox = tmp_path / "outbox.jsonl"
    (home / "config.yaml").write_text(
        f"platforms:\n  api:\n    port: {port}\n  loopchat:\n    enabled: true\n"
        f"    allow_all_users: true\n    outbox: {outbox}\n    greetings: 2\n"
    )
    env = clean_env(PYTHONPATH=f"{site}:{ROOT}", LOOPCHAT_TOKEN="loop-good")
    proc = _run_daemon(home, env)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_healthy(url, proc)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lines = outbox.read_text().splitlines() if outbox.exists() else []
            if len(lines) >= 2:
                break
            await asyncio.sleep(0.05)
        replies = [json.loads(line) for line in lines]
        assert [r["chat_id"] for r in replies] == ["room1", "room1"]
        assert all("hello" in r["text"] for r in replies)
        import aiohttp

        async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
            health = await resp.json()
        assert health["adapters"]["loopchat"] == {"state": "running"}
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "adapters: api, loopchat" in err


@pytest.mark.parametrize("name", PLATFORM_NAMES)
def test_every_built_in_adapter_declares_its_platform(name: str) -> None:
    """What the core asks of a registered class, present on each built-in adapter."""
    from gateway.adapters.base import PlatformAdapter
    from gateway.sections import PlatformSettings, build, schema_of

    cls = adapters.adapter_class(name)
    assert cls.platform == name and issubclass(cls.settings, PlatformSettings)
    wanted = {m for m in dir(PlatformAdapter) if not m.startswith("_")}
    assert wanted <= set(dir(cls)), wanted - set(dir(cls))
    defaults = build(cls.settings, {k: v.default for k, v in schema_of(cls.settings).items()})  # type: ignore[union-attr]
    assert defaults == cls.settings() and not defaults.enabled
    needs = [n.key for n in cls.secrets_needed(defaults)]
    # signal-cli has no token; the webhook's secrets are its endpoints' (none by default)
    assert needs[:1] == ([] if name in ("signal", "webhook") else ["token_env"])
    assert cls.home_chat_type("100") in ("dm", "group")


CAPABILITY_METHODS = {
    base.Typing: ("turn_started", "turn_ended"),
    base.TurnHooks: ("turn_ended",),
    base.UsesCursors: ("use_cursors",),
    base.UsesShards: ("use_shards",),
    base.Outbound: ("open_outbound",),
    base.HomeIds: ("split_home",),
    base.SetupSteps: ("setup_steps",),
    base.ReplicaLimits: ("replica_problems",),
    base.Login: ("login",),
}


@pytest.mark.parametrize("name", [*adapters.BUILTIN, *adapters.CORE])
def test_an_adapter_declares_every_capability_it_has_among_its_bases(name: str) -> None:
    """The core asks with isinstance/issubclass; an adapter with a capability's methods
    names that Protocol among its bases, so what it can do is read from its class line."""
    target = adapters.CORE.get(name) or adapters.BUILTIN[name]
    cls = adapters._load(target)
    for capability, methods in CAPABILITY_METHODS.items():
        has = all(callable(getattr(cls, m, None)) for m in methods)
        declared = capability in cls.__mro__
        assert has == declared, (
            f"{cls.__name__}: {capability.__name__} has={has} declared={declared}"
        )


@pytest.mark.parametrize("good", [True, False])
async def test_doctor_checks_qqbot_credentials_by_getting_an_access_token(
    tmp_path: Path, good: bool
) -> None:
    fake = FakeQQ()
    await fake.start()
    try:
        env = {**QQBOT_ENV, **({} if good else {"QQBOT_CLIENT_SECRET": "wrong"})}
        cfg = tmp_path / "c.yaml"
        cfg.write_text(
            "platforms:\n  qqbot:\n    enabled: true\n    allow_all_users: true\n"
            f"    base_url: {fake.api_url}\n    token_url: {fake.token_url}\n"
        )
        config = load_config(cfg, env)
        checks = await run_doctor(tmp_path / "home", config, None, fix=False, full=False)
    finally:
        await fake.stop()
    [reach] = [c for c in checks if c.name == "qqbot reachable"]
    expected = (
        "switchboard-bot"
        if good
        else "qq refused the app credentials: invalid appid or secret (code 100016)"
    )
    assert (reach.ok, reach.detail) == (good, expected)
    assert [m for m, _ in fake.calls] == (["token", "me"] if good else ["token"])
