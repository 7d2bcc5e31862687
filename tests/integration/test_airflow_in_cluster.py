"""Airflow inside Kubernetes, as its Helm chart deploys it (issue 44): the tasks and the triggerer run
as ServiceAccounts of Airflow's own namespace (`<release>-worker`, `<release>-triggerer`), the
connection is in-cluster, and the training Jobs run in another namespace, allowed by
deploy/rbac-helm-chart.yaml (applied as a user edits it: their release's namespace).

What is real: the apiserver, its RBAC across namespaces, the ServiceAccount tokens (TokenRequest, as the
kubelet projects them into a pod, each bound to an object whose deletion revokes it), the Kubernetes
client's in-cluster loader and the files and environment it reads. What is simulated: the process is on
this machine, not in a pod: the test writes the token, CA and namespace where a pod has them
(/var/run/secrets/kubernetes.io/serviceaccount) and sets KUBERNETES_SERVICE_HOST/PORT as the kubelet does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from airflow_volcano.preflight import main as preflight

from ..log_lines import Lines
from .conftest import REPO, create_test_namespace, token_client
from .test_operator import seed_operator

RBAC_HELM_CHART = REPO / "deploy" / "rbac-helm-chart.yaml"


POD_IDENTITY = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@pytest.fixture
def airflow_namespace(cluster, admin) -> Iterator[str]:
    """Airflow's own namespace with the chart's two ServiceAccounts; the Jobs' namespace (the test's)
    has deploy/rbac.yaml's Role (the cluster fixture) and deploy/rbac-helm-chart.yaml, edited to name it."""
    namespace = f"{cluster.namespace}-airflow"
    create_test_namespace(cluster.core, namespace)
    for name in ("airflow-worker", "airflow-triggerer"):
        cluster.core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=name)))
    (binding,) = yaml.safe_load_all(RBAC_HELM_CHART.read_text())
    for subject in binding["subjects"]:
        assert subject["namespace"] == "airflow", "the file names the chart's default release namespace"
        subject["namespace"] = namespace
    utils.create_from_dict(admin, binding, namespace=cluster.namespace)
    try:
        yield namespace
    finally:
        cluster.core.delete_namespace(namespace)


def bound_token(cluster, namespace: str, service_account: str) -> tuple[str, str]:
    """A token of the ServiceAccount bound to a Secret of its own (as a pod's is bound to the pod):
    deleting the Secret revokes the token. Returns the token and the Secret's name."""
    holder = f"token-holder-{secrets.token_hex(3)}"
    created = cluster.core.create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name=holder)))
    bound_to = client.V1BoundObjectReference(api_version="v1", kind="Secret", name=holder, uid=created.metadata.uid)
    token = cluster.core.create_namespaced_service_account_token(
        service_account, namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3600, bound_object_ref=bound_to))).status.token
    return token, holder


@contextlib.contextmanager
def pod_identity(kubeconfig: Path, namespace: str, monkeypatch) -> Iterator[Path]:
    """What a pod has for its in-cluster configuration, on this machine, held by one test at a time."""
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    with open("/tmp/airflow-volcano-pod-identity.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = POD_IDENTITY.parent.parent  # /var/run/secrets
        assert not made.exists(), f"{made} exists on this machine: not this test's to replace"
        POD_IDENTITY.mkdir(parents=True)
        try:
            shutil.copyfile(kubeconfig.parent / "pki" / "ca.crt", POD_IDENTITY / "ca.crt")
            (POD_IDENTITY / "namespace").write_text(namespace)
            monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
            monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
            yield POD_IDENTITY / "token"
        finally:
            shutil.rmtree(made)


def refused(api: client.ApiClient) -> bool:
    try:
        client.VersionApi(api).get_code()
        client.CoreV1Api(api).list_namespaced_config_map("default", limit=1)
    except ApiException as error:
        return error.status == 401
    return False


def in_cluster_connection(monkeypatch, jobs_namespace: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(
        {"conn_type": "kubernetes", "extra": {"in_cluster": True, "namespace": jobs_namespace}}))


def test_the_charts_worker_and_triggerer_identities_may_do_what_the_provider_does(
        cluster, airflow_namespace, kubeconfig, monkeypatch):
    """The preflight, in-cluster, as each of the two ServiceAccounts, for the Jobs' namespace."""
    in_cluster_connection(monkeypatch, cluster.namespace)
    with pod_identity(kubeconfig, airflow_namespace, monkeypatch) as token_file:
        for service_account in ("airflow-worker", "airflow-triggerer"):
            token_file.write_text(bound_token(cluster, airflow_namespace, service_account)[0])
            lines: list[str] = []
            assert preflight(["--queue", "default"], out=lines.append) == 0, (service_account, lines)
            assert lines[2] == ("OK    permissions: every permission deploy/rbac.yaml grants, in namespace "
                                f"'{cluster.namespace}'"), (service_account, lines)
        # Airflow's other identities get nothing there from this file.
        token_file.write_text(service_account_token_of(cluster, airflow_namespace, "default"))
        lines = []
        assert preflight([], out=lines.append) == 1 and "FAIL  permissions" in lines[2], lines


def service_account_token_of(cluster, namespace: str, name: str) -> str:
    return cluster.core.create_namespaced_service_account_token(name, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token


def test_a_task_trains_in_the_jobs_namespace_as_the_charts_worker_and_outlives_its_token_rotating(
        cluster, airflow_namespace, kubeconfig, monkeypatch, run_task):
    """A training task through the in-cluster configuration, as airflow-worker of Airflow's namespace.
    Then the pod's token rotates (the old one revoked, a new one in the file, as the kubelet does): the
    next call is refused, the provider reads the token file again, and goes on."""
    from airflow_volcano.hooks.volcano import VolcanoHook

    in_cluster_connection(monkeypatch, cluster.namespace)
    with pod_identity(kubeconfig, airflow_namespace, monkeypatch) as token_file:
        token, holder = bound_token(cluster, airflow_namespace, "airflow-worker")
        token_file.write_text(token)
        cluster.write_log("incluster-master-0", ["trained as the chart's worker"])
        run = run_task(lambda: seed_operator(cluster.namespace, "incluster", worker_replicas=1,
                                             on_finish_action="keep_job"))
        assert run.state == "success", run.log
        assert "[incluster-master-0] trained as the chart's worker" in run.log
        hook = VolcanoHook()
        said = Lines()
        hook._log = logging.getLogger("test_airflow_in_cluster.hook")  # a stdlib logger, to read what it says
        hook._log.addHandler(said)
        review = client.AuthenticationV1Api(hook.api_client).create_self_subject_review(
            client.V1SelfSubjectReview())
        assert review.status.user_info.username == f"system:serviceaccount:{airflow_namespace}:airflow-worker"
        # The token rotates: the old one revoked (its holder deleted), a new one in the pod's file.
        new_token, _ = bound_token(cluster, airflow_namespace, "airflow-worker")
        cluster.core.delete_namespaced_secret(holder, airflow_namespace)
        token_file.write_text(new_token)
        # The apiserver caches a token's authentication for a few seconds: until it refuses the old one.
        old_client = token_client(cluster.api, token)
        cluster.wait_for("the old token to be refused", lambda: refused(old_client), timeout=60)
        assert [job["metadata"]["name"] for job in hook.list_jobs(cluster.namespace, "")] == ["incluster"], \
            "the call after the rotation went through with the new token"
        assert said.lines == ["The apiserver refused the connection's credentials; reading them again"], said.lines
        assert client.AuthenticationV1Api(hook.api_client).create_self_subject_review(
            client.V1SelfSubjectReview()).status.user_info.username.endswith(":airflow-worker")
