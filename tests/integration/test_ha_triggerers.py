"""Two real `airflow triggerer` processes run the same deferred trigger (HA), before Airflow 3.3.

Triggerer A runs the trigger and stalls (SIGSTOP, its whole process group: the supervisor and its trigger
runner). Once A's heartbeat is older than the health-check threshold, triggerer B assigns A's trigger to
itself (Trigger.assign_unassigned), runs it, fires when the Job completes, and the worker resumes the
task, which succeeds and keeps its Job (on_finish_action="keep_job", labelled reported). Then A wakes
(SIGCONT): its trigger is no longer assigned to it, so A cancels it. Before 3.3 a cancellation is all a
trigger sees (no on_kill): A must keep the finished Job, not take the task's new state for a user's kill.

A stays stopped until the task has succeeded, so its cancellation sees the task finished. A stopped
process's kernel still buffers what the apiserver sends, so A would read the Job's completion from its
watch the moment it wakes and fire too (before its supervisor cancels it: seen, 14 ms after SIGCONT), and
never be cancelled. A stalled host does not get that news either: A reaches the apiserver through a proxy
that, from the stall on, cuts A's watches and answers A's requests only after a delay (a network slow to
come back), so A's supervisor cancels the trigger before the trigger can learn the Job ended.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
from pathlib import Path

import pytest

from . import warm_worker
from .airflow_db import migrate
from .faults import FaultyProxy, through, upstream_of
from .test_kill_and_reattach import SIM, write_dag
from .test_triggerer import AIRFLOWS, airflow_env, in_an_airflow_lane, task_state  # noqa: F401 - a fixture

# Both pre-3.3 releases: 3.3+ calls the trigger's on_kill, and its cancellation path does not run there.
PRE_ON_KILL = ["lowest", "airflow-3.2"]
# Seconds without a heartbeat after which a triggerer's triggers go to another ([triggerer]
# triggerer_health_check_threshold, 30 by default; read as an int).
HEALTH_CHECK_THRESHOLD = 5
# Seconds the proxy holds each of A's requests once A stalled: far longer than A's supervisor takes to cancel
# the trigger once it wakes (its next loops: 1.8 s on 3.1, 3.1 s on 3.2, seen), well within the 30 s the
# cancellation has for its own read of the Job.
WAKING_NETWORK_DELAY = 12.0
# The lines that end A's run of the trigger: its pre-3.3 cancellation (airflow_volcano/triggers/job.py),
# whichever way it went, or Airflow's own when it fired after all.
A_TRIGGER_ENDS = ("keeping Volcano Job", "nothing to stop", "Task killed", "Could not delete", "keeping it",
                  "Trigger fired event")


def trigger_logs(home: Path) -> dict[Path, str]:
    """Each triggerer's log of the trigger: Airflow files it per triggerer (`<task log>.trigger.<job id>.log`)."""
    return {path: path.read_text(errors="replace") for path in sorted((home / "logs").rglob("*.trigger.*.log"))
            if path.is_file()}


def watching(home: Path) -> set[Path]:
    """The trigger logs of the triggerers that started to wait for the Job."""
    return {path for path, text in trigger_logs(home).items() if "Waiting for Volcano Job" in text}


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """A triggerer is a supervisor and its trigger runner (a forked child): signal both, as a stall stops both."""
    if process.poll() is None:
        os.killpg(process.pid, signum)


def stop(process: subprocess.Popen, *, group: bool = False) -> None:
    if group:
        signal_group(process, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
    if process.poll() is None:
        process.terminate()  # a triggerer then stops its trigger runner and its log server
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if group:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what the supervisor left of its group
        except ProcessLookupError:
            pass


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.usefixtures("in_an_airflow_lane")
@pytest.mark.parametrize("airflow", PRE_ON_KILL)
def test_a_stalled_triggerer_waking_after_another_fired_keeps_the_finished_job(
    cluster, operator_kubeconfig, kubeconfig, tmp_path, monkeypatch, airflow
):
    python = AIRFLOWS[airflow]
    assert python.exists(), f"{python} is missing: `make venv` builds it"
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    # Each process its own environment: each triggerer its own log server port.
    worker_env, env_b = airflow_env(home, dags), airflow_env(home, dags)
    migrate(python, worker_env)

    dag_id = "ha_triggerers"
    # Pods that run until B has taken the trigger over (the test then ends them), then succeed: on a
    # loaded machine a fixed run time could end before A even stalled.
    dag_file = write_dag(dags, dag_id, cluster.namespace, name="hatrig", deferrable=True, on_finish_action="keep_job",
                         annotations={SIM + "outcome": "run-forever"})
    worker_log = tmp_path / "worker.log"
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()

    def start_triggerer(env: dict[str, str], log: Path) -> subprocess.Popen:
        env = {**env, "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": str(HEALTH_CHECK_THRESHOLD)}
        # A process group of its own, so that a stall stops the supervisor and its trigger runner alike.
        return subprocess.Popen([str(python), "-m", "airflow", "triggerer"], env=env, stdout=log.open("ab"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    worker = triggerer_a = triggerer_b = None
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)
        env_a = airflow_env(home, dags)  # A alone reaches the apiserver through the proxy
        try:
            worker = warm_worker.start([str(dag_file), dag_id, logical_date, "--external-triggerer"], worker_env,
                                       worker_log, python=python)
            triggerer_a = start_triggerer(env_a, tmp_path / "triggerer-a.log")
            job = cluster.wait_phase("hatrig", {"Running"}, timeout=180)  # a worker's start, on a loaded machine
            (log_a,) = cluster.wait_for("triggerer A to run the trigger", lambda: watching(home), timeout=180)
            assert task_state(python, worker_env, dag_id) == "deferred"

            # A stalls: no heartbeat, its trigger frozen mid-wait, its connections to the apiserver lost.
            signal_group(triggerer_a, signal.SIGSTOP)
            proxy.latency = WAKING_NETWORK_DELAY
            proxy.cut_streams()
            triggerer_b = start_triggerer(env_b, tmp_path / "triggerer-b.log")
            cluster.wait_for("triggerer B to take the trigger over from the stalled A",
                             lambda: watching(home) - {log_a}, timeout=180)
            cluster.finish_simulated_pods("hatrig")
            # B fires once the Job completes; the worker resumes the task, which reports and keeps the Job.
            assert worker.wait(timeout=240) == 0, worker_log.read_text()[-3000:]
            assert task_state(python, worker_env, dag_id) == "success"
            kept = cluster.job("hatrig")
            assert kept["metadata"]["labels"].get("airflow-volcano.io/checked") == "true", kept["metadata"]

            # A wakes: the trigger is no longer its own, so A cancels it while the task is finished.
            signal_group(triggerer_a, signal.SIGCONT)
            cluster.wait_for("triggerer A to end its trigger",
                             lambda: any(line in trigger_logs(home)[log_a] for line in A_TRIGGER_ENDS), timeout=120)
            logs = trigger_logs(home)
            said = "\n".join(f"== {path.name}\n{text[-3000:]}" for path, text in logs.items())
            survivor = cluster.job("hatrig")
            assert survivor is not None and survivor["metadata"]["uid"] == job["metadata"]["uid"], (
                "the stalled triggerer's cancellation must not delete the Job the task finished with\n" + said)
            assert "Cancelled while the task is success" in logs[log_a], said  # the pre-3.3 cancellation ran
            assert "nothing to stop" in logs[log_a], said
            assert not [text for text in logs.values() if "treating it as a kill" in text or "Task killed" in text], (
                said)
        finally:
            if worker is not None:
                stop(worker)
            for triggerer in (triggerer_a, triggerer_b):
                if triggerer is not None:
                    stop(triggerer, group=True)
