"""The end of a wait, the same for the operator (waiting in a worker, or resumed after deferring) and
the sensor: the result, the failure explained (the pod that failed first, its exit code and last log
lines), and the Job cleaned up as docs/deferrable.md "Cleanup guarantees" says. No Airflow operator state lives
here: callers pass what they know."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import OnFinishAction
from airflow_volcano.exceptions import VolcanoJobError
from airflow_volcano.observability import metrics
from airflow_volcano.observability.goodput import goodput
from airflow_volcano.observability.lineage import image_digest
from airflow_volcano.observability.logs import iter_lines
from airflow_volcano.observability.pod_logs import PodLogCopy, follow_until_exit
from airflow_volcano.ownership import cleanup, delete_job_and_script
from airflow_volcano.status import (
    LOG_SCAN_LINES,
    PodLogTail,
    failed_pods,
    failure_message,
    failures_not_listed,
    job_state,
    termination_result,
    unstarted_pods,
)
from airflow_volcano.waiting.events import Verdict, WaitOutcome

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")
# How many troubled pods' events a failure report reads (one request each).
EVENT_PODS = 5


@dataclass(frozen=True)
class Explained:
    """A failure's report, and what it was read from (the panel's record shows the same pods, the same
    one marked first)."""

    message: str
    pods: list[dict]
    logs: dict[str, PodLogTail]


def explain_failure(hook: VolcanoHook, ref: JobRef, outcome: WaitOutcome) -> Explained:
    """Final phase, the pod that failed first with its exit code, reason and last log lines, the
    pods that failed after it, warnings."""
    pods: list[dict] = []
    events: list[dict] = []
    try:
        pods = hook.list_job_pods(ref.name, ref.namespace)
        # Failed pods seen during the wait that Volcano has removed or replaced since (their last state).
        gone = failures_not_listed(pods, outcome.failed_pods)
        pods = [pod for pod in pods if pod["metadata"]["name"] not in gone] + list(gone.values())
        podgroup = hook.get_podgroup(outcome.job) if outcome.job is not None else None
        # The events of the Job, its PodGroup, the master and the pods that failed or never started.
        troubled = [problem.pod for problem in failed_pods(pods, ref.main_task)] + unstarted_pods(pods)
        names = {ref.name, ref.main_pod, *troubled[:EVENT_PODS]}
        if podgroup is not None:
            names.add(podgroup["metadata"]["name"])
        events = hook.list_events(ref.namespace, names)
    except Exception as error:  # noqa: BLE001 - explain with what we have
        log.warning("Could not read pods/events of %s/%s: %s", ref.namespace, ref.name, error)
    # The failed containers' logs (the earliest few: which failed first is read from them too),
    # else the master's. More lines than shown: a cause (a DataLoader worker's bus error) may
    # precede a long traceback.
    problems = failed_pods(pods, ref.main_task)
    wanted = [(problem.pod, problem.container) for problem in problems[:EVENT_PODS]] or [
        (ref.main_pod, ref.main_pod_container)]
    logs: dict[str, PodLogTail] = {}
    for pod, container in wanted:
        try:
            chunks = hook.pod_log_chunks(pod, ref.namespace, container=container, tail_lines=LOG_SCAN_LINES)
            logs[pod] = PodLogTail.from_raw(list(iter_lines(chunks))[-LOG_SCAN_LINES:])
        except Exception:  # noqa: BLE001 - gone: its termination message (its log's tail) if it left one
            pass
    for problem in problems:
        if problem.pod not in logs and problem.log_tail:
            logs[problem.pod] = PodLogTail(lines=problem.log_tail, last_ns=None)
    headline = None
    if outcome.verdict is Verdict.JOB_TIMEOUT:
        headline = f"Volcano Job {ref.namespace}/{ref.name} failed: {outcome.message}; the Job was deleted"
    elif outcome.verdict is Verdict.STALLED:
        headline = (f"Volcano Job {ref.namespace}/{ref.name} {outcome.message}; the Job was deleted (the stacks are "
                    "in the task log above)")
    elif outcome.verdict in (Verdict.CANNOT_START, Verdict.BUDGET_SPENT):
        headline = f"{outcome.message}; the Job was deleted"
    state = job_state(outcome.job or {"metadata": {"name": ref.name, "namespace": ref.namespace}})
    message = failure_message(state, pods=pods, events=events, main_task=ref.main_task, logs=logs,
                              log_pod=ref.main_pod, headline=headline, lost_nodes=outcome.lost_nodes)
    if outcome.stalls and outcome.verdict is not Verdict.STALLED:
        message += (f"\nThe Job stalled {outcome.stalls} time(s) (no output for stall_timeout) and was restarted each "
                    "time (stall_action='restart')")
    return Explained(message, pods, logs)


def main_result(hook: VolcanoHook, ref: JobRef) -> tuple[Any, str | None, str | None]:
    """The master's termination message (JSON if it parses): how a training script hands metrics
    or a model URI to the next task; and the image it ran, with its digest. Read before cleanup deletes
    the pod."""
    try:
        pod = hook.get_pod(ref.main_pod, ref.namespace)
    except Exception as error:  # noqa: BLE001 - a missing result must not hide a finished Job
        log.warning("Could not read the termination message of master pod %s/%s: %s", ref.namespace,
                    ref.main_pod, error)
        return None, None, None
    return (termination_result(pod, ref.main_pod_container), *image_digest(pod, ref.main_pod_container))


def report_goodput(ref: JobRef, outcome: WaitOutcome, metric_tags: Mapping[str, str] | None) -> dict | None:
    """The run's time by bucket (goodput.py): a table in the task log, the figures to Airflow's metrics;
    returned for the task's return value. None when the Job as last read cannot tell it."""
    spent = goodput(outcome.job, outcome.timeline, outcome.log_cursor.progress) if outcome.job else None
    if spent is None:
        return None
    log.info("\n".join(spent.table(f"{ref.namespace}/{ref.name}")))
    if metric_tags is not None:
        try:
            metrics.send(spent, metric_tags)
        except Exception as error:  # noqa: BLE001 - the metrics backend is not the task's business
            log.warning("Could not send the run's figures to Airflow's metrics: %s", error)
    return spent.result()


def record_panel(hook: VolcanoHook, ref: JobRef, outcome: WaitOutcome, push_xcom: Callable[[str, Any], None] | None,
                 *, links: Mapping[str, str] | None, failure: Explained | None = None) -> None:
    """What the Volcano Job panel shows after the Job is gone (XCom `volcano_panel`): the Job, its pods,
    progress, where its time went, the failure report, the stacks, the main pod's last lines; every
    text masked as the task log is (this process's masker, and the Job's secrets: see masking.JobSecrets)."""
    if push_xcom is None or outcome.job is None:
        return
    from airflow_volcano.hooks import calls
    from airflow_volcano.observability.masking import JobSecrets
    from airflow_volcano.panel.view import LOG_TAIL_BYTES, LOG_TAIL_LINES, RECORD_KEY, log_tail, panel

    redact = JobSecrets.of(outcome.job).redact
    pods = failure.pods if failure is not None else None
    if pods is None:
        try:
            pods = hook.list_job_pods(ref.name, ref.namespace)
        except Exception as error:  # noqa: BLE001 - the panel shows less, the task goes on
            log.warning("Could not read the pods of Volcano Job %s/%s for its panel: %s", ref.namespace, ref.name,
                        error)
            pods = []
        listed = {pod["metadata"]["name"] for pod in pods}
        pods += [view for name, view in outcome.failed_pods.items() if name not in listed]
    try:
        raw = hook.run(calls.read_pod_log(ref.main_pod, ref.namespace, container=ref.main_pod_container,
                                          tail_lines=LOG_TAIL_LINES, limit_bytes=LOG_TAIL_BYTES))
        shown_log: dict | None = log_tail(ref.main_pod, raw, redact)
    except Exception:  # noqa: BLE001 - gone, or never written (kwok): the panel says so
        shown_log = {"pod": ref.main_pod, "lines": [], "gone": True}
    push_xcom(RECORD_KEY, panel(job=outcome.job, pods=pods, main_task=ref.main_task,
                                logs=failure.logs if failure is not None else None,
                                progress=outcome.log_cursor.progress, timeline=outcome.timeline,
                                failure=failure.message if failure is not None else None,
                                stacks=outcome.stacks, log=shown_log, links=links, redact=redact,
                                preemptions=outcome.preemptions or None))


def summary(ref: JobRef, outcome: WaitOutcome, result: Any, goodput_figures: dict[str, Any] | None = None,
            image: str | None = None, digest: str | None = None) -> dict[str, Any]:
    """The task's return value (XCom), in both modes and for the sensor."""
    state = job_state(outcome.job or {})
    progress = outcome.log_cursor.progress
    return {
        "job_name": ref.name,
        "namespace": ref.namespace,
        "phase": outcome.phase or state.phase,
        "main_pod": ref.main_pod,
        "master_pod": ref.main_pod,  # deprecated: main_pod (see CHANGELOG)
        "retry_count": state.retry_count,
        "log_lines": outcome.log_cursor.lines_shown,
        "resumed_from": outcome.log_cursor.resumed_from,
        "progress": progress.result() if progress is not None else None,
        "goodput": goodput_figures,
        "image": image,
        "image_digest": digest,
        "result": result,
    }


def finalize(
    hook: VolcanoHook,
    ref: JobRef,
    outcome: WaitOutcome,
    *,
    on_finish_action: OnFinishAction,
    push_xcom: Callable[[str, Any], None] | None = None,
    main_log: PodLogCopy | None = None,
    metric_tags: Mapping[str, str] | None = None,
    links: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Push the final phase, say where the run's time went, record what the Volcano Job panel shows once
    the Job is gone, clean up, and return the summary, or raise with the failure's reason. What becomes
    of the Job follows docs/deferrable.md "Cleanup guarantees": a wait that failed (DEADLINE, WAIT_FAILED) raises and
    leaves the Job to the caller, which keeps it for a later try. `metric_tags` (the DAG and task): the
    run's figures go to Airflow's metrics with them; `links`: the UI's links, for the panel. What it returns
    and raises is masked (masking.JobSecrets): the summary becomes the return XCom and the asset events'
    extra, and the error's text the OpenLineage failure event's (whose own redaction may predate the
    Variables the task read)."""
    from airflow_volcano.observability.masking import JobSecrets

    redact = JobSecrets.of(outcome.job).redact
    if outcome.verdict is Verdict.DELETED:
        raise VolcanoJobError(redact(f"{outcome.message} while the task waited"))
    if outcome.verdict is Verdict.WAIT_FAILED:
        raise VolcanoJobError(redact(f"Waiting for Volcano Job {ref.namespace}/{ref.name} failed: {outcome.message}"))
    if outcome.verdict is Verdict.DEADLINE:
        raise VolcanoJobError(redact(f"Volcano Job {ref.namespace}/{ref.name}: {outcome.message} while the task was "
                                     "deferred"))
    if push_xcom is not None:
        push_xcom("phase", outcome.phase)
    if outcome.log_cursor.resumed_from:
        log.info("The training resumed from checkpoint %s (Volcano restarts so far: %d)",
                 outcome.log_cursor.resumed_from, job_state(outcome.job or {}).retry_count)
    figures = report_goodput(ref, outcome, metric_tags)
    if outcome.succeeded:
        result, image, digest = main_result(hook, ref)
        done = redact(summary(ref, outcome, result, figures, image, digest))
        record_panel(hook, ref, outcome, push_xcom, links=links)
        cleanup(hook, ref, succeeded=True, action=on_finish_action)
        return done
    explained = explain_failure(hook, ref, outcome)
    record_panel(hook, ref, outcome, push_xcom, links=links, failure=explained)
    if outcome.ends_the_job and ref.owned:
        # Past job_timeout, unable to start, or stalled: it must not run (and hold GPUs) later with
        # nobody watching it. Its main pod's last lines (a checkpoint saved on SIGTERM) come first.
        delete_job_and_script(hook, ref)
        if main_log is not None:
            follow_until_exit(hook, ref.namespace, main_log)
    else:
        cleanup(hook, ref, succeeded=False, action=on_finish_action)
    raise VolcanoJobError(redact(explained.message))
