"""Copying pods' logs into the task log from a worker: each line once, in order, shown with the time the
pod printed it (the triggerer copies with the same cursor, see triggers/job.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import STARTED_POD_PHASES
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.observability.logs import LineEmit, LogCursor, LogFollower, emit_new_lines, iter_lines

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")
# After the Job is deleted, its main pod's last lines (a script saving a checkpoint on SIGTERM) are
# followed until it has exited: its grace period and this much more at most.
EXIT_MARGIN_SECONDS = 5.0
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' own terminationGracePeriodSeconds


def printed_at(nanoseconds: int | None) -> datetime | None:
    """When the pod printed a line, as the time a task log line shows (an aware datetime: Airflow's
    log supervisor takes nothing else)."""
    return datetime.fromtimestamp(nanoseconds / 1e9, UTC) if nanoseconds else None


def pod_line_emit(logger: Any, pod: str) -> LineEmit:
    """Each copied line into the task log as `[pod] text`, stamped with the time the pod printed it."""
    def emit(message: str, at_ns: int | None) -> None:
        if (at := printed_at(at_ns)) is not None:
            logger.info("[%s] %s", pod, message, timestamp=at)
        else:
            logger.info("[%s] %s", pod, message)

    return emit


@dataclass
class PodLogCopy:
    """One pod's log copied into the task log: where to read it, where it goes, how far it got."""

    pod: str
    container: str | None
    emit: LineEmit
    cursor: LogCursor = field(default_factory=LogCursor)


def main_log_copy(ref: JobRef, logger: Any, cursor: LogCursor | None = None) -> PodLogCopy:
    return PodLogCopy(ref.main_pod, ref.main_pod_container, pod_line_emit(logger, ref.main_pod),
                      cursor or LogCursor())


def log_copies(logger: Any, pods: list[tuple[str, str | None]],
               cursors: dict[str, LogCursor] | None = None) -> list[PodLogCopy]:
    """A copy into the task log (`logger`'s) of each of `pods` (pod, container), in order, each line
    prefixed with its pod and stamped with the time the pod printed it; from `cursors`' place where it
    has one (what an earlier copy, the trigger's, got to)."""
    cursors = cursors or {}
    return [PodLogCopy(pod, container, pod_line_emit(logger, pod), cursors.get(pod) or LogCursor())
            for pod, container in pods]


def pod_log_stream(hook: VolcanoHook, namespace: str, copy: PodLogCopy) -> Callable[[float | None], Any]:
    """What a LogFollower opens: the pod's log followed from the epoch time `since`; LookupError while
    the pod has not started (nothing to see yet)."""
    def open_stream(since: float | None) -> Any:
        pod = hook.get_pod(copy.pod, namespace)
        phase = ((pod or {}).get("status") or {}).get("phase")
        if phase not in STARTED_POD_PHASES:
            raise LookupError(f"pod {copy.pod} is not running yet ({phase or 'absent'})")
        return hook.stream_pod_log(copy.pod, namespace, container=copy.container, since=since)

    return open_stream


def read_remaining_log(hook: VolcanoHook, namespace: str, copy: PodLogCopy) -> None:
    """Show whatever the pod's log holds that its cursor has not shown (nothing if it cannot be read).
    Streamed and split like every other read: one chunk in memory, each line bounded and escaped."""
    try:
        chunks = hook.pod_log_chunks(copy.pod, namespace, container=copy.container,
                                     since=copy.cursor.last_line_at)
        emit_new_lines(iter_lines(chunks), copy.cursor, copy.emit)
    except VolcanoApiError as error:
        if error.status != 404:
            log.warning("Could not read the log of pod %s/%s: %s", namespace, copy.pod, error)
        else:  # not a fault: Volcano removes the pods still running when a Job ends (a worker failed, say)
            log.info("Pod %s/%s is gone, and its log with it (Volcano removes the pods still running when a Job "
                     "ends)", namespace, copy.pod)
    except Exception as error:  # noqa: BLE001 - a missing log must not hide the Job's result
        log.warning("Could not read the log of pod %s/%s: %s", namespace, copy.pod, error)


def _exited(pod: dict | None, container: str | None) -> bool:
    """Whether the pod is gone, or its container has stopped (its log is complete)."""
    if pod is None:
        return True
    status = pod.get("status") or {}
    if status.get("phase") not in ("Pending", "Running"):
        return True
    return any(item.get("name") == container and (item.get("state") or {}).get("terminated")
               for item in status.get("containerStatuses") or [])


def follow_until_exit(hook: VolcanoHook, namespace: str, copy: PodLogCopy, *, poll: float = 1.0) -> None:
    """After the Job was deleted: keep copying the pod's log until its container has exited (a script's
    SIGTERM handler saving a checkpoint says so in its last lines), at most its grace period and
    EXIT_MARGIN_SECONDS more, so those lines come before the task's failure.

    The log is followed, as while waiting: a followed stream ends only after the container's last line.
    Reading it now and then instead lost that line (found on the real node: the kubelet removes a deleted
    pod moments after its container exits, between two reads, and its log with it)."""
    try:
        pod = hook.get_pod(copy.pod, namespace)
    except Exception:  # noqa: BLE001 - cannot tell
        pod = {"status": {"phase": "Running"}}  # taken as running: followed until the deadline at most
    if _exited(pod, copy.container):
        read_remaining_log(hook, namespace, copy)
        return
    grace = ((pod or {}).get("spec") or {}).get("terminationGracePeriodSeconds")
    deadline = time.monotonic() + float(DEFAULT_GRACE_SECONDS if grace is None else grace) + EXIT_MARGIN_SECONDS

    def exited() -> bool:
        try:
            return _exited(hook.get_pod(copy.pod, namespace), copy.container)
        except Exception:  # noqa: BLE001 - cannot tell: follow on (until the deadline)
            return False

    follower = LogFollower(pod_log_stream(hook, namespace, copy), copy.cursor, copy.emit, retry_interval=poll,
                           finished=exited)
    follower.start()
    follower.join(max(0.0, deadline - time.monotonic()))
    if follower.is_alive():  # past its grace period (its node out of reach, say): what can be read now
        follower.stop()
        read_remaining_log(hook, namespace, copy)
