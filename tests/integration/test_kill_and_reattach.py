"""Kill safety and reattach: a worker process killed mid-job, a retry, a user killing the task.

The task runs in a separate process (dag_runner.py, a real dag.test()), so the test can SIGTERM
or kill -9 it exactly as a worker shutdown or crash would.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from . import warm_worker

SIM = "sim.airflow-volcano.io/"
RUNNER = warm_worker.RUNNER
# How long a worker process may take to start Airflow, submit, and stop: seconds alone, but up to a
# few minutes beside other tests on a loaded 2-core machine. A bound on waiting, not on the provider.
WORKER_WAIT = 180


def write_dag(tmp_path: Path, dag_id: str, namespace: str, **operator_kwargs) -> Path:
    kwargs = {"task_id": "train", "namespace": namespace, "image": "img:1", "worker_replicas": 1,
              "startup_timeout": 60, "poll_interval": 1, "deferrable": False, **operator_kwargs}
    path = tmp_path / f"{dag_id}.py"
    path.write_text(textwrap.dedent(f"""
        import datetime
        from airflow.sdk import DAG
        from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
        with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
            VolcanoPyTorchJobOperator(**{kwargs!r})
    """))
    return path


def start_worker(dag_file: Path, dag_id: str, logical_date: str, log: Path, *, retry: bool = False,
                 external_triggerer: bool = False,
                 env: dict[str, str] | None = None) -> warm_worker.WarmProcess | subprocess.Popen:
    """A worker running the DAG's task, its own process (forked warm: warm_worker.py); `retry` runs the
    next try of the same task instance; `external_triggerer` leaves a deferred task to a triggerer (none
    runs unless the test starts one)."""
    return warm_worker.start([str(dag_file), dag_id, logical_date, *(["--retry"] if retry else []),
                              *(["--external-triggerer"] if external_triggerer else [])],
                             dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})), log)



def running_job(cluster) -> dict:
    """The test's one Job once it runs (a worker's start may take minutes beside other tests)."""
    return cluster.wait_for("the Job to run", lambda: (jobs := our_jobs(cluster)) and
                            (jobs[0].get("status") or {}).get("state", {}).get("phase") == "Running" and jobs[0],
                            timeout=WORKER_WAIT)

def our_jobs(cluster) -> list[dict]:
    return [job for job in cluster.jobs()
            if job["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "airflow-volcano"]


@pytest.mark.parametrize(("kill_signal", "comes_back_as", "found_by"), [
    # The scheduler's retry: the same task instance, whose task state store (Airflow 3.3+) names the Job.
    (signal.SIGKILL, "retry", "the task state store"),
    (signal.SIGTERM, "retry", "the task state store"),
    # The same run_id with a new task instance (dag.test replaces the run): only the labels find it,
    # as on Airflow before 3.3, or after a crash between creating the Job and storing its name.
    (signal.SIGKILL, "new-task-instance", "its labels"),
], ids=["kill-9", "sigterm", "kill-9-labels"])
def test_worker_dies_mid_job_and_the_retry_reattaches_without_a_duplicate(
    cluster, operator_kubeconfig, airflow_db, tmp_path, kill_signal, comes_back_as, found_by
):
    dag_id = f"reattach_{kill_signal.name.lower()}_{comes_back_as.replace('-', '_')}"
    # A try is left: the task instance will come back, so a worker going away keeps its Job.
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, annotations={SIM + "run-for": "25s"}, retries=1)
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"

    first = start_worker(dag_file, dag_id, logical_date, log)
    job = running_job(cluster)
    first.send_signal(kill_signal)
    if kill_signal == signal.SIGTERM:
        # A worker shutdown: Airflow's supervisor forwards SIGTERM (the task's on_kill runs), then
        # SIGKILLs what is left after its grace period.
        time.sleep(3)
        first.kill()
    first.wait(timeout=WORKER_WAIT)
    assert [j["metadata"]["uid"] for j in our_jobs(cluster)] == [job["metadata"]["uid"]], (
        "the worker going away must not delete the Job its retry will reattach to\n" + log.read_text()[-5000:])

    second = start_worker(dag_file, dag_id, logical_date, log, retry=comes_back_as == "retry")
    assert second.wait(timeout=WORKER_WAIT) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert f"Reattaching to Volcano Job {cluster.namespace}/{job['metadata']['name']}" in text
    assert f"found by {found_by})" in text
    jobs = our_jobs(cluster)
    assert len(jobs) <= 1 and all(j["metadata"]["uid"] == job["metadata"]["uid"] for j in jobs), "no duplicate Job"


# A later release of the provider, as a worker upgraded while a Job trains would run it: its
# signal-forwarding shell differs by one line (what pods run, not what the user asked for).
UPGRADE = """
import sys
import airflow_volcano.shell as shell

_read = shell.read


def read(name):
    text = _read(name)
    if name != "forward-signals.sh":
        return text
    # Said when used, in the worker's own log (a worker forked warm loaded this in its zygote).
    print("this worker runs an upgraded airflow-volcano", file=sys.stderr)
    return text + "\\n# a line of a later release of airflow-volcano\\n"


shell.read = read
"""


def test_a_retry_run_by_an_upgraded_provider_reattaches_to_the_job_an_earlier_release_submitted(
        cluster, operator_kubeconfig, airflow_db, tmp_path):
    """The worker is killed mid-wait; the provider is upgraded (its shell differs); the retry reattaches.
    It used to refuse the Job as built "from other arguments" and fail every try, leaving it training
    with nobody waiting."""
    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "upgrade_mid_job"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, training_script=str(script), retries=1,
                         annotations={SIM + "run-for": "25s"})
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"
    first = start_worker(dag_file, dag_id, logical_date, log)
    job = running_job(cluster)
    first.kill()
    first.wait(timeout=WORKER_WAIT)
    upgraded = tmp_path / "upgraded"
    upgraded.mkdir()
    (upgraded / "sitecustomize.py").write_text(UPGRADE)

    second = start_worker(dag_file, dag_id, logical_date, log, retry=True, env={"PYTHONPATH": str(upgraded)})
    assert second.wait(timeout=WORKER_WAIT) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert "this worker runs an upgraded airflow-volcano" in text
    assert f"Reattaching to Volcano Job {cluster.namespace}/{job['metadata']['name']}" in text
    assert "from other arguments" not in text
    assert all(j["metadata"]["uid"] == job["metadata"]["uid"] for j in our_jobs(cluster)), "no second Job"


def test_user_killing_the_task_deletes_job_pods_and_configmap(cluster, operator_kubeconfig, airflow_db, tmp_path):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "user_kill"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killme", training_script=str(script),
                         annotations={SIM + "outcome": "run-forever"})
    log = tmp_path / "worker.log"
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), log)
    cluster.wait_phase("killme", {"Running"}, timeout=WORKER_WAIT)
    assert "killme-script" in cluster.configmap_names()

    # What "Mark failed" in the UI does: the server's state changes, then the task gets SIGTERM.
    with create_session() as session:
        session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=WORKER_WAIT)

    cluster.wait_for("Job, pods and ConfigMap to be gone", lambda: cluster.job("killme") is None
                     and not cluster.pods("killme") and "killme-script" not in cluster.configmap_names(),
                     timeout=WORKER_WAIT)


def test_a_user_kill_while_the_job_is_being_created_leaves_no_job(cluster, operator_kubeconfig, kubeconfig,
                                                                   airflow_db, tmp_path, monkeypatch):
    """Found by the chaos soak: "Mark failed" while a try was starting. Airflow's SIGTERM handler only
    calls on_kill, which found no Job yet; the task ran on, created its Job and waited (deferred, in the
    soak) until Airflow's SIGKILL, and the Job trained on with nobody to delete it. Here the real SIGTERM
    reaches the task while its create request is in flight (held by the proxy): the Job it creates is
    deleted and the task stops, saying why."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from .faults import FaultyProxy, through, upstream_of

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "kill_during_create"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killcreate", training_script=str(script),
                         annotations={SIM + "outcome": "run-forever"})
    log = tmp_path / "worker.log"
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        proxy.job_create_delay = 5.0
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), log)
        cluster.wait_for("the Job's create in flight", lambda: proxy.job_creates_seen > 0, timeout=WORKER_WAIT)
        with create_session() as session:  # what "Mark failed" does: the state, then SIGTERM
            session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=WORKER_WAIT)

    cluster.wait_for("the Job created after the kill to be gone", lambda: cluster.job("killcreate") is None
                     and not cluster.pods("killcreate") and "killcreate-script" not in cluster.configmap_names(),
                     timeout=60)
    output = log.read_text()
    assert "The task was killed while it was starting: nothing more is submitted" in output, output[-3000:]
    assert "Task killed: deleting Volcano Job" in output, output[-3000:]


def test_a_user_kill_landing_as_the_task_defers_leaves_no_job(cluster, operator_kubeconfig, kubeconfig,
                                                               airflow_db, tmp_path, monkeypatch):
    """Found by the chaos soak: "Mark failed" changed the task instance's state just before the task
    deferred, and before Airflow's heartbeat could SIGTERM it. Airflow refused the deferral (409, "not in
    the running state"): no trigger ran, no on_kill was called, and the Job trained on to Completed with
    nobody to delete it. Here the server's state changes while the Job's create is held by the proxy, and
    no SIGTERM follows: the task must see the kill before deferring, delete its Job and say why."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from .faults import FaultyProxy, through, upstream_of

    dag_id = "kill_as_deferring"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="killdefer", deferrable=True, retries=0,
                         annotations={SIM + "outcome": "run-forever"})
    log = tmp_path / "worker.log"
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        proxy.job_create_answer_delay = 5.0
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        # As a real worker does: the trigger is left to a triggerer (dag.test would run it in line, even
        # after Airflow refused the deferral). None runs: a refused deferral makes no trigger.
        worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), log,
                              external_triggerer=True)
        cluster.wait_for("the Job created, its answer held", lambda: cluster.job("killdefer") is not None,
                         timeout=WORKER_WAIT)
        with create_session() as session:  # "Mark failed": the server's state only (the SIGTERM comes late)
            session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
        try:
            worker.wait(timeout=WORKER_WAIT)
        except subprocess.TimeoutExpired:  # dag.test waits on for the trigger a refused deferral never made
            worker.kill()
            worker.wait()

    cluster.wait_for("the Job to be gone", lambda: cluster.job("killdefer") is None and not cluster.pods("killdefer")
                     and "killdefer-script" not in cluster.configmap_names(), timeout=60)
    output = log.read_text()
    assert (f"The task instance is failed on the server (a user marked it, or cleared it) as it was about to "
            f"defer: Airflow would run no trigger for Volcano Job {cluster.namespace}/killdefer") in output, \
        output[-3000:]
    assert "Task killed: deleting Volcano Job" in output, output[-3000:]


def test_a_try_killed_before_recording_its_job_is_reattached_though_an_earlier_try_recorded_its_own(
        cluster, operator_kubeconfig, kubeconfig, airflow_db, tmp_path, monkeypatch):
    """Found by the chaos soak: a Clear made a try's write to the task state store fail right after it
    created its Job; the store still named the Job of the try before, reported since, and the next
    try, reading the labels only when the store named nothing, submitted a second Job beside the
    first. Here: try 1's Job fails (reported, recorded); try 2 is killed -9 while the answer to its
    create is held (its Job exists, unrecorded); try 3 must reattach to try 2's Job."""
    from airflow_volcano.constants import CHECKED_LABEL

    from .faults import FaultyProxy, through, upstream_of

    dag_id = "unrecorded_job"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, annotations={SIM + "outcome": "run-forever"},
                         retries=2, retry_delay=0)
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        worker = start_worker(dag_file, dag_id, logical_date, log)  # tries 1 and 2 (retry_delay=0)
        first = running_job(cluster)
        proxy.job_create_answer_delay = WORKER_WAIT
        cluster.finish_simulated_pods(first["metadata"]["name"], exit_code=1)  # try 1's Job fails: not retryable
        second = cluster.wait_for("try 2's Job", lambda: next(
            (job for job in our_jobs(cluster) if job["metadata"]["uid"] != first["metadata"]["uid"]), None),
            timeout=WORKER_WAIT)
        worker.kill()
        worker.wait(timeout=WORKER_WAIT)
        proxy.job_create_answer_delay = 0
        assert cluster.job(first["metadata"]["name"])["metadata"]["labels"].get(CHECKED_LABEL) == "true", \
            "try 1 reported its Job"

        third = start_worker(dag_file, dag_id, logical_date, log, retry=True)
        cluster.wait_for("try 3 to reattach or submit", lambda: "Reattaching to Volcano Job" in log.read_text()
                         or proxy.job_creates_seen > 2, timeout=WORKER_WAIT)
        assert proxy.job_creates_seen == 2, "try 3 created a Job of its own beside try 2's"
        cluster.finish_simulated_pods(second["metadata"]["name"])
        assert third.wait(timeout=WORKER_WAIT) == 0, log.read_text()[-5000:]
    text = log.read_text()
    assert re.search(rf"Reattaching to Volcano Job {cluster.namespace}/{second['metadata']['name']} submitted by an "
                     r"earlier try \(\w+; found by its labels\)", text), text[-5000:]


def test_a_try_killed_between_creating_its_job_and_its_script_is_reattached_and_the_script_made(
        cluster, operator_kubeconfig, kubeconfig, airflow_db, tmp_path, monkeypatch):
    """Found by the chaos soak: a try killed -9 between creating its script's ConfigMap and its Job left
    the ConfigMap, owned by nothing. The Job comes first now, and its script after, owned by it from
    the start: a try killed in between (here while the proxy holds the answer to its create) leaves a
    Job without its script; the next try reattaches and makes it. (With no try left, the orphan sweep
    deletes such a Job: test_a_job_left_by_a_task_marked_failed_after_its_worker_died_is_deleted...)"""
    from .faults import FaultyProxy, through, upstream_of

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "killed_before_script"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, training_script=str(script), retries=1,
                         annotations={SIM + "outcome": "run-forever"})
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        proxy.job_create_answer_delay = WORKER_WAIT
        worker = start_worker(dag_file, dag_id, logical_date, log)
        job = cluster.wait_for("the Job created", lambda: next(iter(our_jobs(cluster)), None), timeout=WORKER_WAIT)
        worker.kill()
        worker.wait(timeout=WORKER_WAIT)
        proxy.job_create_answer_delay = 0
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        assert f"{name}-script" not in cluster.configmap_names(), "the script comes after the Job"

        retry = start_worker(dag_file, dag_id, logical_date, log, retry=True)
        made = cluster.wait_for("the retry to make the script", lambda: f"{name}-script" in cluster.configmap_names()
                                and cluster.core.read_namespaced_config_map(f"{name}-script", cluster.namespace),
                                timeout=WORKER_WAIT)
        assert [(owner.kind, owner.uid) for owner in made.metadata.owner_references] == [("Job", uid)]
        assert made.data["train.py"] == "print('training')\n"
        running_job(cluster)
        cluster.finish_simulated_pods(name)
        assert retry.wait(timeout=WORKER_WAIT) == 0, log.read_text()[-5000:]
    assert re.search(rf"Reattaching to Volcano Job {cluster.namespace}/{name} submitted by an earlier try",
                     log.read_text())
    assert [job["metadata"]["uid"] for job in our_jobs(cluster)] in ([], [uid]), "one Job for the task instance"
    cluster.wait_for("Job and script gone", lambda: not our_jobs(cluster)
                     and f"{name}-script" not in cluster.configmap_names(), timeout=60)


@pytest.mark.parametrize("if_job_exists", ["fail", "replace"])
def test_if_job_exists_fail_refuses_and_replace_resubmits(cluster, operator_kubeconfig, airflow_db, tmp_path,
                                                           if_job_exists):
    dag_id = f"exists_{if_job_exists}"
    # The refused Job must still run when the retry finds it, however long the retry takes to start.
    runs = {SIM + "outcome": "run-forever"} if if_job_exists == "fail" else {SIM + "run-for": "25s"}
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, if_job_exists=if_job_exists, annotations=runs)
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"

    first = start_worker(dag_file, dag_id, logical_date, log)
    old = running_job(cluster)
    first.kill()
    first.wait(timeout=WORKER_WAIT)

    second = start_worker(dag_file, dag_id, logical_date, log, retry=True)
    code = second.wait(timeout=WORKER_WAIT)
    text = log.read_text()
    jobs = our_jobs(cluster)
    if if_job_exists == "fail":
        assert code == 1, text[-3000:]
        assert (f"if_job_exists='fail': an earlier try of this task instance submitted Volcano Job "
                f"{cluster.namespace}/{old['metadata']['name']} (phase Running)") in text
        assert [j["metadata"]["uid"] for j in jobs] == [old["metadata"]["uid"]], "the running Job is left alone"
    else:
        assert code == 0, text[-3000:]
        assert f"Replacing Volcano Job {cluster.namespace}/{old['metadata']['name']}" in text
        assert all(j["metadata"]["uid"] != old["metadata"]["uid"] for j in jobs), "the old Job is gone"
        assert len(jobs) <= 1, "one Job: the replacement (deleted after it succeeded, by default)"


def test_a_worker_stopping_with_no_try_left_deletes_the_job(cluster, operator_kubeconfig, airflow_db, tmp_path):
    """SIGTERM from a worker shutdown while the task instance is still running on the server, and
    retries=0: no try will ever reattach, so the Job is deleted instead of training unwatched."""
    dag_id = "stop_no_retry"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, name="orphan", retries=0,
                         annotations={SIM + "outcome": "run-forever"})
    log = tmp_path / "worker.log"
    worker = start_worker(dag_file, dag_id, datetime.datetime.now(datetime.UTC).isoformat(), log)
    cluster.wait_phase("orphan", {"Running"}, timeout=WORKER_WAIT)
    worker.send_signal(signal.SIGTERM)
    time.sleep(3)
    worker.kill()
    worker.wait(timeout=WORKER_WAIT)

    cluster.wait_for("the Job to be deleted", lambda: cluster.job("orphan") is None, timeout=WORKER_WAIT)
    assert "Task killed: deleting Volcano Job" in log.read_text()


@pytest.mark.parametrize(("first", "then"), [("train", "debug"), ("debug", "train")])
def test_a_retry_reattaches_only_to_a_job_of_its_own_request(cluster, operator_kubeconfig, airflow_db, tmp_path,
                                                             first, then):
    """The DAG changed between two tries of one task instance (here: debug mode switched). A debug
    try must not take over the training Job: the task fails saying why and what to do, and, being its
    last try, settles the Job as any failure with no try left does (deleted: nobody would watch it
    train); a training try must not wait on a sleeping debug Job, which it replaces."""
    dag_id = f"mode_{first}_then_{then}"
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = tmp_path / "worker.log"

    def dag(mode: str, **sim: str) -> Path:
        return write_dag(tmp_path, dag_id, cluster.namespace, retries=1, debug=mode == "debug", debug_timeout=600,
                         annotations={SIM + key: value for key, value in sim.items()})

    worker = start_worker(dag(first, outcome="run-forever"), dag_id, logical_date, log)
    old = cluster.wait_for("the first try's Job to run", lambda: (jobs := our_jobs(cluster)) and
                           (jobs[0].get("status") or {}).get("state", {}).get("phase") == "Running" and jobs[0],
                           timeout=WORKER_WAIT)
    cluster.wait_for("its pods to run", lambda: all(p.status.phase == "Running" for p in
                                                    cluster.pods(old["metadata"]["name"])), timeout=WORKER_WAIT)
    worker.kill()
    worker.wait(timeout=WORKER_WAIT)

    retry = start_worker(dag(then, **{"run-for": "3s"}), dag_id, logical_date, log, retry=True)
    code = retry.wait(timeout=WORKER_WAIT)
    text = log.read_text()
    uids = [job["metadata"]["uid"] for job in our_jobs(cluster)]
    if then == "debug":
        assert code == 1, text[-3000:]
        assert (f"an earlier try of this task instance submitted Volcano Job {cluster.namespace}/"
                f"{old['metadata']['name']} (phase Running) from other arguments, script or debug mode") in text
        assert "Set if_job_exists='replace' to replace it with this try's, or delete it" in text
        assert (f"No later try of this task will reattach: deleting Volcano Job {cluster.namespace}/"
                f"{old['metadata']['name']} (Running)") in text
        cluster.wait_for("the Job nobody would watch to be gone", lambda: not our_jobs(cluster), timeout=WORKER_WAIT)
        assert "Reattaching" not in text
    else:
        assert code == 0, text[-3000:]
        assert f"Replacing Volcano Job {cluster.namespace}/{old['metadata']['name']} of an earlier try: a debug" in text
        assert old["metadata"]["uid"] not in uids, "the sleeping debug Job is gone"
        assert "Submitted Volcano Job" in text.split("Replacing Volcano Job")[1], "the retry trained anew"


def test_a_job_left_by_a_task_marked_failed_after_its_worker_died_is_deleted_by_the_next_submission(
        cluster, operator_kubeconfig, airflow_db, tmp_path):
    """Found by the chaos soak: a worker killed -9, then its task instance marked failed before Airflow
    retried it. No process was left to hear the mark, no try would reattach, and the Job trained on
    unwatched, then stayed. The next task to submit in the namespace finds it by the task instance the
    Job names, asks Airflow (which says failed) and marks it; a submission ORPHAN_GRACE later deletes it
    with its script's ConfigMap. A Job whose task instance still runs is left alone."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    from airflow_volcano.constants import ORPHANED_AT_ANNOTATION
    from airflow_volcano.ownership.orphans import ORPHAN_GRACE

    script = tmp_path / "train.py"
    script.write_text("print('training')\n")
    dag_id = "swept_after_mark"
    dag_file = write_dag(tmp_path, dag_id, cluster.namespace, training_script=str(script), retries=0,
                         annotations={SIM + "outcome": "run-forever"})
    first_log = tmp_path / "first.log"
    first = start_worker(dag_file, dag_id, "2026-11-01T00:00:00+00:00", first_log)
    left = running_job(cluster)
    name = left["metadata"]["name"]
    first.kill()  # kill -9: no on_kill, no cleanup
    first.wait(timeout=30)
    # What "Mark failed" does on the server; no worker is left to signal.
    with create_session() as session:
        session.query(TaskInstance).filter_by(dag_id=dag_id, task_id="train").update({"state": "failed"})
        run_id = session.query(TaskInstance.run_id).filter_by(dag_id=dag_id, task_id="train").scalar()
    found = (f"Volcano Job {cluster.namespace}/{name} (Running) of task instance {dag_id}.train in run {run_id}, "
             "which is failed with no try left watching it")

    # The next run's task: the orphan is marked, not deleted (a process of its task might still be settling it).
    second_log = tmp_path / "second.log"
    second = start_worker(dag_file, dag_id, "2026-11-02T00:00:00+00:00", second_log)
    cluster.wait_for("the second task to submit", lambda: "Submitted Volcano Job" in second_log.read_text(),
                     timeout=WORKER_WAIT)
    assert f"Found {found}: a submission in {cluster.namespace} deletes it from" in second_log.read_text()
    marked = cluster.job(name)
    assert marked is not None and ORPHANED_AT_ANNOTATION in marked["metadata"]["annotations"]

    # ORPHAN_GRACE later (the mark made older, as that much time would): a third run's task deletes it,
    # and leaves the second's Job, whose task instance runs, alone.
    aged = float(marked["metadata"]["annotations"][ORPHANED_AT_ANNOTATION]) - ORPHAN_GRACE
    cluster.custom.patch_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cluster.namespace, "jobs", name, {
        "metadata": {"annotations": {ORPHANED_AT_ANNOTATION: f"{aged:.0f}"}}})
    third_log = tmp_path / "third.log"
    third = start_worker(dag_file, dag_id, "2026-11-03T00:00:00+00:00", third_log)
    cluster.wait_for("the third task to submit", lambda: "Submitted Volcano Job" in third_log.read_text(),
                     timeout=WORKER_WAIT)
    assert f"Deleted {found}" in third_log.read_text(), third_log.read_text()[-3000:]
    assert third_log.read_text().count("Deleted Volcano Job") == 1, "the second's Job is its task instance's"
    cluster.wait_for("the orphan, its pods and ConfigMap gone", lambda: cluster.job(name) is None
                     and not cluster.pods(name) and f"{name}-script" not in cluster.configmap_names(), timeout=60)
    running = cluster.wait_for("the second's and third's Jobs to run", lambda: len(jobs := [
        job for job in our_jobs(cluster) if (job.get("status") or {}).get("state", {}).get("phase") == "Running"]) == 2
        and jobs, timeout=WORKER_WAIT)
    for job in running:
        cluster.finish_simulated_pods(job["metadata"]["name"])
    assert second.wait(timeout=WORKER_WAIT) == 0, second_log.read_text()[-3000:]
    assert third.wait(timeout=WORKER_WAIT) == 0, third_log.read_text()[-3000:]
