"""What the panel's JSON endpoint reads: the task instance from Airflow's metadata database (its state,
the fields the task rendered, the XComs it pushed) and the Job, its pods, its queue and a log's tail from
the cluster, through the caches of `app.py`.

Whom to trust for what. XComs can be written by any user who may edit this DAG's XComs (Airflow's REST
API), so they never choose where to read: the connection and the namespace come from the fields the task
rendered (RenderedTaskInstanceFields, which the REST API cannot write); the Job's name comes from XCom
but the Job is shown only if its `airflow-volcano.io/task-instance` annotation names exactly this task
instance and no other Airflow deployment (its `airflow-volcano.io/deployment` label: staging and prod
sharing a namespace run the same task instances); a pod's log is read only for a pod the Job owns (its
owner reference carries the Job's uid).
What the task recorded at its end (XCom `volcano_panel`) is shown as recorded text, its links checked,
and never makes the panel read anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import yaml

from airflow_volcano.exceptions import KubernetesConnectionError, VolcanoApiError
from airflow_volcano.manifest.names import pod_name
from airflow_volcano.ownership.deployment import (
    DEPLOYMENT_OPTION,
    DEPLOYMENT_VARIABLE,
    known_deployment_id,
    of_deployment,
)
from airflow_volcano.ownership.orphans import TaskInstanceId
from airflow_volcano.panel.view import (
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    RECORD_KEY,
    log_tail,
    panel,
    progress_from_log,
    without_preemptors,
)

if TYPE_CHECKING:
    from airflow_volcano.panel.app import Cache

# What the task pushes that the panel reads (the operator's XCom keys; the links' own keys, links.LINKS).
KEYS = ("job_name", "main_pod", "main_task", RECORD_KEY)
# The template fields of the operators (operators/arguments.py `templated_fields`) the panel reads.
CONN_FIELD, MANIFEST_FIELD, NAMESPACE_FIELD = "kubernetes_conn_id", "job_manifest", "namespace"
# Airflow's mark on a rendered field cut at [core] max_templated_field_length.
TRUNCATED_PREFIX = "Truncated. You can change this behaviour in [core]max_templated_field_length. "
LINK_SCHEMES = ("http", "https")
NO_LOG_READ = ("You may not read this task's logs, so the panel shows no log lines, no progress, no failure "
               "report and no stacks (they come from the pods' logs), and does not name who preempted the Job (the "
               "task log does).")


def link_keys() -> dict[str, str]:
    """The UI links' XCom keys, and their names."""
    from airflow_volcano.links import LINKS

    return {link.xcom_key: link.name for link in LINKS}


def safe_links(links: Any) -> dict[str, str]:
    """The links whose URL is http(s) with a host; any other (`javascript:`, `data:`, relative) is dropped:
    they come from XCom, which users may write."""
    if not isinstance(links, Mapping):
        return {}
    kept = {}
    for name, url in links.items():
        if not isinstance(url, str):
            continue
        try:
            parts = urlsplit(url.strip())
        except ValueError:
            continue
        if parts.scheme.lower() in LINK_SCHEMES and parts.netloc:
            kept[str(name)] = url.strip()
    return kept


RUNNING_STATES = {"running", "deferred", "queued", "scheduled", "up_for_reschedule", "restarting", "up_for_retry"}


@dataclass(frozen=True)
class TaskInstanceRecord:
    """What the metadata database holds of a task instance for the panel."""

    state: str | None
    xcom: dict[str, Any] = field(default_factory=dict)
    rendered: dict[str, Any] | None = None  # its rendered template fields; None: Airflow keeps none
    deployment: str | None = None  # this Airflow deployment's id (deployment.py); None: it submitted no Job


def task_instance_record(dag_id: str, run_id: str, task_id: str, map_index: int) -> TaskInstanceRecord:
    """The task instance's state, rendered fields and the panel's XComs of it (none: no Job submitted yet),
    and this deployment's id."""
    from airflow.configuration import conf
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.variable import Variable
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id,
                                                   map_index=map_index).one_or_none()
        rows = session.query(XComModel).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
            XComModel.map_index == map_index, XComModel.key.in_((*KEYS, *link_keys()))).all()
        values = {row.key: XComModel.deserialize_value(row) for row in rows}
        rtif = session.query(RenderedTaskInstanceFields).filter_by(
            dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index).one_or_none()
        rendered = dict(rtif.rendered_fields) if rtif is not None and isinstance(rtif.rendered_fields, dict) else None
        state = None if ti is None or ti.state is None else str(getattr(ti.state, "value", ti.state))
        stored = session.query(Variable).filter_by(key=DEPLOYMENT_VARIABLE).one_or_none()
        deployment = known_deployment_id(conf.get("volcano", DEPLOYMENT_OPTION, fallback=""),
                                         None if stored is None else stored.val)
    return TaskInstanceRecord(state, values, rendered, deployment)


_UNKNOWN = object()


def manifest_namespace(text: Any) -> Any:
    """The namespace in a rendered `job_manifest` (its first document's `metadata.namespace`; None: it names
    none, the connection's applies), or _UNKNOWN when it cannot be read. Airflow cuts a long rendered field
    (TRUNCATED_PREFIX): then the top-level `metadata` block alone is read, if it is whole."""
    if not isinstance(text, str) or not text.strip():
        return _UNKNOWN
    cut = text.startswith(TRUNCATED_PREFIX)
    if not cut:
        try:
            document = next(iter(yaml.safe_load_all(text)), None)
        except yaml.YAMLError:
            return _UNKNOWN
        return _namespace_of(document)
    lines = text[len(TRUNCATED_PREFIX):].splitlines()
    for index, line in enumerate(lines):
        if line.startswith("metadata:"):
            block = [line]
            for following in lines[index + 1:]:
                if following and not following.startswith((" ", "-")):
                    break  # the next top-level key: the block is whole
                block.append(following)
            else:
                return _UNKNOWN  # the cut fell inside the block
            try:
                return _namespace_of(yaml.safe_load("\n".join(block)))
            except yaml.YAMLError:
                return _UNKNOWN
        if line == "---":
            break
    return _UNKNOWN


def _namespace_of(document: Any) -> Any:
    if not isinstance(document, Mapping) or not isinstance(document.get("metadata"), Mapping):
        return _UNKNOWN
    namespace = document["metadata"].get("namespace")
    return str(namespace) if namespace else None


@dataclass(frozen=True)
class Target:
    """Where this task's Job is, as the task rendered it: its connection, and its namespace (None: the
    connection's, else `default`, as the operator resolves it)."""

    conn_id: str
    namespace: str | None


def rendered_target(rendered: Mapping[str, Any] | None) -> Target | str:
    """The Job's connection and namespace from the task's rendered fields, or why they are not known."""
    if rendered is None:
        return ("Airflow keeps no rendered fields of this task instance (it keeps those of the newest runs "
                "only: [core] max_num_rendered_ti_fields_per_task)")
    conn_id = rendered.get(CONN_FIELD)
    if not isinstance(conn_id, str) or not conn_id:
        return f"the task rendered no `{CONN_FIELD}`"
    namespace = manifest_namespace(rendered.get(MANIFEST_FIELD))
    if namespace is _UNKNOWN or namespace is None:
        given = rendered.get(NAMESPACE_FIELD)
        if isinstance(given, str) and given:
            namespace = given
        elif namespace is _UNKNOWN:
            return f"its rendered `{MANIFEST_FIELD}` does not say the Job's namespace"
    return Target(conn_id, namespace)


def own_job(job: Mapping[str, Any], ti: TaskInstanceId, deployment: str | None) -> bool:
    """Whether the Job names exactly this task instance (its task-instance annotation) of this deployment."""
    named = TaskInstanceId.from_job(job)
    return named is not None and named[0] == ti and of_deployment(job, deployment)


def owned_pods(pods: list[dict], job: Mapping[str, Any]) -> list[dict]:
    """The pods the Job owns (their owner reference carries its uid): a pod that only wears its name label is
    not one of them."""
    uid = (job.get("metadata") or {}).get("uid")
    return [pod for pod in pods if uid and any(
        owner.get("uid") == uid for owner in (pod.get("metadata") or {}).get("ownerReferences") or [])]


def nameable(namespace: str, dag_id: str, deployment: str | None) -> Any:
    """Whose Jobs the waiting report may name to a viewer of this DAG: its own namespace's Jobs of this DAG
    and deployment (a PodGroup carries its Job's labels and annotations); the others are counted only."""
    def check(podgroup: Mapping[str, Any]) -> bool:
        named = TaskInstanceId.from_job(podgroup)
        return ((podgroup.get("metadata") or {}).get("namespace") == namespace and named is not None
                and named[0].dag_id == dag_id and of_deployment(podgroup, deployment))
    return check


def read_job(conn_id: str, namespace: str | None, name: str, ti: TaskInstanceId,
             deployment: str | None = None) -> dict[str, Any]:
    """The Job as the cluster has it now, if it is this task instance's (of this deployment): the Job, its
    pods, why it waits (blocking). Nothing more is read of a Job that names another task instance."""
    from airflow_volcano.hooks import calls
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.observability.masking import JobSecrets, secret_values
    from airflow_volcano.status import job_state
    from airflow_volcano.waiting.queueing import queue_of, waiting_report

    hook = VolcanoHook(kubernetes_conn_id=conn_id)
    namespace = namespace or hook.get_namespace() or "default"
    job = hook.get_job(name, namespace)
    if job is None:
        return {"gone": True, "namespace": namespace}
    if not own_job(job, ti, deployment):
        return {"foreign": True, "namespace": namespace}
    secrets = JobSecrets()
    secrets.add(secret_values(job))
    pods = owned_pods(hook.list_job_pods(name, namespace), job)
    waiting = None
    if job_state(job).phase == "Pending":
        podgroup = hook.get_podgroup(job)
        snapshot = hook.drive(calls.queue_snapshot(queue_of(job, podgroup), namespace))
        waiting = waiting_report(podgroup, snapshot, (job.get("metadata") or {}).get("uid"),
                                 nameable=nameable(namespace, ti.dag_id, deployment))
    return {"job": job, "pods": pods, "waiting": waiting, "secrets": secrets, "namespace": namespace}


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


def read_progress(conn_id: str, namespace: str, pod: str) -> Any:
    """The progress the main pod's log reports (None: none, or unreadable)."""
    from airflow_volcano.hooks.volcano import VolcanoHook

    try:
        return progress_from_log(newest_lines(VolcanoHook(kubernetes_conn_id=conn_id), pod, namespace))
    except Exception:  # noqa: BLE001 - no progress shown rather than no panel
        return None


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


class NotTheJobsPod(LookupError):
    """`?pod=` names a pod that is not one of the task's Job's pods (the app answers 404)."""


def recorded_panel(recorded: Mapping[str, Any], may_read_logs: bool) -> dict[str, Any]:
    """What the task recorded, as text: its links checked, and without what comes from the pods' logs for
    a viewer who may not read them."""
    shown = {**recorded, "links": safe_links(recorded.get("links"))}
    if not may_read_logs:
        shown.update(log=None, progress=None, failure=None, stacks=[], log_denied=NO_LOG_READ,
                     preemptions=without_preemptors(shown.get("preemptions") or []))
    return shown


async def panel_data(dag_id: str, run_id: str, task_id: str, map_index: int, pod: str | None, *,
                     jobs: Cache, logs: Cache, may_read_logs: bool = True) -> dict[str, Any]:
    """The panel of one task instance: what the task recorded once it ended (the Job may be gone), else
    the Job as the cluster has it (read at most once per cache period, whoever asks). Raises NotTheJobsPod
    for a `pod` the Job does not own (nothing read of it)."""
    record = await asyncio.to_thread(task_instance_record, dag_id, run_id, task_id, map_index)
    values = record.xcom
    task = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "map_index": map_index, "state": record.state,
            "live": record.state in RUNNING_STATES}
    name = values.get("job_name")
    if not name or not isinstance(name, str):
        return {"task": task, "job": None,
                "message": "This task has not submitted a Volcano Job" + (" yet" if task["live"] else "")}
    recorded = values.get(RECORD_KEY)
    recorded = recorded_panel(recorded, may_read_logs) if isinstance(recorded, Mapping) else None
    if recorded is not None and not task["live"] and not pod:
        return {"task": task, "source": "recorded", **recorded}  # no cluster read at all
    target = rendered_target(record.rendered)
    if isinstance(target, str):
        if recorded is not None:
            return {"task": task, "source": "recorded", **recorded}
        return {"task": task, "job": None, "message": f"The panel cannot read this task's Volcano Job: {target}"}
    ti = TaskInstanceId(dag_id, task_id, run_id, map_index)
    try:
        live = await jobs.get((target.conn_id, target.namespace, name, ti, record.deployment),
                              lambda: asyncio.to_thread(read_job, target.conn_id, target.namespace, name, ti,
                                                        record.deployment))
    except (VolcanoApiError, KubernetesConnectionError) as error:
        # The API server's own identity may read less than the task's (Airflow in Kubernetes: another
        # ServiceAccount), the cluster may not answer: say so, with what the task recorded if it did.
        message = unreadable_job_message(f"{target.namespace}/{name}" if target.namespace else name, error)
        if recorded is not None:
            return {"task": task, "source": "recorded", **recorded, "message": message}
        return {"task": task, "job": None, "message": message}
    namespace = live["namespace"]
    if live.get("foreign"):
        return {"task": task, "job": None, "message": (
            f"The panel cannot show Volcano Job {namespace}/{name}: it is not this task instance's Job (its "
            "airflow-volcano.io/task-instance annotation names another task instance, or none, or its "
            "airflow-volcano.io/deployment label another Airflow deployment)")}
    if live.get("gone"):
        if recorded is not None:
            if pod:
                recorded["log"] = _recorded_log(recorded, pod, may_read_logs)
            return {"task": task, "source": "recorded", **recorded}
        return {"task": task, "job": None, "message": f"Volcano Job {namespace}/{name} no longer exists"}
    names = {(item.get("metadata") or {}).get("name") for item in live["pods"]}
    if pod and pod not in names:
        raise NotTheJobsPod(f"Pod {pod!r} is not a pod of this task's Volcano Job {namespace}/{name}: its log is "
                            "not shown")
    main_pod = next((candidate for candidate in (values.get("main_pod"), pod_name(name, "master"))
                     if candidate in names), None)
    redact = live["secrets"].redact
    log: dict[str, Any] | None = None
    shown = pod or main_pod
    if may_read_logs:  # else not one log read, for this viewer
        if shown is None:
            log = {"pod": values.get("main_pod") or pod_name(name, "master"), "lines": [], "gone": True}
        else:
            raw = await logs.get((target.conn_id, namespace, shown), lambda: asyncio.to_thread(
                read_log, target.conn_id, namespace, shown))
            log = log_tail(shown, raw, redact) if raw is not None else {"pod": shown, "lines": [], "gone": True}
    if recorded is not None and not task["live"]:  # ended: what it recorded, with the pod asked for
        if log is not None and log.get("gone") and (recorded.get("log") or {}).get("pod") == shown:
            log = recorded["log"]  # gone since: its lines as the task recorded them
        return {"task": task, "source": "recorded", **recorded, "log": log}
    progress = None
    if may_read_logs and main_pod is not None:
        progress = await logs.get((target.conn_id, namespace, main_pod, "progress"), lambda: asyncio.to_thread(
            read_progress, target.conn_id, namespace, main_pod))
    links = safe_links({name: values[key] for key, name in link_keys().items() if values.get(key)})
    shown_panel = panel(job=live["job"], pods=live["pods"], main_task=values.get("main_task"), now=time.time(),
                        waiting=live["waiting"], progress=progress, log=log, links=links, redact=redact)
    if not may_read_logs:
        shown_panel.update(log_denied=NO_LOG_READ, preemptions=without_preemptors(shown_panel["preemptions"]))
    return {"task": task, "source": "cluster", **shown_panel}


def unreadable_job_message(job: str, error: Exception) -> str:
    """Why the panel shows no live Job. A refusal names the identity's missing permission: the API server
    reads with the task's connection, as its own identity (in Kubernetes, its pod's ServiceAccount)."""
    if isinstance(error, VolcanoApiError) and error.status == 403 and not error.denied_by_admission():
        return (f"The panel cannot read Volcano Job {job}: {error.brief()}. The API server reads the Job with the "
                "task's connection as its own identity: grant that identity deploy/rbac-helm-chart.yaml's "
                "read-only Role airflow-volcano-panel in the Job's namespace")
    return f"The panel cannot read Volcano Job {job}: {error}"


def _recorded_log(recorded: Mapping[str, Any], pod: str, may_read_logs: bool) -> dict[str, Any] | None:
    """A pod's lines as the task recorded them (only the main pod's are), once its Job is gone."""
    if not may_read_logs:
        return None
    kept = recorded.get("log") or {}
    return dict(kept) if kept.get("pod") == pod else {"pod": pod, "lines": [], "gone": True}
