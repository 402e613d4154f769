"""docker-compose.yml, Dockerfile and .dockerignore describe a deployment that would work.

There is no Docker engine on the project's machines or in CI, so these files are checked structurally:
data volumes at the paths the images really write to, healthchecks, start order, commands that the
``commitline`` parser accepts, and environment variables that commitline (the configuration reference) or the
images actually read.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from commitline.cli import build_parser
from commitline.infrastructure.config import variables_markdown

ROOT = Path(__file__).parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]

# What each commitline service must run: its argv after the image's `commitline` entrypoint.
COMMITLINE_COMMANDS = {
    "migrate": ("migrate",),
    "serve": ("serve",),
    "publisher": ("publish",),
    "projector": ("project",),
    "sagas": ("sagas", "run"),
}
FOLLOWERS = ("publisher", "projector", "sagas")
LONG_RUNNING = ("serve", *FOLLOWERS)
STORES = ("postgres", "kafka")
# The stores each long-running process uses: only the publisher talks to Kafka.
USES = {"serve": {"postgres"}, "publisher": {"postgres", "kafka"}, "projector": {"postgres"}, "sagas": {"postgres"}}
# The python one-liner a health check fetches a URL with (the slim image has no curl): exit 1 unless 2xx.
URL_PROBE = re.compile(r"import urllib\.request; urllib\.request\.urlopen\('(http://127\.0\.0\.1:(\d+)(/\w+))', "
                       r"timeout=(\d+)\)")

# Variables the official postgres image reads (its documentation, "Environment Variables").
POSTGRES_IMAGE_VARIABLES = {
    "POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "POSTGRES_INITDB_ARGS", "POSTGRES_INITDB_WALDIR",
    "POSTGRES_HOST_AUTH_METHOD", "PGDATA",
}
# The apache/kafka image turns KAFKA_A_B into the broker property a.b (`__` -> `_`, `___` -> `-`) and also
# reads CLUSTER_ID. These are the broker properties (Kafka's broker configuration reference) a
# single-node KRaft deployment sets; the broker only warns about a misspelt one and ignores it.
KAFKA_BROKER_PROPERTIES = {
    "node.id", "process.roles", "controller.quorum.voters", "controller.listener.names", "listeners",
    "advertised.listeners", "listener.security.protocol.map", "inter.broker.listener.name", "log.dirs",
    "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
    "transaction.state.log.min.isr", "min.insync.replicas", "auto.create.topics.enable", "num.partitions",
    "default.replication.factor", "message.max.bytes", "group.initial.rebalance.delay.ms", "log.retention.hours",
}


def environment(service: str) -> dict[str, Any]:
    env = SERVICES[service].get("environment") or {}
    if isinstance(env, list):  # the `- NAME=value` form
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in env)
    return dict(env)


def kafka_property(variable: str) -> str | None:
    """The broker property the apache/kafka image sets from ``variable`` (None: not a KAFKA_ variable)."""
    if not variable.startswith("KAFKA_"):
        return None
    words = variable.removeprefix("KAFKA_").lower().split("___")
    return "-".join("_".join(part.replace("_", ".") for part in word.split("__")) for word in words)


def named_volume_mounts(service: str) -> dict[str, str]:
    """target path -> named volume, for the service's volumes that are named volumes declared at top level."""
    mounts = {}
    for volume in SERVICES[service].get("volumes", []):
        if isinstance(volume, dict):
            source, target = volume.get("source"), volume["target"]
            kind = volume.get("type", "volume")
        else:
            source, target = volume.split(":")[:2]
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        if kind == "volume" and source in (COMPOSE.get("volumes") or {}):
            mounts[target] = source
    return mounts


def image_tag(service: str, repository: str) -> str:
    image = SERVICES[service]["image"]
    name, _, tag = image.partition(":")
    assert name == repository, f"{service} must use the {repository} image, not {image}"
    assert tag and tag != "latest", f"{service}'s image must be pinned to a version, not {image!r}"
    return tag


def commitline_services() -> set[str]:
    return {name for name, s in SERVICES.items() if "build" in s}


def documented_configuration_variables() -> set[str]:
    """The variables of the configuration reference (generated from the settings when the docs are built)."""
    names = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", variables_markdown(), flags=re.MULTILINE))
    assert "COMMITLINE_DATABASE_URL" in names, "could not read the configuration reference's table"
    return names


def parsed(argv: list[str]) -> Any:
    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"`commitline {shlex.join(argv)}` is not a valid commitline command (see its --help)")


def cli_route(argv: list[str]) -> tuple[str, ...]:
    """The subcommand path the real ``commitline`` parser resolves ``argv`` to; fails on anything it refuses."""
    args = parsed(argv)
    route = (args.subcommand,)
    nested = getattr(args, f"{args.subcommand}_command", None)
    return route + ((nested,) if nested else ())


def as_argv(command: str | list[str]) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())  # join continuation lines
    lines = (line.strip() for line in text.splitlines())
    return [(i.upper(), rest.strip()) for i, _, rest in
            (line.partition(" ") for line in lines if line and not line.startswith("#"))]


def test_postgres_keeps_its_data_in_a_named_volume_at_the_images_data_path() -> None:
    major = image_tag("postgres", "postgres").split(".")[0].split("-")[0]
    # Up to 17 the image's PGDATA is /var/lib/postgresql/data; 18+ moved it (and refuses a mount there).
    assert major.isdigit() and int(major) <= 17, f"postgres:{major}: its data path is not /var/lib/postgresql/data"
    assert "PGDATA" not in environment("postgres")
    assert "/var/lib/postgresql/data" in named_volume_mounts("postgres"), (
        f"postgres data would be lost with its container: mounts {SERVICES['postgres'].get('volumes')}")


def test_kafka_runs_kraft_single_node_and_writes_its_log_to_the_mounted_volume() -> None:
    image_tag("kafka", "apache/kafka")
    env = environment("kafka")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith(f"{env['KAFKA_NODE_ID']}@")
    log_dirs = env.get("KAFKA_LOG_DIRS")
    assert log_dirs, "without KAFKA_LOG_DIRS apache/kafka writes to /tmp/kraft-combined-logs, outside any volume"
    assert log_dirs in named_volume_mounts("kafka"), (
        f"KAFKA_LOG_DIRS={log_dirs} but the named volume is mounted at {list(named_volume_mounts('kafka'))}")


def test_kafka_advertises_the_listener_commitline_connects_to() -> None:
    env = environment("kafka")
    listeners = dict(re.fullmatch(r"(\w+)://.*:(\d+)", item).groups() for item in env["KAFKA_LISTENERS"].split(","))
    advertised = {item.split("://")[1]: item.split("://")[0] for item in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for service in sorted(commitline_services()):
        for server in environment(service)["KAFKA_BOOTSTRAP_SERVERS"].split(","):
            host, port = server.rsplit(":", 1)
            assert host == "kafka", f"{service}: {server} is not the kafka service's name"
            assert server in advertised, f"{service}: kafka advertises {sorted(advertised)}, not {server}"
            assert listeners.get(advertised[server]) == port, f"{server}: no {advertised[server]} listener on {port}"


def test_every_service_but_the_one_shot_migrate_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        if name == "migrate":
            assert service.get("restart") == "no" and "healthcheck" not in service, "migrate runs once"
            continue
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable") and check["test"] != ["NONE"], f"{name}: no healthcheck"
    assert as_argv(SERVICES["postgres"]["healthcheck"]["test"])[1].startswith("pg_isready")
    kafka_check = " ".join(as_argv(SERVICES["kafka"]["healthcheck"]["test"]))
    assert re.search(r"/opt/kafka/bin/(kafka-broker-api-versions\.sh|kafka-topics\.sh) --bootstrap-server "
                     r"localhost:9092", kafka_check), kafka_check


def test_commitline_services_are_the_four_commands_and_restart_unless_stopped() -> None:
    assert commitline_services() == set(COMMITLINE_COMMANDS)
    for name in LONG_RUNNING:
        assert SERVICES[name]["restart"] == "unless-stopped", name


def test_commitline_services_start_after_the_stores_they_use_and_a_successful_migration() -> None:
    assert SERVICES["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in LONG_RUNNING:
        depends_on = SERVICES[name]["depends_on"]
        stores = {store for store in STORES if store in depends_on}
        assert stores == USES[name], f"{name} waits for {sorted(stores)} but uses {sorted(USES[name])}"
        assert all(depends_on[store]["condition"] == "service_healthy" for store in stores), f"{name}: {depends_on}"
        assert depends_on["migrate"]["condition"] == "service_completed_successfully", name


@pytest.mark.parametrize("service", sorted(COMMITLINE_COMMANDS))
def test_each_commitline_service_runs_its_real_cli_subcommand(service: str) -> None:
    argv = as_argv(SERVICES[service]["command"])
    assert cli_route(argv) == COMMITLINE_COMMANDS[service]


def health_probe(service: str) -> tuple[int, str, int]:
    """(port, path, timeout) of the URL the service's health check fetches."""
    check = SERVICES[service]["healthcheck"]
    assert {k: v for k, v in check.items() if k != "test"} == COMPOSE["x-commitline-healthcheck"], service
    kind, executable, flag, code = as_argv(check["test"])
    assert (kind, executable, flag) == ("CMD", "python", "-c"), f"{service}: {check['test']}"
    match = URL_PROBE.fullmatch(code)
    assert match, f"{service}: the health check does not fetch one local URL: {code}"
    _, port, path, timeout = match.groups()
    assert int(timeout) < int(check["timeout"].removesuffix("s")), f"{service}: the probe outlives the check"
    return int(port), path, int(timeout)


def test_serve_is_deployed_on_loopback_and_healthy_while_ready() -> None:
    args = parsed(as_argv(SERVICES["serve"]["command"]))
    assert args.host == "0.0.0.0", "inside its container serve must listen beyond the container's loopback"
    assert f"127.0.0.1:{args.port}:{args.port}" in SERVICES["serve"]["ports"], SERVICES["serve"]["ports"]
    assert health_probe("serve")[:2] == (args.port, "/readyz")
    # the operators' views (no API key, every tenant's stuck sagas) are not on the port tenants reach
    assert args.operator_port not in (None, args.port) and args.operator_host == "0.0.0.0"
    assert f"127.0.0.1:{args.operator_port}:{args.operator_port}" in SERVICES["serve"]["ports"]


def test_a_follower_container_is_healthy_while_its_process_answers_not_by_business_state() -> None:
    """A STUCK saga or a poison event fails ``status --check``; an orchestrator restarting the container for it
    would fix nothing. The container's check is the process's /healthz on its --metrics-port."""
    for name in FOLLOWERS:
        args = parsed(as_argv(SERVICES[name]["command"]))
        assert args.metrics_port is not None, f"{name} has no --metrics-port to answer /healthz on"
        assert args.metrics_host in ("0.0.0.0", "127.0.0.1"), f"{name}: the probe uses 127.0.0.1"
        assert health_probe(name)[:2] == (args.metrics_port, "/healthz"), name
    for name in commitline_services():
        check = " ".join(as_argv(SERVICES[name].get("healthcheck", {}).get("test", [])))
        assert "status" not in check, f"{name}: container health must not judge followers' business state"


def test_host_ports_are_on_loopback_and_not_a_local_postgresqls() -> None:
    for name, service in SERVICES.items():
        for mapping in service.get("ports", []):
            host, host_port, _ = mapping.split(":")
            assert host == "127.0.0.1", f"{name}: {mapping} would be reachable from other machines"
            assert host_port != "5432", f"{name}: 127.0.0.1:5432 clashes with a PostgreSQL on the host"


def test_the_deployment_guide_says_how_to_get_the_first_tenant_key() -> None:
    deployment = (ROOT / "docs" / "guides" / "deploy-compose.md").read_text()
    match = re.search(r"docker compose exec (?:-T )?(\w+) commitline (tenants add \w+)", deployment)
    assert match, "the deployment guide does not show `docker compose exec SERVICE commitline tenants add NAME`"
    assert match.group(1) in commitline_services()
    assert cli_route(shlex.split(match.group(2))) == ("tenants", "add")


def test_commitline_variables_are_documented_and_store_variables_the_images() -> None:
    documented = documented_configuration_variables()
    for name in sorted(commitline_services()):
        undocumented = set(environment(name)) - documented
        assert not undocumented, f"{name}: {sorted(undocumented)} not in the configuration reference"
    assert set(environment("postgres")) <= POSTGRES_IMAGE_VARIABLES, set(environment("postgres"))
    for variable in environment("kafka"):
        assert variable == "CLUSTER_ID" or kafka_property(variable) in KAFKA_BROKER_PROPERTIES, (
            f"kafka: {variable} is no broker property the image would set")


def test_commitline_services_use_the_compose_stores_with_kafka_idempotence_on() -> None:
    pg = environment("postgres")
    for name in sorted(commitline_services()):
        env = environment(name)
        url = urlsplit(env["COMMITLINE_DATABASE_URL"])  # set, or commitline would start an embedded PostgreSQL
        assert (url.scheme, url.hostname, url.port, url.path.lstrip("/")) == (
            "postgresql", "postgres", 5432, pg["POSTGRES_DB"]), f"{name}: COMMITLINE_DATABASE_URL"
        assert (url.username, url.password) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"]), name
        assert env["COMMITLINE_KAFKA_IDEMPOTENCE"] == "true", name


def test_environment_values_are_ones_compose_accepts() -> None:
    for name in SERVICES:  # Compose refuses YAML booleans (true, no, off) as environment values
        bad = {k: v for k, v in environment(name).items() if isinstance(v, bool) or not isinstance(v, (str, int))}
        assert not bad, f"{name}: quote these values: {bad}"


def test_dockerfile_installs_the_package_and_runs_commitline_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    froms = [args for i, args in instructions if i == "FROM"]
    assert froms and froms[-1].split()[0] == "python:3.11-slim", froms
    final_stage = instructions[max(n for n, (i, _) in enumerate(instructions) if i == "FROM"):]
    copied = {src for i, args in final_stage if i == "COPY" for src in args.split()[:-1]}
    assert {"pyproject.toml", "README.md"} <= copied and copied & {"commitline", ".", "./commitline"}, copied
    assert any(re.search(r"\bpip install \.(\s|$)", args) for i, args in final_stage if i == "RUN")
    users = [args.split(":")[0] for i, args in final_stage if i == "USER"]
    assert users and users[-1] not in ("root", "0"), f"the image must not run as root: USER {users}"
    entrypoints = [json.loads(args) for i, args in final_stage if i == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == ["commitline"], entrypoints


def test_dockerignore_keeps_local_state_and_caches_out_of_the_build() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".commitline", ".git", ".pytest_cache", ".hypothesis", "**/__pycache__"} <= ignored, ignored
    assert not ignored & {"README.md", "pyproject.toml", "commitline", "*.md"}, "the build needs these"
