"""Deferrable mode: the task waits in VolcanoJobTrigger (kubernetes_asyncio), not in a worker slot.

dag.test() runs a deferred task's trigger inline, as the triggerer would, then resumes the task
in execute_complete: so these tests go through defer -> trigger -> resume for real.
"""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest

from airflow_volcano.job_ref import JobRef
from airflow_volcano.sensors.job import VolcanoJobSensor
from airflow_volcano.triggers.job import VolcanoJobTrigger

from .jobs import pytorch_job
from .test_operator import SIM, _failing_worker_template, seed_operator


def test_deferred_job_completes_with_its_log_shown_once(cluster, operator_kubeconfig, run_task):
    cluster.write_log("dfr-master-0", [f"step {i}" for i in range(50)])

    run = run_task(lambda: seed_operator(cluster.namespace, "dfr", deferrable=True,
                                         annotations={SIM + "run-for": "3s"}))

    assert run.state == "success", run.log
    assert "Deferring: the triggerer waits for Volcano Job" in run.log
    assert "Resumed: the trigger reports Volcano Job" in run.log and "Completed" in run.log
    for i in (0, 49):
        assert run.log.count(f"[dfr-master-0] step {i}\n") + run.log.count(f"[dfr-master-0] step {i} ") == 1
    assert run.xcom["return_value"]["phase"] == "Completed"
    assert run.xcom["return_value"]["log_lines"] == 50


def test_deferred_failure_reports_the_same_reason_as_the_sync_path(cluster, operator_kubeconfig, run_task):
    run = run_task(lambda: seed_operator(
        cluster.namespace, "dbad", deferrable=True, max_retry=1, restart_policy="Never",
        job_template=_failing_worker_template(),
        policies=[{"event": "PodFailed", "action": "RestartJob"}, {"event": "PodEvicted", "action": "RestartJob"}],
    ))
    assert run.state == "failed", run.log
    assert "the retry budget is exhausted (max_retry 1" in run.log, run.log
    assert "pod dbad-worker-" in run.log and "exit code 1, reason Error" in run.log


def test_job_timeout_holds_while_deferred(cluster, operator_kubeconfig, run_task):
    run = run_task(lambda: seed_operator(cluster.namespace, "dslow", deferrable=True, job_timeout=6,
                                         annotations={SIM + "outcome": "run-forever"}))
    assert run.state == "failed", run.log
    assert "job_timeout of 6s passed" in run.log
    cluster.wait_for("the timed-out Job to be deleted", lambda: cluster.job("dslow") is None)


def test_execution_timeout_holds_while_deferred(cluster, operator_kubeconfig, run_task):
    """Airflow 3 does not enforce execution_timeout on a deferred task; the trigger must."""
    run = run_task(lambda: seed_operator(cluster.namespace, "dexec", deferrable=True,
                                         execution_timeout=datetime.timedelta(seconds=8),
                                         annotations={SIM + "outcome": "run-forever"}))
    assert run.state == "failed", run.log
    assert "Deferring: the triggerer waits" in run.log and "the task's execution_timeout passed" in run.log
    cluster.wait_for("the timed-out Job to be deleted", lambda: cluster.job("dexec") is None)


def test_trigger_arguments_hold_no_credentials_and_the_triggerer_resolves_the_connection(cluster,
                                                                                         operator_kubeconfig):
    """Airflow before 3.2 returns a deferred task's trigger arguments through its REST API: they name
    the connection, and the triggerer resolves it (here from the environment, as a worker would)."""
    cluster.create_job(pytorch_job("trig", master_sim={"run-for": "2s"}))
    job = cluster.wait_phase("trig", {"Running", "Completed"})
    trigger = VolcanoJobTrigger(JobRef.from_job(job, "master").to_dict(), "kubernetes_default", get_logs=False)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_volcano.triggers.job.VolcanoJobTrigger"
    stored = json.dumps(kwargs)  # trigger arguments must be storable
    token = json.loads(operator_kubeconfig.read_text())["users"][0]["user"]["token"]
    assert token not in stored and str(operator_kubeconfig) not in stored
    assert kwargs["kubernetes_conn_id"] == "kubernetes_default"

    async def first_event():
        return await anext(VolcanoJobTrigger(**kwargs).run())

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=60))
    assert event.payload["verdict"] == "finished" and event.payload["phase"] == "Completed"


@pytest.mark.parametrize("action", ["delete_job", "keep_job"])
def test_killing_a_deferred_task_deletes_the_job_unless_kept(cluster, operator_kubeconfig, action):

    body = pytorch_job("dkill", master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    # Labelled as the operator submits it: under deploy/admission-policy.yaml the provider deletes only its own.
    body["metadata"].setdefault("labels", {})["app.kubernetes.io/managed-by"] = "airflow-volcano"
    cluster.create_job(body)
    job = cluster.wait_phase("dkill", {"Running"})
    trigger = VolcanoJobTrigger(JobRef.from_job(job, "master").to_dict(), "kubernetes_default",
                                on_kill_action=action)
    asyncio.run(trigger.on_kill())
    if action == "keep_job":
        assert cluster.job("dkill") is not None
    else:
        cluster.wait_for("Job and pods to be gone", lambda: cluster.job("dkill") is None and not cluster.pods("dkill"))


def test_deferrable_sensor_waits_in_the_trigger(cluster, operator_kubeconfig, run_task):
    cluster.create_job(pytorch_job("dsense", master_sim={"run-for": "4s"}))
    cluster.wait_phase("dsense", {"Running"})
    run = run_task(lambda: VolcanoJobSensor(task_id="wait", job_name="dsense", namespace=cluster.namespace,
                                            deferrable=True, poke_interval=1, timeout=120))
    assert run.state == "success", run.log
    assert run.xcom["return_value"]["phase"] == "Completed"


STAMP_BYTES = len("2026-11-23T18:11:03.059379000Z ")  # the apiserver's timestamp prefix (kwok: fixed width)


def hostile_log() -> list[str | bytes]:
    """A master log over one chunk of the trigger's read (LOG_CHUNK_BYTES): numbered Chinese lines,
    one line of invalid UTF-8, and a padding line chosen so that a full first chunk would end inside
    a 3-byte character."""
    from airflow_volcano.observability.logs import LOG_CHUNK_BYTES

    body = [f"{i:04d} " + "训练" * 50 for i in range(1100)]
    body[500] = b"0500 bad bytes \xff\xfe then " + "训练".encode()
    for pad in range(1, 400):
        lines = ["p" * pad, *body]
        offset = 0
        for line in lines:
            size = STAMP_BYTES + len(line if isinstance(line, bytes) else line.encode()) + 1
            if offset + size > LOG_CHUNK_BYTES:
                cut = LOG_CHUNK_BYTES - offset - STAMP_BYTES  # where the chunk ends in this line's text
                text = line if isinstance(line, str) else ""
                if text and cut > 5 and (cut - 5) % 6 in (1, 2, 4, 5):  # after "NNNN ", inside a character
                    return lines
                break
            offset += size
    raise AssertionError("no padding puts the chunk's end inside a character")


def assert_whole(lines: list[str]) -> None:
    shown = [line for line in lines if line[:4].isdigit()]
    assert [line[:4] for line in shown] == [f"{i:04d}" for i in range(1100)], "every line once, in order"
    assert shown[1099] == "1099 " + "训练" * 50, "the last line whole"
    assert shown[500] == "0500 bad bytes \ufffd\ufffd then 训练", "invalid UTF-8 shown as U+FFFD"


def test_a_hostile_master_log_is_copied_whole_by_the_trigger(cluster, operator_kubeconfig, trigger_log):
    """Larger than one chunk of the trigger's streamed read (chunks may end inside a character), with
    invalid UTF-8 inside: every line reaches the task log once (the client's strict decoding used
    to fail every read, and the trigger copied nothing more, silently)."""
    cluster.write_log("hostile-master-0", hostile_log())
    cluster.create_job(pytorch_job("hostile", master_sim={"run-for": "6s"}))
    job = cluster.wait_phase("hostile", {"Running", "Completed"})
    trigger = VolcanoJobTrigger(JobRef.from_job(job, "master").to_dict(), "kubernetes_default", log_interval=1)

    async def first_event():
        return await anext(trigger.run())

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=90))
    assert event.payload["verdict"] == "finished", event.payload
    assert_whole([line.removeprefix("[hostile-master-0] ") for line in trigger_log
                  if line.startswith("[hostile-master-0] ")])


def test_a_hostile_master_log_is_copied_whole_by_the_worker(cluster, operator_kubeconfig, run_task):
    cluster.write_log("hostilew-master-0", hostile_log())

    run = run_task(lambda: seed_operator(cluster.namespace, "hostilew", annotations={SIM + "run-for": "3s"}))

    assert run.state == "success", run.log
    # Task log lines: "<time> [info] [hostilew-master-0] <line> [<logger>] loc=<file>"
    assert_whole([line.split("[hostilew-master-0] ", 1)[1].rsplit(" [airflow", 1)[0].rstrip()
                  for line in run.log.splitlines() if "[hostilew-master-0] " in line])


def test_the_trigger_names_the_first_failure_before_it_fires(cluster, operator_kubeconfig, trigger_log):
    """Found by the chaos soak: a deferred task marked failed after its trigger saw the Job fail and
    fired, before a worker resumed it, had a log naming no cause (the resume, which writes the failure
    report, never ran). The trigger now says which pod failed first, and its exit code, before it fires."""
    cluster.create_job(pytorch_job("saysfail", master_sim={"run-for": "4s", "outcome": "fail", "exit-code": "7"},
                                   worker_sim={"outcome": "run-forever"}))
    job = cluster.wait_phase("saysfail", {"Running", "Failed", "Terminating", "Terminated", "Aborting", "Aborted"})
    trigger = VolcanoJobTrigger(JobRef.from_job(job, "master").to_dict(), "kubernetes_default", get_logs=False)

    async def first_event():
        return await anext(trigger.run())

    event = asyncio.run(asyncio.wait_for(first_event(), timeout=90))
    assert event.payload["verdict"] == "finished", event.payload
    first = [line for line in trigger_log if "first to fail" in line]
    assert len(first) == 1, trigger_log
    assert first[0].startswith(f"Volcano Job {cluster.namespace}/saysfail failed; first to fail: "
                               "pod saysfail-master-0 (task master) Failed, container master, exit code 7"), first
