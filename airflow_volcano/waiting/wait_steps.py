"""What a driver does at the cluster for the wait engine's actions, written once: programs of API calls
(`hooks.calls`) that the worker's hook runs blocking (`VolcanoHook.drive`) and the triggerer's on its
event loop (`AsyncVolcanoHook.drive`). Pure: they yield calls and sleeps, read no clock.

And the one dispatch both drivers use: STEPS, each action's step, a method of `DriverSteps` that each
driver implements (blocking in `wait_worker`, async in `triggers/job.py`), called by `step`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar, get_args

from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.calls import Program, Sleep
from airflow_volcano.job_ref import JobRef
from airflow_volcano.manifest import TENSORBOARD_TASK
from airflow_volcano.observability.logs import Emit, iter_lines, stamped_line
from airflow_volcano.waiting.stalls import (
    STACKS_MAX_BYTES,
    STACKS_POLL_SECONDS,
    STACKS_REQUEST_ANNOTATION,
    STACKS_WAIT_SECONDS,
    StackCollection,
    stall_notice,
)
from airflow_volcano.waiting.wait_engine import (
    BLIND,
    CheckPods,
    CollectStacks,
    DeletePods,
    PodRef,
    ProbeOutput,
    ReadClock,
    ReadQueue,
    RecordPreemptions,
    Reread,
    RestartJob,
    Step,
    Watch,
    restart_subjects,
    scheduling_subjects,
)

# A stacks read starts this long before the request: slack for the node's clock.
STACKS_READ_SLACK_SECONDS = 10.0
# A probe reads a pod's last line: this many bytes are plenty (a line longer is cut by the reader).
PROBE_MAX_BYTES = 64 * 1024


def scheduling_view(job: dict | None, pods: list[dict], action: CheckPods,
                    podgroup: dict | None = None) -> Program[tuple[dict | None, list[dict]]]:
    """For CheckPods: the PodGroup (read here unless given: a triggerer has it from its shared cache)
    and the events that explain scheduling (and a restart), when it asked for them."""
    if not action.scheduling or job is None:
        return None, []
    if podgroup is None:
        podgroup = yield from calls.get_podgroup(job)
    subjects = scheduling_subjects(podgroup, pods) | (restart_subjects(job) if action.restart else set())
    events = yield from calls.list_events(job["metadata"]["namespace"], subjects)
    return podgroup, events


def delete_lost_pods(namespace: str, pods: Iterable[PodRef], warn: Emit) -> Program[None]:
    """For DeletePods: each pod of a lost node, exactly as it was seen (uid), with no grace period (its
    kubelet cannot confirm: a graceful delete would leave it Terminating for good). A failure is said;
    the engine's next check tries again."""
    for pod in pods:
        try:
            yield from calls.delete_pod(pod.name, namespace, pod.uid, grace_seconds=0)
        except Exception as error:  # noqa: BLE001 - e.g. no permission to delete pods: the next check retries
            warn(f"Could not delete pod {namespace}/{pod.name} on a lost node: {error}")


def restart_gang(namespace: str, pods: Iterable[PodRef]) -> Program[str | None]:
    """For RestartJob: delete the Job's running training pods, gracefully (a script may save a
    checkpoint on SIGTERM); the Job's policies (PodEvicted -> RestartJob, or RestartTask) restart the
    gang, counted in max_retry like any restart. Returns why it was refused if no pod could be deleted."""
    refused: list[str] = []
    deleted = False
    for pod in pods:
        try:
            deleted |= yield from calls.delete_pod(pod.name, namespace, pod.uid)
        except Exception as error:  # noqa: BLE001 - the engine fails the stall with the reason
            refused.append(str(error))
    return refused[0] if refused and not deleted else None


def record_preemptions(ref: JobRef, annotations: dict[str, str]) -> Program[str | None]:
    """For RecordPreemptions: annotate the Job (this uid only). Returns why not, if it could not be."""
    try:
        kept = yield calls.annotate_job(ref.name, ref.namespace, annotations, uid=ref.uid or None)
    except Exception as error:  # noqa: BLE001 - e.g. no permission to patch Jobs: the engine says so
        return str(error)
    return None if kept else "the Job is gone"


def newest_line_stamp(data: bytes) -> int | None:
    """The timestamp (nanoseconds, the node's clock) of the last line of a log read with timestamps."""
    stamp = None
    for raw_line in iter_lines([data]):
        if (line := stamped_line(raw_line)) is not None:
            stamp = line[0]
    return stamp


def probe_output(namespace: str, pods: Iterable[tuple[str, str | None]]) -> Program[dict[str, Any]]:
    """For ProbeOutput: each pod's newest line's timestamp; None if it has no log (not started, gone),
    BLIND if the read failed (the apiserver cannot reach its kubelet, say)."""
    newest: dict[str, Any] = {}
    for pod, container in pods:
        try:
            data = yield calls.read_pod_log(pod, namespace, container=container, tail_lines=1,
                                            limit_bytes=PROBE_MAX_BYTES)
            newest[pod] = newest_line_stamp(data)
        except VolcanoApiError as error:
            # 404: gone; 400: its container has not started ("is waiting to start"): nothing to see.
            newest[pod] = None if error.status in (400, 404) else BLIND
        except Exception:  # noqa: BLE001 - no answer: the waiter cannot see it
            newest[pod] = BLIND
    return newest


def collect_stacks(ref: JobRef, silent_for: float, report: Emit,
                   requested_at: float) -> Program[tuple[str, tuple[PodRef, ...], list[str]]]:
    """For CollectStacks: ask every Running training pod for its Python stacks (the pod annotation its
    forward-signals.sh watches, set to `requested_at`, epoch seconds, as the request's id), read them
    from the pods' logs (at most STACKS_MAX_BYTES a read), show them; returns where each process was,
    briefly, the pods asked (what a restart deletes) and the report's lines."""
    report(stall_notice(ref.namespace, ref.name, silent_for))
    request = str(int(requested_at))
    collection = StackCollection.of((yield calls.list_job_pods(ref.name, ref.namespace)), request,
                                    skip_tasks=[TENSORBOARD_TASK])
    for pod, _container in collection.pods:
        try:
            if not (yield calls.annotate_pod(pod, ref.namespace, {STACKS_REQUEST_ANNOTATION: request})):
                collection.unreachable[pod] = "the pod is gone"
        except Exception as error:  # noqa: BLE001 - said in the report
            collection.unreachable[pod] = f"could not annotate it ({error})"
    polls = 0
    while collection.waiting_for() and polls * STACKS_POLL_SECONDS < STACKS_WAIT_SECONDS:
        yield Sleep(STACKS_POLL_SECONDS)
        polls += 1
        for pod, container in collection.waiting_for():
            try:  # from the request on (with slack: the node's clock is not ours): the answer comes after it
                data = yield calls.read_pod_log(pod, ref.namespace, container=container,
                                                since=requested_at - STACKS_READ_SLACK_SECONDS,
                                                limit_bytes=STACKS_MAX_BYTES)
            except Exception:  # noqa: BLE001 - a pod that cannot be read now may be read at the next poll
                continue
            collection.log_read(pod, [line.partition(" ")[2] for line in iter_lines([data])],
                                capped=len(data) >= STACKS_MAX_BYTES)
    lines = collection.report()
    for line in lines:
        report(line)
    running = tuple(PodRef(pod, collection.uids.get(pod, "")) for pod, _ in collection.pods
                    if pod not in collection.unreachable)
    return collection.where(), running, lines


# -- the one dispatch --------------------------------------------------------------------------------------

_Next = TypeVar("_Next")  # what a driver's step returns: the engine's next action, or an awaitable of it


class DriverSteps(ABC, Generic[_Next]):
    """What a driver does for each of the engine's actions but Done (which ends its wait), each returning the
    engine's next action: the worker's steps block (`_Next` is Action), the trigger's are coroutines (`_Next` an
    Awaitable of it). Both drivers dispatch through STEPS with `step`, so a new action is one row there, one
    method here and one in each driver; a driver class lacking one fails where it is defined, at import."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [method.__name__ for method in STEPS.values()
                   if getattr(getattr(cls, method.__name__), "__isabstractmethod__", False)]
        if missing:
            raise TypeError(f"{cls.__qualname__} does not do the wait steps {', '.join(missing)}")

    @abstractmethod
    def read_clock(self, action: ReadClock) -> _Next:
        """Read the apiserver's time; the engine's `clock_read`."""

    @abstractmethod
    def check_pods(self, action: CheckPods) -> _Next:
        """Read the Job's pods (and, when asked, what explains scheduling: `scheduling_view`); `pods_seen`."""

    @abstractmethod
    def read_queue(self, action: ReadQueue) -> _Next:
        """Read the queue the Job waits in; `queue_seen`."""

    @abstractmethod
    def watch(self, action: Watch) -> _Next:
        """Follow the Job's changes for up to `action.seconds`; `job_changed` / `job_deleted` / `watch_ended`."""

    @abstractmethod
    def reread(self, action: Reread) -> _Next:
        """Back off `action.after` seconds, read the Job again; `job_read` (or `job_unseen`)."""

    @abstractmethod
    def delete_pods(self, action: DeletePods) -> _Next:
        """`delete_lost_pods`; `pods_deleted`."""

    @abstractmethod
    def probe_output(self, action: ProbeOutput) -> _Next:
        """`probe_output`; `output_probed`."""

    @abstractmethod
    def collect_stacks(self, action: CollectStacks) -> _Next:
        """`collect_stacks`; `stacks_collected`."""

    @abstractmethod
    def restart_job(self, action: RestartJob) -> _Next:
        """`restart_gang`; `restart_requested`."""

    @abstractmethod
    def record_preemptions(self, action: RecordPreemptions) -> _Next:
        """`record_preemptions`; `preemptions_recorded`."""


# Each action's step: the one table both drivers dispatch from.
STEPS: dict[type[Step], Callable[..., Any]] = {
    ReadClock: DriverSteps.read_clock,
    CheckPods: DriverSteps.check_pods,
    ReadQueue: DriverSteps.read_queue,
    Watch: DriverSteps.watch,
    Reread: DriverSteps.reread,
    DeletePods: DriverSteps.delete_pods,
    ProbeOutput: DriverSteps.probe_output,
    CollectStacks: DriverSteps.collect_stacks,
    RestartJob: DriverSteps.restart_job,
    RecordPreemptions: DriverSteps.record_preemptions,
}
# An action without a step, or a step no action asks for, fails here, at import.
if set(STEPS) != set(get_args(Step)) or {method.__name__ for method in STEPS.values()} != \
        DriverSteps.__abstractmethods__:
    raise TypeError("wait_steps.STEPS must give each of wait_engine.Step's actions one of DriverSteps' methods")


def step(steps: DriverSteps[_Next], action: Step) -> _Next:
    """What `steps` (a driver's) does for `action`, by STEPS: the engine's next action (or an awaitable of it)."""
    method: Callable[[Step], _Next] = getattr(steps, STEPS[type(action)].__name__)
    return method(action)
