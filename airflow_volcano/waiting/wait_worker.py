"""Waiting for a Job in a worker: the blocking driver of the wait engine (`triggers/job.py` is the
asyncio one). It watches its one Job, follows the followed pods' logs on threads, keeps the failed
pods' last states, and carries out the engine's actions with the programs of `wait_steps`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog

from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.logs import Emit, LogFollower
from airflow_volcano.observability.pod_logs import PodLogCopy, pod_log_stream, read_remaining_log
from airflow_volcano.status import pod_problem, pod_view
from airflow_volcano.waiting import wait_steps
from airflow_volcano.waiting.events import WaitOutcome
from airflow_volcano.waiting.wait_engine import (
    RUNNING_WATCH_SECONDS,
    Action,
    CheckPods,
    CollectStacks,
    DeletePods,
    Done,
    FollowedLog,
    OutputClock,
    ProbeOutput,
    ReadClock,
    ReadQueue,
    RecordPreemptions,
    Reread,
    RestartJob,
    WaitEngine,
    WaitLimits,
    Watch,
)

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")


class PodRecorder(threading.Thread):
    """Watches the Job's pods while the worker waits: keeps each pod's last failed state
    (`status.pod_view`), and tells the run's timeline when each generation of pods was placed.
    Volcano removes the pods still running when it ends a Job, and the pod that failed first may be
    one of them: its exit code and its log tail (the termination message, FallbackToLogsOnError) are
    then known only from what was seen before it went; a restart replaces them all."""

    def __init__(self, hook: VolcanoHook, ref: JobRef, timeline: RunTimeline) -> None:
        super().__init__(name="volcano-pod-recorder", daemon=True)
        self.hook, self.ref, self.timeline = hook, ref, timeline
        self.failed: dict[str, dict] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                # One request per five minutes (each a fresh list of the Job's few pods, then changes).
                for pod in self.hook.watch_job_pods(self.ref.name, self.ref.namespace,
                                                    timeout_seconds=int(RUNNING_WATCH_SECONDS),
                                                    stop=self._stop_event.is_set):
                    self.timeline.pod_seen(pod)
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
    probed: Sequence[tuple[str, str | None]] = (),
    report: Emit | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> WaitOutcome:
    """Watch the Job until it finishes, a deadline passes, a pod shows it cannot start, or it stalls.

    Follows each pod log of `logs` on a background thread while waiting (the main pod's first: its
    cursor becomes the outcome's); `probed` are pods whose output counts for stall_timeout without
    being copied. `report` (if given) is told each change of phase and the scheduler's reason. `clock`:
    the waiter's own, monotonic (the engine's `now`).
    """
    output = OutputClock()
    followers = []
    for copy in logs:
        output.expected(f"log:{copy.pod}", clock())  # blind until its first read
        followers.append(LogFollower(pod_log_stream(hook, ref.namespace, copy), copy.cursor, copy.emit,
                                     output=output, source=f"log:{copy.pod}", clock=clock))
    followed = (*(FollowedLog(copy.pod, copy.container, copy.cursor) for copy in logs),
                *(FollowedLog(pod, container) for pod, container in probed))
    for follower in followers:
        follower.start()
    timeline = RunTimeline()
    recorder = PodRecorder(hook, ref, timeline)
    recorder.start()
    try:
        outcome = _drive(hook, ref, limits, clock, report or (lambda line: None), output, followed, timeline)
    finally:
        for follower in followers:
            follower.stop()
        failed = recorder.stop()
    for copy in logs:
        read_remaining_log(hook, ref.namespace, copy)
    return dataclasses.replace(outcome, failed_pods=failed | outcome.failed_pods,
                               log_cursor=logs[0].cursor if logs else outcome.log_cursor)


def read_server_clock(hook: VolcanoHook, clock: Callable[[], float]) -> tuple[float | None, float]:
    """The apiserver's epoch time (its Date header; None if it cannot be read) and the waiter's `clock`
    when it was read (the middle of the request)."""
    before = clock()
    try:
        date = hook.run(calls.read_server_date())
    except Exception:  # noqa: BLE001 - unknown: the engine decides nothing on it and asks again
        date = None
    return calls.server_time(date), (before + clock()) / 2


def _read_job(hook: VolcanoHook, engine: WaitEngine, ref: JobRef, clock: Callable[[], float]) -> Action:
    """Read the Job for the engine; a resource the apiserver does not serve is "cannot see", not "gone"."""
    try:
        job = hook.get_job(ref.name, ref.namespace)
    except VolcanoApiError as error:
        if not error.not_served:
            raise
        return engine.job_unseen(str(error), clock())
    return engine.job_read(job, clock())


class _BlockingSteps(wait_steps.DriverSteps[Action]):
    """The worker's steps for the engine's actions (dispatched by `wait_steps.step`): blocking calls
    through the sync hook, the waiter's own clock."""

    def __init__(self, hook: VolcanoHook, ref: JobRef, engine: WaitEngine, clock: Callable[[], float],
                 report: Emit) -> None:
        self.hook, self.ref, self.engine, self.clock, self.report = hook, ref, engine, clock, report

    def read_clock(self, action: ReadClock) -> Action:
        return self.engine.clock_read(*read_server_clock(self.hook, self.clock))

    def check_pods(self, action: CheckPods) -> Action:
        pods = self.hook.list_job_pods(self.ref.name, self.ref.namespace)
        podgroup, events = self.hook.drive(wait_steps.scheduling_view(self.engine.job, pods, action))
        return self.engine.pods_seen(pods, podgroup, events, self.clock())

    def read_queue(self, action: ReadQueue) -> Action:
        return self.engine.queue_seen(self.hook.drive(calls.queue_snapshot(action.queue, self.ref.namespace)),
                                      self.clock())

    def watch(self, action: Watch) -> Action:
        next_action: Action | None = None
        changes = self.hook.watch_job(self.ref.name, self.ref.namespace, resource_version=action.resource_version,
                                      timeout_seconds=action.seconds)
        try:
            for kind, job in changes:
                if kind == "DELETED":
                    next_action = self.engine.job_deleted((job.get("metadata") or {}).get("uid"), self.clock())
                else:
                    next_action = self.engine.job_changed(job, self.clock())
                if next_action is not None:
                    break
        finally:
            changes.close()  # ends the watch request now, not when garbage-collected
        return next_action if next_action is not None else self.engine.watch_ended(self.clock())

    def reread(self, action: Reread) -> Action:
        time.sleep(action.after)
        return _read_job(self.hook, self.engine, self.ref, self.clock)

    def delete_pods(self, action: DeletePods) -> Action:
        self.hook.drive(wait_steps.delete_lost_pods(self.ref.namespace, action.pods, log.warning))
        return self.engine.pods_deleted(self.clock())

    def probe_output(self, action: ProbeOutput) -> Action:
        return self.engine.output_probed(self.hook.drive(wait_steps.probe_output(self.ref.namespace, action.pods)),
                                         self.clock())

    def collect_stacks(self, action: CollectStacks) -> Action:
        where, running, lines = self.hook.drive(
            wait_steps.collect_stacks(self.ref, action.silent_for, self.report, action.requested_at))
        return self.engine.stacks_collected(where, self.clock(), running, lines)

    def restart_job(self, action: RestartJob) -> Action:
        refused = self.hook.drive(wait_steps.restart_gang(self.ref.namespace, action.pods))
        return self.engine.restart_requested(self.clock(), refused)

    def record_preemptions(self, action: RecordPreemptions) -> Action:
        refused = self.hook.drive(wait_steps.record_preemptions(self.ref, action.annotations))
        return self.engine.preemptions_recorded(refused, self.clock())


def _drive(hook: VolcanoHook, ref: JobRef, limits: WaitLimits, clock: Callable[[], float], report: Emit,
           output: OutputClock, followed: tuple[FollowedLog, ...], timeline: RunTimeline | None = None) -> WaitOutcome:
    """The engine's actions, carried out blocking."""
    server_time, read_at = read_server_clock(hook, clock)
    engine = WaitEngine(ref, limits, report=report, output=output, followed=followed, timeline=timeline,
                        server_offset=None if server_time is None else server_time - read_at,
                        epoch_offset=time.time() - clock())
    steps = _BlockingSteps(hook, ref, engine, clock, report)
    action = _read_job(hook, engine, ref, clock)
    while not isinstance(action, Done):
        action = wait_steps.step(steps, action)
    return action.outcome
