"""Airflow inside the local cluster, as its official Helm chart deploys it (`scripts/airflow-in-cluster`).

    scripts/airflow-in-cluster up [--namespace airflow] [--jobs-namespace ml] [--dags DIR]
    scripts/airflow-in-cluster down [--namespace airflow]
    scripts/airflow-in-cluster status [--namespace airflow]

In Airflow's namespace, on the real node, with the images scripts/volcano_images.py builds (Airflow 3.3.2
from its release-day constraints with this provider's wheel installed as a user adds a provider; PostgreSQL
from Debian): PostgreSQL, the migration Job, then the scheduler (KubernetesExecutor: each task in a worker
pod of its own), the DAG processor, the triggerer and the API server, each a Deployment with the chart's
ServiceAccount (`<release>-scheduler`, `-worker`, `-triggerer`, `-api-server`, `-dag-processor`). Every
pod's ServiceAccount token is projected with a 600-second life, which the apiserver does not extend: the
kubelet rotates it, and a client that keeps an old one is refused. The `kubernetes_default` connection is
in-cluster; the training Jobs run in the Jobs' namespace, allowed there by deploy/rbac.yaml's Role and
deploy/rbac-helm-chart.yaml's bindings (edited to name this release's namespace, as a chart user does).

What stands in for the chart's own parts: the DAGs folder and the logs are directories of this machine
mounted into every pod (the chart's git-sync and logs volume), and the users are the simple auth
manager's (`admin`, its password in the Secret `<release>-simple-auth`). Standard library and kubectl
only, like scripts/volcano-cluster.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import volcano_cluster
import volcano_images

REPO = Path(__file__).resolve().parent.parent
RELEASE = "airflow"
AIRFLOW_UID = 50000
API_PORT = 8080
TOKEN_SECONDS = 600  # the shortest a projected token may live
COMPONENTS = ("scheduler", "dag-processor", "triggerer", "api-server")
LOCAL_SETTINGS = REPO / "cluster" / "airflow" / "airflow_local_settings.py"


def log(message: str) -> None:
    print(f"[airflow-in-cluster {time.strftime('%H:%M:%S')}] {message}", flush=True)


def kubectl(*args: str, stdin: str | None = None) -> str:
    return volcano_cluster.kubectl(*args, stdin=stdin)


def apply(*objects: dict, namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def host_dir(namespace: str, name: str) -> Path:
    """A directory of this machine mounted into the pods (the DAGs, the logs)."""
    return volcano_cluster.STATE / "airflow" / namespace / name


def api_url(namespace: str) -> str:
    """The API server as its Service's ClusterIP (this machine reaches ClusterIPs through kube-proxy)."""
    address = kubectl("get", "service", f"{RELEASE}-api-server", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}")
    return f"http://{address}:{API_PORT}"


def admin_password(namespace: str) -> str:
    encoded = kubectl("get", "secret", f"{RELEASE}-simple-auth", "-n", namespace, "-o",
                      "jsonpath={.data.passwords\\.json}")
    return json.loads(base64.b64decode(encoded))["admin"]


# --- what every pod shares ---------------------------------------------------------------------

def secret_env(name: str, secret: str, key: str) -> dict:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def airflow_env(namespace: str, jobs_namespace: str) -> list[dict]:
    api = f"http://{RELEASE}-api-server.{namespace}.svc.cluster.local:{API_PORT}"
    repository, tag = volcano_images.AIRFLOW.reference.rsplit(":", 1)
    plain = {
        "AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": "/opt/airflow/dags",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        # Hours of training hold no worker pod: the retraining example's `train` defers.
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": "/opt/airflow/auth/passwords.json",
        "AIRFLOW__API__BASE_URL": api,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": "/opt/airflow/logs",
        "AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE": namespace,
        "AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE": "/opt/airflow/pod_templates/pod_template_file.yaml",
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_REPOSITORY": repository,
        "AIRFLOW__KUBERNETES_EXECUTOR__WORKER_CONTAINER_TAG": tag,
        # The chart's `kubernetes` connection for in-cluster credentials: the pod's own ServiceAccount.
        "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(
            {"conn_type": "kubernetes", "extra": {"in_cluster": True, "namespace": jobs_namespace}}),
        # What LOCAL_SETTINGS' cluster policy puts on the Volcano tasks: the local real node.
        "AIRFLOW_VOLCANO_LOCAL_PLACEMENT": json.dumps(volcano_cluster.real_node_placement()),
    }
    return [{"name": key, "value": value} for key, value in plain.items()] + [
        secret_env("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"{RELEASE}-metadata", "connection"),
        secret_env("AIRFLOW__CORE__FERNET_KEY", f"{RELEASE}-fernet-key", "fernet-key"),
        secret_env("AIRFLOW__API__SECRET_KEY", f"{RELEASE}-api-secret-key", "api-secret-key"),
        secret_env("AIRFLOW__API_AUTH__JWT_SECRET", f"{RELEASE}-jwt-secret", "jwt-secret"),
    ]


def real_node_placement() -> dict:
    placement = volcano_cluster.real_node_placement()
    return {"nodeSelector": placement["node_selector"], "tolerations": placement["tolerations"]}


def token_volume() -> dict:
    """The ServiceAccount token, CA and namespace where a pod's in-cluster configuration reads them, the
    token living TOKEN_SECONDS (the kubelet renews it at 80 % of its life)."""
    return {"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
    ]}}


def pod_spec(namespace: str, jobs_namespace: str, service_account: str, args: list[str], **container: object) -> dict:
    """A pod of Airflow's (a component, the migration, a task's worker), as the chart makes them."""
    mounts = [
        {"name": "dags", "mountPath": "/opt/airflow/dags", "readOnly": True},
        {"name": "logs", "mountPath": "/opt/airflow/logs"},
        {"name": "config", "mountPath": "/opt/airflow/pod_templates/pod_template_file.yaml",
         "subPath": "pod_template_file.yaml", "readOnly": True},
        {"name": "config", "mountPath": "/opt/airflow/config/airflow_local_settings.py",
         "subPath": "airflow_local_settings.py", "readOnly": True},
        {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True},
    ]
    return {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,  # token_volume's instead: short-lived
        "securityContext": {"runAsUser": AIRFLOW_UID, "runAsGroup": 0, "fsGroup": 0},
        **real_node_placement(),
        "containers": [{"name": "base", "image": volcano_images.AIRFLOW.reference, "imagePullPolicy": "IfNotPresent",
                        "args": args, "env": airflow_env(namespace, jobs_namespace), "volumeMounts": mounts,
                        **container}],
        "volumes": [
            {"name": "dags", "hostPath": {"path": str(host_dir(namespace, "dags")), "type": "Directory"}},
            {"name": "logs", "hostPath": {"path": str(host_dir(namespace, "logs")), "type": "Directory"}},
            {"name": "config", "configMap": {"name": f"{RELEASE}-config"}},
            token_volume(),
        ],
    }


# --- the objects -------------------------------------------------------------------------------

def secret(name: str, **data: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}


def service_account(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name},
            "automountServiceAccountToken": False}


def service(name: str, app: str, port: int) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": app}, "ports": [{"port": port, "targetPort": port}]}}


def deployment(name: str, pod: dict, **pod_metadata: object) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "Recreate"},
                     "template": {"metadata": {"labels": {"app": name}, **pod_metadata}, "spec": pod}}}


def made_once_secrets(namespace: str) -> list[dict]:
    """The Secrets, with random values: made at the first `up`, kept by the later ones."""
    password = secrets.token_urlsafe(24)
    database = f"{RELEASE}-postgresql.{namespace}.svc.cluster.local"
    return [
        secret(f"{RELEASE}-postgresql", password=password),
        secret(f"{RELEASE}-metadata", connection=f"postgresql+psycopg2://airflow:{password}@{database}:5432/airflow"),
        secret(f"{RELEASE}-fernet-key", **{"fernet-key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()}),
        secret(f"{RELEASE}-api-secret-key", **{"api-secret-key": secrets.token_urlsafe(32)}),
        secret(f"{RELEASE}-jwt-secret", **{"jwt-secret": secrets.token_urlsafe(32)}),
        secret(f"{RELEASE}-simple-auth", **{"passwords.json": json.dumps({"admin": secrets.token_urlsafe(16)})}),
    ]


def base_objects(namespace: str, jobs_namespace: str) -> list[dict]:
    """The ServiceAccounts, the executor's pod template and cluster policy, and the scheduler's right to
    launch and watch worker pods (the chart's pod-launcher Role)."""
    worker = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "placeholder-name"},
              "spec": {**pod_spec(namespace, jobs_namespace, f"{RELEASE}-worker", []), "restartPolicy": "Never"}}
    return [
        *(service_account(f"{RELEASE}-{name}") for name in (*COMPONENTS, "worker", "migrate-database-job")),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{RELEASE}-config"},
         "data": {"pod_template_file.yaml": json.dumps(worker, indent=2),
                  "airflow_local_settings.py": LOCAL_SETTINGS.read_text()}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": f"{RELEASE}-pod-launcher-role"},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["create", "list", "get", "patch", "watch", "delete"]},
                   {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{RELEASE}-pod-launcher-rolebinding"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{RELEASE}-pod-launcher-role"},
         "subjects": [{"kind": "ServiceAccount", "name": f"{RELEASE}-scheduler", "namespace": namespace}]},
    ]


def postgres() -> list[dict]:
    pod = {
        **real_node_placement(),
        "automountServiceAccountToken": False,
        "containers": [{
            "name": "postgresql", "image": volcano_images.POSTGRES.reference, "imagePullPolicy": "IfNotPresent",
            "env": [secret_env("POSTGRES_PASSWORD", f"{RELEASE}-postgresql", "password"),
                    {"name": "POSTGRES_USER", "value": "airflow"}, {"name": "POSTGRES_DB", "value": "airflow"}],
            "ports": [{"containerPort": 5432}],
            "readinessProbe": {"exec": {"command": ["pg_isready", "-h", "127.0.0.1", "-U", "airflow"]},
                               "periodSeconds": 2},
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
        }],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    return [deployment(f"{RELEASE}-postgresql", pod), service(f"{RELEASE}-postgresql", f"{RELEASE}-postgresql", 5432)]


def migration_job(namespace: str, jobs_namespace: str) -> dict:
    pod = {**pod_spec(namespace, jobs_namespace, f"{RELEASE}-migrate-database-job", ["airflow", "db", "migrate"]),
           "restartPolicy": "Never"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{RELEASE}-run-airflow-migrations"},
            "spec": {"backoffLimit": 2, "template": {"metadata": {"labels": {"app": f"{RELEASE}-migrations"}},
                                                     "spec": pod}}}


def with_users(pod: dict) -> None:
    """The simple auth manager's passwords file, from its Secret: a copy the manager may open for
    appending (it does, even when every user has a password)."""
    (container,) = pod["containers"]
    container["volumeMounts"].append({"name": "users", "mountPath": "/opt/airflow/auth"})
    pod["initContainers"] = [{
        "name": "users", "image": container["image"], "imagePullPolicy": "IfNotPresent",
        "args": ["cp", "/opt/airflow/auth-secret/passwords.json", "/opt/airflow/auth/passwords.json"],
        "volumeMounts": [{"name": "users", "mountPath": "/opt/airflow/auth"},
                         {"name": "users-secret", "mountPath": "/opt/airflow/auth-secret", "readOnly": True}]}]
    pod["volumes"] += [{"name": "users", "emptyDir": {}},
                       {"name": "users-secret", "secret": {"secretName": f"{RELEASE}-simple-auth"}}]


def components(namespace: str, jobs_namespace: str) -> list[dict]:
    health = {"httpGet": {"path": "/api/v2/monitor/health", "port": API_PORT}, "periodSeconds": 3,
              "failureThreshold": 100}
    commands = {
        "scheduler": (["airflow", "scheduler"], {}),
        "dag-processor": (["airflow", "dag-processor"], {}),
        "triggerer": (["airflow", "triggerer"], {}),
        "api-server": (["airflow", "api-server", "--port", str(API_PORT)],
                       {"ports": [{"containerPort": API_PORT}], "readinessProbe": health}),
    }
    objects = []
    for name, (args, extra) in commands.items():
        pod = pod_spec(namespace, jobs_namespace, f"{RELEASE}-{name}", args, **extra)
        if name == "api-server":
            with_users(pod)
        # The image's build in the pod template: an `up` after the image changed (its tag does not) rolls them.
        objects.append(deployment(f"{RELEASE}-{name}", pod, annotations={
            "airflow-volcano.io/image-build": volcano_images.AIRFLOW.archive(volcano_cluster.IMAGE_CACHE).stem}))
    objects.append(service(f"{RELEASE}-api-server", f"{RELEASE}-api-server", API_PORT))
    return objects


def ensure_namespace(name: str) -> None:
    if not kubectl("get", "namespace", name, "--ignore-not-found", "-o", "name").strip():
        kubectl("create", "namespace", name)


def jobs_namespace_access(namespace: str, jobs_namespace: str) -> None:
    """deploy/rbac.yaml's Role in the Jobs' namespace and deploy/rbac-helm-chart.yaml's bindings, edited
    to name this release's namespace (what the README asks of a chart user)."""
    ensure_namespace(jobs_namespace)
    kubectl("apply", "-n", jobs_namespace, "-f", str(REPO / "deploy" / "rbac.yaml"))
    chart = (REPO / "deploy" / "rbac-helm-chart.yaml").read_text()
    kubectl("apply", "-n", jobs_namespace, "-f", "-",
            stdin=chart.replace("namespace: airflow", f"namespace: {namespace}"))


# --- up / down ---------------------------------------------------------------------------------

def wait(what: str, check: Callable[[], bool], timeout: float, namespace: str, app: str) -> None:
    """Until `check`; a pod of `app` that failed twice ends the wait at once, with its log's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except volcano_cluster.ClusterError:
            pass
        if trouble := failing_pod(namespace, app):
            raise volcano_cluster.ClusterError(f"{what}: {trouble}")
        time.sleep(1)
    raise volcano_cluster.ClusterError(f"timed out after {timeout:.0f}s waiting for {what}\n{status(namespace)}")


def failing_pod(namespace: str, app: str) -> str | None:
    """A pod of `app` whose container failed twice (restarted, or two failed pods of a Job), with the end
    of its log; None when none has."""
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", f"app={app}", "-o", "json"))["items"]
    failed = [pod for pod in pods if pod["status"].get("phase") == "Failed"]
    restarted = [pod for pod in pods if any(container.get("restartCount", 0) >= 2
                                            for container in pod["status"].get("containerStatuses", []))]
    if len(failed) < 2 and not restarted:
        return None
    pod = (restarted or failed)[-1]["metadata"]["name"]
    previous = ["--previous"] if restarted else []
    result = subprocess.run(["kubectl", f"--kubeconfig={volcano_cluster.admin_kubeconfig()}", "logs", "-n",
                             namespace, pod, "--tail=25", *previous], capture_output=True, text=True)
    return f"pod {pod} failed; the end of its log:\n{result.stdout or result.stderr}"


def job_complete(namespace: str) -> bool:
    out = kubectl("get", "job", f"{RELEASE}-run-airflow-migrations", "-n", namespace, "-o",
                  'jsonpath={.status.conditions[?(@.type=="Complete")].status}')
    return out == "True"


def available(namespace: str, name: str) -> bool:
    out = kubectl("get", "deployment", name, "-n", namespace, "-o", "jsonpath={.status.availableReplicas}")
    return out == "1"


def up(namespace: str, jobs_namespace: str, dags: Path | None) -> str:
    """Deploy (or update) Airflow in `namespace`; returns the API server's URL."""
    if not volcano_cluster.healthy():
        raise volcano_cluster.ClusterError("the local cluster is not up with its real node: `make cluster-up` first")
    started = time.monotonic()
    volcano_cluster.import_images(volcano_images.AIRFLOW_IMAGES)
    for name in ("dags", "logs"):
        directory = host_dir(namespace, name)
        directory.mkdir(parents=True, exist_ok=True)
        os.chown(directory, AIRFLOW_UID, 0)
        directory.chmod(0o775)
    if dags:
        shutil.copytree(dags, host_dir(namespace, "dags"), dirs_exist_ok=True)
    ensure_namespace(namespace)
    if not kubectl("get", "secret", f"{RELEASE}-metadata", "-n", namespace, "--ignore-not-found", "-o", "name").strip():
        # Created, not applied: `kubectl apply` would keep each value in plain text in an annotation.
        kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": made_once_secrets(namespace)}))
    apply(*base_objects(namespace, jobs_namespace), namespace=namespace)
    jobs_namespace_access(namespace, jobs_namespace)
    apply(*postgres(), namespace=namespace)
    wait("PostgreSQL", lambda: available(namespace, f"{RELEASE}-postgresql"), 180, namespace, f"{RELEASE}-postgresql")
    # As the chart's migration hook: each `up` runs it anew (a Job's pod template cannot be changed).
    kubectl("delete", "job", f"{RELEASE}-run-airflow-migrations", "-n", namespace, "--ignore-not-found", "--wait=true")
    apply(migration_job(namespace, jobs_namespace), namespace=namespace)
    wait("the migration Job", lambda: job_complete(namespace), 600, namespace, f"{RELEASE}-migrations")
    apply(*components(namespace, jobs_namespace), namespace=namespace)
    for name in COMPONENTS:
        wait(f"{RELEASE}-{name}", lambda name=name: available(namespace, f"{RELEASE}-{name}"), 600, namespace,
             f"{RELEASE}-{name}")
    url = api_url(namespace)
    log(f"Airflow up in namespace {namespace} in {time.monotonic() - started:.0f}s: {url} "
        f"(user admin, password: Secret {RELEASE}-simple-auth); Jobs in namespace {jobs_namespace}")
    return url


def down(namespace: str) -> None:
    kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", "--timeout=120s")
    shutil.rmtree(host_dir(namespace, ""), ignore_errors=True)


def status(namespace: str) -> str:
    return kubectl("get", "deployments,jobs,pods", "-n", namespace, "-o", "wide")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="airflow-in-cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--namespace", default="airflow", help="Airflow's own namespace (default: airflow)")
    parser.add_argument("--jobs-namespace", default="ml", help="where the training Jobs run (default: ml)")
    parser.add_argument("--dags", type=Path, help="a folder of DAG files to copy into the DAGs folder")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            print(up(args.namespace, args.jobs_namespace, args.dags))
        elif args.command == "down":
            down(args.namespace)
        else:
            print(status(args.namespace), end="")
    except volcano_cluster.ClusterError as error:
        print(f"airflow-in-cluster: {error}", file=sys.stderr)
        return 1
    return 0
