"""From an operator's arguments to what its task submits and waits with: the Job request (the local
files read), the manifests for this task instance (its labels, a default name, the checks that need the
built Job, the secrets marked), the wait limits, the pods whose logs are followed.

Pure apart from reading the local files (local_files.py) and the connection's extra that may allow more
of them. The operator's override points are asked here: `_read_training_script` (the decorator ships
its function instead), `_default_name_limit` (a master/worker Job's pod names), `_log_pods`.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from airflow_volcano.constants import StallAction
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.local_files import ALLOWED_FILE_DIRS_OPTION, file_folders, parsed_job_template
from airflow_volcano.manifest import (
    JobManifests,
    JobRequest,
    build_manifests,
    checkpoint_subdir,
    default_job_name,
    run_labels,
    seconds,
    task_pods,
)
from airflow_volcano.manifest.names import pod_name
from airflow_volcano.manifest.policies import restarts_on_eviction
from airflow_volcano.observability.masking import MASKED_ANNOTATION, mark_masked_places, register_secrets
from airflow_volcano.operators.arguments import request_arguments
from airflow_volcano.ownership.orphans import TaskInstanceId

if TYPE_CHECKING:
    from pathlib import Path

    from airflow.sdk import Context

    from airflow_volcano.operators.job import VolcanoJobOperator
    from airflow_volcano.waiting.wait_engine import WaitLimits


def task_manifests(operator: VolcanoJobOperator, context: Context | None) -> JobManifests:
    """The ConfigMap and Job `operator`'s task submits (`build_manifests`); raises JobSpecError before
    any API call."""
    ti = context.get("ti") if context else None
    own = task_instance_id(operator, context)
    dag_id, run_id, map_index = own.dag_id, own.run_id, own.map_index
    labels = run_labels(dag_id=dag_id, task_id=operator.task_id, run_id=run_id,
                        try_number=int(getattr(ti, "try_number", 1) or 1), map_index=map_index)
    # Sized for the common task names; a template's longer ones shorten it (manifest._fit_default_name).
    default_name = default_job_name(dag_id, operator.task_id, suffix=secrets.token_hex(3),
                                    max_len=operator._default_name_limit())
    wait_limits(operator)  # bad timeouts fail here, before submitting
    if operator.debug:
        seconds("debug_timeout", operator.debug_timeout)
    request = job_request(operator, context)
    manifests = build_manifests(request, run_labels=labels, default_name=default_name,
                                checkpoint_subdir=checkpoint_subdir(dag_id=dag_id, task_id=operator.task_id,
                                                                    run_id=run_id, map_index=map_index))
    operator._log_pods(manifests.job, manifests.main_task)  # an unknown task name fails here, before submitting
    if operator.stall_timeout is not None and operator.stall_action == StallAction.RESTART and \
            not restarts_on_eviction(manifests.job):
        raise JobSpecError("stall_action='restart' restarts a stalled gang by deleting its pods, and this Job's "
                           "policies do not answer an evicted pod with a restart: add a policy {'event': "
                           "'PodEvicted', 'action': 'RestartJob'}, or use stall_action='fail'")
    register_secrets(manifests.job)  # the task log hides them from now on
    # Where the values this process's masker knows (Variables, connection fields) sit in the Job, for
    # whoever else reads it to mask them: the triggerer, the panel, a resumed worker (masking.py).
    found = mark_masked_places(manifests.job)
    if found is None:
        operator.log.warning("Airflow's secrets masker cannot be read in this Airflow release: Variables and "
                             "connection fields in the Job are masked in this process's log only, not in what a "
                             "triggerer copies, the panel, XCom, asset events or lineage")
    elif found:
        operator.log.info("The Job holds %d value(s) Airflow masks (Variables, connection fields): masked in what "
                          "the triggerer copies, the panel, XCom, asset events and lineage too (their places, not "
                          "the values, are in its annotation %s)", found, MASKED_ANNOTATION)
    return manifests


def task_instance_id(operator: VolcanoJobOperator, context: Context | None) -> TaskInstanceId:
    """`operator`'s task instance, as far as `context` tells ("no-dag", "manual" and -1 where it does not)."""
    ti = context.get("ti") if context else None
    return TaskInstanceId(
        operator.dag_id if operator.has_dag() else "no-dag", operator.task_id,
        str(context.get("run_id")) if context and context.get("run_id") else "manual",
        int(getattr(ti, "map_index", -1) if getattr(ti, "map_index", None) is not None else -1))


def job_request(operator: VolcanoJobOperator, context: Context | None) -> JobRequest:
    """The arguments as the one request the manifest builder takes: every argument of the operator's
    signature that is a JobRequest field, by name; the files are read here (the template rendered with
    Jinja when there is a `context`)."""
    values = {name: getattr(operator, name) for name in request_arguments(type(operator))}
    render = (lambda text: operator.render_template(text, context)) if context is not None else None
    values.update(debug=bool(operator.debug) or None, training_script=operator._read_training_script(),
                  job_template=parsed_job_template(operator.job_template, lambda: task_file_folders(operator),
                                                   render))
    return JobRequest(kind=operator.job_kind, **values)


def task_file_folders(operator: VolcanoJobOperator) -> list[Path]:
    """Where `operator`'s `training_script` and `job_template` may be read from (local_files.file_folders);
    the connection's extra is read only when a file is named."""
    def connection_file_dirs() -> Any:
        try:
            return operator.hook.connection_extra(ALLOWED_FILE_DIRS_OPTION)
        except Exception:  # noqa: BLE001 - no connection here (dry_run without a cluster): no extra
            return None

    return file_folders(operator.allowed_file_dirs, connection_file_dirs,
                        operator.dag if operator.has_dag() else None)


def wait_limits(operator: VolcanoJobOperator) -> WaitLimits:
    """The wait's limits from `operator`'s timeouts, checked (a bad one fails before submitting)."""
    from airflow_volcano.waiting.wait_engine import WaitLimits  # not at DAG parse

    if operator.stall_timeout is not None and not operator.get_logs:
        raise JobSpecError(f"stall_timeout={operator.stall_timeout!r} needs get_logs=True: a stall is a main pod "
                           "that writes no new output")
    return WaitLimits.checked(startup_timeout=operator.startup_timeout, job_timeout=operator.job_timeout,
                              image_pull_timeout=operator.image_pull_timeout,
                              poll_interval=operator.poll_interval, node_lost_timeout=operator.node_lost_timeout,
                              stall_timeout=operator.stall_timeout, stall_action=operator.stall_action, owns_job=True)


def log_task_pods(job: dict, main: str, log_tasks: Any) -> list[tuple[str, str | None]]:
    """The pods (and containers) `log_tasks` copies into the task log; the main pod is get_logs'."""
    if log_tasks is None:
        return []
    if not isinstance(log_tasks, list | tuple) or not all(isinstance(n, str) for n in log_tasks):
        raise JobSpecError(f"log_tasks must be a list of Volcano task names, got {log_tasks!r}")
    main_pod = pod_name(job["metadata"]["name"], main)
    return [pod for pod in task_pods(job, list(log_tasks), "log_tasks") if pod[0] != main_pod]
