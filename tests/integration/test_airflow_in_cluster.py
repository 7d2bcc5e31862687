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

import base64
import contextlib
import fcntl
import json
import logging
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException

from airflow_volcano.panel.plugin import PREFIX as PANEL_PREFIX
from airflow_volcano.preflight import main as preflight

from ..log_lines import Lines
from .conftest import HTTP, REPO, create_test_namespace, token_client
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
    for document in yaml.safe_load_all(RBAC_HELM_CHART.read_text()):
        for subject in document.get("subjects", []):
            assert subject["namespace"] == "airflow", "the file names the chart's default release namespace"
            subject["namespace"] = namespace
        utils.create_from_dict(admin, document, namespace=cluster.namespace)
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


# --- Airflow's own pods (scripts/airflow-in-cluster) -------------------------------------------------

# A training task that waits in its worker pod (not deferred), long enough to lose that pod mid-wait; a
# try is left, so the pod going away keeps the Job for the retry to reattach to. Its image and placement
# come from the deployment's cluster policy (cluster/airflow/airflow_local_settings.py).
REATTACH_DAG = '''
import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(dag_id="in_cluster_reattach", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
         catchup=False):
    VolcanoPyTorchJobOperator(task_id="train", image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                              worker_replicas=1, training_script="scripts/steps.py", deferrable=False,
                              retries=1, retry_delay=datetime.timedelta(seconds=5), poll_interval=1)
'''
STEPS = '''
import os, sys, time
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
for step in range(1, steps + 1):
    print(f"rank {os.environ['RANK']} step {step}/{steps}", flush=True)
    time.sleep(1)
'''
# A deferred training longer than a pod's token lives (scripts/airflow_in_cluster.py: 600 s, which the
# apiserver does not extend): the triggerer's wait goes on across the kubelet's rotation and the first
# token's expiry.
LONG_WAIT_DAG = '''
import datetime

from airflow.sdk import DAG

from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

with DAG(dag_id="in_cluster_long_wait", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
         catchup=False):
    VolcanoPyTorchJobOperator(task_id="train", image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
                              worker_replicas=0, training_script="scripts/steps.py", args=["{steps}"],
                              deferrable=True, job_timeout=1800)
'''
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"
TOKEN_LIFE = 600  # scripts/airflow_in_cluster.py's TOKEN_SECONDS


@dataclass
class AirflowPods:
    """Airflow deployed in the cluster: its namespace, its API server (the Service's ClusterIP) and a
    token of its admin user."""

    namespace: str
    url: str
    token: str

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        return HTTP.request(method, f"{self.url}{path}", headers={"Authorization": f"Bearer {self.token}"},
                            timeout=60, **kwargs)

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        deadline = time.monotonic() + 300
        while self.call("GET", f"/api/v2/dags/{dag_id}").status_code != 200:  # until the DAG processor parsed it
            assert time.monotonic() < deadline, f"{dag_id} never appeared in the API server"
            time.sleep(2)
        response = self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        assert response.status_code == 200, response.text
        return response.json()["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}").json()["state"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        run = quote(run_id, safe="")
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run}/taskInstances/{task_id}").json()

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        """The try's log as the UI shows it: each line's message."""
        response = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                                    f"{task_id}/logs/{try_number}", params={"full_content": True})
        assert response.status_code == 200, response.text
        return "\n".join(str(line.get("event", "")) for line in response.json()["content"])


@pytest.fixture
def airflow_pods(cluster, real_node, tmp_path) -> Iterator[AirflowPods]:
    """Airflow in a namespace of its own (`<test namespace>-airflow`), its Jobs in the test's namespace,
    its DAGs folder holding the retraining example (and seed 000's script) and REATTACH_DAG."""
    import airflow_in_cluster  # scripts/, on pytest's pythonpath

    namespace = f"{cluster.namespace}-airflow"
    dags = tmp_path / "dags"
    (dags / "scripts").mkdir(parents=True)
    # The example as it is, but run when the test triggers it, not also on its daily schedule.
    example = (REPO / "dags" / "volcano_retraining_pipeline.py").read_text()
    assert 'schedule="@daily"' in example
    (dags / "volcano_retraining_pipeline.py").write_text(example.replace('schedule="@daily"', "schedule=None"))
    shutil.copy(REPO / "dags" / "scripts" / "pytorch_demo.py", dags / "scripts")
    (dags / "in_cluster_reattach.py").write_text(REATTACH_DAG)
    # Past the first token's expiry by two minutes, counted from now: the pods start after this.
    (dags / "in_cluster_long_wait.py").write_text(LONG_WAIT_DAG.replace("{steps}", str(TOKEN_LIFE + 120)))
    (dags / "scripts" / "steps.py").write_text(STEPS)
    try:
        url = airflow_in_cluster.up(namespace, cluster.namespace, dags)
        response = HTTP.post(f"{url}/auth/token", timeout=60, json={
            "username": "admin", "password": airflow_in_cluster.admin_password(namespace)})
        response.raise_for_status()
        yield AirflowPods(namespace, url, response.json()["access_token"])
    finally:
        print(airflow_in_cluster.status(namespace))
        airflow_in_cluster.down(namespace)


def token_claims(kubeconfig: Path, namespace: str, pod: str) -> dict:
    """The claims of the ServiceAccount token a pod holds now (read in the pod, as its clients read it)."""
    token = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", namespace, pod, "--", "cat",
                            TOKEN_PATH], capture_output=True, text=True, check=True, timeout=60).stdout
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def worker_pods(cluster, namespace: str, dag_id: str) -> list[client.V1Pod]:
    """The KubernetesExecutor's worker pods of a DAG's tasks (labelled with the DAG's id)."""
    return cluster.core.list_namespaced_pod(namespace, label_selector=f"dag_id={dag_id}").items


def reattach_jobs(cluster) -> list[dict]:
    return [job for job in cluster.jobs()
            if job["metadata"]["labels"].get("airflow-volcano.io/dag-id") == "in_cluster_reattach"]


def test_airflow_deployed_as_the_charts_pods_trains_deferred_and_a_killed_worker_pods_retry_reattaches(
        cluster, airflow_pods):
    """Airflow as the Helm chart runs it: scheduler (KubernetesExecutor), triggerer, API server and DAG
    processor as pods of their own namespace with the chart's ServiceAccounts; each task in a worker pod;
    the `kubernetes` connection in-cluster (the pods' projected, short-lived tokens); the Jobs in
    another namespace. The retraining example runs to its end with `train` deferred (the triggerer's
    pod waits) and its log and panel are read through the in-cluster API server; a training waiting in
    its worker pod loses that pod (deleted, no grace: the process is killed), and the retry, in a new
    worker pod, reattaches to the same Job."""
    retraining = airflow_pods.trigger("volcano_retraining_pipeline", {"namespace": cluster.namespace, "workers": 1})
    reattach = airflow_pods.trigger("in_cluster_reattach")

    # The reattach DAG's training runs, waited for in its worker pod: that pod is killed.
    job = cluster.wait_for("the reattach DAG's Job to run", lambda: next(
        (j for j in reattach_jobs(cluster) if j.get("status", {}).get("state", {}).get("phase") == "Running"), None),
        timeout=420)
    # The panel of a training still running, read live through the API server's own identity.
    panel = airflow_pods.call("GET", f"{PANEL_PREFIX}/api/ti/in_cluster_reattach/{quote(reattach, safe='')}/train/-1")
    assert panel.status_code == 200 and panel.json()["source"] == "cluster", panel.text[:3000]
    assert panel.json()["job"]["phase"] == "Running", panel.text[:3000]
    (worker,) = [pod for pod in worker_pods(cluster, airflow_pods.namespace, "in_cluster_reattach")
                 if pod.status.phase == "Running"]
    cluster.core.delete_namespaced_pod(worker.metadata.name, airflow_pods.namespace, grace_period_seconds=0)

    for dag_id, run_id in (("volcano_retraining_pipeline", retraining), ("in_cluster_reattach", reattach)):
        cluster.wait_for(f"{dag_id} to end", lambda dag_id=dag_id, run_id=run_id: airflow_pods.run_state(
            dag_id, run_id) in ("success", "failed"), timeout=600)

    # The retraining pipeline: train deferred, its master's log in the task log, evaluate read its summary.
    assert airflow_pods.run_state("volcano_retraining_pipeline", retraining) == "success"
    train = airflow_pods.task_instance("volcano_retraining_pipeline", retraining, "train")
    log = airflow_pods.task_log("volcano_retraining_pipeline", retraining, "train", train["try_number"])
    assert "Epoch [5/5], Average Loss" in log, log[-5000:]
    assert f"Deferring: the triggerer waits for Volcano Job {cluster.namespace}/" in log, log[-5000:]
    assert "Pausing task as DEFERRED" in log and "Trigger fired event" in log, log[-5000:]
    # Where its time went: it never restarted (the trigger first looked once it ran).
    assert "Where the time went" in log and not re.search(r"^\s*restarting\s", log, re.MULTILINE), log[-3000:]
    # The panel, through the API server in the cluster, as its ServiceAccount reads the Job.
    panel = airflow_pods.call("GET", f"{PANEL_PREFIX}/api/ti/volcano_retraining_pipeline/"
                                     f"{quote(retraining, safe='')}/train/-1")
    assert panel.status_code == 200, panel.text
    assert "Completed" in panel.text and cluster.namespace in panel.text, panel.text[:3000]

    # The killed worker pod's task: one retry, in a new pod, took the same Job over.
    assert airflow_pods.run_state("in_cluster_reattach", reattach) == "success"
    retried = airflow_pods.task_instance("in_cluster_reattach", reattach, "train")
    assert retried["try_number"] == 2, retried
    second = airflow_pods.task_log("in_cluster_reattach", reattach, "train", 2)
    assert f"Reattaching to Volcano Job {cluster.namespace}/{job['metadata']['name']}" in second, second[-5000:]
    assert "rank 0 step 60/60" in second, second[-5000:]
    assert [j["metadata"]["uid"] for j in reattach_jobs(cluster)] in ([], [job["metadata"]["uid"]]), "no second Job"


@pytest.mark.soak
def test_a_deferred_wait_outlives_the_triggerers_first_token(cluster, airflow_pods, kubeconfig):
    """A deferred training that lasts past the expiry of the triggerer's first ServiceAccount token (600 s,
    which the apiserver does not extend) goes on to its end: the kubelet rotated the token in the pod and
    the triggerer's clients went on with the new one. Twelve minutes: `make soak` runs it."""
    (triggerer,) = cluster.core.list_namespaced_pod(airflow_pods.namespace,
                                                    label_selector="app=airflow-triggerer").items
    first_token = token_claims(kubeconfig, airflow_pods.namespace, triggerer.metadata.name)
    assert first_token["exp"] - first_token["iat"] == TOKEN_LIFE, first_token
    long_wait = airflow_pods.trigger("in_cluster_long_wait")
    cluster.wait_for("the long deferred training to end", lambda: airflow_pods.run_state(
        "in_cluster_long_wait", long_wait) in ("success", "failed"), timeout=TOKEN_LIFE + 900)
    assert airflow_pods.run_state("in_cluster_long_wait", long_wait) == "success"
    assert time.time() > first_token["exp"], "the wait ended before the first token expired"
    rotated = token_claims(kubeconfig, airflow_pods.namespace, triggerer.metadata.name)
    assert rotated["iat"] > first_token["iat"] and rotated["exp"] > first_token["exp"], (first_token, rotated)
    waited = airflow_pods.task_log("in_cluster_long_wait", long_wait, "train", 1)
    assert "Pausing task as DEFERRED" in waited and f"step {TOKEN_LIFE + 120}/{TOKEN_LIFE + 120}" in waited, \
        waited[-5000:]
