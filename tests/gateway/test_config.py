"""Configuration: defaults, errors that name the key path, placeholders, secrets."""

from __future__ import annotations

import sys
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
        (
            "runtime:\n  event_loop: libuv\n",
            {},
            "runtime.event_loop",
            "must be one of auto, uvloop",
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


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=10),
        lambda kids: (
            st.lists(kids, max_size=3)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "agent",
                        "platforms",
                        "api",
                        "port",
                        "backend",
                        "sessions",
                        "x",
                        "enabled",
                        "logging",
                    ]
                ),
                kids,
                max_size=3,
            )
        ),
    ),
)
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


def _schema_keys(schema: dict, prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, spec in schema.items():
        path = f"{prefix}{name}"
        keys |= _schema_keys(spec, path + ".") if isinstance(spec, dict) else {path}
    return keys


def _documented_keys(node: object, schema: object, prefix: str = "") -> set[str]:
    if not isinstance(node, dict) or not isinstance(schema, dict):
        return {prefix.rstrip(".")}  # a value, or a key whose value is one mapping (by_platform)
    keys: set[str] = set()
    for name, value in node.items():
        keys |= _documented_keys(value, schema.get(name), f"{prefix}{name}.")
    return keys


def test_the_example_documents_exactly_the_schema() -> None:
    # every schema key is in config.example.yaml, and every key there is in the schema
    import yaml

    from gateway.config import schema as full_schema

    SCHEMA = full_schema()  # the core sections and each registered adapter's
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())
    documented, schema = _documented_keys(example, SCHEMA), _schema_keys(SCHEMA)
    assert sorted(schema - documented) == [], "in the schema but not in config.example.yaml"
    assert sorted(documented - schema) == [], "in config.example.yaml but not in the schema"
    assert "not yet" not in (ROOT / "config.example.yaml").read_text()


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    # check-config names every problem, not only the first
    text = (
        "agent:\n  backend: magic\n  context_tokens: lots\n"
        "sessions:\n  histroy_messages: 5\n"
        "session_reset:\n  by_platform:\n    irc: {mode: idle}\n"
        "platforms:\n  telegram:\n    enabled: true\n    home_channel: 'a:b:c'\n"
        "  discord:\n    mode: webhook\n"
    )
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, text)
    keys = [e.key for e in err.value.all()]
    assert sorted(keys) == sorted(
        [
            "agent.backend",
            "agent.context_tokens",
            "sessions.histroy_messages",
            "session_reset.by_platform.irc",
            "platforms.telegram.home_channel",
            "platforms.discord.mode",
            "platforms.telegram.token_env",
            "platforms.telegram.allowed_users",
        ]
    )
    assert err.value.exit_code == 78 and err.value.key == keys[0]
    assert all(f"{e.key}: " in str(err.value) for e in err.value.all())


@pytest.mark.parametrize(
    "text, keys",
    [
        (
            "agent:\n  backend: echo\n  backend: openai\n",
            ["agent.backend: duplicate key at line 3 (first at line 2)"],
        ),
        (
            "agent:\n  backend: echo\nsessions:\n  history_messages: 5\nagent:\n  reply_tokens: 9\n",
            ["agent: duplicate key at line 5 (first at line 1)"],
        ),
        (
            "platforms:\n  api:\n    port: 1\n    port: 2\n  telegram:\n    admins: [1]\n    admins: [2]\n",
            [
                "platforms.api.port: duplicate key at line 4",
                "platforms.telegram.admins: duplicate key at line 7",
            ],
        ),
    ],
)
def test_duplicate_keys_are_refused_naming_the_line(
    tmp_path: Path, text: str, keys: list[str]
) -> None:
    # a YAML parser keeps the last of two equal keys without a word; the loader refuses them
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, text)
    found = [str(e) for e in err.value.all()]
    assert len(found) == len(keys)
    assert all(line.startswith(want) for line, want in zip(found, keys, strict=True))
    assert err.value.exit_code == 78


def _typed_values(node: object, path: str = "") -> list[tuple[str, object, object]]:
    """(dotted key, value, declared kind) for every leaf of a typed section."""
    import dataclasses
    import typing

    from gateway.sections import _kind

    out: list[tuple[str, object, object]] = []
    hints = typing.get_type_hints(type(node))
    for f in dataclasses.fields(node):  # type: ignore[arg-type]
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out += _typed_values(value, f"{path}{f.name}.")
        else:
            out.append((f"{path}{f.name}", value, _kind(hints[f.name])))
    return out


def test_sections_are_frozen_typed_and_agree_with_data(tmp_path: Path) -> None:
    # each section is a frozen dataclass whose fields carry their declared types
    import dataclasses

    cfg = _cfg(
        tmp_path,
        (
            "agent:\n  reply_tokens: 99\n  openai:\n    tools: [session_search]\n"
            "sessions:\n  auto_prune:\n    retention_days: 7\n"
            "session_reset:\n  by_platform:\n    api: {mode: idle}\n"
            "platforms:\n  api:\n    port: 0\n  discord:\n    admins: [5, '6']\n"
        ),
    )
    assert cfg.agent.reply_tokens == 99 and cfg.agent.openai.tools == ("session_search",)
    assert cfg.sessions.auto_prune.retention_days == 7 and cfg.api.port == 0
    assert cfg.session_reset.by_platform == {"api": {"mode": "idle"}}
    assert cfg.platforms["discord"].admins == (5, "6")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.agent.reply_tokens = 1  # type: ignore[misc]
    sections = [
        ("", getattr(cfg, n))
        for n in (
            "logging",
            "state",
            "sessions",
            "agent",
            "access",
            "display",
            "session_reset",
            "shutdown",
        )
    ]
    sections += [(f"platforms.{n}.", s) for n, s in (("api", cfg.api), *cfg.platforms.items())]
    for prefix, section in sections:
        for key, value, kind in _typed_values(section):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            expect = tuple if list in kinds else kinds
            assert isinstance(value, expect), (prefix + key, value, kind)
    for name in ("reply_tokens", "openai"):
        data = cfg.get(f"agent.{name}")
        value = getattr(cfg.agent, name)
        assert (dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value) == (
            {**data, "tools": tuple(data["tools"])} if name == "openai" else data
        )


@pytest.mark.slow
def test_the_gateway_reads_typed_sections_not_dotted_gets() -> None:
    """No `config.get("a.b")` (or `.platform(name)[...]`) left in gateway code."""
    import ast

    found = []
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if path.name == "config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "platform")
                and ast.unparse(node.func.value).split(".")[-1] == "config"
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_an_event_loop_not_installed_is_refused_by_name_and_auto_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import event_loops

    assert event_loops.loop_factory("asyncio") is None
    assert event_loops.loop_factory("auto") is not None  # a dependency here (Linux)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a machine without it
    assert event_loops.loop_factory("auto") is None
    assert _cfg(tmp_path, "runtime:\n  event_loop: auto\n", {}).runtime.event_loop == "auto"
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, "runtime:\n  event_loop: uvloop\n", {})
    assert err.value.key == "runtime.event_loop" and "not installed" in str(err.value)
    assert err.value.exit_code == 78
