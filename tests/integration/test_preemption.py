"""Preemption (issue 45): a training preempted by a higher-priority Job is told so, by whom, and waits
to run again. Real: the apiserver, Volcano's scheduler with the simulated-only cluster's configuration
(cluster/scheduler/volcano-scheduler.conf: `gangpreempt` from v1.15, `preempt` before; marked
preempting_scheduler, scripts/test-suite runs these on that cluster), its controller restarting the gang.
Simulated: the pods (kwok), on a node of the test's own, tainted so that nothing else lands there and the
preemptor can take the room only from the training.

Each test has its own queue (Volcano's preempt and gangpreempt take victims only in the preemptor's queue)
and PriorityClasses; they are negative, the training's lowest, as a further guard."""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from airflow_volcano.constants import PREEMPTIONS_ANNOTATION
from airflow_volcano.waiting.preemption import recorded

from .jobs import SIM, pytorch_job
from .test_operator import seed_operator
from .test_queues import objects  # noqa: F401 - a fixture

GANG_CPU = "2"  # each of the two pods of either gang; the node has room for one gang
TAINT = "airflow-volcano.io/preemption-test"


@dataclass
class Room:
    """A node for one gang, a queue and two PriorityClasses of the test's own: Volcano preempts only within
    a queue, so no other test's Job (nor another preemption test's) can preempt or be preempted here."""

    node: str
    queue: str
    low: str
    high: str

    def pods_here(self, spec: dict) -> dict:
        spec["nodeSelector"] = {"kubernetes.io/hostname": self.node}
        spec["tolerations"] = [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}]
        return spec


@pytest.fixture
def room(cluster, objects) -> Iterator[Room]:  # noqa: F811 - the fixture imported above
    found = Room(node=f"room-{cluster.namespace}", queue=objects.queue("preempt", {"cpu": "100"}),
                 low=objects.priority_class("low", -20), high=objects.priority_class("high", -10))
    resources = {"cpu": "4", "memory": "16Gi", "pods": "20"}
    cluster.core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": found.node, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": found.node, "type": "kwok"}},
        "spec": {"taints": [{"key": TAINT, "value": "yes", "effect": "NoSchedule"}]},
        "status": {"allocatable": resources, "capacity": resources}})
    try:
        yield found
    finally:
        cluster.core.delete_node(found.node)


def preemptor(room: Room, name: str, run_for: str) -> dict:
    """Another team's higher-priority Job, submitted from outside Airflow."""
    body = pytorch_job(name, master_sim={"run-for": run_for}, worker_sim={"run-for": run_for})
    body["spec"]["priorityClassName"], body["spec"]["queue"] = room.high, room.queue
    for task in body["spec"]["tasks"]:
        room.pods_here(task["template"]["spec"])
        task["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": GANG_CPU}}
    return body


def training(room: Room, namespace: str, name: str, **arguments):
    """The training, in the room: a gang of two pods, the lower priority."""
    return seed_operator(namespace, name, worker_replicas=1, priority_class_name=room.low, volcano_queue=room.queue,
                         container_resources={"cpu": GANG_CPU, "memory": "1Gi"},
                         node_selector={"kubernetes.io/hostname": room.node},
                         tolerations=[{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}], **arguments)


@pytest.mark.preempting_scheduler
@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_a_preempted_training_names_its_preemptor_and_runs_again_once_it_is_gone(
        cluster, operator_kubeconfig, run_task, room, deferrable):
    """The training runs on the room's node; a higher-priority Job of the same queue comes: Volcano evicts
    the training's gang and places the preemptor. The task log says when, by which Job and priority, in
    which queue; the training waits, runs again once the preemptor has ended, and succeeds. The preemption
    is kept on the Job, and goodput counts its restart as preempted time."""
    name, other = "low", "high"
    submitted: list[str] = []

    def preempt() -> None:
        cluster.wait_phase(name, {"Running"}, timeout=180)
        cluster.create_job(preemptor(room, other, "20s"))
        submitted.append(other)

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    try:
        run = run_task(lambda: training(room, cluster.namespace, name, deferrable=deferrable, max_retry=2,
                                        annotations={SIM + "run-for": "30s"}, on_finish_action="keep_job"))
    finally:
        thread.join(timeout=200)

    assert submitted == [other]
    assert run.state == "success", run.log
    said = [line for line in run.log.splitlines() if "was preempted at" in line]
    assert len(said) == 1, run.log
    assert (f"Volcano Job {cluster.namespace}/{name} was preempted at ") in said[0], said[0]
    assert f" by {cluster.namespace}/{other} (PriorityClass {room.high}, priority -10" in said[0], \
        f"{said[0]}\n\nThe task log:\n{run.log}"
    assert f" in queue `{room.queue}`: Volcano's scheduler (gangpreempt) evicted " in said[0], said[0]
    assert f"evicted {name}-master-0, {name}-worker-0." in said[0] and "Preemptions so far: 1" in said[0], said[0]
    high = cluster.job(other)
    assert high is not None and high["status"]["state"]["phase"] == "Completed", "the preemptor ran and ended"
    low = cluster.job(name)
    assert low is not None and low["status"]["state"]["phase"] == "Completed"
    # Volcano counts the preemption's restart in maxRetry like any other (max_retry=2: one restart).
    assert low["status"].get("retryCount") == 1, low["status"]
    (kept,) = recorded(low["metadata"]["annotations"].get(PREEMPTIONS_ANNOTATION))
    assert kept.preemptor == f"{cluster.namespace}/{other}", "kept on the Job for a waiter that takes over"
    # Goodput: from the preemption to running again is preempted time: from the eviction (the scheduler's
    # event, kept on the Job) to when the wait saw the gang run again (the task log; the controller's time is
    # within a second or two of it).
    spent = run.xcom["return_value"]["goodput"]
    again = re.search(rf"^(\S+) \[info +\] Volcano Job {cluster.namespace}/{name} is Running: .*\(1 restart",
                      run.log, re.M)
    assert again is not None, run.log
    preempted = datetime.datetime.fromisoformat(again.group(1)).timestamp() - kept.at
    assert preempted > 15 and abs(spent["preempted_seconds"] - preempted) <= 3, (spent, preempted)
    assert spent["restarting_seconds"] == 0 and spent["preemptions"] == 1, spent
    assert re.search(r"  preempted +\d+s +\d+\.\d% \(1 preemption\(s\)\)", run.log), run.log
