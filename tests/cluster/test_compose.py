"""deploy/compose (three replicas, PostgreSQL, Caddy) checked without docker: the compose
file's services, health checks, dependencies and environment; every replica config through
switchboard's own config loader; the Caddyfile naming every replica; the env template
naming every variable the configs and services read. deploy/docker (one container) too: the
env file its compose file requires ships as a template the comments say to copy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy" / "compose"
DOCKER = ROOT / "deploy" / "docker"
REPLICAS = ["replica1", "replica2", "replica3"]


def compose() -> dict[str, Any]:
    doc = yaml.safe_load((HERE / "compose.yaml").read_text())  # anchors and merges resolved
    assert isinstance(doc, dict)
    return doc


def template_env() -> dict[str, str]:
    """switchboard.env.example's variables, filled with stand-ins as an operator would."""
    names = [
        line.split("=", 1)[0]
        for line in (HERE / "switchboard.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    env = {name: f"stand-in-{name.lower()}" for name in names}
    env["SWITCHBOARD_PG_DSN"] = "postgresql://switchboard:pw@postgres:5432/switchboard"
    return env


def test_the_services_are_a_database_three_replicas_and_a_proxy() -> None:
    services = compose()["services"]
    assert set(services) == {"postgres", "proxy", *REPLICAS}
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:15")
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert pg["environment"]["POSTGRES_DB"] == "switchboard" and pg["env_file"] == "switchboard.env"
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    homes = set()
    for name in REPLICAS:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/docker/Dockerfile"
        assert svc["env_file"] == "switchboard.env" and svc["restart"] == "unless-stopped"
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "/health" in " ".join(svc["healthcheck"]["test"])
        mounts = dict(
            v.rsplit(":", 1)[0].split(":", 1) if v.endswith(":ro") else v.split(":", 1)
            for v in svc["volumes"]
        )
        assert mounts[f"./{name}.yaml"] == "/data/config.yaml"  # its own config
        homes.add(next(src for src, dst in mounts.items() if dst == "/data"))
        assert (HERE / f"{name}.yaml").is_file()
    assert len(homes) == 3  # a home volume each: the home lock is per replica
    assert homes | {"pg-data"} == set(compose()["volumes"])
    proxy = services["proxy"]
    assert (
        proxy["image"].startswith("caddy:2")
        and "./Caddyfile:/etc/caddy/Caddyfile:ro" in proxy["volumes"]
    )
    assert {n: d["condition"] for n, d in proxy["depends_on"].items()} == dict.fromkeys(
        REPLICAS, "service_healthy"
    )
    assert proxy["ports"] == ["8080:8080"]


def test_stop_grace_outlasts_each_replicas_drain() -> None:
    services = compose()["services"]
    for name in REPLICAS:
        grace = int(services[name]["stop_grace_period"].removesuffix("s"))
        drain = yaml.safe_load((HERE / f"{name}.yaml").read_text())["shutdown"]["drain_seconds"]
        assert drain < grace, name


@pytest.mark.parametrize("name", REPLICAS)
def test_each_replica_config_passes_switchboards_own_loader(name: str) -> None:
    config = load_config(HERE / f"{name}.yaml", template_env())
    assert config.state.backend == "postgres" and config.state.dsn_env == "SWITCHBOARD_PG_DSN"
    assert config.cluster.replicas == len(REPLICAS) and config.cluster.replica_id == name
    api = config.data["platforms"]["api"]
    assert (api["host"], api["port"], api["key_env"]) == ("0.0.0.0", 8642, "SWITCHBOARD_API_KEY")
    assert config.data["platforms"]["telegram"]["mode"] == "webhook"
    assert config.data["platforms"]["slack"]["mode"] == "http"


def test_the_replica_configs_differ_only_in_their_name() -> None:
    texts = [(HERE / f"{n}.yaml").read_text().replace(n, "NAME") for n in REPLICAS]
    assert texts[0] == texts[1] == texts[2]


def test_every_variable_a_replica_reads_is_in_the_env_template() -> None:
    env = template_env()
    needed: set[str] = set()
    for name in REPLICAS:
        text = (HERE / f"{name}.yaml").read_text()
        needed |= set(re.findall(r"_env:\s*([A-Z][A-Z0-9_]*)", text))
    # the platforms' default variable names, for the keys a config leaves out
    needed |= {"TELEGRAM_BOT_TOKEN", "SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "POSTGRES_PASSWORD"}
    assert needed <= set(env)
    for name in REPLICAS:  # and the loader finds nothing missing once they are all set
        load_config(HERE / f"{name}.yaml", env)
        with pytest.raises(Exception, match="SWITCHBOARD_PG_DSN|state.dsn_env"):
            load_config(
                HERE / f"{name}.yaml", {k: v for k, v in env.items() if k != "SWITCHBOARD_PG_DSN"}
            )


def test_the_caddyfile_balances_over_every_replica_with_health_checks() -> None:
    text = (HERE / "Caddyfile").read_text()
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    assert text.count("{") == text.count("}")  # balanced blocks
    (proxy,) = [ln for ln in lines if ln.startswith("reverse_proxy ")]
    upstreams = proxy.removesuffix("{").split()[1:]
    port = 8642
    assert upstreams == [f"{n}:{port}" for n in REPLICAS]
    assert "lb_policy round_robin" in lines and "health_uri /health" in lines
    assert any(ln.startswith(":8080") for ln in lines)  # the port compose publishes


def test_the_single_container_ships_the_env_file_its_compose_requires_as_a_template() -> None:
    text = (DOCKER / "compose.yaml").read_text()
    service = yaml.safe_load(text)["services"]["switchboard"]
    env_file = service["env_file"]
    assert (DOCKER / f"{env_file}.example").is_file()
    copy = f"cp deploy/docker/{env_file}.example deploy/docker/{env_file}"
    assert copy in text and copy in (DOCKER / f"{env_file}.example").read_text()
    assert f"{env_file}\n" in (ROOT / ".gitignore").read_text()  # the filled-in copy stays out


def test_the_single_containers_config_loads_with_its_env_template_filled_in() -> None:
    service = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["switchboard"]
    assert "./config.yaml:/data/config.yaml:ro" in service["volumes"]
    template = (DOCKER / "switchboard.env.example").read_text().splitlines()
    names = [ln.split("=", 1)[0] for ln in template if ln and not ln.startswith("#")]
    env = {name: f"stand-in-{name.lower()}" for name in names}
    config = load_config(DOCKER / "config.yaml", env)
    api = config.data["platforms"]["api"]
    assert (api["host"], api["port"]) == ("0.0.0.0", 8642)
    assert service["ports"] == [f"127.0.0.1:{api['port']}:{api['port']}"]
    with pytest.raises(Exception, match="SWITCHBOARD_API_KEY"):
        load_config(DOCKER / "config.yaml", {})
