"""`python -m airflow_volcano.preflight` against the real apiserver and Volcano (issue 44): what a
platform engineer runs before the first DAG, with the connection the tasks use. The least-privilege
identity of deploy/rbac.yaml passes; an identity without it is told which permissions it lacks; a queue
that is not there, and an apiserver that does not answer, are each one line; the exit code says it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml
from kubernetes import client

from airflow_volcano.preflight import main

from .conftest import REPO, service_account_token


def preflight(*args: str) -> tuple[int, list[str]]:
    lines: list[str] = []
    return main(list(args), out=lines.append), lines


def test_the_least_privilege_identity_passes_and_the_command_says_so(cluster, operator_kubeconfig):
    """The command as a user runs it, in its own process, with the connection of deploy/rbac.yaml's identity
    (and deploy/queue-reader.yaml's), whose namespace is the test's."""
    result = subprocess.run([sys.executable, "-m", "airflow_volcano.preflight"],
                            capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK    apiserver: https://127.0.0.1:") and "(Kubernetes v1." in lines[0], lines
    assert lines[1].startswith("OK    Volcano: its resources are served (Volcano "), lines
    assert lines[2] == ("OK    permissions: every permission deploy/rbac.yaml grants, in namespace "
                        f"'{cluster.namespace}'"), lines
    assert lines[3:] == ["OK    queue 'default': exists and is Open"], "deploy/queue-reader.yaml lets it read queues"


def test_an_identity_without_the_role_is_told_each_permission_it_lacks(cluster, kubeconfig, tmp_path, monkeypatch):
    cluster.core.create_namespaced_service_account(cluster.namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="nobody")))
    connect_as(cluster, kubeconfig, tmp_path, monkeypatch, "nobody")
    code, lines = preflight("--conn-id", "nobody", "--namespace", cluster.namespace)
    assert code == 1, lines
    (permissions,) = [line for line in lines if "permissions:" in line]
    assert permissions.startswith(f"FAIL  permissions: the connection's identity may not, in namespace "
                                  f"'{cluster.namespace}': create jobs.batch.volcano.sh, get jobs.batch.volcano.sh")
    for lacking in ("get pods/log", "list events", "create configmaps", "list podgroups.scheduling.volcano.sh"):
        assert lacking in permissions, permissions
    assert permissions.endswith("deploy/rbac.yaml grants every permission the provider needs")


def test_a_role_missing_one_verb_fails_naming_that_verb(cluster, kubeconfig, admin, tmp_path, monkeypatch):
    """deploy/rbac.yaml's Role with `watch` of pods left out, bound to an identity of its own."""
    import yaml as yaml_module
    from kubernetes import utils

    (_, role, binding) = yaml_module.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text())
    role["metadata"]["name"] = binding["roleRef"]["name"] = binding["metadata"]["name"] = "almost"
    for rule in role["rules"]:
        if rule["resources"] == ["pods"]:
            rule["verbs"].remove("watch")
    binding["subjects"] = [{"kind": "ServiceAccount", "name": "almost", "namespace": cluster.namespace}]
    cluster.core.create_namespaced_service_account(cluster.namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="almost")))
    for document in (role, binding):
        utils.create_from_dict(admin, document, namespace=cluster.namespace)
    connect_as(cluster, kubeconfig, tmp_path, monkeypatch, "almost")
    code, lines = preflight("--conn-id", "almost", "--namespace", cluster.namespace)
    assert code == 1 and lines[2] == (
        f"FAIL  permissions: the connection's identity may not, in namespace '{cluster.namespace}': watch pods; "
        "deploy/rbac.yaml grants every permission the provider needs"), lines


def connect_as(cluster, kubeconfig: Path, tmp_path: Path, monkeypatch, service_account: str) -> None:
    """An Airflow connection (id: the ServiceAccount's name) with a token of the test namespace's `service_account`."""
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    path = tmp_path / f"{service_account}-kubeconfig.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": service_account, "user": {"token": service_account_token(
            cluster.core, cluster.namespace, service_account)}}],
        "contexts": [{"name": "c", "context": {"cluster": "local", "user": service_account}}],
    }))
    monkeypatch.setenv(f"AIRFLOW_CONN_{service_account.upper()}", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(path)}}))


def test_a_missing_queue_fails_naming_it(cluster, kubeconfig, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_ADMIN", json.dumps({"conn_type": "kubernetes",
                                                         "extra": {"kube_config_path": str(kubeconfig)}}))
    code, lines = preflight("--conn-id", "admin", "--namespace", cluster.namespace, "--queue", "no-such-queue")
    assert code == 1 and lines[-1] == ("FAIL  queue 'no-such-queue': no such Volcano queue: a Job submitted to it "
                                       "would never start (`kubectl get queues` lists them)"), lines
    assert [line[:4] for line in lines[:-1]] == ["OK  "] * 3, lines


def test_an_apiserver_that_does_not_answer_is_one_line(tmp_path: Path, monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "kubeconfig.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    monkeypatch.setenv("AIRFLOW_CONN_GONE", json.dumps({"conn_type": "kubernetes",
                                                        "extra": {"kube_config_path": str(path)}}))
    code, lines = preflight("--conn-id", "gone", "--retries", "0")
    assert code == 1 and lines == [
        f"FAIL  apiserver: read the apiserver's version failed: no answer from the Kubernetes apiserver "
        f"https://127.0.0.1:{port} of Airflow connection 'gone' (Connection refused; tried for 0s): check the "
        "connection's server address and credentials, and that this machine can reach it"], lines
