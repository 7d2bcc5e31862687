"""Pods held by a scheduling gate (Volcano v1.15's queue gate, or anyone's: Kubernetes schedules no pod
until each of its gates is removed): the task log says which gate holds which pod and whose it is,
and the Job runs once the gate is removed. Simulated pods, the real scheduler; both modes."""

from __future__ import annotations

import threading

import pytest

from .test_operator import SIM, seed_operator

GATE = "example.com/hold"


def gated_template() -> dict:
    """The master's pod held by a gate of somebody else's (as a capacity planner or an admission
    controller would add one)."""
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {},
            "spec": {"tasks": [{"name": "master", "replicas": 1, "template": {
                "spec": {"schedulingGates": [{"name": GATE}], "containers": [{"name": "master", "image": "img"}]}}},
                {"name": "worker", "replicas": 2, "template": {
                    "spec": {"containers": [{"name": "worker", "image": "img"}]}}}]}}


@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_pod_held_by_a_scheduling_gate_is_named_and_the_job_runs_once_it_is_removed(
        cluster, operator_kubeconfig, run_task, deferrable):
    name = "gated"
    cluster.write_log(f"{name}-master-0", ["trained"])
    removed = threading.Event()

    def remove_the_gate() -> None:
        pod = f"{name}-master-0"
        cluster.wait_for(f"{pod} to exist, held", lambda: _gates(cluster, pod) == [GATE], timeout=60)
        # Long enough for a pod check to see it held (poll_interval=1) in either mode.
        removed.wait(8)
        cluster.core.patch_namespaced_pod(pod, cluster.namespace, [{"op": "remove", "path": "/spec/schedulingGates"}])
        removed.set()

    remover = threading.Thread(target=remove_the_gate, daemon=True)
    remover.start()
    run = run_task(lambda: seed_operator(cluster.namespace, name, job_template=gated_template(), deferrable=deferrable,
                                         annotations={SIM + "run-for": "2s"}, on_finish_action="keep_job"))
    remover.join(timeout=5)
    assert removed.is_set(), "the gate was removed"
    assert run.state == "success", run.log
    said = (f"Volcano Job {cluster.namespace}/{name}: {name}-master-0 held by scheduling gate {GATE} (not Volcano's: "
            "removed by whoever added it); Kubernetes schedules a pod only once its gates are removed")
    assert run.log.count(said) == 1, run.log
    assert cluster.job(name)["status"]["state"]["phase"] == "Completed"


def _gates(cluster, pod: str) -> list[str] | None:
    from kubernetes.client.rest import ApiException

    try:
        found = cluster.core.read_namespaced_pod(pod, cluster.namespace)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return [gate.name for gate in found.spec.scheduling_gates or []]
