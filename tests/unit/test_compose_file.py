"""docker-compose.yaml against the Compose Specification's JSON schema, and what docs/getting-started.md
("Running Airflow with docker compose") promises about it. (tests/integration/test_compose_services.py runs
its services.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from airflow_volcano.get_provider_info import get_provider_info

from .. import compose

REPO = compose.REPO
# What a user puts in .env (the secrets are required: the file has no default for them).
USER_VARIABLES = {"AIRFLOW_UID": "1000", "AIRFLOW_JWT_SECRET": "j" * 64, "AIRFLOW_API_SECRET_KEY": "k" * 64,
                  "AIRFLOW_FERNET_KEY": "f" * 43 + "="}
LONG_RUNNING = ("api-server", "scheduler", "dag-processor", "triggerer")


def validator(schema: dict) -> jsonschema.Draft7Validator:
    # The schema says draft-07 in a spelling jsonschema does not look up ("…/draft-07/schema", no "#").
    return jsonschema.Draft7Validator(schema)


@pytest.fixture(scope="module")
def spec() -> dict:
    return compose.load(USER_VARIABLES)


def test_the_file_is_valid_against_the_compose_specification_schema(spec):
    schema = compose.compose_schema()
    assert schema["$schema"].startswith("https://json-schema.org/draft-07/")
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(validator(schema).iter_errors(spec), key=lambda error: list(error.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_schema_rejects_what_compose_rejects():
    """The schema is the real thing, not an empty one that accepts anything."""
    check = validator(compose.compose_schema())
    assert list(check.iter_errors({"services": {"x": {"image": "i", "restart_policy": "always"}}}))
    assert list(check.iter_errors({"services": {"x": {"image": "i", "depends_on": {"y": {"condition": 1}}}}}))


def test_services_executor_and_init(spec):
    assert set(spec["services"]) == {"postgres", "airflow-init", *LONG_RUNNING}
    assert sorted(compose.airflow_services(spec)) == sorted(["airflow-init", *LONG_RUNNING])
    assert spec["services"]["postgres"]["image"].startswith("postgres:")  # the official image
    assert compose.command(spec["services"]["airflow-init"]) == ["db", "migrate"]
    for name in LONG_RUNNING:
        assert compose.command(spec["services"][name]) == [name]
    for name in compose.airflow_services(spec):
        env = compose.environment(spec["services"][name])
        assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        assert env["AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE"] == "true", name
        assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith(".SimpleAuthManager"), name
        assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://api-server:8080/execution/", name
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://"), name
        assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], name
    assert "127.0.0.1:8080:8080" in spec["services"]["api-server"]["ports"]


def test_every_airflow_service_has_the_same_secrets_from_the_users_environment(spec):
    for key, variable in [("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW_JWT_SECRET"),
                          ("AIRFLOW__API__SECRET_KEY", "AIRFLOW_API_SECRET_KEY"),
                          ("AIRFLOW__CORE__FERNET_KEY", "AIRFLOW_FERNET_KEY")]:
        values = {name: compose.environment(spec["services"][name]).get(key) for name in compose.airflow_services(spec)}
        assert set(values.values()) == {USER_VARIABLES[variable]}, key
        # No secret in the file: without the variable Compose refuses to start.
        with pytest.raises(compose.InterpolationError, match=variable):
            compose.load({k: v for k, v in USER_VARIABLES.items() if k != variable})


def test_the_kubeconfig_is_mounted_read_only_and_is_the_connections(spec, tmp_path):
    for name in compose.airflow_services(spec):
        service = spec["services"][name]
        conn = json.loads(compose.environment(service)["AIRFLOW_CONN_KUBERNETES_DEFAULT"])
        assert conn["conn_type"] == "kubernetes"
        (kube,) = [v for v in compose.volumes(service, home=tmp_path) if v.target == conn["extra"]["kube_config_path"]]
        assert (kube.type, kube.read_only) == ("bind", True), name
        assert kube.source == str(tmp_path / ".kube" / "config"), "default: ~/.kube/config"
        assert service["volumes"][-1]["bind"]["create_host_path"] is False
        dags = [v for v in compose.volumes(service) if v.target == f"{compose.IMAGE_AIRFLOW_HOME}/dags"]
        assert dags == [compose.Volume("bind", str(REPO / "dags"), "/opt/airflow/dags", False)], name

    chosen = compose.load(USER_VARIABLES | {"KUBECONFIG_PATH": "/etc/k8s/admin.conf"})
    sources = {v.source for v in compose.volumes(chosen["services"]["scheduler"]) if v.target.endswith("/.kube/config")}
    assert sources == {"/etc/k8s/admin.conf"}


def test_link_templates_are_the_providers_options_and_empty_by_default(spec):
    options = set(get_provider_info()["config"]["volcano"]["options"])
    for name in compose.airflow_services(spec):
        env = compose.environment(spec["services"][name])
        volcano = {key.removeprefix("AIRFLOW__VOLCANO__").lower(): value for key, value in env.items()
                   if key.startswith("AIRFLOW__VOLCANO__")}
        assert set(volcano) == options, name
        assert set(volcano.values()) == {""}, "no template, no button"
    template = "https://volcano.example.com/job/{namespace}/{name}"
    chosen = compose.load(USER_VARIABLES | {"VOLCANO_JOB_URL_TEMPLATE": template})
    assert compose.environment(chosen["services"]["scheduler"])["AIRFLOW__VOLCANO__JOB_URL_TEMPLATE"] == template


def test_start_order_and_healthchecks_as_in_airflows_own_compose_file(spec):
    services = spec["services"]
    for name in LONG_RUNNING:
        depends = services[name]["depends_on"]
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["airflow-init"] == {"condition": "service_completed_successfully"}, name
        assert services[name]["restart"] == "always"
        assert services[name]["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
    assert services["airflow-init"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert "restart" not in services["airflow-init"], "a one-shot"
    for name, service in services.items():
        for dependency, how in (service.get("depends_on") or {}).items():
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s healthcheck"


def test_the_image_is_the_constraints_airflow_with_this_provider():
    dockerfile = (REPO / "Dockerfile").read_text()
    pinned = re.search(r"^apache-airflow==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)[1]
    assert re.search(rf"^ARG AIRFLOW_VERSION={re.escape(pinned)}$", dockerfile, re.M), pinned
    assert re.search(r"^FROM apache/airflow:\$\{AIRFLOW_VERSION\}", dockerfile, re.M)
    assert "-c /opt/airflow-volcano/constraints.txt" in dockerfile
    # The build context holds what the Dockerfile copies, and no venv.
    ignored = Path(REPO / ".dockerignore").read_text().splitlines()
    assert "*" in ignored and "!airflow_volcano/" in ignored and "!constraints.txt" in ignored
