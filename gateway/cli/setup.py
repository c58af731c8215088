"""`switchboard setup`: a wizard that writes config.yaml and the home's secrets file for the
agent backend and each platform picked, asking only for what the config's own validator
says is missing, checking each token live through the adapter's `check_credentials`, and
ending with check-config and doctor. Plain prompts (input, getpass), so it works over SSH;
`--non-interactive` takes the same answers from flags and the environment, for scripts.

Re-running it edits the existing config as a round-trip document (comments and unrelated
keys kept) and keeps secrets already set unless new ones are given."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.errors import (
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    ConfigErrors,
    GatewayError,
    PlatformRefused,
    PlatformUnreachable,
)

CHECK_TRIES = 3  # interactive: how often a refused token is asked for again
_UNSET = re.compile(r"([A-Za-z_][A-Za-z0-9_]*) (is not set|holds a placeholder)")

EPILOG = """\
Interactive: run it in a terminal and answer the prompts (Enter keeps the value shown in
brackets; a secret left empty keeps the one already stored).

Non-interactive (scripts), e.g.:
  MY_BOT_TOKEN_VAR=... switchboard setup --non-interactive \\
      --platform <name> --allow <name>=12345,67890
  switchboard setup --non-interactive --agent openai --secret OPENAI_API_KEY=sk-... \\
      --set agent.openai.model=gpt-4o-mini
Secrets come from --secret NAME=VALUE, else the environment, else the home's
switchboard.env; they are written to <home>/switchboard.env (mode 0600), never to
config.yaml. Each platform's secret variable is the one its *_env key names (see
config.example.yaml).

exit codes: 0 done and doctor passes; 1 doctor found a problem; 2 usage (no terminal
without --non-interactive); 69 a platform could not be reached to check its token; 77 a
platform refused its token; 78 an unknown platform, a key not in the schema, a value of the
wrong type, or an answer still missing (--non-interactive)."""


class UsageError(GatewayError):
    exit_code = EXIT_USAGE


def add_parser(sub: Any, add_command: Callable[..., argparse.ArgumentParser]) -> None:
    p = add_command(
        sub,
        "setup",
        "a wizard that writes config.yaml and the secrets file",
        description="Set up the agent backend and chat platforms: writes "
        "config.yaml and <home>/switchboard.env (0600), checks each token with "
        "the platform, then runs check-config and doctor.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--non-interactive",
        action="store_true",
        help="ask nothing: take every answer from the flags and the environment",
    )
    p.add_argument("--agent", choices=("echo", "openai"), help="the agent backend")
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="NAME",
        help="enable this platform (repeat for several)",
    )
    p.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="PLATFORM=IDS",
        help="who may talk there: user ids (comma-separated), all, or pair",
    )
    p.add_argument(
        "--secret",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a secret for the secrets file: the variable an *_env key names, and its value",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="settings",
        help="any config key, as switchboard config set takes it",
    )
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="the https address that reaches the api server (for the URLs platforms post to)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="do not check tokens with the platforms (nor in doctor)",
    )
    p.set_defaults(func=cmd_setup)


class Prompts:
    """Questions on the terminal (input and getpass: fine over SSH), or none at all."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def ask(self, question: str, current: str | None = None) -> str:
        if not self.interactive:
            raise ConfigError("", f"{question}: no answer given (--non-interactive)")
        shown = f" [{current}]" if current else ""
        try:
            answer = input(f"{question}{shown}: ").strip()
        except EOFError:
            raise UsageError("setup ended: no more input") from None
        return answer or (current or "")

    def secret(self, question: str) -> str:
        if not self.interactive:
            raise ConfigError("", f"{question}: no answer given (--non-interactive)")
        try:
            return getpass.getpass(f"{question} (typing is hidden): ").strip()
        except EOFError:
            raise UsageError("setup ended: no more input") from None


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


class Wizard:
    """One run: the config as a round-trip document, the environment secrets are checked
    against (the process's, the secrets file's, and the answers so far), and the secrets
    to write."""

    def __init__(self, args: argparse.Namespace, home: Path, path: Path) -> None:
        from gateway.ops import envfile
        from gateway.ops.config_edit import Document

        self.args = args
        self.home = home
        self.ui = Prompts(not args.non_interactive)
        self.doc = Document(path)
        self.env = envfile.environment(home)
        self.new_secrets: dict[str, str] = _pairs(args.secret, "--secret")
        self.env.update(self.new_secrets)
        self.allow = _pairs(args.allow, "--allow")

    # --- the document ------------------------------------------------------------------

    def current(self, dotted: str) -> Any:
        from gateway.ops.config_edit import value_at

        data, _ = self.state()
        return value_at(data, tuple(dotted.split(".")))[1]

    def put(self, dotted: str, value: Any) -> None:
        from gateway.ops.config_edit import parse_value, resolve

        key = resolve(dotted)
        if isinstance(value, str):
            value = parse_value(key, value)
        self.doc.set(key.parts, value)

    def state(self) -> tuple[dict[str, Any], list[ConfigError]]:
        from gateway.ops.config_edit import problems_of

        return problems_of(self.doc.render(), self.doc.path, self.env)

    def secrets_of(self, platform: str) -> dict[str, str]:
        from gateway.config import check, parse

        _, secrets, _ = check(parse(self.doc.render(), self.doc.path), self.env)
        prefix = f"platforms.{platform}."
        return {k[len(prefix) :]: v for k, v in secrets.items() if k.startswith(prefix)}

    def set_secret(self, var: str, value: str) -> None:
        self.new_secrets[var] = value
        self.env[var] = value

    # --- the steps ---------------------------------------------------------------------

    def run(self) -> None:
        for dotted, text in _pairs(self.args.settings, "--set").items():
            self.put(dotted, text)
        self.agent()
        for platform in self.platforms():
            self.platform(platform)
        self.finish_problems()

    def agent(self) -> None:
        backend = self.args.agent or (
            self.ui.ask("Agent backend (echo, openai)", str(self.current("agent.backend")))
            if self.ui.interactive
            else str(self.current("agent.backend"))
        )
        self.put("agent.backend", backend)
        if self.current("agent.backend") != "openai":
            return
        if self.ui.interactive:
            self.put(
                "agent.openai.base_url",
                self.ui.ask("Model API base URL", self.current("agent.openai.base_url")),
            )
            self.put("agent.openai.model", self.ui.ask("Model", self.current("agent.openai.model")))
        self.fill("agent.")
        if not self.args.offline:
            self.check_agent_key()

    def check_agent_key(self) -> None:
        from gateway.agent.openai import OpenAIAgent
        from gateway.config import check, parse

        for attempt in range(CHECK_TRIES):
            _, secrets, _ = check(parse(self.doc.render(), self.doc.path), self.env)
            base = str(self.current("agent.openai.base_url"))
            key = secrets.get("agent.openai.api_key_env")
            ok, detail = asyncio.run(OpenAIAgent.check_credentials(base, key))
            if self.verdict("the model provider", ok, detail, attempt):
                return
            var = self.current("agent.openai.api_key_env")
            if not var:  # a provider without a key refused: nothing to ask again
                raise PlatformRefused(
                    f"the model provider: refused ({detail}); set agent.openai.api_key_env"
                )
            self.ask_secret(str(var), "(the model provider's API key)")

    def verdict(self, name: str, ok: bool, detail: str, attempt: int) -> bool:
        """Say what the check found; True when accepted, an error when out of tries."""
        if ok:
            self.ui.say(f"  {name}: the token is accepted ({detail})")
            return True
        unreachable = detail.startswith("unreachable")
        what = "could not be reached" if unreachable else "refused the token"
        self.ui.say(f"  {name}: {what}: {detail}")
        if not self.ui.interactive or attempt == CHECK_TRIES - 1:
            kind = PlatformUnreachable if unreachable else PlatformRefused
            raise kind(f"{name}: {what} ({detail}); nothing was written")
        return False

    def platforms(self) -> list[str]:
        from gateway import adapters

        known = adapters.names()
        enabled = [p for p in known if self.current(f"platforms.{p}.enabled")]
        while True:
            if self.args.platform or not self.ui.interactive:
                wanted = self.args.platform
            else:
                answer = self.ui.ask(
                    f"Platforms to enable, comma-separated ({', '.join(known)})",
                    ", ".join(enabled) or None,
                )
                wanted = [w.strip().lower() for w in answer.split(",") if w.strip()]
            unknown = [w for w in wanted if w not in known]
            if not unknown:
                return list(dict.fromkeys(wanted))
            problem = ConfigError(
                f"platforms.{unknown[0]}",
                f"unknown platform {unknown[0]!r} (known: {', '.join(known)})",
            )
            if not self.ui.interactive or self.args.platform:
                raise problem
            self.ui.say(f"  {problem}")

    def platform(self, name: str) -> None:
        self.ui.say(f"\n== {name} ==")
        self.put(f"platforms.{name}.enabled", True)
        self.allowlist(name)
        self.fill(f"platforms.{name}.")
        if not self.args.offline:
            self.check_token(name)

    def allowlist(self, name: str) -> None:
        given = self.allow.get(name)
        users = self.current(f"platforms.{name}.allowed_users") or []
        everyone = self.current(f"platforms.{name}.allow_all_users")
        if given is None and self.ui.interactive:
            shown = "all" if everyone else ", ".join(str(u) for u in users) or None
            given = self.ui.ask(
                f"Who may talk to the bot on {name}? user ids (comma-separated), "
                "all, or pair (unknown users DM for a code you approve)",
                shown,
            )
        if not given:
            return
        if given.lower() == "all":
            self.put(f"platforms.{name}.allow_all_users", True)
        elif given.lower() == "pair":
            self.put("access.unknown_dm", "pair")
        else:
            ids: list[str | int] = [
                int(u) if u.strip().lstrip("-").isdigit() else u.strip()
                for u in given.split(",")
                if u.strip()
            ]
            self.put(f"platforms.{name}.allowed_users", ids)
            self.put(f"platforms.{name}.allow_all_users", False)

    def fill(self, prefix: str) -> None:
        """Ask for each key under `prefix` that the validator says is missing or wrong,
        until it says nothing (secrets go to the secrets file, the rest to config.yaml)."""
        asked: set[str] = set()
        while True:
            _, errors = self.state()
            mine = [e for e in errors if e.key.startswith(prefix)]
            if not mine:
                return
            fresh = [e for e in mine if str(e) not in asked]
            if not fresh or not self.ui.interactive:
                raise mine[0] if len(mine) == 1 else ConfigErrors(mine)
            for e in fresh:
                asked.add(str(e))
                unset = _UNSET.search(e.problem)
                if e.key.endswith("_env") and unset:
                    self.ask_secret(unset.group(1), e.problem)
                else:
                    self.ui.say(f"  {e.key}: {e.problem}")
                    try:
                        self.put(e.key, self.ui.ask(f"  {e.key}", None))
                    except ConfigError as bad:  # a value of the wrong type: asked again
                        self.ui.say(f"  {bad}")
                        asked.discard(str(e))

    def ask_secret(self, var: str, why: str) -> None:
        reason = why.partition("(")[2].rstrip(")") or var
        value = self.ui.secret(f"  {reason} ({var})")
        if value:
            self.set_secret(var, value)

    def check_token(self, name: str) -> None:
        from gateway import adapters
        from gateway.sections import PlatformSettings, build

        cls = adapters.adapter_class(name)
        for attempt in range(CHECK_TRIES):
            data, _ = self.state()
            settings: PlatformSettings = build(cls.settings, data["platforms"][name])
            try:
                ok, detail = asyncio.run(cls.check_credentials(settings, self.secrets_of(name)))
            except Exception as exc:  # a third-party adapter's surprise: not reachable
                ok, detail = False, f"unreachable ({type(exc).__name__})"
            if self.verdict(name, ok, detail, attempt):
                return
            for need in cls.secrets_needed(settings):
                var = getattr(settings, need.key, None) or need.default_env
                self.ask_secret(var, f"({need.why})")

    def finish_problems(self) -> None:
        """Whatever else the whole config still gets wrong is refused before writing."""
        _, errors = self.state()
        if errors:
            raise errors[0] if len(errors) == 1 else ConfigErrors(errors)

    # --- writing and the platform's side --------------------------------------------------

    def secret_vars(self) -> dict[str, str]:
        """The variables the finished config reads its secrets from, with their values."""
        from gateway import adapters
        from gateway.config import check, parse
        from gateway.ops.config_edit import value_at
        from gateway.sections import build

        data, secrets, _ = check(parse(self.doc.render(), self.doc.path), self.env)
        out = {}
        for key, value in secrets.items():
            var = value_at(data, tuple(key.split(".")))[1]
            if not var and key.startswith("platforms."):
                name, leaf = key.split(".")[1], key.split(".")[2]
                cls = adapters.adapter_class(name)
                needs = cls.secrets_needed(build(cls.settings, data["platforms"][name]))
                var = next((n.default_env for n in needs if n.key == leaf), None)
            if var:
                out[str(var)] = value
        return out

    def write(self) -> None:
        from gateway.ops import envfile
        from gateway.ops.config_edit import write_atomically

        stored = envfile.read(envfile.path_of(self.home))
        for var, value in self.secret_vars().items():  # taken from the environment: the
            if stored.get(var) != value and var not in self.new_secrets:  # service needs it too
                self.new_secrets[var] = value
        write_atomically(self.doc.path, self.doc.render())
        self.ui.say(f"\nwrote {self.doc.path}")
        if self.new_secrets:
            envfile.write(envfile.path_of(self.home), self.new_secrets)
            names = ", ".join(sorted(self.new_secrets))
            self.ui.say(f"wrote {envfile.path_of(self.home)} (mode 600): {names}")

    def console_steps(self, names: list[str]) -> None:
        from gateway import adapters
        from gateway.adapters.base import SetupSteps
        from gateway.sections import build

        data, _ = self.state()
        base = (self.args.public_url or "https://<your public address>").rstrip("/")
        for name in names:
            cls = adapters.adapter_class(name)
            settings = build(cls.settings, data["platforms"][name])
            steps = cls.setup_steps(settings) if issubclass(cls, SetupSteps) else []
            try:
                paths = list(cls.from_config(settings, self.secrets_of(name)).routes())
            except Exception:  # an adapter that cannot be built without its library: no URLs
                paths = []
            for key in paths:
                method, _, path = key.rpartition(" ")
                steps.append(
                    f"URL to paste into {name}'s console: {base}{path}"
                    + (f" ({method})" if method else "")
                )
            if steps:
                self.ui.say(f"\nOn {name}'s side:")
                for step in steps:
                    self.ui.say(f"  - {step}")


def cmd_setup(args: argparse.Namespace) -> int:
    from gateway.cli.paths import home_of
    from gateway.config import load_config
    from gateway.ops import envfile
    from gateway.ops.doctor import exit_code, run_doctor

    if not args.non_interactive and not sys.stdin.isatty():
        raise UsageError(
            "no terminal to ask on: run setup in a terminal, or pass "
            "--non-interactive with flags (see switchboard setup --help)"
        )
    home = home_of(args)
    path = Path(args.config).expanduser() if args.config else home / "config.yaml"
    wizard = Wizard(args, home, path)
    if wizard.ui.interactive:
        wizard.ui.say(f"switchboard setup: {path} (Enter keeps the value in brackets)")
    wizard.run()
    wizard.write()
    platforms = [
        p for p, s in wizard.state()[0]["platforms"].items() if s.get("enabled") and p != "api"
    ]
    wizard.console_steps(platforms)
    config = load_config(path, envfile.environment(home))
    print(f"\ncheck-config: config ok: {path}")
    checks = asyncio.run(
        run_doctor(home, config, None, fix=False, full=False, check_platforms=not args.offline)
    )
    print("doctor:")
    for check in checks:
        print(f"  {check.line()}")
    code = exit_code(checks)
    if code == EXIT_OK:
        print("\nready: start it with `switchboard run` (or switchboard service install)")
    return code
