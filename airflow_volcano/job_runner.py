"""Submit a Volcano Job, wait for it, and finalize it: the one path the operator, the sensor and
the deferred resume all share (logs, XCom, cleanup, error text).

No Airflow operator state lives here: callers pass what they know, so the same code runs in a
worker after `execute` and after a trigger fires.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEBUG_ANNOTATION,
    ENDED_POD_PHASES,
    STARTED_POD_PHASES,
    OnFinishAction,
    PodPhase,
)
from airflow_volcano.exceptions import VolcanoApiError, VolcanoJobError
from airflow_volcano.job_ref import JobRef
from airflow_volcano.logs import Emit, LogCursor, LogFollower, emit_new_lines, iter_lines
from airflow_volcano.manifest import TENSORBOARD_TASK, task_pods
from airflow_volcano.stalls import STACKS_POLL_SECONDS, STACKS_REQUEST_ANNOTATION, STACKS_WAIT_SECONDS, StackCollection
from airflow_volcano.status import (
    LOG_SCAN_LINES,
    Outcome,
    PodLogTail,
    failed_pods,
    failure_message,
    job_state,
    pod_problem,
    pod_view,
    termination_result,
    unstarted_pods,
)
from airflow_volcano.wait_engine import (
    RUNNING_WATCH_SECONDS,
    Action,
    CheckPods,
    CollectStacks,
    DeletePods,
    Done,
    Reread,
    RestartJob,
    WaitEngine,
    WaitLimits,
    WaitResult,
    Watch,
    scheduling_subjects,
    startup_problem,
)

if TYPE_CHECKING:
    # Type hints only: the trigger imports this module, and the triggerer must not load the
    # Kubernetes clients inside its event loop (see VolcanoJobTrigger._hook).
    from airflow_volcano.hooks.volcano import VolcanoHook

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")
# How many troubled pods' events a failure report reads (one request each).
EVENT_PODS = 5
# How long a cleanup keeps retrying an apiserver it cannot reach before the task fails (and its next
# try, if any, reattaches and cleans up).
CLEANUP_RETRY_SECONDS = 120.0


def task_state_key(task_id: str, map_index: int | None) -> str:
    """How Airflow's get_task_states names a task instance: mapped ones carry their index."""
    return task_id if map_index is None or map_index < 0 else f"{task_id}_{map_index}"


@dataclass
class PodLogCopy:
    """One pod's log copied into the task log: where to read it, where it goes, how far it got."""

    pod: str
    container: str | None
    emit: Emit
    cursor: LogCursor = field(default_factory=LogCursor)


def main_log_copy(ref: JobRef, emit: Emit, cursor: LogCursor | None = None) -> PodLogCopy:
    return PodLogCopy(ref.main_pod, ref.main_pod_container, emit, cursor or LogCursor())


def pod_log_stream(hook: VolcanoHook, namespace: str, copy: PodLogCopy) -> Callable[[int | None], Any]:
    def open_stream(since_seconds: int | None) -> Any:
        pod = hook.get_pod(copy.pod, namespace)
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase not in STARTED_POD_PHASES:
            raise LookupError(f"pod {copy.pod} is not running yet ({phase or 'absent'})")
        return hook.stream_pod_log(copy.pod, namespace, container=copy.container, since_seconds=since_seconds)

    return open_stream


def read_remaining_log(hook: VolcanoHook, namespace: str, copy: PodLogCopy) -> None:
    """Show whatever the pod's log holds that its cursor has not shown (nothing if it cannot be read).
    Streamed and split like every other read: one chunk in memory, each line bounded and escaped."""
    try:
        chunks = hook.pod_log_chunks(copy.pod, namespace, container=copy.container,
                                     since_seconds=copy.cursor.since_seconds())
        emit_new_lines(iter_lines(chunks), copy.cursor, copy.emit)
    except VolcanoApiError as error:
        if error.status != 404:
            log.warning("Could not read the log of pod %s/%s: %s", namespace, copy.pod, error)
        else:  # not a fault: Volcano removes the pods still running when a Job ends (a worker failed, say)
            log.info("Pod %s/%s is gone, and its log with it (Volcano removes the pods still running when a Job "
                     "ends)", namespace, copy.pod)
    except Exception as error:  # noqa: BLE001 - a missing log must not hide the Job's result
        log.warning("Could not read the log of pod %s/%s: %s", namespace, copy.pod, error)


class PodFailureRecorder(threading.Thread):
    """Watches the Job's pods while the worker waits and keeps each pod's last failed state
    (`status.pod_view`). Volcano removes the pods still running when it ends a Job, and the pod
    that failed first may be one of them: its exit code and its log tail (the termination message,
    FallbackToLogsOnError) are then known only from what was seen before it went."""

    def __init__(self, hook: VolcanoHook, ref: JobRef) -> None:
        super().__init__(name="volcano-pod-failures", daemon=True)
        self.hook, self.ref = hook, ref
        self.failed: dict[str, dict] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                # One request per five minutes (each a fresh list of the Job's few pods, then changes).
                for pod in self.hook.watch_job_pods(self.ref.name, self.ref.namespace,
                                                    timeout_seconds=int(RUNNING_WATCH_SECONDS),
                                                    stop=self._stop_event.is_set):
                    view = pod_view(pod)
                    if pod_problem(view) is not None:
                        self.failed[view["metadata"]["name"]] = view
            except Exception:  # noqa: BLE001 - a dropped watch: watch again (a missed failure is still listed)
                pass
            self._stop_event.wait(1.0)

    def stop(self) -> dict[str, dict]:
        """The failures seen; the thread ends at its watch's next event or timeout (a daemon)."""
        self._stop_event.set()
        return dict(self.failed)


def wait_for_job(
    hook: VolcanoHook,
    ref: JobRef,
    limits: WaitLimits,
    *,
    logs: Sequence[PodLogCopy] = (),
    report: Emit | None = None,
    clock: Callable[[], float] = time.time,
) -> WaitResult:
    """Watch the Job until it finishes, a deadline passes, or a pod shows it cannot start.

    Follows each pod log of `logs` on a background thread while waiting (the master's first:
    its cursor becomes the result's), and tells `report` (if given) each change of phase and the
    scheduler's reason while Pending.
    """
    followers = [LogFollower(pod_log_stream(hook, ref.namespace, copy), copy.cursor, copy.emit) for copy in logs]
    for follower in followers:
        follower.start()
    failures = PodFailureRecorder(hook, ref)
    failures.start()
    def last_output() -> float | None:
        return max((copy.cursor.last_line_at or 0.0 for copy in logs), default=0.0) or None

    try:
        result = _watch_until_done(hook, ref, limits, clock, report or (lambda line: None), last_output)
    finally:
        for follower in followers:
            follower.stop()
        result_failures = failures.stop()
    result.failed_pods = result_failures
    for copy in logs:
        read_remaining_log(hook, ref.namespace, copy)
    if logs:
        result.log_cursor = logs[0].cursor
    return result


def _watch_until_done(hook: VolcanoHook, ref: JobRef, limits: WaitLimits, clock: Callable[[], float],
                      report: Emit, last_output: Callable[[], float | None]) -> WaitResult:
    """The blocking driver of the wait engine (the trigger is the asyncio one)."""
    engine = WaitEngine(ref, limits, started_at=ref.created_at or clock(), report=report, last_output=last_output)
    action: Action | None = engine.job_read(hook.get_job(ref.name, ref.namespace), clock())
    while True:
        match action:
            case Done(result=result):
                if result.deleted:
                    raise VolcanoJobError(f"{result.deleted} while the task waited")
                return result
            case CheckPods(scheduling=scheduling):
                pods = hook.list_job_pods(ref.name, ref.namespace)
                podgroup = hook.get_podgroup(engine.job) if scheduling and engine.job else None
                events = hook.list_events(ref.namespace, scheduling_subjects(podgroup, pods)) if scheduling else []
                action = engine.pods_seen(pods, podgroup, events, clock())
            case Watch(resource_version=resource_version, seconds=seconds):
                action = None
                changes = hook.watch_job(ref.name, ref.namespace, resource_version=resource_version,
                                         timeout_seconds=seconds)
                try:
                    for job in changes:
                        if (action := engine.job_changed(job, clock())) is not None:
                            break
                finally:
                    changes.close()  # ends the watch request now, not when garbage-collected
                if action is None:
                    action = engine.watch_ended(clock())
            case Reread(after=after):
                time.sleep(after)
                action = engine.job_read(hook.get_job(ref.name, ref.namespace), clock())
            case DeletePods(pods=pods):
                for pod in pods:
                    try:
                        hook.delete_lost_pod(pod, ref.namespace)
                    except VolcanoApiError as error:  # e.g. no permission to delete pods: the check retries
                        log.warning("Could not delete pod %s/%s on a lost node: %s", ref.namespace, pod, error)
                action = engine.pods_deleted(clock())
            case CollectStacks(silent_for=silent_for):
                action = engine.stacks_collected(collect_stacks(hook, ref, report, silent_for), clock())
            case RestartJob():
                try:
                    hook.restart_job(engine.job or {})
                except (VolcanoApiError, KeyError) as error:
                    log.warning("Could not restart Volcano Job %s/%s: %s", ref.namespace, ref.name, error)
                action = engine.restart_requested(clock())


def stall_notice(ref: JobRef, silent_for: float) -> str:
    return (f"Volcano Job {ref.namespace}/{ref.name} gave no output and no change for {silent_for:.0f}s "
            "(stall_timeout): asking its pods for their Python stacks")


def collect_stacks(hook: VolcanoHook, ref: JobRef, report: Emit, silent_for: float) -> str:
    """A stall: ask every Running training pod for its Python stacks (a pod annotation its
    forward-signals.sh watches), read them from the pods' logs, show them; returns where each
    process was, briefly. The trigger's `_collect_stacks` is the asyncio twin."""
    report(stall_notice(ref, silent_for))
    asked_at = time.time()
    collection = StackCollection.of(hook.list_job_pods(ref.name, ref.namespace), str(int(asked_at)),
                                    skip_tasks=[TENSORBOARD_TASK])
    for pod, _container in collection.pods:
        try:
            if not hook.annotate_pod(pod, ref.namespace, {STACKS_REQUEST_ANNOTATION: collection.request}):
                collection.unreachable[pod] = "the pod is gone"
        except VolcanoApiError as error:
            collection.unreachable[pod] = f"could not annotate it ({error})"
    deadline = time.monotonic() + STACKS_WAIT_SECONDS
    while collection.waiting_for() and time.monotonic() < deadline:
        time.sleep(STACKS_POLL_SECONDS)
        for pod, container in collection.waiting_for():
            try:
                chunks = hook.pod_log_chunks(pod, ref.namespace, container=container,
                                             since_seconds=int(time.time() - asked_at) + 5)
                collection.log_read(pod, [line.partition(" ")[2] for line in iter_lines(chunks)])
            except Exception:  # noqa: BLE001 - a pod that cannot be read now may be read at the next poll
                pass
    for line in collection.report():
        report(line)
    return collection.where()


def wait_until_running(
    hook: VolcanoHook,
    ref: JobRef,
    pods: list[str],
    limits: WaitLimits,
) -> None:
    """Return once every named pod runs (debug mode); raise with the reason if one cannot start.

    Polled, not watched: it lasts seconds, and pods, not the Job, say whether they run."""
    started = time.monotonic()
    while True:
        found = hook.list_job_pods(ref.name, ref.namespace)
        running = {pod["metadata"]["name"] for pod in found
                   if (pod.get("status") or {}).get("phase") == PodPhase.RUNNING}
        if set(pods) <= running:
            return
        ended = [pod["metadata"]["name"] for pod in found
                 if (pod.get("status") or {}).get("phase") in ENDED_POD_PHASES]
        if ended:
            raise VolcanoJobError(f"Volcano Job {ref.namespace}/{ref.name}: pod {ended[0]} ended before debugging "
                                  "could start (its image has no /bin/sh?)")
        job = hook.get_job(ref.name, ref.namespace)
        podgroup = hook.get_podgroup(job) if job is not None else None
        problem = startup_problem(ref, found, podgroup, limits, time.monotonic() - started)
        if problem is not None:
            raise VolcanoJobError(problem)
        time.sleep(limits.poll_interval)


def debug_session(hook: VolcanoHook, ref: JobRef, job: dict, limits: WaitLimits, seconds: float) -> dict[str, Any]:
    """Debug mode: once every pod runs, say how to open a shell in each and what it would have run,
    keep the pods up for `seconds` (or until the Job is deleted: a kill of the task does that),
    then delete the Job. Returns the task's summary."""
    job = {**job, "metadata": {**job["metadata"], "name": ref.name}}  # a reattached Job has its own name
    pods = task_pods(job, [task["name"] for task in job["spec"]["tasks"] if task["name"] != TENSORBOARD_TASK],
                     "debug")
    try:
        wait_until_running(hook, ref, [name for name, _ in pods], limits)
        annotations = {task["name"]: (task["template"].get("metadata") or {}).get("annotations") or {}
                       for task in job["spec"]["tasks"]}
        commands = {task: json.loads(values[DEBUG_ANNOTATION]) for task, values in annotations.items()
                    if DEBUG_ANNOTATION in values}
        log.info("Debug mode: %d pod(s) of Volcano Job %s/%s are up and sleeping instead of training; for %.0fs (mark "
                 "this task success or failed to end sooner). Open a shell in one with:", len(pods), ref.namespace,
                 ref.name, seconds)
        for name, container in pods:
            task = name[len(ref.name) + 1:].rsplit("-", 1)[0]
            if task not in commands:  # e.g. a DeepSpeed worker's sshd, which the launcher needs
                log.info("  %s runs its command as usual", name)
                continue
            command = commands[task]
            log.info("  kubectl exec -it -n %s %s -c %s -- bash   # then: %s", ref.namespace, name, container,
                     shlex.join(command) if command else "the image's entrypoint")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if hook.get_job(ref.name, ref.namespace) is None:
                log.info("Volcano Job %s/%s was deleted: debug session over", ref.namespace, ref.name)
                break
            time.sleep(min(limits.poll_interval, max(0.0, deadline - time.monotonic())))
    finally:
        delete_job_and_script(hook, ref)
    return {"job_name": ref.name, "namespace": ref.namespace, "phase": "Debug", "master_pod": ref.main_pod,
            "pods": [name for name, _ in pods]}


def delete_if_still_running(hook: VolcanoHook, ref: JobRef) -> None:
    """When no later try will reattach: delete the Job if it still runs (or waits to), so nothing trains
    (and holds GPUs) unwatched; a finished Job is left to on_finish_action. Never raises: the task's own
    error is the one to report."""
    try:
        job = hook.get_job(ref.name, ref.namespace)
    except Exception:  # noqa: BLE001 - cannot tell whether it still runs: delete it rather than leave it running
        job = {}
    if job is None or (job and job_state(job).finished):
        return  # gone, or finished: on_finish_action has had its say
    log.info("No later try of this task will reattach: deleting Volcano Job %s/%s (%s), which would otherwise run "
             "unwatched", ref.namespace, ref.name, job_state(job).phase if job else "unreadable")
    try:
        delete_job_and_script(hook, ref)
    except Exception as error:  # noqa: BLE001 - see above
        log.error("Could not delete Volcano Job %s/%s (%s): delete it by hand (kubectl -n %s delete vcjob %s)",
                  ref.namespace, ref.name, error, ref.namespace, ref.name)


# ---------------------------------------------------------------------------------------------
# finalize
# ---------------------------------------------------------------------------------------------


def explain_failure(hook: VolcanoHook, ref: JobRef, result: WaitResult) -> str:
    """Final phase, the pod that failed first with its exit code, reason and last log lines, the
    pods that failed after it, warnings."""
    pods: list[dict] = []
    events: list[dict] = []
    try:
        pods = hook.list_job_pods(ref.name, ref.namespace)
        # Failed pods seen during the wait that Volcano has removed since (their last state).
        listed = {pod["metadata"]["name"] for pod in pods}
        pods += [view for name, view in result.failed_pods.items() if name not in listed]
        podgroup = hook.get_podgroup(result.job) if result.job is not None else None
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
    if result.timed_out:
        headline = f"Volcano Job {ref.namespace}/{ref.name} failed: {result.timed_out}; the Job was deleted"
    elif result.stalled:
        headline = (f"Volcano Job {ref.namespace}/{ref.name} {result.stalled}; the Job was deleted (the stacks are "
                    "in the task log above)")
    elif result.problem:
        headline = f"{result.problem}; the Job was deleted"
    message = failure_message(result.state, pods=pods, events=events, main_task=ref.main_task, logs=logs,
                              log_pod=ref.main_pod, headline=headline, lost_nodes=result.lost_nodes)
    if result.stalls and not result.stalled:
        message += (f"\nThe Job stalled {result.stalls} time(s) (no output for stall_timeout) and was restarted each "
                    "time (stall_action='restart')")
    return message


def main_result(hook: VolcanoHook, ref: JobRef) -> Any:
    """The master's termination message (JSON if it parses): how a training script hands metrics
    or a model URI to the next task. Read before cleanup deletes the pod."""
    try:
        return termination_result(hook.get_pod(ref.main_pod, ref.namespace), ref.main_pod_container)
    except Exception as error:  # noqa: BLE001 - a missing result must not hide a finished Job
        log.warning("Could not read the termination message of master pod %s/%s: %s", ref.namespace,
                    ref.main_pod, error)
        return None


def cleanup(hook: VolcanoHook, ref: JobRef, *, succeeded: bool, action: OnFinishAction) -> bool:
    """Apply `on_finish_action`; returns whether the Job was deleted. A Job kept is labelled as
    reported, so no later try takes it for its own; a Job to delete is not labelled first: if the
    delete fails, the task fails, and its next try reattaches to the finished Job and deletes it
    (never trains again, never leaves it behind)."""
    delete = action is OnFinishAction.DELETE_JOB or (action is OnFinishAction.DELETE_SUCCEEDED_JOB and succeeded)
    if not delete:
        log.info("Keeping Volcano Job %s/%s (on_finish_action=%s)", ref.namespace, ref.name, action.value)
        mark_reported(hook, ref)
        return False
    delete_job_and_script(hook, ref)
    return True


def mark_reported(hook: VolcanoHook, ref: JobRef) -> None:
    """Label a kept Job as reported by this try: a later try of the task must not pick it up again."""
    if ref.owned:
        hook.label_job(ref.name, ref.namespace, {CHECKED_LABEL: "true"})


def delete_job_and_script(hook: VolcanoHook, ref: JobRef) -> None:
    """Delete the Job (its pods, PodGroup, Service go with it), retrying an unreachable apiserver for
    up to CLEANUP_RETRY_SECONDS: a Job nobody deletes trains on unwatched."""
    hook.delete_job(ref.name, ref.namespace, retry_for=CLEANUP_RETRY_SECONDS)
    # The ConfigMap is owned by the Job, but a cluster without the garbage collector (or a Job that
    # was never created) would leave it behind: delete it explicitly.
    if ref.script_configmap:
        hook.delete_configmap(ref.script_configmap, ref.namespace)
    log.info("Deleted Volcano Job %s/%s", ref.namespace, ref.name)


def finalize(
    hook: VolcanoHook,
    ref: JobRef,
    result: WaitResult,
    *,
    on_finish_action: OnFinishAction,
    push_xcom: Callable[[str, Any], None] | None = None,
) -> dict[str, Any]:
    """Push the final phase, clean up, and return a summary or raise with the failure's reason."""
    succeeded = (result.state.outcome is Outcome.SUCCEEDED and not result.timed_out and not result.problem
                 and not result.stalled)
    if push_xcom is not None:
        push_xcom("phase", result.state.phase)
    summary = {
        "job_name": ref.name,
        "namespace": ref.namespace,
        "phase": result.state.phase,
        "master_pod": ref.main_pod,
        "retry_count": result.state.retry_count,
        "log_lines": result.log_cursor.lines_shown,
        "resumed_from": result.log_cursor.resumed_from,
        "result": main_result(hook, ref) if succeeded else None,
    }
    if result.log_cursor.resumed_from:
        log.info("The training resumed from checkpoint %s (Volcano restarts so far: %d)",
                 result.log_cursor.resumed_from, result.state.retry_count)
    if succeeded:
        cleanup(hook, ref, succeeded=True, action=on_finish_action)
        return summary
    message = explain_failure(hook, ref, result)
    if result.timed_out or result.problem or result.stalled:
        # A Job past its deadline, one that cannot start or one stalled must not run (and hold
        # GPUs) later with nobody watching it.
        delete_job_and_script(hook, ref)
    else:
        cleanup(hook, ref, succeeded=False, action=on_finish_action)
    raise VolcanoJobError(message)
