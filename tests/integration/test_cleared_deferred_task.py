"""A user clears a deferred task and its next try starts at once, with a fixed Job `name=` (issue 41).

The triggerer (Airflow 3.3+) calls the old try's trigger on_kill, whose delete of the Job is retried
for up to 30 s against an apiserver that refuses it for a while (the fault proxy, 503 on every Job
DELETE for 15 s), while the next try reattaches to that very Job (here within a second of the Clear):
the kill must leave it to that try. Before, the delete (by name) landed on the Job the next try had
taken over once the apiserver took it, and that try failed "was deleted while the task waited".
"""

from __future__ import annotations

import datetime
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import warm_worker
from .airflow_api_client import api_call
from .airflow_db import migrate
from .test_kill_and_reattach import SIM, WORKER_WAIT, write_dag
from .test_triggerer import airflow_env, in_an_airflow_lane, trigger_log  # noqa: F401 - a fixture


def hold_outside_a_transaction(pid: int, database: Path, attempts: int = 50) -> None:
    """Stop the process (SIGSTOP) at a moment it holds no lock on the SQLite database: stopped within
    a transaction (its heartbeat writes every second), it would hold the lock until woken, and the
    Clear's own writes would fail "database is locked" (HTTP 500)."""
    for _ in range(attempts):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(database, timeout=0.5, isolation_level=None)
        try:
            probe.execute("BEGIN EXCLUSIVE")  # the write lock (Airflow's SQLite is in WAL mode: readers do not block)
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
        finally:
            probe.close()
    raise AssertionError(f"the triggerer held the database at each of {attempts} stops")


@pytest.mark.xdist_group("airflow-releases")
def test_a_cleared_deferred_tasks_kill_leaves_the_job_its_next_try_took_over(
        in_an_airflow_lane, cluster, operator_kubeconfig, kubeconfig, tmp_path, monkeypatch):  # noqa: F811
    from .faults import FaultyProxy, through, upstream_of

    python = sys.executable
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    dag_id = "cleared_deferred"
    dag_file = write_dag(dags, dag_id, cluster.namespace, name="cleared", deferrable=True,
                         annotations={SIM + "outcome": "run-forever"})
    worker_log, triggerer_log = tmp_path / "worker.log", tmp_path / "triggerer.log"
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0,
                     job_deletes_fail_for=15) as proxy:
        through(proxy, operator_kubeconfig, cluster.namespace, monkeypatch)  # the worker's and triggerer's too
        env = airflow_env(home, dags)
        migrate(python, env)
        worker = warm_worker.start([str(dag_file), dag_id, logical_date, "--external-triggerer"], env, worker_log,
                                   python=python)
        triggerer = subprocess.Popen([python, "-m", "airflow", "triggerer"], env=env, stdout=triggerer_log.open("ab"),
                                     stderr=subprocess.STDOUT)
        try:
            first = cluster.wait_phase("cleared", {"Running"}, timeout=WORKER_WAIT)
            cluster.wait_for("the triggerer to run the trigger", lambda: "Waiting for Volcano Job" in trigger_log(home),
                             timeout=WORKER_WAIT)
            # The triggerer is held (a real SIGSTOP) from the Clear until the next try has deferred: on SQLite
            # a trigger row the triggerer deletes once unused gives its id to the next one inserted (a
            # database sequence never does), and the triggerer then takes the next try's trigger for the old
            # one it runs under that id: it cancels nothing and this test's subject never happens. Held, it
            # finds both rows when it wakes, as on PostgreSQL.
            hold_outside_a_transaction(triggerer.pid, home / "airflow.db")
            try:
                code, output = api_call(python, env, "clear", dag_id, "train")
                assert code == 0, output
                cluster.wait_for("the next try to defer", lambda: worker_log.read_text().count(
                    "Pausing task as DEFERRED") >= 2, timeout=WORKER_WAIT)
            finally:
                os.kill(triggerer.pid, signal.SIGCONT)
            # Whichever comes first, the old try's kill or the next try's reattach, the kill leaves the Job.
            cluster.wait_for("the old try's kill to end", lambda: "Task killed:" in trigger_log(home)
                             or "Could not delete Volcano Job" in trigger_log(home) or cluster.job("cleared") is None,
                             timeout=90)
            cluster.wait_for("the next try to reattach", lambda: "Reattaching to Volcano Job" in worker_log.read_text(),
                             timeout=WORKER_WAIT)
            job = cluster.job("cleared")
            assert job is not None and job["metadata"]["uid"] == first["metadata"]["uid"], (
                "the Job the next try reattached to was deleted by the old try's kill\n" + trigger_log(home)[-4000:])
            assert job["metadata"]["labels"]["airflow-volcano.io/try-number"] == "2", "try 2 owns it now"
            cluster.finish_simulated_pods("cleared")
            assert worker.wait(timeout=WORKER_WAIT) == 0, worker_log.read_text()[-5000:]
        finally:
            for process in (worker, triggerer):
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
    log = trigger_log(home)
    assert "Task killed: leaving Volcano Job" in log and "which a later try of the task reattached to" in log, log
    assert f"Reattaching to Volcano Job {cluster.namespace}/cleared submitted by an earlier try" in \
        worker_log.read_text()
