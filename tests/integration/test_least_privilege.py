"""Powers no wider than the Job: what the provider's identity may do to pods, Volcano Jobs and ConfigMaps
it did not make, against the real apiserver under deploy/rbac.yaml's Role and deploy/admission-policy.yaml
(applied by conftest's session fixture).

The Role grants delete and patch on every pod of the namespace; the policy lets the identity touch only
objects labelled app.kubernetes.io/managed-by=airflow-volcano, and change nothing of its own pods but the
dump-stacks annotation. Each test acts as the ServiceAccount airflow-volcano (a token, the connection
`operator_kubeconfig` sets): the provider's own requests through its hook, and requests it never makes
through a plain client. The pods are plain pods bound to a kwok node: real objects in the apiserver at once.
"""

from __future__ import annotations

import uuid

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from airflow_volcano.constants import CHECKED_LABEL, MANAGED_BY_LABEL, MANAGED_BY_VALUE
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.volcano import VolcanoHook
from airflow_volcano.stalls import STACKS_REQUEST_ANNOTATION
from airflow_volcano.wait_engine import PodRef
from airflow_volcano.wait_steps import restart_gang

from .jobs import SIM, pytorch_job

OURS = {MANAGED_BY_LABEL: MANAGED_BY_VALUE, "app": "trainer"}
THEIRS = {"app": "someone-elses"}
POLICY = "ValidatingAdmissionPolicy 'airflow-volcano-own-objects'"
SERVICE_ACCOUNT = "system:serviceaccount:{namespace}:airflow-volcano"


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


def refused(cluster, error: VolcanoApiError | ApiException, *phrases: str) -> None:
    """A 403 from the policy (not from RBAC) naming the identity and saying what and why."""
    message = error.message if isinstance(error, VolcanoApiError) else error.body
    assert error.status == 403, message
    assert POLICY in message and SERVICE_ACCOUNT.format(namespace=cluster.namespace) in message, message
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
