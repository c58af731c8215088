"""`switchboard send` without a daemon on every platform: the adapter opens for sending
only (its receiving side never starts), the platform's fake shows the message, and a
refused credential exits 77. Each case runs the real command in a subprocess against the
platform's loopback fake. Telegram, Slack and Discord are in tests/gateway/test_cli_send.py;
Weixin, which can only answer a chat that wrote first (its reply token), in
tests/gateway/test_weixin.py."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import clean_env, switchboard
from tests.fakes import (
    bluebubbles,
    dingtalk,
    feishu,
    homeassistant,
    matrix,
    qqbot,
    teams,
    twilio,
    wecom,
    whatsapp,
)
from tests.fakes.bluebubbles import FakeBlueBubbles
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.feishu import FakeFeishu
from tests.fakes.homeassistant import FakeHomeAssistant
from tests.fakes.imap import FakeImap
from tests.fakes.matrix import FakeMatrix
from tests.fakes.mattermost import TOWN, FakeMattermost
from tests.fakes.qqbot import FakeQQ
from tests.fakes.signal import ALICE, BOT, FakeSignal
from tests.fakes.smtp import FakeSmtp
from tests.fakes.teams import FakeTeams
from tests.fakes.twilio import FakeTwilio
from tests.fakes.webhook_receiver import CallbackReceiver
from tests.fakes.wecom import FakeWeCom
from tests.fakes.whatsapp import FakeGraph

TEXT = "release 2.4 is out <b>not markup</b>"


@dataclass
class Case:
    """One platform: its config section, secrets, a target, and what its fake shows."""

    section: str  # the YAML lines under platforms.<name> after enabled/allow_all_users
    env: dict[str, str]
    bad_env: dict[str, str]  # the same with the credential the platform refuses
    target: str
    shown: Callable[[], list[str]]  # the texts the platform shows, in order
    # the receiving side was never opened (None: the platform posts to the daemon's route)
    received_nothing: Callable[[], bool] | None


async def sb(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        switchboard(home, *args),
        capture_output=True,
        text=True,
        timeout=90,
        env=clean_env(),
    )


def _home(tmp_path: Path, platform: str, case: Case, env: dict[str, str]) -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(
        f"platforms:\n  {platform}:\n    enabled: true\n    allow_all_users: true\n"
        + "".join(f"    {line}\n" for line in case.section.splitlines())
    )
    (home / "switchboard.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return home


async def _case(platform: str) -> AsyncIterator[Case]:
    """The platform's fake, started, and how to address it; stopped afterwards."""
    if platform == "email":
        imap, smtp = FakeImap(), FakeSmtp()
        await imap.start()
        await smtp.start()
        try:
            yield Case(
                f"address: {imap.user}\nimap_host: 127.0.0.1\nimap_port: {imap.port}\n"
                f"imap_tls: plain\nsmtp_host: 127.0.0.1\nsmtp_port: {smtp.port}\n"
                "smtp_tls: plain",
                {"EMAIL_PASSWORD": imap.password},
                {"EMAIL_PASSWORD": "not-the-password"},
                "alice@example.com",
                lambda: [
                    str(m.message.get_body(("plain",)).get_content()).strip() for m in smtp.accepted
                ],
                lambda: not imap.logins,
            )
        finally:
            await imap.stop()
            await smtp.stop()
        return
    fake: Any
    if platform == "signal":
        fake = FakeSignal()
    elif platform == "matrix":
        fake = FakeMatrix()
    elif platform == "mattermost":
        fake = FakeMattermost()
    elif platform == "teams":
        fake = FakeTeams()
    elif platform == "whatsapp":
        fake = FakeGraph()
    elif platform == "sms":
        fake = FakeTwilio()
    elif platform == "feishu":
        fake = FakeFeishu()
    elif platform == "dingtalk":
        fake = FakeDingTalk()
    elif platform == "bluebubbles":
        fake = FakeBlueBubbles()
    elif platform == "qqbot":
        fake = FakeQQ()
    elif platform == "homeassistant":
        fake = FakeHomeAssistant()
    elif platform == "wecom":
        fake = FakeWeCom()
    else:
        fake = CallbackReceiver()
    await fake.start()
    try:
        yield _addressed(platform, fake)
    finally:
        await fake.stop()


def _addressed(platform: str, fake: Any) -> Case:
    if platform == "signal":
        return Case(
            f"url: {fake.url}\naccount: '{BOT}'",
            {},
            {},
            ALICE,
            lambda: [str(d["message"]) for d in fake.delivered()],
            lambda: not fake.last_event_ids,
        )
    if platform == "matrix":
        fake.add_room("!general:fake.test", {"@alice:fake.test": "Alice"})
        return Case(
            f"homeserver: {fake.base_url}\nuser_id: '{matrix.BOT}'",
            {"MATRIX_ACCESS_TOKEN": fake.token},
            {"MATRIX_ACCESS_TOKEN": "syt_revoked"},
            "!general:fake.test",
            lambda: [str(s["body"]) for s in fake.sends()],
            lambda: not fake.requests("sync"),
        )
    if platform == "mattermost":
        return Case(
            f"url: {fake.url}",
            {"MATTERMOST_TOKEN": fake.token},
            {"MATTERMOST_TOKEN": "revoked-token"},
            TOWN,
            lambda: [str(p["message"]) for p in fake.bot_posts()],
            lambda: not [c for c in fake.calls if c[0] == "WS"],
        )
    if platform == "teams":
        return Case(
            f"token_url: {fake.token_url}\nopenid_metadata_url: {fake.metadata_url}\n"
            f"base_url: {fake.service_url}",
            {"TEAMS_APP_ID": teams.APP_ID, "TEAMS_APP_PASSWORD": teams.PASSWORD},
            {"TEAMS_APP_ID": teams.APP_ID, "TEAMS_APP_PASSWORD": "wrong"},
            "19:general@thread.tacv2",
            lambda: [str(a["text"]) for a in fake.posted()],
            None,  # activities only arrive at the daemon's route
        )
    if platform == "whatsapp":
        return Case(
            f"phone_number_id: '{whatsapp.PHONE_ID}'\nbase_url: {fake.base_url}",
            {
                "WHATSAPP_TOKEN": whatsapp.TOKEN,
                "WHATSAPP_APP_SECRET": whatsapp.APP_SECRET,
                "WHATSAPP_VERIFY_TOKEN": whatsapp.VERIFY,
            },
            {
                "WHATSAPP_TOKEN": "EAAG-bad",
                "WHATSAPP_APP_SECRET": whatsapp.APP_SECRET,
                "WHATSAPP_VERIFY_TOKEN": whatsapp.VERIFY,
            },
            "15551234567",
            lambda: [str(m["text"]["body"]) for m in fake.sent()],
            None,  # events only arrive at the daemon's route
        )
    if platform == "sms":
        return Case(
            f"account_sid: {twilio.ACCOUNT}\nfrom_number: '{twilio.FROM}'\n"
            f"webhook_url: {twilio.PUBLIC_URL}\nbase_url: {fake.base_url}",
            {"TWILIO_AUTH_TOKEN": twilio.AUTH_TOKEN},
            {"TWILIO_AUTH_TOKEN": "wrong-token"},
            "+15551234567",
            lambda: [str(m["Body"]) for m in fake.sent()],
            None,  # events only arrive at the daemon's route
        )
    if platform == "feishu":
        return Case(
            f"base_url: {fake.base_url}",
            dict(feishu.ENV),
            {**feishu.ENV, "FEISHU_APP_SECRET": "wrong"},
            "oc_grp",
            lambda: [str(m["markdown"]) for m in fake.sent()],
            None,  # events only arrive at the daemon's route
        )
    if platform == "dingtalk":
        return Case(
            f"base_url: {fake.base_url}",
            dict(dingtalk.ENV),
            {**dingtalk.ENV, "DINGTALK_CLIENT_SECRET": "wrong"},
            "cidGROUP",
            lambda: [str(body["text"]) for _kind, body in fake.sent()],
            lambda: not fake.sockets,
        )
    if platform == "bluebubbles":
        return Case(
            f"url: {fake.base_url}\nbot_name: switchboard",
            {
                "BLUEBUBBLES_PASSWORD": bluebubbles.PASSWORD,
                "BLUEBUBBLES_WEBHOOK_SECRET": bluebubbles.SECRET,
            },
            {"BLUEBUBBLES_PASSWORD": "wrong", "BLUEBUBBLES_WEBHOOK_SECRET": bluebubbles.SECRET},
            bluebubbles.GROUP,
            lambda: [str(m["message"]) for m in fake.sent()],
            None,  # events only arrive at the daemon's route
        )
    if platform == "wecom":
        return Case(
            f"base_url: {fake.url}",
            dict(wecom.ENV),
            {**wecom.ENV, "WECOM_SECRET": "wrong"},
            "wrGROUP",
            lambda: [t for _h, _w, t in fake.sent()],
            None,  # the bot's one connection is taken for the send: nothing arrives on it
        )
    if platform == "homeassistant":
        return Case(
            f"url: {fake.url}",
            dict(homeassistant.ENV),
            {"HOMEASSISTANT_TOKEN": "wrong"},
            "user.bob",
            lambda: [str(r["text"]) for r in fake.replies()],
            lambda: not fake.subs,
        )
    if platform == "qqbot":
        return Case(
            f"base_url: {fake.api_url}\ntoken_url: {fake.token_url}",
            dict(qqbot.ENV),
            {**qqbot.ENV, "QQBOT_CLIENT_SECRET": "wrong"},
            qqbot.BOB,
            lambda: [str(p["text"]) for p in fake.sent()],
            lambda: not fake.sockets,
        )
    return Case(
        f"endpoints:\n  ci:\n    secret_env: WEBHOOK_CI_SECRET\n    mode: async\n"
        f"    callback_url: {fake.url}",
        {"WEBHOOK_CI_SECRET": fake.secret},
        {},
        "ci:ann",
        lambda: [str(r["text"]) for r in fake.replies()],
        None,  # requests only arrive at the daemon's route
    )


PLATFORMS = [
    "signal",
    "matrix",
    "mattermost",
    "teams",
    "whatsapp",
    "sms",
    "email",
    "feishu",
    "dingtalk",
    "bluebubbles",
    "qqbot",
    "homeassistant",
    "wecom",
    "webhook",
]


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_send_without_a_daemon_reaches_the_platform_and_opens_no_receiving_side(
    tmp_path: Path, platform: str
) -> None:
    cases = _case(platform)
    case = await cases.__anext__()
    try:
        home = _home(tmp_path, platform, case, case.env)
        proc = await sb(home, "send", platform, case.target, TEXT)
        assert proc.returncode == 0, proc.stderr
        assert case.shown() == [TEXT]
        assert case.received_nothing is None or case.received_nothing()
        if case.bad_env:
            _home(tmp_path, platform, case, case.bad_env)
            refused = await sb(home, "send", platform, case.target, "again")
            assert refused.returncode == 77, (refused.returncode, refused.stderr)
            assert case.shown() == [TEXT]
    finally:
        await cases.aclose()


@pytest.mark.parametrize("platform", PLATFORMS)
async def test_setup_checks_the_credentials_live_and_shows_the_steps_on_the_platform_side(
    tmp_path: Path, platform: str
) -> None:
    cases = _case(platform)
    case = await cases.__anext__()
    try:
        home = _home(tmp_path, platform, case, case.env)
        proc = await asyncio.to_thread(
            subprocess.run,
            switchboard(home, "setup", "--non-interactive", "--platform", platform),
            capture_output=True,
            text=True,
            timeout=120,
            env=clean_env(),
        )
    finally:
        await cases.aclose()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, header, after = proc.stdout.partition(f"On {platform}'s side:\n")
    assert header, proc.stdout
    steps = [line for line in after.splitlines() if line.startswith("  - ")]
    console = [line for line in steps if not line.startswith("  - URL to paste")]
    assert len(console) >= 2, proc.stdout
