"""Powers no wider than the Job: what the provider's identity may do to pods, Volcano Jobs and ConfigMaps
it did not make, to its own, and what the pods of the Jobs it creates may do, against the real apiserver
under deploy/rbac.yaml's Role and deploy/admission-policy.yaml (applied by conftest's session fixture).

The Role grants delete and patch on every pod of the namespace; the policies let the identity touch only
objects labelled app.kubernetes.io/managed-by=airflow-volcano, change nothing of its own pods but the
dump-stacks annotation and nothing of its own Jobs but its checked and try-number labels and orphaned-at
annotation, and create only Jobs whose pods run as a service account the namespace allows, without
hostPath volumes, privileged containers, added capabilities or host namespaces unless the namespace
allows them. Each test acts as the ServiceAccount airflow-volcano (a token, the connection
`operator_kubeconfig` sets): the provider's own requests through its hook, and requests it never makes
through a plain client. The pods are plain pods bound to a kwok node: real objects in the apiserver at once.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEPLOYMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ORPHANED_AT_ANNOTATION,
    PREEMPTIONS_ANNOTATION,
    REQUEST_HASH_ANNOTATION,
    RETRIES_ANNOTATION,
    TRY_NUMBER_LABEL,
)
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.volcano import VolcanoHook
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
from airflow_volcano.waiting.stalls import STACKS_REQUEST_ANNOTATION
from airflow_volcano.waiting.wait_engine import PodRef
from airflow_volcano.waiting.wait_steps import restart_gang

from .conftest import ALLOWED_PRIVILEGES, VOLCANO
from .jobs import SIM, pytorch_job

OURS = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, "app": "trainer"}
THEIRS = {"app": "someone-elses"}
# (The tests apply each policy under its name and a version suffix: conftest.apply_admission_policy.)
POLICY = "ValidatingAdmissionPolicy 'airflow-volcano-own-objects"
JOB_PODS_POLICY = "ValidatingAdmissionPolicy 'airflow-volcano-job-pods"
SERVICE_ACCOUNT = "system:serviceaccount:{namespace}:airflow-volcano"
ALLOWED_SERVICE_ACCOUNTS = "airflow-volcano.io/allowed-service-accounts"


def make_pod(cluster, name: str, labels: dict[str, str]) -> client.V1Pod:
    """A pod bound to a simulated node that runs until deleted (kwok finishes a graceful delete)."""
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": {SIM + "outcome": "run-forever"}},
        "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "main", "image": "pytorch/pytorch:2.7.1"}]},
    }
    return cluster.core.create_namespaced_pod(cluster.namespace, body)


def pod_or_none(cluster, name: str) -> client.V1Pod | None:
    try:
        return cluster.core.read_namespaced_pod(name, cluster.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def refused(cluster, error: VolcanoApiError | ApiException, *phrases: str, policy: str = POLICY) -> None:
    """A 403 from the policy (not from RBAC) naming the identity and saying what and why."""
    message = error.message if isinstance(error, VolcanoApiError) else error.body
    assert error.status == 403, message
    assert policy in message and SERVICE_ACCOUNT.format(namespace=cluster.namespace) in message, message
    for phrase in phrases:
        assert phrase in message, message


@pytest.fixture
def operator(operator_kubeconfig) -> client.CoreV1Api:
    """A plain client as the ServiceAccount: for requests the provider itself never makes."""
    return client.CoreV1Api(config.new_client_from_config(str(operator_kubeconfig)))


def test_someone_elses_pod_is_neither_deleted_nor_annotated(cluster, operator_kubeconfig):
    theirs = make_pod(cluster, "theirs", THEIRS)
    name, namespace, uid = theirs.metadata.name, cluster.namespace, theirs.metadata.uid
    hook = VolcanoHook()
    not_ours = f"Pod {namespace}/theirs is not labelled so"

    with pytest.raises(VolcanoApiError) as lost_node:  # node_lost_timeout's delete: grace 0, its uid
        hook.drive(calls.delete_pod(name, namespace, uid, grace_seconds=0))
    refused(cluster, lost_node.value, "may delete only its own pods", not_ours)
    # stall_action="restart": the graceful delete is refused, and the reason is what the stall reports.
    reason = hook.drive(restart_gang(namespace, [PodRef(name, uid)]))
    assert reason is not None and not_ours in reason, reason
    assert "lacks this permission" not in reason, "RBAC allowed it: no permission is missing"
    with pytest.raises(VolcanoApiError) as stacks:  # stall_timeout's request for the stacks
        hook.run(calls.annotate_pod(name, namespace, {STACKS_REQUEST_ANNOTATION: "1"}))
    refused(cluster, stacks.value, "may change only its own pods", not_ours)

    after = pod_or_none(cluster, name)
    assert after is not None and after.metadata.uid == uid and after.metadata.deletion_timestamp is None
    assert STACKS_REQUEST_ANNOTATION not in after.metadata.annotations


def test_on_its_own_pod_only_the_dump_stacks_annotation_may_change(cluster, operator_kubeconfig, operator):
    ours = make_pod(cluster, "ours", OURS)
    name, namespace = ours.metadata.name, cluster.namespace

    assert VolcanoHook().run(calls.annotate_pod(name, namespace, {STACKS_REQUEST_ANNOTATION: "request-1"}))
    assert cluster.core.read_namespaced_pod(name, namespace).metadata.annotations[STACKS_REQUEST_ANNOTATION] \
        == "request-1"

    others = "annotations other than airflow-volcano.io/dump-stacks"
    for patch, changed in [
        ({"metadata": {"labels": {"extra": "1"}}}, "labels"),
        ({"metadata": {"labels": {MANAGED_BY_LABEL: None}}}, "labels"),  # disowning it
        ({"metadata": {"annotations": {"note": "1"}}}, others),
        ({"metadata": {"annotations": {SIM + "outcome": None}}}, others),
        ({"metadata": {"annotations": {STACKS_REQUEST_ANNOTATION: "request-2", "note": "1"}}}, others),
        ({"metadata": {"finalizers": ["example.com/keep"]}}, "finalizers"),
        ({"spec": {"activeDeadlineSeconds": 60}}, "spec"),
    ]:
        with pytest.raises(ApiException) as error:
            operator.patch_namespaced_pod(name, namespace, patch)
        refused(cluster, error.value, "may change only the annotation airflow-volcano.io/dump-stacks of its own pods",
                f"this update of Pod {namespace}/ours changes its {changed}")

    after = cluster.core.read_namespaced_pod(name, namespace).metadata
    assert after.labels == OURS and after.finalizers is None
    assert after.annotations == {SIM + "outcome": "run-forever", STACKS_REQUEST_ANNOTATION: "request-1"}


def test_its_own_pods_are_deleted_by_uid_and_a_stale_uid_deletes_nothing(cluster, operator_kubeconfig, operator):
    lost, stalled = make_pod(cluster, "lost", OURS), make_pod(cluster, "stalled", OURS)
    namespace, hook = cluster.namespace, VolcanoHook()
    stale = str(uuid.uuid4())  # a pod of that name that was replaced since it was seen

    with pytest.raises(ApiException) as conflict:
        operator.delete_namespaced_pod("lost", namespace, body=client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=stale), grace_period_seconds=0))
    assert conflict.value.status == 409, conflict.value.body
    assert hook.drive(calls.delete_pod("lost", namespace, stale, grace_seconds=0)) is False
    still = pod_or_none(cluster, "lost")
    assert still is not None and still.metadata.uid == lost.metadata.uid and still.metadata.deletion_timestamp is None

    # node_lost_timeout: grace 0, gone at once.
    assert hook.drive(calls.delete_pod("lost", namespace, lost.metadata.uid, grace_seconds=0)) is True
    assert pod_or_none(cluster, "lost") is None
    # stall_action="restart": a graceful delete (kwok, the simulated kubelet, then finishes it).
    assert hook.drive(restart_gang(namespace, [PodRef("stalled", stalled.metadata.uid)])) is None
    cluster.wait_for("the stalled pod to be deleted", lambda: pod_or_none(cluster, "stalled") is None, timeout=30)


def test_someone_elses_volcano_job_is_neither_labelled_nor_deleted_its_own_is(cluster, operator_kubeconfig):
    theirs = pytorch_job("theirs", master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    theirs["metadata"]["labels"] = THEIRS
    ours = pytorch_job("ours", master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    ours["metadata"]["labels"] = OURS
    cluster.create_job(theirs)
    cluster.create_job(ours)
    namespace, hook = cluster.namespace, VolcanoHook()
    not_ours = f"Volcano Job {namespace}/theirs is not labelled so"

    with pytest.raises(VolcanoApiError) as label:
        hook.label_job("theirs", namespace, {CHECKED_LABEL: "true"})
    refused(cluster, label.value, "may change only its own", not_ours)
    with pytest.raises(VolcanoApiError) as delete:
        hook.delete_job("theirs", namespace)
    refused(cluster, delete.value, "may delete only its own", not_ours)
    job = cluster.job("theirs")
    assert job is not None and job["metadata"]["labels"] == THEIRS and "deletionTimestamp" not in job["metadata"]

    assert hook.label_job("ours", namespace, {CHECKED_LABEL: "true"}) is True
    assert cluster.job("ours")["metadata"]["labels"][CHECKED_LABEL] == "true"
    assert hook.delete_job("ours", namespace) is True
    cluster.wait_for("the provider's Job to be deleted", lambda: cluster.job("ours") is None, timeout=30)


def test_someone_elses_configmap_is_neither_replaced_nor_deleted_its_own_is(cluster, operator_kubeconfig):
    namespace, hook = cluster.namespace, VolcanoHook()
    for name, labels in (("theirs-script", THEIRS), ("ours-script", OURS)):
        cluster.core.create_namespaced_config_map(namespace, {"metadata": {"name": name, "labels": labels},
                                                              "data": {"train.py": "print('v1')"}})
    not_ours = f"ConfigMap {namespace}/theirs-script is not labelled so"
    script = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs-script", "labels": OURS},
              "data": {"train.py": "print('v2')"}}

    # Even a replace_if that wrongly took it for the provider's: the replace is refused.
    with pytest.raises(VolcanoApiError) as replace:
        hook.create_configmap(namespace, script, replace_if=lambda found: True)
    refused(cluster, replace.value, "may change only its own", not_ours)
    with pytest.raises(VolcanoApiError) as delete:
        hook.run(calls.delete_configmap("theirs-script", namespace))
    refused(cluster, delete.value, "may delete only its own", not_ours)
    after = cluster.core.read_namespaced_config_map("theirs-script", namespace)
    assert after.data == {"train.py": "print('v1')"} and after.metadata.labels == THEIRS
    assert after.metadata.owner_references is None

    script["metadata"]["name"] = "ours-script"
    replaced = hook.create_configmap(namespace, script, replace_if=lambda found: True)
    assert replaced["data"] == {"train.py": "print('v2')"}
    assert hook.run(calls.delete_configmap("ours-script", namespace)) is True
    assert "ours-script" not in cluster.configmap_names()


# -- what the pods of the Jobs it creates may do --------------------------------------------------------


def one_pod_job(name: str, container: dict[str, Any] | None = None, **pod: Any) -> dict[str, Any]:
    """A Job of one task `main` whose pod spec has `pod`'s fields and its container `container`'s."""
    main = {"name": "main", "image": "pytorch/pytorch:2.7.1", "command": ["true"], **(container or {})}
    spec = {"restartPolicy": "Never", **pod, "containers": [main]}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name, "labels": OURS},
            "spec": {"schedulerName": "volcano", "minAvailable": 1,
                     "tasks": [{"name": "main", "replicas": 1, "template": {"spec": spec}}]}}


def jobs_client(operator_kubeconfig) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(operator_kubeconfig)))


def annotate_namespace(cluster, annotations: dict[str, str | None]) -> None:
    cluster.core.patch_namespace(cluster.namespace, {"metadata": {"annotations": annotations}})


ROOT = {"name": "node", "hostPath": {"path": "/"}}
# Each way past the namespace's defaults, and what the refusal says of it.
WIDER = {
    "another-account": ({"serviceAccountName": "builder"}, "task main runs as service account builder"),
    "deprecated-field": ({"serviceAccount": "builder"}, "task main runs as service account builder"),
    "both-fields": ({"serviceAccountName": "default", "serviceAccount": "builder"},
                    "task main runs as service account default, builder"),
    "host-path": ({"volumes": [ROOT], "container": {"volumeMounts": [{"name": "node", "mountPath": "/host"}]}},
                  "task main has hostPath volumes node (/)"),
    "privileged-init": ({"initContainers": [{"name": "setup", "image": "busybox",
                                             "securityContext": {"privileged": True}}]},
                        "task main has privileged containers setup"),
    "sys-admin": ({"container": {"securityContext": {"capabilities": {"add": ["CHOWN", "SYS_ADMIN"]}}}},
                  "task main has containers adding capabilities: main (SYS_ADMIN)"),
    "host-network": ({"hostNetwork": True}, "task main uses hostNetwork"),
    "host-pid": ({"hostPID": True}, "task main uses hostPID"),
    "host-ipc": ({"hostIPC": True}, "task main uses hostIPC"),
}


def wider_job(case: str) -> dict[str, Any]:
    pod = dict(WIDER[case][0])
    return one_pod_job(case, pod.pop("container", None), **pod)


def test_a_job_whose_pods_would_do_more_than_the_namespace_allows_is_refused(cluster, operator_kubeconfig, kubeconfig):
    jobs, namespace = jobs_client(operator_kubeconfig), cluster.namespace
    creating = f"may not create Volcano Job {namespace}/"
    for case, (_pod, says) in WIDER.items():
        with pytest.raises(ApiException) as error:
            jobs.create_namespaced_custom_object(*VOLCANO, namespace, "jobs", wider_job(case))
        refused(cluster, error.value, creating + case + ": " + says, policy=JOB_PODS_POLICY)
        allows = (f"namespace {namespace} allows default (its annotation {ALLOWED_SERVICE_ACCOUNTS}"
                  if "service account" in says else f"its annotation {ALLOWED_PRIVILEGES}")
        assert allows in error.value.body, error.value.body
    # What the provider's hook reports (a task's log): the policy's words, no missing permission.
    with pytest.raises(VolcanoApiError) as through_hook:
        VolcanoHook().drive(calls.create_job(namespace, wider_job("host-path")))
    refused(cluster, through_hook.value, creating + "host-path: task main has hostPath volumes node (/)",
            policy=JOB_PODS_POLICY)
    assert "lacks this permission" not in str(through_hook.value), through_hook.value
    # As a platform team checks it: kubectl impersonating the ServiceAccount.
    for case in ("host-path", "another-account"):
        out = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "-n", namespace, "create", "-f", "-",
                              f"--as={SERVICE_ACCOUNT.format(namespace=namespace)}"],
                             input=json.dumps(wider_job(case)), capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and JOB_PODS_POLICY in out.stderr, out.stdout + out.stderr
        assert creating + case + ": " + WIDER[case][1] in out.stderr, out.stderr
    assert cluster.jobs() == []


def test_a_task_asking_for_a_hostpath_fails_with_the_policys_words_in_its_log(cluster, operator_kubeconfig, run_task):
    run = run_task(lambda: VolcanoPyTorchJobOperator(
        task_id="train", name="mounts-node", namespace=cluster.namespace, image="pytorch/pytorch:2.7.1",
        command=["python", "-c", "pass"], worker_replicas=1, deferrable=False, volumes=[ROOT],
        volume_mounts=[{"name": "node", "mountPath": "/host"}]))
    assert run.state == "failed", run.log
    assert (f"{SERVICE_ACCOUNT.format(namespace=cluster.namespace)} may not create Volcano Job "
            f"{cluster.namespace}/mounts-node: task master has hostPath volumes node (/); task worker has hostPath "
            f"volumes node (/); namespace {cluster.namespace} allows hostPath volumes only with hostPath in its "
            f"annotation {ALLOWED_PRIVILEGES}") in run.log, run.log
    assert cluster.jobs() == []


def test_the_namespace_allows_what_its_annotations_name_and_only_the_providers_identity_is_checked(
        cluster, operator_kubeconfig):
    jobs, namespace = jobs_client(operator_kubeconfig), cluster.namespace
    trainer = one_pod_job("trainer", {"volumeMounts": [{"name": "node", "mountPath": "/host"}]},
                          serviceAccountName="trainer", hostNetwork=True, volumes=[ROOT])

    def answer(body: dict[str, Any]) -> str:
        """"admitted", or the policy's refusal (a server-side dry run: nothing is created)."""
        try:
            jobs.create_namespaced_custom_object(*VOLCANO, namespace, "jobs", body, dry_run="All")
        except ApiException as error:
            assert error.status == 403 and JOB_PODS_POLICY in error.body, error.body
            return error.body
        return "admitted"

    # Anyone else (here the harness's admin) is not checked: the policy is about this identity's Jobs.
    cluster.custom.create_namespaced_custom_object(*VOLCANO, namespace, "jobs", trainer, dry_run="All")
    assert "task main runs as service account trainer" in answer(trainer)

    annotate_namespace(cluster, {ALLOWED_SERVICE_ACCOUNTS: "default, trainer",
                                 ALLOWED_PRIVILEGES: "hostPath,hostNetwork"})
    # The apiserver reads the namespace from its cache: a moment after the change.
    cluster.wait_for("the namespace's allow-lists to apply", lambda: answer(trainer) == "admitted", timeout=30)
    assert answer(one_pod_job("plain")) == "admitted"  # default, still listed
    builder = answer(one_pod_job("builder", serviceAccountName="builder"))
    assert (f"task main runs as service account builder; namespace {namespace} allows default, trainer "
            f"(its annotation {ALLOWED_SERVICE_ACCOUNTS}") in builder, builder
    # What is not listed stays refused.
    for case in ("privileged-init", "sys-admin", "host-pid", "host-ipc"):
        assert WIDER[case][1] in answer(wider_job(case)), case

    annotate_namespace(cluster, {ALLOWED_SERVICE_ACCOUNTS: "trainer", ALLOWED_PRIVILEGES: None})
    cluster.wait_for("the namespace's new allow-lists to apply",
                     lambda: "task main has hostPath volumes node (/)" in answer(trainer), timeout=30)
    # A list without default: a pod that names no account runs as default, and is refused.
    assert "task main runs as service account default;" in answer(one_pod_job("plain"))


def providers_own_jobs(namespace: str, tmp_path) -> dict[str, dict[str, Any]]:
    """Jobs as the operators build them, with everything they put in a pod spec."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    common = dict(task_id="train", namespace=namespace, image="pytorch/pytorch:2.7.1",
                  allowed_file_dirs=[str(tmp_path)], training_script=str(script), worker_replicas=1)
    logs = dict(volumes=[{"name": "logs", "persistentVolumeClaim": {"claimName": "logs"}}],
                volume_mounts=[{"name": "logs", "mountPath": "/logs"}])
    operators = {
        # the shm emptyDir, the script ConfigMap, pytorch's wait-for-master init container (Volcano's
        # plugin adds it to the pods), TensorBoard's task, the podinfo downward API (stall_timeout)
        "python": VolcanoPyTorchJobOperator(wait_for_master=True, tensorboard={"logdir": "/logs/tb"},
                                            checkpoint_dir="/logs/ckpt", stall_timeout=600, **logs, **common),
        "torchrun": VolcanoPyTorchJobOperator(launcher="torchrun", nproc_per_node=2, **common),
        "debug": VolcanoPyTorchJobOperator(debug=True, service_account_name="default", **common),
        # the ssh plugin (Volcano's controller adds its Secret volume to the pods, not to the Job)
        "deepspeed": VolcanoDeepSpeedJobOperator(stall_timeout=600, **common),
        "mpirun": VolcanoDeepSpeedJobOperator(launcher="mpirun", debug=True, **common),
    }
    return {kind: operator.build_manifests().job for kind, operator in operators.items()}


def test_the_providers_own_jobs_are_admitted(cluster, operator_kubeconfig, tmp_path):
    jobs = jobs_client(operator_kubeconfig)
    for kind, job in providers_own_jobs(cluster.namespace, tmp_path).items():
        pods = [task["template"]["spec"] for task in job["spec"]["tasks"]]
        volumes = {next(iter(set(volume) - {"name"})) for pod in pods for volume in pod.get("volumes", [])}
        assert volumes <= {"configMap", "emptyDir", "downwardAPI", "persistentVolumeClaim"}, (kind, volumes)
        try:
            jobs.create_namespaced_custom_object(*VOLCANO, cluster.namespace, "jobs", job, dry_run="All")
        except ApiException as error:
            raise AssertionError(f"the provider's own {kind} Job was refused: {error.body}") from None


def test_every_pod_of_the_providers_own_jobs_passes_pod_security_baseline(cluster, operator_kubeconfig, kubeconfig,
                                                                          tmp_path):
    """Pod Security admission (`pod-security.kubernetes.io/enforce=baseline` on the namespace) judges the pods
    Volcano's controller creates, with what its plugins add (ssh's Secret volume, svc's hosts, the pytorch
    plugin's init container): what the docs advise beside the policy. Asked as a platform team would,
    before labelling: the server-side dry run of the label lists the existing pods that would violate it."""
    jobs = jobs_client(operator_kubeconfig)
    built = providers_own_jobs(cluster.namespace, tmp_path)
    for job in built.values():
        jobs.create_namespaced_custom_object(*VOLCANO, cluster.namespace, "jobs", job)
    expected = sum(task.get("replicas", 1) for job in built.values() for task in job["spec"]["tasks"])
    cluster.wait_for(f"the Jobs' {expected} pods", lambda: len(cluster.pods()) >= expected, timeout=120)

    def label(level: str) -> str:
        out = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "label", "namespace", cluster.namespace,
                              f"pod-security.kubernetes.io/enforce={level}", "--dry-run=server"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stderr

    assert "violate" not in label("baseline"), label("baseline")
    # The check sees these pods: under `restricted` (non-root, no privilege escalation, seccomp) they would not pass.
    assert "violate the new PodSecurity enforce level" in label("restricted"), label("restricted")


# -- what it may change of its own Jobs -------------------------------------------------------------------


def test_on_its_own_volcano_job_only_its_labels_the_orphan_mark_and_the_preemptions_may_change(
        cluster, operator_kubeconfig):
    namespace, hook, jobs = cluster.namespace, VolcanoHook(), jobs_client(operator_kubeconfig)
    body = pytorch_job("ours", master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    body["metadata"]["labels"] = {**OURS, TRY_NUMBER_LABEL: "1"}
    body["metadata"]["annotations"] = {REQUEST_HASH_ANNOTATION: "built-from"}
    created = hook.drive(calls.create_job(namespace, body))  # as the provider submits it

    # The provider's own writes: a reattaching try takes it over (a Job of an earlier release, with no
    # deployment label: labelled its deployment's), the orphan sweep marks it and a new run of its task
    # instance unmarks it, the reporting try labels it checked.
    adopted = hook.drive(calls.adopt_job(created, 2, deployment="prod"))
    assert adopted is not None and adopted["metadata"]["labels"][TRY_NUMBER_LABEL] == "2"
    assert adopted["metadata"]["labels"][DEPLOYMENT_LABEL] == "prod"
    assert hook.annotate_job("ours", namespace, {ORPHANED_AT_ANNOTATION: "1795000000"}) is True
    assert cluster.job("ours")["metadata"]["annotations"][ORPHANED_AT_ANNOTATION] == "1795000000"
    assert hook.annotate_job("ours", namespace, {ORPHANED_AT_ANNOTATION: None}) is True
    assert hook.label_job("ours", namespace, {CHECKED_LABEL: "true"}) is True
    # A waiter keeps the preemptions it counted on that Job, by its uid: never on another of its name.
    kept = {PREEMPTIONS_ANNOTATION: '[{"at": 1795000000.0, "action": "gangpreempt", "pods": []}]'}
    assert hook.run(calls.annotate_job("ours", namespace, kept, uid=created["metadata"]["uid"])) is True
    assert cluster.job("ours")["metadata"]["annotations"][PREEMPTIONS_ANNOTATION] == kept[PREEMPTIONS_ANNOTATION]
    with pytest.raises(VolcanoApiError) as another:
        hook.run(calls.annotate_job("ours", namespace, {PREEMPTIONS_ANNOTATION: "[]"}, uid=str(uuid.uuid4())))
    assert another.value.status in (409, 422), another.value
    assert cluster.job("ours")["metadata"]["annotations"][PREEMPTIONS_ANNOTATION] == kept[PREEMPTIONS_ANNOTATION]
    assert hook.run(calls.annotate_job("ours", namespace, {PREEMPTIONS_ANNOTATION: None},
                                       uid=created["metadata"]["uid"])) is True

    # And the restarts it counted against max_retry, likewise.
    assert hook.run(calls.annotate_job("ours", namespace, {RETRIES_ANNOTATION: "2"},
                                       uid=created["metadata"]["uid"])) is True
    assert cluster.job("ours")["metadata"]["annotations"][RETRIES_ANNOTATION] == "2"
    assert hook.run(calls.annotate_job("ours", namespace, {RETRIES_ANNOTATION: None},
                                       uid=created["metadata"]["uid"])) is True

    own_keys = ("may change only the labels airflow-volcano.io/checked and airflow-volcano.io/try-number and the "
                "annotations airflow-volcano.io/orphaned-at, airflow-volcano.io/preemptions and "
                "airflow-volcano.io/retries of its own Volcano Jobs, and add the label "
                f"airflow-volcano.io/deployment to one without it: this update of Volcano Job {namespace}/ours "
                "changes its ")
    other_labels = "labels other than airflow-volcano.io/checked and airflow-volcano.io/try-number"
    other_annotations = ("annotations other than airflow-volcano.io/orphaned-at and airflow-volcano.io/preemptions and "
                         "airflow-volcano.io/retries")
    # Through the hook's own calls, with keys it never writes.
    with pytest.raises(VolcanoApiError) as relabel:
        hook.label_job("ours", namespace, {"airflow-volcano.io/task-id": "another-task"})
    refused(cluster, relabel.value, own_keys + other_labels)
    with pytest.raises(VolcanoApiError) as reannotate:
        hook.annotate_job("ours", namespace, {REQUEST_HASH_ANNOTATION: "forged"})
    refused(cluster, reannotate.value, own_keys + other_annotations)
    template = body["spec"]["tasks"][0]["template"]
    for patch, changed in [
        ({"metadata": {"labels": {"extra": "1"}}}, other_labels),
        ({"metadata": {"labels": {MANAGED_BY_LABEL: None}}}, other_labels),  # disowning it
        ({"metadata": {"labels": {DEPLOYMENT_LABEL: "staging"}}}, other_labels),  # another deployment's now
        ({"metadata": {"labels": {DEPLOYMENT_LABEL: None}}}, other_labels),  # anyone's to take
        ({"metadata": {"annotations": {"note": "1"}}}, other_annotations),
        ({"metadata": {"annotations": {REQUEST_HASH_ANNOTATION: None, ORPHANED_AT_ANNOTATION: "1"}}},
         other_annotations),
        ({"metadata": {"finalizers": ["example.com/keep"]}}, "finalizers"),
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x",
                                            "uid": str(uuid.uuid4())}]}}, "owner references"),
        ({"spec": {"maxRetry": 9}}, "spec"),
        # what the create check refuses cannot come in by a patch either
        ({"spec": {"tasks": [{**body["spec"]["tasks"][0], "template": {**template, "spec": {
            **template["spec"], "volumes": [ROOT]}}}]}}, "spec"),
    ]:
        with pytest.raises(ApiException) as error:
            jobs.patch_namespaced_custom_object(*VOLCANO, namespace, "jobs", "ours", patch)
        refused(cluster, error.value, own_keys + changed)

    after = cluster.job("ours")
    assert after["metadata"]["labels"] == {**OURS, TRY_NUMBER_LABEL: "2", CHECKED_LABEL: "true",
                                           DEPLOYMENT_LABEL: "prod"}
    assert after["metadata"]["annotations"] == {REQUEST_HASH_ANNOTATION: "built-from"}
    assert "finalizers" not in after["metadata"] and "ownerReferences" not in after["metadata"]
    assert after["spec"] == created["spec"]
