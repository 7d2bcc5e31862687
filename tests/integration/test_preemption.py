"""Preemption (issue 45): a training preempted by a higher-priority Job is told so, by whom, and waits
to run again. Real: the apiserver, Volcano's scheduler with a preempting configuration
(cluster/scheduler/volcano-scheduler.conf: `gangpreempt` from v1.15, `preempt` before), its controller
restarting the gang.

On simulated pods (kwok; marked preempting_scheduler, which scripts/test-suite runs on the second,
simulated-only cluster, whose scheduler preempts): a node of the test's own, tainted so that nothing else
lands there and the preemptor can take the room only from the training. On the real node (real
containers, the kubelet's SIGTERM, a checkpoint and a resume): an extended resource of the test's own that
only its two Jobs ask; the first cluster's scheduler preempts only for that test, which runs alone
(marked disruptive).

Each test has its own queue (Volcano's preempt and gangpreempt take victims only in the preemptor's queue)
and PriorityClasses; they are negative, the training's lowest, as a further guard."""

from __future__ import annotations

import datetime
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from airflow_volcano.constants import PREEMPTIONS_ANNOTATION
from airflow_volcano.waiting.preemption import recorded

from .conftest import REPO
from .jobs import SIM, pytorch_job
from .real_node import real_operator
from .test_long_training import RESUMABLE, checkpoints, latest
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


def create_tainted_node(cluster, name: str, **extra: str) -> None:
    """A simulated node (kwok) of the test's own, tainted so that only pods tolerating TAINT land there."""
    resources = {"cpu": "4", "memory": "16Gi", "pods": "20", **extra}
    cluster.core.create_node({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                     "labels": {"kubernetes.io/hostname": name, "type": "kwok"}},
        "spec": {"taints": [{"key": TAINT, "value": "yes", "effect": "NoSchedule"}]},
        "status": {"allocatable": resources, "capacity": resources}})


@pytest.fixture
def room(cluster, objects) -> Iterator[Room]:  # noqa: F811 - the fixture imported above
    found = Room(node=f"room-{cluster.namespace}", queue=objects.queue("preempt", {"cpu": "100"}),
                 low=objects.priority_class("low", -20), high=objects.priority_class("high", -10))
    create_tainted_node(cluster, found.node)
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
        run = run_task(lambda: training(room, cluster.namespace, name, deferrable=deferrable, max_retry=1,
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
    # Volcano counts the preemption's restart like any other, but in the room the Job has beside max_retry
    # (max_retry=1 allows no restart: without that room this preemption would have failed it).
    assert low["status"].get("retryCount") == 1 and low["spec"]["maxRetry"] == 1 + 10 + 1, low
    assert "the retry budget is exhausted" not in run.log
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


@pytest.mark.preempting_scheduler
def test_preemptions_do_not_spend_max_retry_and_the_one_beyond_max_preemptions_fails_the_task(
        cluster, operator_kubeconfig, run_task, room):
    """Three higher-priority Jobs in a row preempt the training, each running for 60 s: it waits and runs
    again each time, although max_retry=1 allows no restart at all. A fourth preemption is one more than
    max_preemptions=3: the task fails naming the bound, and the Job is deleted. Goodput's preempted share is
    what the test saw from outside (the Job out of Running from each eviction until it ran again, and after
    the last until the task ended it), within 2 points.

    Goodput adds up the Job's phase times, which are whole seconds (cut, not rounded): each of its four
    spans may be up to a second longer or shorter than what the test saw; in all, goodput's were 1.1 to
    2.7 s longer (7 runs, 2026-12-07). With 20 s preemptors the run took about 110 s, so 2 points were
    2.2 s and a CI run missed them by 0.2 s; with 60 s ones (about 240 s) 2 points are about 5 s, more
    than the four spans can be off together."""
    name = "low"
    out_of_running: list[tuple[float, float | None]] = []  # (left Running, ran again), as this test saw them
    errors: list[BaseException] = []

    def phase_and_restarts() -> tuple[str, int]:
        job = cluster.job(name) or {}
        status = job.get("status") or {}
        return (status.get("state") or {}).get("phase") or "", int(status.get("retryCount") or 0)

    def until(condition, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition(phase_and_restarts()):
                return time.time()
            time.sleep(0.2)
        raise TimeoutError(f"Job {name}: {phase_and_restarts()} after {timeout:.0f}s")

    def preempt_four_times() -> None:
        try:
            for count in range(1, 5):
                until(lambda seen, count=count: seen == ("Running", count - 1), 300)
                time.sleep(10)  # it runs a while
                cluster.create_job(preemptor(room, f"high-{count}", "60s"))
                left = until(lambda seen: seen[0] != "Running", 120)
                out_of_running.append((left, None))
                if count < 4:
                    out_of_running[-1] = (left, until(lambda seen, count=count: seen == ("Running", count), 300))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)

    thread = threading.Thread(target=preempt_four_times, daemon=True)
    thread.start()
    try:
        run = run_task(lambda: training(room, cluster.namespace, name, max_retry=1, max_preemptions=3,
                                        annotations={SIM + "run-for": "3600s"}, job_timeout=1800))
    finally:
        thread.join(timeout=60)
    assert not errors, f"{errors}\n\nThe task log:\n{run.log}"
    assert run.state == "failed", run.log
    said = [line for line in run.log.splitlines() if "was preempted at" in line]
    assert [re.search(r"Preemptions so far: (\d) of max_preemptions 3", line).group(1) for line in said] == \
        ["1", "2", "3", "4"][:len(said)] and len(said) >= 3, run.log
    failure = f"Volcano Job {cluster.namespace}/{name} was preempted 4 times, more than max_preemptions (3); the last"
    assert failure in run.log and f" by {cluster.namespace}/high-4 " in run.log.split(failure, 1)[1], run.log
    assert "the retry budget is exhausted" not in run.log, "no preemption spent max_retry"
    assert cluster.wait_for(f"Job {name} to be deleted", lambda: cluster.job(name) is None, timeout=60)
    # Goodput: the preempted share against the time the test saw the Job out of Running.
    ended = re.search(r"^(\S+) \[info +\] Where the time went \(Volcano Job \S+, (\S+) from submit", run.log, re.M)
    share = re.search(r"  preempted +\S+ +(\d+\.\d)% \(4 preemption\(s\)\)", run.log)
    assert ended is not None and share is not None, run.log
    end = datetime.datetime.fromisoformat(ended.group(1)).timestamp()
    wall = wall_seconds(ended.group(2))
    injected = sum((back if back is not None else end) - left for left, back in out_of_running)
    assert abs(float(share.group(1)) - 100 * injected / wall) <= 2, (share.group(1), injected, wall, out_of_running)


def wall_seconds(text: str) -> float:
    """goodput's `45s` / `4m05s` / `2h03m`, in seconds."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    assert match is not None and text, text
    hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return 3600 * hours + 60 * minutes + seconds


@dataclass
class RealRoom:
    """Room on the real node for one gang: a resource of the test's own that the node advertises 2 of and
    each pod of either gang asks 1 of, so the preemptor fits only where the training runs. No other test's
    pod asks it, and the queue and PriorityClasses are the test's own, so only its two Jobs are concerned.

    A simulated node of the test's own, tainted, has 2 more, which neither Job may use (both are bound to the
    real node): the cluster's idle room that Volcano's enqueue asks for. Its `overcommit` plugin admits a
    Job only while the cluster's idle resources (x 1.2) cover it, and only an admitted Job preempts; in a
    cluster whose every slot is taken a preemptor would wait unadmitted (docs/failures.md)."""

    node: str
    slot: str
    queue: str
    low: str
    high: str

    def resources(self) -> dict:
        # An extended resource's request must equal its limit.
        return {"requests": {"cpu": "100m", "memory": "256Mi", self.slot: "1"},
                "limits": {"memory": "2Gi", self.slot: "1"}}


def first_cluster_scheduler(configuration: str) -> None:
    subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "scheduler", configuration], check=True,
                   capture_output=True, timeout=120)


@pytest.fixture
def preempting_scheduler_for_this_test(cluster) -> Iterator[None]:
    """The first cluster's scheduler with a preempting action, for this test only, as a platform team turns
    it on: the scheduler restarted with it (the built-in configuration again afterwards). With it on
    there, tests beside each other saw gangs wait minutes for their pods; the tests using it run alone."""
    first_cluster_scheduler("preempting")
    try:
        yield
    finally:
        first_cluster_scheduler("built-in")


@pytest.fixture
def real_room(cluster, objects, real_node) -> Iterator[RealRoom]:  # noqa: F811 - the fixture imported above
    label = ",".join(f"{key}={value}" for key, value in real_node["node_selector"].items())
    (node,) = cluster.core.list_node(label_selector=label).items
    slot = f"airflow-volcano.io/slot-{cluster.namespace}"
    # As a platform team advertises an extended resource (a node's status, which the kubelet keeps).
    cluster.core.patch_node_status(node.metadata.name, {"status": {"capacity": {slot: "2"},
                                                                   "allocatable": {slot: "2"}}})
    elsewhere = f"elsewhere-{cluster.namespace}"
    create_tainted_node(cluster, elsewhere, **{slot: "2"})
    try:
        yield RealRoom(node=node.metadata.name, slot=slot,
                       queue=objects.queue("preempt", {"cpu": "100", "memory": "100Gi", slot: "4"}),
                       low=objects.priority_class("low", -20), high=objects.priority_class("high", -10))
    finally:
        cluster.core.delete_node(elsewhere)
        escaped = slot.replace("~", "~0").replace("/", "~1")
        cluster.core.patch_node_status(node.metadata.name, [
            {"op": "remove", "path": f"/status/capacity/{escaped}"},
            {"op": "remove", "path": f"/status/allocatable/{escaped}"}])


def real_preemptor(room: RealRoom, real_node: dict, name: str, seconds: int) -> dict:
    """Another team's higher-priority Job on the real node, submitted from outside Airflow: two pods that
    sleep `seconds`."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
        "spec": {"schedulerName": "volcano", "minAvailable": 2, "queue": room.queue,
                 "priorityClassName": room.high, "tasks": [{
                     "name": "main", "replicas": 2,
                     "template": {"spec": {
                         "restartPolicy": "Never", "nodeSelector": real_node["node_selector"],
                         "tolerations": real_node["tolerations"], "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "main", "image": real_node["image"],
                                         "imagePullPolicy": real_node["image_pull_policy"],
                                         "command": ["sleep", str(seconds)], "resources": room.resources()}]}}}]}}


@pytest.mark.disruptive
@pytest.mark.usefixtures("preempting_scheduler_for_this_test")
@pytest.mark.parametrize("deferrable", [False, True], ids=["sync", "deferred"])
def test_on_the_real_node_a_preempted_training_resumes_from_its_checkpoint_without_spending_max_retry(
        cluster, operator_kubeconfig, run_task, real_node, real_room, tmp_path, deferrable):
    """Real containers: a training (checkpointing every epoch) runs; after its second checkpoint a
    higher-priority Job of the same queue comes, and Volcano's scheduler evicts the training's gang for it
    (the kubelet stops its containers). The preemptor runs and ends; the training is placed again, resumes
    from its last checkpoint (the one it had when the preemptor came, or a later one) and succeeds, with
    max_retry=1, which allows no restart. The task log names the preemptor."""
    shared, volume = checkpoints(tmp_path)
    name, other = "low", "high"
    preempted_after: list[int] = []

    def preempt() -> None:
        cluster.wait_for("a second checkpoint", lambda: latest(shared).get("epoch", 0) >= 2, timeout=240)
        preempted_after.append(latest(shared)["epoch"])
        cluster.create_job(real_preemptor(real_room, real_node, other, 10))

    thread = threading.Thread(target=preempt, daemon=True)
    thread.start()
    try:
        run = run_task(lambda: real_operator(
            real_node, cluster.namespace, name, training_script=RESUMABLE, worker_replicas=1, deferrable=deferrable,
            container_resources=real_room.resources(), priority_class_name=real_room.low,
            volcano_queue=real_room.queue, max_retry=1, on_finish_action="keep_job", startup_timeout=240,
            env={"EPOCHS": "8", "EPOCH_SECONDS": "3"}, **volume))
    finally:
        thread.join(timeout=300)

    assert preempted_after, f"the training never checkpointed twice\n\nThe task log:\n{run.log}"
    assert run.state == "success", run.log
    said = [line for line in run.log.splitlines() if "was preempted at" in line]
    assert len(said) == 1, run.log
    assert f" by {cluster.namespace}/{other} (PriorityClass {real_room.high}, priority -10" in said[0], said[0]
    assert f" in queue `{real_room.queue}`: Volcano's scheduler " in said[0], said[0]
    assert "Preemptions so far: 1 of max_preemptions 10 (they do not spend max_retry)" in said[0], said[0]
    assert "the retry budget is exhausted" not in run.log
    result = run.xcom["return_value"]
    resumed = re.fullmatch(r"/checkpoints/test_\S+/epoch-(\d+)\.pt", result["resumed_from"] or "")
    assert resumed is not None and int(resumed.group(1)) >= preempted_after[0], (result, preempted_after)
    assert f"[{name}-master-0] [airflow-volcano] resumed from {result['resumed_from']}" in run.log, run.log
    assert latest(shared)["epoch"] == 8
    high = cluster.job(other)
    assert high is not None and high["status"]["state"]["phase"] == "Completed", "the preemptor ran and ended"
    low = cluster.job(name)
    assert low is not None and low["status"].get("retryCount") == 1, low
    (kept,) = recorded(low["metadata"]["annotations"].get(PREEMPTIONS_ANNOTATION))
    assert kept.preemptor == f"{cluster.namespace}/{other}"
    assert result["goodput"]["preemptions"] == 1 and result["goodput"]["restarting_seconds"] == 0, result["goodput"]
