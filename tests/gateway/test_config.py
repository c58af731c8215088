"""Configuration: defaults, errors that name the key path, placeholders, secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import load_config
from gateway.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path: Path, text: str, env: dict[str, str] | None = None):
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return load_config(p, env or {})


def test_embedded_defaults_need_no_file_and_no_secrets() -> None:
    cfg = load_config(None, {})
    assert cfg.get("agent.backend") == "echo"
    assert cfg.platform("api")["port"] == 8642 and cfg.platform("api")["host"] == "127.0.0.1"
    assert cfg.get("state.synchronous") == "NORMAL"


def test_the_example_config_is_valid_with_its_env_vars(tmp_path: Path) -> None:
    env = {"TELEGRAM_BOT_TOKEN": "123:real-looking-token", "OPENAI_API_KEY": "sk-realkey123"}
    cfg = load_config(ROOT / "config.example.yaml", env)
    assert cfg.get("sessions.history_messages") > 0


@pytest.mark.parametrize(
    "text, env, key, phrase",
    [
        ("agent:\n  backend: magic\n", {}, "agent.backend", "must be one of"),
        ("agent:\n  bakend: echo\n", {}, "agent.bakend", "unknown key"),
        ("sessions:\n  history_messages: lots\n", {}, "sessions.history_messages", "whole number"),
        (
            "sessions:\n  history_messages: true\n",
            {},
            "sessions.history_messages",
            "not true/false",
        ),
        ("platforms:\n  api:\n    port: 70000\n", {}, "platforms.api.port", "between"),
        (
            "platforms:\n  telegram:\n    enabled: true\n    allow_all_users: true\n",
            {},
            "platforms.telegram.token_env",
            "TELEGRAM_BOT_TOKEN is not set",
        ),
        (
            "platforms:\n  telegram:\n    enabled: true\n    token_env: TG\n    allow_all_users: true\n",
            {"TG": "<your-token>"},
            "platforms.telegram.token_env",
            "placeholder",
        ),
        (
            "platforms:\n  telegram:\n    enabled: true\n    token_env: TG\n",
            {"TG": "123:abc"},
            "platforms.telegram.allowed_users",
            "is empty",
        ),
        (
            "platforms:\n  discord:\n    enabled: true\n    token_env: 'not a name'\n",
            {},
            "platforms.discord.token_env",
            "environment variable name",
        ),
        (
            "platforms:\n  slack:\n    enabled: true\n    allow_all_users: true\n    token_env: S\n    mode: polling\n",
            {"S": "xoxb-1"},
            "platforms.slack.mode",
            "http or socket",
        ),
        (
            "platforms:\n  slack:\n    enabled: true\n    allow_all_users: true\n    token_env: S\n",
            {"S": "xoxb-1"},
            "platforms.slack.signing_secret_env",
            "SLACK_SIGNING_SECRET is not set",
        ),
        (
            "platforms:\n  slack:\n    enabled: true\n    allow_all_users: true\n    mode: socket\n    token_env: S\n",
            {"S": "xoxb-1"},
            "platforms.slack.app_token_env",
            "SLACK_APP_TOKEN is not set",
        ),
        ("platforms:\n  api:\n    host: 0.0.0.0\n", {}, "platforms.api.key_env", "not loopback"),
        ("agent:\n  system_prompt: CHANGE_ME\n", {}, "agent.system_prompt", "placeholder"),
        (
            "agent:\n  backend: openai\n",
            {},
            "agent.openai.api_key_env",
            "OPENAI_API_KEY is not set",
        ),
        ("- a\n- b\n", {}, "config", "mapping"),
        ("agent: [\n", {}, "", "not valid YAML"),
    ],
)
def test_errors_name_the_key(
    tmp_path: Path, text: str, env: dict[str, str], key: str, phrase: str
) -> None:
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, text, env)
    assert err.value.key == key
    assert phrase in str(err.value)
    assert err.value.exit_code == 78


def test_secrets_come_from_the_named_env_vars(tmp_path: Path) -> None:
    cfg = _cfg(
        tmp_path,
        "platforms:\n  api:\n    host: 0.0.0.0\n    key_env: API_KEY\n",
        {"API_KEY": "s3cret-value"},
    )
    assert cfg.secret("platforms.api.key_env") == "s3cret-value"


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml", {})


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(
                        ["agent", "platforms", "api", "port", "backend", "sessions", "x", "enabled", "logging"]), kids, max_size=3)),
       )  # fmt: skip
def test_any_yaml_value_gives_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, value: object
) -> None:
    import yaml

    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    path.write_text(yaml.safe_dump(value))
    try:
        load_config(path, {})
    except ConfigError as exc:
        assert str(exc)
