"""The waiting process's clock 20 minutes off the cluster's: a real skew of a real process (libfaketime).

Clocks in these tests:
- the apiserver, Volcano, the kubelet and containerd of the real node (which stamps every log line),
  and this pytest process: the machine's own clock;
- synchronous case: the WORKER process (dag_runner.py running the DAG, whose operator waits in its
  wait loop) runs under `faketime +20m`, its whole process tree;
- deferred cases: the worker runs on the machine's clock and the `airflow triggerer` process (its
  trigger runner too) under `faketime +20m` (the waiter ahead: job_timeout and startup_timeout must not
  fire) or `faketime -20m` (the waiter behind, i.e. the node's clock ahead of it: the trigger's periodic
  log copies must lose no line).
Monotonic clocks are left alone (FAKETIME_DONT_FAKE_MONOTONIC=1), as two real machines' would be. The
skewed processes load faketime_sleep/sitecustomize.py, which sleeps around a libfaketime 0.9.10 bug
(every time.sleep of Python 3.11 fails under it); the skew itself is libfaketime's.

The provider used to compare the Job's creationTimestamp (the apiserver's clock) with the waiter's
time.time(): a waiter 20 minutes ahead deleted a healthy Job at its first check ("job_timeout of 600s
passed"). And its log reads asked for `sinceSeconds` worked out on the waiter's clock from the node's
timestamp of the last line copied: a waiter behind the node asked for too short a span, and every
deferred copy skipped what the pod printed since the previous one.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from volcano_cluster import faketime_env

from .airflow_db import migrate
from .real_node import SMALL
from .test_kill_and_reattach import RUNNER, write_dag
from .test_triggerer import airflow_env, in_an_airflow_lane, task_state, trigger_log  # noqa: F401 - a fixture

PYTHON = Path(sys.executable)
# How long a worker or triggerer may take to start Airflow, run a ~1-minute Job and end, beside other
# tests on a loaded 2-core machine: a bound on waiting, not on the provider.
RUN_WAIT = 420
TICKS = 90  # numbered lines, one every 0.5 s: 45 s of output
# After the last tick the master stays quiet a while, longer than a copy interval (stall_timeout / 4 =
# 10 s), before it exits: the trigger's periodic copy, not a final read at the end, copies the last ticks.
QUIET_AFTER = 14
TICKER = f"""
    import os, time
    for i in range({TICKS}):
        print(f"tick {{i:03d}}/{TICKS} of rank {{os.environ['RANK']}}", flush=True)
        time.sleep(0.5)
    print("ticks done", flush=True)
    time.sleep({QUIET_AFTER})
"""


SLEEP_FIX = Path(__file__).with_name("faketime_sleep")  # its sitecustomize: time.sleep under libfaketime 0.9.10


def skewed_env(skew: str, env: dict[str, str]) -> dict[str, str]:
    """`env` for a process whose whole tree's wall clock is moved by `skew` (libfaketime's `+20m`)."""
    # Only the wall clock: monotonic clocks (timeouts, asyncio) run as on any machine.
    path = os.pathsep.join(part for part in (str(SLEEP_FIX), env.get("PYTHONPATH", "")) if part)
    return {**faketime_env(skew, env), "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": path}


def ticks_dag(dags: Path, namespace: str, real_node: dict, dag_id: str, name: str, **operator_kwargs) -> Path:
    script = dags / "ticks.py"
    script.write_text(textwrap.dedent(TICKER))
    # keep_job: the test reads the Job the wait left, its uid and phase, after the task ended.
    return write_dag(dags, dag_id, namespace, name=name, training_script=str(script), container_resources=SMALL,
                     worker_replicas=1, job_timeout=600, startup_timeout=300, poll_interval=1,
                     on_finish_action="keep_job", **real_node, **operator_kwargs)


def assert_every_tick_once(text: str, pod: str, what: str) -> None:
    counts = {i: text.count(f"[{pod}] tick {i:03d}/{TICKS} of rank 0") for i in range(TICKS)}
    wrong = {i: count for i, count in counts.items() if count != 1}
    assert not wrong, f"{what}: tick -> times shown, for the ticks not shown exactly once: {wrong}"
    assert text.count(f"[{pod}] ticks done") == 1, what


def assert_job_left_completed(cluster, name: str, uid: str, log: str) -> None:
    """The Job the wait started with is still there (keep_job), Completed: no deadline ended it early."""
    job = cluster.job(name)
    assert job is not None and job["metadata"]["uid"] == uid, "the Job was deleted\n" + log[-4000:]
    assert job["status"]["state"]["phase"] == "Completed", job["status"]
    for deadline in ("job_timeout of", "did not start within startup_timeout"):
        assert deadline not in log, log[-4000:]


def clock_shown(log: str, text: str) -> datetime.datetime:
    """The time at the start of the first log line containing `text`: the writing process's clock."""
    line = next(line for line in log.splitlines() if text in line)
    stamp = re.search(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d(?:\.\d+)?)", line)
    assert stamp, f"no time in {line!r}"
    return datetime.datetime.fromisoformat(f"{stamp[1]}T{stamp[2]}+00:00")


def assert_skewed(log: str, text: str, minutes: int) -> None:
    """The process wrote `text` with its clock `minutes` off the machine's: the skew is real."""
    off = (clock_shown(log, text) - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert abs(off - minutes * 60) < 180, f"{text!r} shown {off:.0f}s off the machine's clock, not {minutes} min"


def assert_certificates_valid_at(minutes: int, kubeconfig: Path) -> None:
    """A process `minutes` behind verifies the apiserver's TLS certificate on its own clock: one issued
    less than that long ago is "not yet valid" to it (scripts/volcano_cluster.py backdates the
    certificates it makes by a day; a cluster made before it did is too young for a while). Said
    plainly rather than as the triggerer's TLS errors."""
    from cryptography import x509

    server = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, port = server.removeprefix("https://").rsplit(":", 1)
    issued = x509.load_pem_x509_certificate(ssl.get_server_certificate((host, int(port))).encode())
    behind = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=minutes)
    assert issued.not_valid_before_utc < behind - datetime.timedelta(minutes=5), (
        f"the apiserver's certificate was issued at {issued.not_valid_before_utc}: a process {-minutes} min behind "
        "cannot trust it for a while yet (a cluster started less than ~25 min ago)")


def stop(*processes: subprocess.Popen) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.usefixtures("in_an_airflow_lane")
def test_a_worker_20_minutes_ahead_waits_for_a_healthy_job_and_shows_every_line(
        cluster, operator_kubeconfig, real_node, tmp_path):
    """Sync mode, the WORKER's clock +20 min (the cluster's and the node's: the machine's): job_timeout=600
    and startup_timeout=300 count from the Job's creation on the apiserver's clock, so neither fires on a
    healthy Job; every line the master prints is shown once."""
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    env = airflow_env(home, dags)
    migrate(PYTHON, env)
    dag_id = "skew_sync"
    dag_file = ticks_dag(dags, cluster.namespace, real_node, dag_id, "skew")
    worker_log = tmp_path / "worker.log"
    worker = subprocess.Popen([str(PYTHON), str(RUNNER), str(dag_file), dag_id,
                               datetime.datetime.now(datetime.UTC).isoformat()],
                              env=skewed_env("+20m", env), stdout=worker_log.open("ab"), stderr=subprocess.STDOUT)
    try:
        uid = cluster.wait_for("the Job to be submitted", lambda: (job := cluster.job("skew")) and
                               job["metadata"]["uid"], timeout=RUN_WAIT)
        code = worker.wait(timeout=RUN_WAIT)
    finally:
        stop(worker)
    # dag.test() runs the task in the worker process: its task log is the worker's output.
    log = worker_log.read_text(errors="replace")
    assert code == 0 and "DAG-RUN-STATE success" in log, log[-4000:]
    assert task_state(PYTHON, env, dag_id) == "success"
    assert_skewed(log, "Submitted Volcano Job", +20)
    assert_job_left_completed(cluster, "skew", uid, log)
    assert_every_tick_once(log, "skew-master-0", "the task log")


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.usefixtures("in_an_airflow_lane")
@pytest.mark.parametrize("skew", [+20, -20], ids=["triggerer-20min-ahead", "triggerer-20min-behind"])
def test_a_triggerer_20_minutes_off_waits_for_a_healthy_job_and_copies_every_line(
        cluster, operator_kubeconfig, real_node, tmp_path, skew):
    """Deferrable mode: the worker on the machine's clock, the TRIGGERER's clock 20 min ahead or behind
    (the cluster's and the node's: the machine's). Ahead: job_timeout and startup_timeout do not fire.
    Behind (the node's clock ahead of the waiter's): each periodic copy (every stall_timeout / 4 = 10 s,
    so about five while the master prints a line every 0.5 s) starts where the previous one ended, by the
    node's own timestamps: every line is copied once."""
    if skew < 0:
        assert_certificates_valid_at(skew, operator_kubeconfig)
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    worker_env, triggerer_env = airflow_env(home, dags), airflow_env(home, dags)
    migrate(PYTHON, worker_env)
    dag_id = "skew_deferred"
    dag_file = ticks_dag(dags, cluster.namespace, real_node, dag_id, "skewd", deferrable=True, stall_timeout=40)
    worker_log, triggerer_log = tmp_path / "worker.log", tmp_path / "triggerer.log"
    worker = subprocess.Popen([str(PYTHON), str(RUNNER), str(dag_file), dag_id,
                               datetime.datetime.now(datetime.UTC).isoformat(), "--external-triggerer"],
                              env=worker_env, stdout=worker_log.open("ab"), stderr=subprocess.STDOUT)
    triggerer = subprocess.Popen([str(PYTHON), "-m", "airflow", "triggerer"],
                                 env=skewed_env(f"{skew:+d}m", triggerer_env), stdout=triggerer_log.open("ab"),
                                 stderr=subprocess.STDOUT)
    try:
        uid = cluster.wait_for("the Job to be submitted", lambda: (job := cluster.job("skewd")) and
                               job["metadata"]["uid"], timeout=RUN_WAIT)
        # A triggerer that dies leaves the task deferred for ever: say so at once, with what it said.
        cluster.wait_for("the worker to end", lambda: worker.poll() is not None or triggerer.poll() is not None,
                         timeout=RUN_WAIT)
        assert triggerer.poll() is None, (f"the triggerer {skew:+d} min exited ({triggerer.returncode}):\n"
                                          + triggerer_log.read_text(errors="replace")[-6000:])
        code = worker.returncode
    finally:
        stop(worker, triggerer)
    out, copied = worker_log.read_text(errors="replace"), trigger_log(home)
    assert code == 0 and "DAG-RUN-STATE success" in out, out[-4000:] + copied[-4000:]
    assert task_state(PYTHON, worker_env, dag_id) == "success"
    assert "Resumed: the trigger reports Volcano Job" in out
    assert_skewed(copied, "Waiting for Volcano Job", skew)
    assert_job_left_completed(cluster, "skewd", uid, copied + out)
    # The trigger copied every line, the last ones too (the master was quiet for a copy interval before
    # it ended); the resumed task then had none left to show.
    assert_every_tick_once(copied, "skewd-master-0", "the trigger's copy")
    assert_every_tick_once(copied + out, "skewd-master-0", "the whole task log")
