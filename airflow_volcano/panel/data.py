"""What the panel's JSON endpoint reads: the task instance (its state, and the XComs the task pushed: its
Job, its connection, what it recorded at its end) from Airflow's metadata database, and the Job, its
pods, its queue and a log's tail from the cluster, through the caches of `app.py`."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from airflow_volcano.constants import DEFAULT_CONN_ID
from airflow_volcano.manifest.names import pod_name
from airflow_volcano.panel.view import LOG_TAIL_BYTES, LOG_TAIL_LINES, RECORD_KEY, log_tail, panel, progress_from_log

if TYPE_CHECKING:
    from airflow_volcano.panel.app import Cache

# What the task pushes that the panel reads (the operator's XCom keys; the links' own keys, links.LINKS).
KEYS = ("job_name", "namespace", "main_pod", "kubernetes_conn_id", "main_task", RECORD_KEY)


def link_keys() -> dict[str, str]:
    """The UI links' XCom keys, and their names."""
    from airflow_volcano.links import LINKS

    return {link.xcom_key: link.name for link in LINKS}


RUNNING_STATES = {"running", "deferred", "queued", "scheduled", "up_for_reschedule", "restarting", "up_for_retry"}


def task_instance_record(dag_id: str, run_id: str, task_id: str, map_index: int) -> tuple[str | None, dict]:
    """The task instance's state and the panel's XComs of it (none: it submitted no Job yet)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id,
                                                   map_index=map_index).one_or_none()
        rows = session.query(XComModel).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
            XComModel.map_index == map_index, XComModel.key.in_((*KEYS, *link_keys()))).all()
        values = {row.key: XComModel.deserialize_value(row) for row in rows}
        state = None if ti is None or ti.state is None else str(getattr(ti.state, "value", ti.state))
    return state, values


def read_job(conn_id: str, namespace: str, name: str, main_pod: str, main_task: str | None) -> dict[str, Any]:
    """The Job as the cluster has it now: the Job, its pods, why it waits, its progress (blocking)."""
    from airflow_volcano.hooks import calls
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.masking import JobSecrets, secret_values
    from airflow_volcano.queueing import queue_of, waiting_report
    from airflow_volcano.status import job_state

    hook = VolcanoHook(kubernetes_conn_id=conn_id)
    job = hook.get_job(name, namespace)
    if job is None:
        return {"gone": True}
    secrets = JobSecrets()
    secrets.add(secret_values(job))
    pods = hook.list_job_pods(name, namespace)
    waiting = None
    if job_state(job).phase == "Pending":
        podgroup = hook.get_podgroup(job)
        waiting = waiting_report(podgroup, hook.drive(calls.queue_snapshot(queue_of(job, podgroup), namespace)),
                                 (job.get("metadata") or {}).get("uid"))
    progress = None
    if any((pod.get("metadata") or {}).get("name") == main_pod for pod in pods):
        try:
            progress = progress_from_log(newest_lines(hook, main_pod, namespace))
        except Exception:  # noqa: BLE001 - no progress shown rather than no panel
            progress = None
    return {"job": job, "pods": pods, "waiting": waiting, "progress": progress, "secrets": secrets,
            "main_task": main_task}


# Progress is read from this many of the main pod's newest lines, at most PROGRESS_BYTES of them.
PROGRESS_LINES = 2000
PROGRESS_BYTES = LOG_TAIL_BYTES * 4


def newest_lines(hook: Any, pod: str, namespace: str, lines: int = PROGRESS_LINES,
                 max_bytes: int = PROGRESS_BYTES) -> bytes:
    """A log's newest lines, at most `max_bytes`. The kubelet cuts a tail at `limitBytes` counted from the
    tail's start (its oldest lines): a tail that fills the limit is read again, shorter, so the newest
    lines are always in what is read (a long run's progress is its latest, not its first)."""
    from airflow_volcano.hooks import calls

    while True:
        data: bytes = hook.run(calls.read_pod_log(pod, namespace, container=None, tail_lines=lines,
                                                  limit_bytes=max_bytes))
        if len(data) < max_bytes or lines <= 10:
            return data
        lines //= 8


def read_log(conn_id: str, namespace: str, pod: str) -> bytes | None:
    """A pod's last LOG_TAIL_LINES lines (at most LOG_TAIL_BYTES), with timestamps; None if it is gone."""
    from airflow_volcano.exceptions import VolcanoApiError
    from airflow_volcano.hooks import calls
    from airflow_volcano.hooks.volcano import VolcanoHook

    try:
        return VolcanoHook(kubernetes_conn_id=conn_id).run(calls.read_pod_log(
            pod, namespace, container=None, tail_lines=LOG_TAIL_LINES, limit_bytes=LOG_TAIL_BYTES))
    except VolcanoApiError as error:
        if error.status in (400, 404):
            return None
        raise


async def panel_data(dag_id: str, run_id: str, task_id: str, map_index: int, pod: str | None, *,
                     jobs: Cache, logs: Cache) -> dict[str, Any]:
    """The panel of one task instance: what the task recorded once it ended (the Job may be gone), else
    the Job as the cluster has it (read at most once per cache period, whoever asks)."""
    state, values = await asyncio.to_thread(task_instance_record, dag_id, run_id, task_id, map_index)
    task = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index, "state": state,
            "live": state in RUNNING_STATES}
    name, namespace = values.get("job_name"), values.get("namespace")
    if not name or not namespace:
        return {"task": task, "job": None,
                "message": "This task has not submitted a Volcano Job" + (" yet" if task["live"] else "")}
    conn_id = values.get("kubernetes_conn_id") or DEFAULT_CONN_ID
    main_pod = values.get("main_pod") or pod_name(name, "master")
    recorded = values.get(RECORD_KEY)
    if recorded is not None and not task["live"] and not pod:
        return {"task": task, "source": "recorded", **recorded}  # no cluster read at all
    live = await jobs.get((conn_id, namespace, name), lambda: asyncio.to_thread(
        read_job, conn_id, namespace, name, main_pod, values.get("main_task")))
    if live.get("gone"):
        if recorded is not None:
            return {"task": task, "source": "recorded", **recorded}
        return {"task": task, "job": None, "message": f"Volcano Job {namespace}/{name} no longer exists"}
    shown = pod or main_pod
    raw = await logs.get((conn_id, namespace, shown), lambda: asyncio.to_thread(read_log, conn_id, namespace, shown))
    redact = live["secrets"].redact
    log = log_tail(shown, raw, redact) if raw is not None else {"pod": shown, "lines": [], "gone": True}
    if recorded is not None and not task["live"]:  # ended: what it recorded, with the pod asked for
        if raw is None and (recorded.get("log") or {}).get("pod") == shown:
            log = recorded["log"]  # gone since: its lines as the task recorded them
        return {"task": task, "source": "recorded", **recorded, "log": log}
    links = {name: values[key] for key, name in link_keys().items() if values.get(key)}
    return {"task": task, "source": "cluster",
            **panel(job=live["job"], pods=live["pods"], main_task=live["main_task"], now=time.time(),
                    waiting=live["waiting"], progress=live["progress"], log=log, links=links, redact=redact)}
