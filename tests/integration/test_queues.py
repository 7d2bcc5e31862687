"""Why a Job waits, on the real Volcano scheduler with kwok's simulated GPUs: its queue, its position in
the scheduler's order (checked against the order the Jobs then really start in), the resource that is
short with numbers; a queue that would never take the Job refused before submitting, a Job that can
never fit failed at once, a closed queue and a missing permission named. Both modes."""

from __future__ import annotations

import datetime
import os
import re
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from .conftest import revoke_queue_reader
from .jobs import pytorch_job
from .test_kill_and_reattach import WORKER_WAIT, start_worker, write_dag
from .test_operator import SIM, seed_operator

GPU = "nvidia.com/gpu"
QUEUES = ("scheduling.volcano.sh", "v1beta1", "queues")


class ClusterObjects:
    """The cluster-scoped objects one test makes (queues, PriorityClasses), named after its namespace
    and removed after it (a queue must be closed before Volcano lets it be deleted)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.queues: list[str] = []
        self.priority_classes: list[str] = []

    def queue(self, name: str, capability: dict[str, str]) -> str:
        name = f"{name}-{self.cluster.namespace}"
        self.cluster.custom.create_cluster_custom_object(*QUEUES, {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"capability": capability, "reclaimable": False}})
        self.queues.append(name)
        self.cluster.wait_for(f"queue {name} to be Open", lambda: self.state(name) == "Open")
        return name

    def state(self, name: str) -> str | None:
        queue = self.cluster.custom.get_cluster_custom_object(*QUEUES, name)
        return (queue.get("status") or {}).get("state")

    def command(self, name: str, action: str) -> None:
        """Open or close a queue as `vcctl queue operate` does: a Volcano Command aimed at it."""
        queue = self.cluster.custom.get_cluster_custom_object(*QUEUES, name)
        self.cluster.custom.create_namespaced_custom_object("bus.volcano.sh", "v1alpha1", self.cluster.namespace,
                                                            "commands", {
            "apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command",
            "metadata": {"generateName": f"{name}-{action.lower()}-"}, "action": action,
            "target": {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "name": name,
                       "uid": queue["metadata"]["uid"]}})

    def priority_class(self, name: str, value: int) -> str:
        name = f"{name}-{self.cluster.namespace}"
        client.SchedulingV1Api(self.cluster.api).create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value))
        self.priority_classes.append(name)
        return name

    def remove(self) -> None:
        for name in self.priority_classes:
            client.SchedulingV1Api(self.cluster.api).delete_priority_class(name)
        # A queue closes only once no Job of it is left: the test namespace's go first.
        for job in self.cluster.jobs():
            self.cluster.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", self.cluster.namespace,
                                                                "jobs", job["metadata"]["name"])
        for name in self.queues:
            try:
                if self.state(name) != "Closed":
                    self.command(name, "CloseQueue")
                    self.cluster.wait_for(f"queue {name} to close", lambda name=name: self.state(name) == "Closed")
                self.cluster.custom.delete_cluster_custom_object(*QUEUES, name)
            except (ApiException, AssertionError) as error:  # noqa: PERF203 - a leftover must not fail the test
                print(f"queue {name} left behind: {error}")


@pytest.fixture
def objects(cluster) -> Iterator[ClusterObjects]:
    made = ClusterObjects(cluster)
    yield made
    made.remove()


def filler(cluster, queue: str, name: str = "filler", gpus_per_pod: int = 1, priority_class: str | None = None) -> dict:
    """A Job of someone else's in `queue`, 2 pods of `gpus_per_pod` GPUs, running until the test ends it."""
    body = pytorch_job(name, master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    body["spec"]["queue"] = queue
    if priority_class:
        body["spec"]["priorityClassName"] = priority_class
    for task in body["spec"]["tasks"]:
        # Requests too: Volcano sums a gang's minResources from the template's requests, and a Job without
        # them counts as elastic (its whole allocation given back when Volcano admits the next Job).
        task["template"]["spec"]["containers"][0]["resources"] = {"requests": {GPU: str(gpus_per_pod)},
                                                                  "limits": {GPU: str(gpus_per_pod)}}
    cluster.create_job(body)
    return cluster.wait_phase(name, {"Running"})


def gpu_task(**overrides) -> dict:
    """A task asking 2 GPUs (2 pods of 1) whose simulated pods run 30 s: long enough for the Jobs waiting
    behind it to read their queue (every QUEUE_REFRESH_SECONDS) twice while it runs."""
    return {"worker_replicas": 1, "container_resources": {"gpu": 1, "cpu": "1", "memory": "1Gi"},
            "annotations": {SIM + "run-for": "30s"}, "startup_timeout": 600, "poll_interval": 1, **overrides}


def own_airflow_home(tmp_path: Path, name: str) -> dict[str, str]:
    """An Airflow home of its own for a worker process, with a copy of this test worker's metadata DB
    (already migrated): concurrent workers never share one SQLite file."""
    home = tmp_path / f"home-{name}"
    home.mkdir()
    # SQLite's own backup: what is still in the write-ahead log is copied too.
    with sqlite3.connect(Path(os.environ["AIRFLOW_HOME"]) / "airflow.db") as source, \
            sqlite3.connect(home / "airflow.db") as copy:
        source.backup(copy)
    return {"AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}"}


def once_waiting(cluster, name: str, action: Callable[[], object]) -> threading.Thread:
    """`action`, in the background, once the task has submitted Job `name` (which then waits in its queue)."""
    def act() -> None:
        cluster.wait_for(f"Job {name} to be submitted", lambda: cluster.job(name) is not None, timeout=WORKER_WAIT)
        action()

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def started_order(cluster, names: list[str]) -> list[str]:
    """The Jobs by when Volcano first made them Running (their conditions)."""
    def first_running(name: str) -> str:
        conditions = (cluster.job(name).get("status") or {}).get("conditions") or []
        return min(condition["lastTransitionTime"] for condition in conditions if condition["status"] == "Running")

    return sorted(names, key=first_running)


def positions(log: str, namespace: str, name: str, since: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """The positions a task log reported for its Job, in order, repeats merged; from `since` on, if given
    (the Jobs are submitted one by one: the first reports come before the others exist)."""
    found = [(int(position), int(of)) for position, of in re.findall(
        rf"Volcano Job {namespace}/{name} waits in queue `[^`]+` \(Open\): position (\d+) of (\d+)", log)]
    if since is not None:
        found = found[found.index(since):] if since in found else []
    return [item for index, item in enumerate(found) if index == 0 or found[index - 1] != item]


def test_waiting_jobs_are_told_their_queue_position_and_short_resource_as_the_scheduler_then_starts_them(
        cluster, operator_kubeconfig, airflow_db, objects, tmp_path):
    """A 2-GPU queue filled by a running Job; three tasks asking 2 GPUs each, with three priorities, wait
    in it (two in workers, one deferred): each task log names the queue, the task's position and the
    short resource; the Jobs start in that order as the Jobs ahead end, and the positions go down."""
    queue = objects.queue("gpus", {GPU: "2"})
    classes = {level: objects.priority_class(level, value) for level, value in (("low", 10), ("mid", 20),
                                                                                 ("high", 30))}
    # The filler above them all: the local cluster's scheduler preempts, and the test is of waiting.
    filler(cluster, queue, priority_class=objects.priority_class("filler", 40))
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    workers = {}
    for level, deferrable in (("low", False), ("mid", True), ("high", False)):
        dag_id = f"queued_{level}"
        dag_file = write_dag(tmp_path, dag_id, cluster.namespace, **gpu_task(
            name=f"q{level}", volcano_queue=queue, priority_class_name=classes[level], deferrable=deferrable,
            on_finish_action="keep_job"))
        log = tmp_path / f"{level}.log"
        workers[level] = (start_worker(dag_file, dag_id, logical_date, log,
                                       env=own_airflow_home(tmp_path, level)), log)
    try:
        for level, position in (("high", 1), ("mid", 2), ("low", 3)):
            log = workers[level][1]
            cluster.wait_for(f"the {level} task to report position {position} of 3", lambda log=log, level=level,
                             position=position: (position, 3) in positions(log.read_text(), cluster.namespace,
                                                                            f"q{level}"), timeout=WORKER_WAIT)
        cluster.finish_simulated_pods("filler")
        for level, (worker, log) in workers.items():
            assert worker.wait(timeout=WORKER_WAIT) == 0, f"the {level} task failed:\n{log.read_text()[-5000:]}"
    finally:
        for worker, _ in workers.values():
            if worker.poll() is None:
                worker.kill()
    assert started_order(cluster, ["qhigh", "qmid", "qlow"]) == ["qhigh", "qmid", "qlow"], (
        "Volcano started them in the order the task logs gave")
    logs = {level: log.read_text() for level, (_, log) in workers.items()}
    assert positions(logs["low"], cluster.namespace, "qlow", (3, 3)) == [(3, 3), (2, 2), (1, 1)], logs["low"]
    assert positions(logs["mid"], cluster.namespace, "qmid", (2, 3)) == [(2, 3), (1, 2)], logs["mid"]
    assert positions(logs["high"], cluster.namespace, "qhigh", (1, 3)) == [(1, 3)], logs["high"]
    assert (f"in the scheduler's order as far as it can be known (priority, then submission); ahead: "
            f"{cluster.namespace}/qhigh, {cluster.namespace}/qmid; needs 2 nvidia.com/gpu; queue `{queue}` has 2 of "
            "its 2 nvidia.com/gpu allocated; the Jobs ahead of it need 4 nvidia.com/gpu") in logs["low"], logs["low"]
    for log in logs.values():
        assert "Where the time went (Volcano Job" in log and re.search(r"  queued +\d", log), log


def test_a_queue_that_would_never_take_the_job_is_refused_before_submitting(cluster, operator_kubeconfig,
                                                                             run_task, objects):
    small = objects.queue("small", {GPU: "4"})
    closed = objects.queue("closed", {GPU: "4"})
    objects.command(closed, "CloseQueue")
    cluster.wait_for("the queue to close", lambda: objects.state(closed) == "Closed")
    refusals = {
        f"nope-{cluster.namespace}": "there is no Volcano queue of that name in this cluster",
        small: "the Job could never start there: it needs 8 nvidia.com/gpu and the queue's capability is 4 "
               "nvidia.com/gpu",
        closed: "the Volcano queue is Closed; it admits no new Job until it is Open again",
    }
    for queue, refusal in refusals.items():
        run = run_task(lambda queue=queue: seed_operator(cluster.namespace, "refused", **gpu_task(
            volcano_queue=queue, container_resources={"gpu": 4})))
        assert run.state == "failed", run.log
        assert f"volcano_queue {queue!r}: {refusal}" in run.log, run.log
        assert cluster.jobs() == [] and "refused-script" not in cluster.configmap_names(), "nothing submitted"


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_waiting_job_that_can_no_longer_fit_fails_at_once_naming_the_capability(
        cluster, operator_kubeconfig, run_task, objects, deferrable):
    """The queue's capability lowered below the Job's gang while it waits: it could never start."""
    queue = objects.queue("shrinks", {GPU: "2"})
    filler(cluster, queue)

    shrinker = once_waiting(cluster, "shrunk", lambda: cluster.custom.patch_cluster_custom_object(
        *QUEUES, queue, {"spec": {"capability": {GPU: "1"}}}))
    run = run_task(lambda: seed_operator(cluster.namespace, "shrunk", **gpu_task(volcano_queue=queue,
                                                                                  deferrable=deferrable)))
    shrinker.join(timeout=5)
    assert run.state == "failed", run.log
    assert (f"Volcano Job {cluster.namespace}/shrunk can never start: it needs 2 nvidia.com/gpu; queue `{queue}` can "
            "never give it: its capability is 1 nvidia.com/gpu; the Job was deleted") in run.log, run.log
    assert "did not start within startup_timeout" not in run.log, "at once, not after startup_timeout"
    cluster.wait_for("the Job to be deleted", lambda: cluster.job("shrunk") is None)


def test_a_closed_queue_and_a_missing_permission_are_named_while_the_job_waits(
        cluster, operator_kubeconfig, run_task, objects, admin):
    queue = objects.queue("closing", {GPU: "2"})
    filler(cluster, queue)

    closer = once_waiting(cluster, "closing", lambda: objects.command(queue, "CloseQueue"))
    run = run_task(lambda: seed_operator(cluster.namespace, "closing", **gpu_task(volcano_queue=queue,
                                                                                   startup_timeout=20)))
    closer.join(timeout=5)
    assert run.state == "failed" and "did not start within startup_timeout (20s)" in run.log, run.log
    # Closing while a Job of its own still runs (the filler), then Closed: either way, named.
    assert re.search(rf"Volcano Job {cluster.namespace}/closing waits in queue `{queue}` \(Clos(ing|ed): Volcano "
                     r"admits no Job from it until it is Open again\)", run.log), run.log

    revoke_queue_reader(admin, cluster.namespace)
    objects.command(queue, "OpenQueue")
    cluster.wait_for("the queue to open", lambda: objects.state(queue) == "Open")
    run = run_task(lambda: seed_operator(cluster.namespace, "unseen", **gpu_task(volcano_queue=queue,
                                                                                  startup_timeout=15)))
    assert run.state == "failed" and "queue resource quota insufficient" in run.log, (
        "the scheduler's words, as before", run.log)
    assert f"Volcano queue {queue} was not checked before submitting (get Queue {queue} failed: HTTP 403" in run.log
    line = next(line for line in run.log.splitlines() if "its state and the Job's place in it cannot be read" in line)
    assert f"waits in queue `{queue}`" in line and "): deploy/queue-reader.yaml grants it" in line, line
    assert run.log.count("its state and the Job's place in it cannot be read") == 1, "said once"


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A StatsD listener on loopback, and Airflow's metrics pointed at it ([metrics] as a deployment sets
    them; InfluxDB-style tags), set up as the task runner sets it up in a worker process."""
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability.metrics import stats_utils

    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    for option, value in (("STATSD_ON", "True"), ("STATSD_HOST", "127.0.0.1"),
                          ("STATSD_PORT", str(listener.getsockname()[1])), ("STATSD_INFLUXDB_ENABLED", "True")):
        monkeypatch.setenv(f"AIRFLOW__METRICS__{option}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    yield listener
    stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
    listener.close()


def test_the_runs_figures_reach_statsd_named_per_bucket_and_tagged_with_the_dag_and_task(
        cluster, operator_kubeconfig, run_task, statsd):
    run = run_task(lambda: seed_operator(cluster.namespace, "metered", **gpu_task(
        annotations={SIM + "run-for": "2s"})), dag_id="metered_training")
    assert run.state == "success", run.log
    received: dict[str, float] = {}
    while True:
        try:
            packet = statsd.recv(65536).decode()
        except TimeoutError:
            break
        for line in packet.splitlines():
            name, _, value = line.partition(":")
            if "volcano.job." in name:
                received[name] = float(value.split("|")[0])
    tags = ",dag_id=metered_training,task_id=train"
    names = {f"airflow.volcano.job.{figure}{tags}" for figure in (
        "queued_seconds", "starting_seconds", "running_seconds", "restarting_seconds", "preempted_seconds",
        "stalled_seconds", "redone_seconds", "wall_seconds", "accelerator_hours", "preemptions", "goodput")}
    assert set(received) == names, received
    spent = run.xcom["return_value"]["goodput"]
    assert received[f"airflow.volcano.job.wall_seconds{tags}"] == pytest.approx(spent["wall_seconds"], abs=0.01)
    assert spent["accelerators"] == {GPU: 2.0} and received[f"airflow.volcano.job.accelerator_hours{tags}"] > 0
