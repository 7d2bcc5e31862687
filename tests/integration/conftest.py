"""Fixtures for tests against the real local Volcano cluster (scripts/volcano-cluster).

The cluster is started once per session (or reused). Each test gets its own namespace, and the
operator under test authenticates as a ServiceAccount bound to deploy/rbac.yaml's Role, the least
privilege docs/getting-started.md documents, under deploy/admission-policy.yaml (applied once per session, bound to
the session's namespaces); the harness itself uses the admin kubeconfig to set up and inspect. A
cluster that cannot start fails the run: it is never skipped.
"""

from __future__ import annotations

import base64
import datetime
import fcntl
import hashlib
import json
import os
import secrets
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, config, utils
from kubernetes.client.rest import ApiException

from ..compose_stack import wait_until
from ..conftest import REAL_NODE_GATE, uses_real_node
from .airflow_api_client import close_all as close_airflow_api_servers

REPO = Path(__file__).resolve().parents[2]
# The tests' one HTTP client (to Airflow's REST API and the panel): httpx.get() and the like build a
# client, and with it a TLS context reading the CA bundle, at each call; polling the API that way was a
# seventh of what the panel tests' pytest workers spent (py-spy, 2026-12-07).
HTTP = httpx.Client()
# How long a test waits for the tests marked node_outage to give the real node back (they take about 4 min).
REAL_NODE_GATE_TIMEOUT = 900
VOLCANO = ("batch.volcano.sh", "v1alpha1")
ADMISSION_POLICY = REPO / "deploy" / "admission-policy.yaml"
QUEUE_READER = REPO / "deploy" / "queue-reader.yaml"
# Sessions of other branches share the cluster, each with its own version of the policies: each version
# is applied under names of its own and bound only to the namespaces labelled with it (those of the
# sessions that applied it), so no session runs under another's policies or replaces them.
POLICY_VERSION = hashlib.sha256(ADMISSION_POLICY.read_bytes()).hexdigest()[:10]
POLICY_LABEL = "test.airflow-volcano.io/admission-policy"
# What a platform team sets on a namespace for pods that mount the node's directories
# (deploy/admission-policy.yaml's airflow-volcano-job-pods).
ALLOWED_PRIVILEGES = "airflow-volcano.io/allowed-privileges"


@pytest.fixture(scope="session")
def kubeconfig() -> Path:
    # One `up` at a time: the suite's concurrent workers (pytest-xdist) each start their session here,
    # and a first start on a fresh machine builds and starts the cluster once for all of them.
    with open("/tmp/airflow-volcano-cluster.up.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"the local Volcano cluster did not start:\n{result.stdout}\n{result.stderr}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def volcano_release(kubeconfig: Path) -> tuple[int, int]:
    """The running cluster's Volcano release as (major, minor), as `scripts/volcano-cluster up` recorded it
    (make test-compat runs the suite's compatibility subset on older releases)."""
    versions = json.loads((kubeconfig.parent / "versions.json").read_text())
    major, minor = versions["volcano"].lstrip("v").split(".")[:2]
    return int(major), int(minor)


@pytest.fixture(autouse=True)
def real_node_free(request: pytest.FixtureRequest) -> None:
    """A test that uses the real node starts once no test marked node_outage has its kubelet stopped: in
    scripts/test-suite those run beside the concurrent tests, while the file REAL_NODE_GATE names exists.
    (Autouse: before the test's own fixtures put anything on the node.)"""
    gate = os.environ.get(REAL_NODE_GATE)
    if gate and uses_real_node(request.node):
        wait_until(f"the node_outage tests to give the real node back ({gate} gone)", lambda: not Path(gate).exists(),
                   timeout=REAL_NODE_GATE_TIMEOUT, interval=1)


@pytest.fixture(autouse=True)
def airflow_api_servers_end_with_the_test() -> Iterator[None]:
    """The REST API server processes a test's calls started (airflow_api_client.api_call) end with it."""
    yield
    close_airflow_api_servers()


@pytest.fixture(scope="session")
def real_node(kubeconfig: Path) -> dict[str, Any]:
    """Operator arguments that run pods on the cluster's real node (real containers) with the local
    training image, as `scripts/volcano-cluster real-node` prints them. On the simulated-only cluster
    (VOLCANO_CLUSTER_SIMULATED=1, where scripts/test-suite runs the tests marked control_plane) a test that
    needs the real node fails, saying so."""
    result = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "real-node"], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.fail(f"no real node: {result.stderr.strip()}", pytrace=False)
    return json.loads(result.stdout)


@dataclass
class Containerd:
    """The real node's container runtime, read with `ctr` as an operator of the node would."""

    socket: Path

    def ctr(self, *args: str) -> str:
        return subprocess.run(["ctr", f"--address={self.socket}", "--namespace=k8s.io", *args],
                              capture_output=True, text=True, check=True).stdout

    def running_containers(self, namespace: str, pod: str | None = None, *, sandboxes: bool = True) -> list[str]:
        """Containers of pods in `namespace` (of one pod, if named) whose process is still running, the
        pods' sandboxes too (`sandboxes=False`: not them)."""
        filters = [f'labels."io.kubernetes.pod.namespace"=={namespace}']
        if not sandboxes:
            filters.append('labels."io.cri-containerd.kind"==container')
        if pod is not None:
            filters.append(f'labels."io.kubernetes.pod.name"=={pod}')
        ours = set(self.ctr("containers", "list", "--quiet", ",".join(filters)).split())
        running = []
        for line in self.ctr("tasks", "list").splitlines()[1:]:
            task, _pid, status = line.split()[:3]
            if task in ours and status == "RUNNING":
                running.append(task)
        return running

    def kill(self, container: str, signal: str = "SIGKILL") -> None:
        """Signal a container's process from the node, as the OOM killer or a preemption would."""
        self.ctr("tasks", "kill", "--signal", signal, container)


@pytest.fixture(scope="session")
def containerd(kubeconfig: Path) -> Containerd:
    return Containerd(kubeconfig.parent / "containerd" / "containerd.sock")


@pytest.fixture(scope="session")
def admin(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(str(kubeconfig))


def service_account_token(core: client.CoreV1Api, namespace: str, name: str = "airflow-volcano") -> str:
    """A token of the ServiceAccount (a TokenRequest, as a pod's projected token is made)."""
    return core.create_namespaced_service_account_token(
        name, namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)),
    ).status.token


def token_client(admin: client.ApiClient, token: str) -> client.ApiClient:
    """A client of the admin's apiserver that authenticates with `token` only."""
    configuration = client.Configuration()
    configuration.host = admin.configuration.host
    configuration.ssl_ca_cert = admin.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def policy_name(name: str) -> str:
    """The name this session's version of deploy/admission-policy.yaml's `name` is applied under."""
    return f"{name}-{POLICY_VERSION}"


def apply_admission_policy(admin: client.ApiClient) -> None:
    """deploy/admission-policy.yaml, server-side applied as `kubectl apply --server-side` would, under this
    version's names, each binding matching only the namespaces labelled with this version."""
    api = client.AdmissionregistrationV1Api(admin)
    apply = {"ValidatingAdmissionPolicy": api.patch_validating_admission_policy,
             "ValidatingAdmissionPolicyBinding": api.patch_validating_admission_policy_binding}
    for doc in yaml.safe_load_all(ADMISSION_POLICY.read_text()):
        doc["metadata"]["name"] = policy_name(doc["metadata"]["name"])
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            assert "matchResources" not in doc["spec"], "the binding's own matchResources would be replaced"
            doc["spec"]["policyName"] = policy_name(doc["spec"]["policyName"])
            doc["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {POLICY_LABEL: POLICY_VERSION}}}
        apply[doc["kind"]](doc["metadata"]["name"], doc, field_manager="airflow-volcano-tests", force=True,
                           _content_type="application/apply-patch+yaml")


def create_test_namespace(core: client.CoreV1Api, name: str, annotations: dict[str, str] | None = None) -> None:
    """A namespace under this session's admission policies."""
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={POLICY_LABEL: POLICY_VERSION}, annotations=annotations)))


def wait_admission_policy_enforced(admin: client.ApiClient, timeout: float = 60) -> None:
    """Until the apiserver enforces the policies (it loads policies and bindings from its informers a
    moment after they are written): probe, as the ServiceAccount in a namespace of its own, with a
    dry-run change of a label of its own Volcano Job and a dry-run create of a Job with a hostPath
    volume, until each is refused by this version's policy (a cluster may hold an older version applied
    to every namespace, which refuses neither and answers first where both refuse)."""
    core = client.CoreV1Api(admin)
    namespace = f"policy-probe-{secrets.token_hex(4)}"
    create_test_namespace(core, namespace)
    try:
        utils.create_from_yaml(admin, str(REPO / "deploy" / "rbac.yaml"), namespace=namespace)
        job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
               "metadata": {"name": "probe", "labels": {"app.kubernetes.io/managed-by": "airflow-volcano"}},
               "spec": {"schedulerName": "volcano", "minAvailable": 1, "tasks": [{"name": "main", "replicas": 1,
                        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "x"}],
                                              "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}}]}}
        client.CustomObjectsApi(admin).create_namespaced_custom_object(*VOLCANO, namespace, "jobs", job)
        operator = client.CustomObjectsApi(token_client(admin, service_account_token(core, namespace)))
        job["metadata"]["name"] = "probe-create"
        probes = {
            policy_name("airflow-volcano-own-objects"): lambda: operator.patch_namespaced_custom_object(
                *VOLCANO, namespace, "jobs", "probe", {"metadata": {"labels": {"probe": "1"}}}, dry_run="All"),
            policy_name("airflow-volcano-job-pods"): lambda: operator.create_namespaced_custom_object(
                *VOLCANO, namespace, "jobs", job, dry_run="All"),
        }
        deadline = time.monotonic() + timeout
        while probes:
            for policy, probe in list(probes.items()):
                try:
                    probe()
                    answer = "the dry run was allowed"
                except ApiException as error:
                    # 403 from RBAC too while the RoleBinding is new to the authorizer's cache: read the reason.
                    if error.status == 403 and f"ValidatingAdmissionPolicy '{policy}'" in (error.body or ""):
                        del probes[policy]
                        continue
                    if error.status != 403:
                        raise
                    answer = f"HTTP 403: {error.body}"
                if time.monotonic() > deadline:
                    pytest.fail(f"{ADMISSION_POLICY.name} was applied but {policy} was not enforced after "
                                f"{timeout:.0f}s (last answer to its probe: {answer})", pytrace=False)
            time.sleep(0.2)
    finally:
        core.delete_namespace(namespace)


@pytest.fixture(scope="session", autouse=True)
def admission_policy(admin: client.ApiClient) -> None:
    """deploy/admission-policy.yaml, applied once (as admin) before any integration test and enforced,
    so every test's operator, sensor and triggerer act under it (each test's namespace is labelled for
    it): the provider's own requests must pass it. It stays applied after the session (cluster-scoped,
    and other sessions of the same version may be running under it; applying again is a no-op)."""
    apply_admission_policy(admin)
    wait_admission_policy_enforced(admin)


@dataclass
class Cluster:
    """The harness's admin view of one test namespace."""

    api: client.ApiClient
    namespace: str
    log_dir: Path

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def jobs(self) -> list[dict]:
        return self.custom.list_namespaced_custom_object(*VOLCANO, self.namespace, "jobs")["items"]

    def job(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(*VOLCANO, self.namespace, "jobs", name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def create_job(self, body: dict) -> dict:
        return self.custom.create_namespaced_custom_object(*VOLCANO, self.namespace, "jobs", body)

    def pods(self, job_name: str | None = None) -> list[client.V1Pod]:
        selector = f"volcano.sh/job-name={job_name}" if job_name else None
        return self.core.list_namespaced_pod(self.namespace, label_selector=selector).items

    def pod_log(self, pod: str) -> str:
        # Undecoded: the client's own decoding turns non-ASCII logs into the repr of bytes.
        response = self.core.read_namespaced_pod_log(pod, self.namespace, _preload_content=False)
        return response.data.decode()

    def log_shows(self, pod: str, text: str) -> bool:
        """Whether the pod's log has `text` yet (not while the pod or its container does not exist)."""
        try:
            return text in self.pod_log(pod)
        except ApiException as error:
            if error.status in (400, 404):
                return False
            raise

    def finish_simulated_pods(self, job_name: str, exit_code: int = 0) -> None:
        """Let a Job's kwok pods that run forever (sim outcome run-forever) end now, succeeding or failing
        with `exit_code`: kwok acts on the changed annotations, so a test ends a Job when it is done with
        it, not on a guessed clock."""
        ending = {"sim.airflow-volcano.io/outcome": "fail" if exit_code else "succeed",
                  "sim.airflow-volcano.io/run-for": "1s"}
        if exit_code:
            ending["sim.airflow-volcano.io/exit-code"] = str(exit_code)
        for pod in self.pods(job_name):
            self.core.patch_namespaced_pod(pod.metadata.name, self.namespace, {"metadata": {"annotations": ending}})

    def configmap_names(self) -> set[str]:
        return {cm.metadata.name for cm in self.core.list_namespaced_config_map(self.namespace).items}

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.scheduling_state()}")

    def scheduling_state(self) -> str:
        """The namespace's Jobs and PodGroups as Volcano sees them, and the PodGroups' events: what a wait
        that timed out was waiting on (said with the timeout, since the namespace is gone afterwards)."""
        try:
            lines = [f"Job {job['metadata']['name']}: {(job.get('status') or {}).get('state', {}).get('phase')}"
                     for job in self.jobs()]
            for group in self.custom.list_namespaced_custom_object(
                    "scheduling.volcano.sh", "v1beta1", self.namespace, "podgroups")["items"]:
                status = group.get("status") or {}
                conditions = "; ".join(f"{c.get('type')} {c.get('reason')}: {c.get('message')}"
                                       for c in status.get("conditions") or [])
                lines.append(f"PodGroup {group['metadata']['name']}: {status.get('phase')} ({conditions})")
            lines += [f"event {event.involved_object.kind}/{event.involved_object.name}: {event.reason}: "
                      f"{event.message} (x{event.count})"
                      for event in self.core.list_namespaced_event(self.namespace).items
                      if event.involved_object.kind == "PodGroup"]
            lines.append(f"pods: {', '.join(sorted(pod.metadata.name for pod in self.pods())) or 'none'}")
        except Exception as error:  # noqa: BLE001 - said beside a failure, never a second one
            return f"(the namespace's scheduling state could not be read: {error})"
        return "The namespace's scheduling state:\n  " + "\n  ".join(lines)

    def wait_phase(self, name: str, phases: set[str], timeout: float = 60) -> dict:
        return self.wait_for(
            f"Job {name} to reach {phases}",
            lambda: (job := self.job(name)) and (job.get("status") or {}).get("state", {}).get("phase") in phases
            and job,
            timeout,
        )

    def serve_crd_version(self, crd: str, served: bool) -> None:
        """Serve (or stop serving) a CRD's version, as an upgrade of its operator may for a while: the
        apiserver then answers 404 for every object of it. Returns once the apiserver does as asked."""
        client.ApiextensionsV1Api(self.api).patch_custom_resource_definition(
            crd, [{"op": "replace", "path": "/spec/versions/0/served", "value": served}])
        group, plural = crd.split(".", 1)[1], crd.split(".", 1)[0]

        def answers() -> bool:
            try:
                self.custom.list_namespaced_custom_object(group, "v1alpha1", self.namespace, plural, limit=1)
            except ApiException as error:
                if error.status != 404:
                    raise
                return not served
            return served

        self.wait_for(f"{crd} to be {'served' if served else 'unserved'}", answers, timeout=30)

    def write_log(self, pod: str, lines: list[str | bytes], container: str = "master") -> Path:
        """Give a pod a log: kwok serves it through the apiserver's real pods/log path."""
        path = self.log_dir / f"{pod}.log"
        self.append_log(path, lines)
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {"name": pod, "namespace": self.namespace},
            "spec": {"logs": [{"containers": [container], "logsFile": str(path), "follow": True}]},
        }
        self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", self.namespace, "logs", body)
        return path

    @staticmethod
    def append_log(path: Path, lines: list[str | bytes]) -> None:
        """Append lines in the CRI log format kubelet writes (and kwok reads); bytes as they are."""
        with path.open("ab") as out:
            for line in lines:
                stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                out.write(f"{stamp} stdout F ".encode() + (line if isinstance(line, bytes) else line.encode()) + b"\n")
                time.sleep(0.001)  # distinct timestamps, as a real process would mostly have


def grant_queue_reader(admin: client.ApiClient, namespace: str) -> str:
    """deploy/queue-reader.yaml for the namespace's ServiceAccount, as a user applies it: the ClusterRole
    (server-side applied: every test applies the same one) and a ClusterRoleBinding of its own, whose
    name is returned."""
    role, binding = yaml.safe_load_all(QUEUE_READER.read_text())
    rbac = client.RbacAuthorizationV1Api(admin)
    rbac.patch_cluster_role(role["metadata"]["name"], role, field_manager="airflow-volcano-tests", force=True,
                            _content_type="application/apply-patch+yaml")
    binding["metadata"]["name"] = f"{binding['metadata']['name']}-{namespace}"
    binding["subjects"][0]["namespace"] = namespace
    rbac.create_cluster_role_binding(binding)
    return binding["metadata"]["name"]


def revoke_queue_reader(admin: client.ApiClient, namespace: str) -> None:
    try:
        client.RbacAuthorizationV1Api(admin).delete_cluster_role_binding(f"airflow-volcano-queue-reader-{namespace}")
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def cluster(admin: client.ApiClient, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A namespace of its own under the session's admission policies, with deploy/rbac.yaml's Role and
    deploy/queue-reader.yaml's ClusterRole bound to its ServiceAccount (both deleted after the test).
    A test on the real node may mount the node's directories (hostPath: the node is this machine), as a
    platform team would allow it."""
    namespace = f"t-{secrets.token_hex(4)}"
    core = client.CoreV1Api(admin)
    # What the namespace allows the Jobs' pods (deploy/admission-policy.yaml), as a platform team would set it:
    # hostPath on the real node (it is this machine), and what a test's `namespace_allows` mark names.
    marked = request.node.get_closest_marker("namespace_allows")
    allowed = sorted({*(["hostPath"] if "real_node" in request.fixturenames else []), *(marked.args if marked else ())})
    # The test's id on its namespace: benchmarks/suite_cpu.py charges the namespace's pods to it.
    create_test_namespace(core, namespace, {"airflow-volcano.io/test": request.node.nodeid,
                                            **({ALLOWED_PRIVILEGES: ",".join(allowed)} if allowed else {})})
    utils.create_from_yaml(admin, str(REPO / "deploy" / "rbac.yaml"), namespace=namespace)
    grant_queue_reader(admin, namespace)
    log_dir = tmp_path / "pod-logs"
    log_dir.mkdir()
    yield Cluster(admin, namespace, log_dir)
    revoke_queue_reader(admin, namespace)
    core.delete_namespace(namespace)


@pytest.fixture
def operator_kubeconfig(cluster: Cluster, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig for the least-privilege ServiceAccount, set as Airflow's kubernetes_default."""
    admin_config = yaml.safe_load(kubeconfig.read_text())
    server = admin_config["clusters"][0]["cluster"]
    token = service_account_token(cluster.core, cluster.namespace)
    path = tmp_path / "operator-kubeconfig.json"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa", "namespace": cluster.namespace}}],
    }))
    conn = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(path), "namespace": cluster.namespace}}
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps(conn))
    return path


# ---------------------------------------------------------------------------------------------
# Running tasks through Airflow itself (dag.test: real task runner, XCom, task log)
# ---------------------------------------------------------------------------------------------


@dataclass
class TaskRun:
    state: str
    log: str
    xcom: dict[str, Any]


@pytest.fixture
def trigger_log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What VolcanoJobTrigger writes into the task log (its info lines), filled as it writes them."""
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    lines: list[str] = []

    class TaskLog:
        def info(self, message: str, *args: object, **fields: object) -> None:
            lines.append(message % args)

        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: None

    monkeypatch.setattr(VolcanoJobTrigger, "log", TaskLog())
    return lines


@pytest.fixture(scope="session")
def airflow_db() -> None:
    from airflow.utils.db import initdb

    initdb()


@pytest.fixture
def run_task(airflow_db: None, capfd: pytest.CaptureFixture, tmp_path: Path) -> Callable[..., TaskRun]:
    """Run one operator as a one-task DAG with dag.test(); return its state, log and XComs. The DAG
    reads files (scripts, templates) from the test's tmp_path and the example DAGs' folder."""

    def run(make_task: Callable[[], Any], dag_id: str | None = None) -> TaskRun:
        from airflow.models.xcom import XComModel
        from airflow.sdk import DAG
        from airflow.utils.session import create_session

        from .dag_runner import run_dag

        with DAG(dag_id or f"test_{uuid.uuid4().hex[:8]}", schedule=None,
                 start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
                 template_searchpath=[str(tmp_path), str(REPO / "dags")]) as dag:
            task = make_task()
        capfd.readouterr()
        run = run_dag(dag)
        out, err = capfd.readouterr()
        print(out, err)  # keep it visible in pytest's report of a failing test
        ti = run.get_task_instance(task.task_id)
        with create_session() as session:
            rows = session.query(XComModel).filter_by(dag_id=dag.dag_id, run_id=run.run_id, task_id=task.task_id)
            xcom = {row.key: XComModel.deserialize_value(row) for row in rows}
        return TaskRun(state=str(ti.state), log=out + err, xcom=xcom)

    return run


def b64decode(value: str) -> str:
    return base64.b64decode(value).decode()
