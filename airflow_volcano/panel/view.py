"""What the "Volcano Job" panel of a task instance's page shows, as one JSON-able dict: the Job, why it
waits, its tasks and pods (the first failure marked), its progress, where its time went, the failure
report and stacks the task recorded, a pod's last log lines, the links. Pure: built from what was read
(the Job, its pods, its queue, a log's tail) or what the task recorded at its end (XCom), never a
credential, never an environment value: no pod spec is copied, and every text goes through `redact`.

The task records the same dict when it ends (`RECORD_KEY` in XCom): after the Job is deleted, the
panel shows that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from airflow_volcano.constants import PREEMPTIONS_ANNOTATION, TASK_LABEL
from airflow_volcano.observability.goodput import RunTimeline, goodput, phase_changes
from airflow_volcano.observability.logs import iter_lines, stamped_line
from airflow_volcano.status import PodLogTail, budget_text, failed_pods, first_failures, job_state, pod_problem
from airflow_volcano.timestamps import parse_time
from airflow_volcano.waiting.preemption import Preemption, recorded
from airflow_volcano.waiting.progress import PROGRESS_MARKER, Progress
from airflow_volcano.waiting.queueing import WaitingReport

RECORD_KEY = "volcano_panel"  # the XCom key of what the task recorded at its end
LOG_TAIL_LINES = 100  # a pod's last lines, as the panel shows them
LOG_TAIL_BYTES = 64 * 1024  # read at most this much of a pod's log for them

Redact = Callable[[Any], Any]


def job_summary(job: Mapping[str, Any], volcano_release: str | None = None,
                now: float | None = None, timeline: RunTimeline | None = None) -> dict[str, Any]:
    """The Job's identity and state, and its phases in order (its conditions, and the phases the waiter
    saw: `timeline`)."""
    metadata, spec = job.get("metadata") or {}, job.get("spec") or {}
    state = job_state(job)
    created = parse_time(metadata.get("creationTimestamp"))
    return {
        "namespace": metadata.get("namespace"), "name": metadata.get("name"), "uid": metadata.get("uid"),
        "phase": state.phase, "queue": spec.get("queue") or "default",
        "priority_class": spec.get("priorityClassName"), "volcano_release": volcano_release,
        "created": created, "age_seconds": None if created is None or now is None else max(0.0, now - created),
        "restarts": state.retry_count,
        "restart_budget": budget_text(state) if state.max_retry else None,  # what bounds them
        "timeline": [{"phase": phase, "at": at} for phase, at in phase_changes(job, timeline)],
    }


def preemption_rows(job: Mapping[str, Any], said: Sequence[Preemption] | None = None) -> list[dict[str, Any]]:
    """The Job's preemptions, oldest first, each its record and its text (as the task log said it): those
    the wait `said`, else those the waiters kept on the Job (its preemptions annotation; a sensor keeps
    none)."""
    if said is None:
        said = recorded(((job.get("metadata") or {}).get("annotations") or {}).get(PREEMPTIONS_ANNOTATION))
    return [preemption_row(preemption) for preemption in said]


def preemption_row(preemption: Preemption) -> dict[str, Any]:
    """A preemption as the panel shows it: its record, and its text."""
    return preemption.to_dict() | {"text": preemption.summary()}


def _redact_texts(value: Any, redact: Redact) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redact_texts(item, redact) for item in value]
    return value


# In place of the preemptor's name for a viewer who may not read this task's logs (which name it).
PREEMPTOR_NOT_SHOWN = "its name is in the task log"


def without_preemptors(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The preemption rows without the preemptors' names and priorities (another team's Jobs, perhaps)."""
    shown = []
    for row in rows:
        try:
            preemption = Preemption.from_dict(row)
        except (KeyError, TypeError, ValueError):
            continue
        if preemption.preemptor is not None or preemption.preemptor_priority is not None:
            preemption = dataclasses.replace(preemption, preemptor=None, preemptor_priority=None,
                                             unknown_why=PREEMPTOR_NOT_SHOWN)
        shown.append(preemption_row(preemption))
    return shown


def pod_rows(pods: Iterable[Mapping[str, Any]], main_task: str | None,
             logs: Mapping[str, PodLogTail] | None = None) -> list[dict[str, Any]]:
    """Every pod, by task: phase, node, restarts, exit code and reason, start and end; the pod that
    failed first (the likely cause of a cascade) marked."""
    pods = list(pods)
    problems = first_failures(failed_pods(pods, main_task), logs or {})
    first = problems[0].pod if problems else None
    rows = []
    for pod in pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        container = containers[0] if containers else {}
        state = container.get("state") or {}
        ended = state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}
        problem = pod_problem(pod)
        rows.append({
            "name": metadata.get("name"), "task": (metadata.get("labels") or {}).get(TASK_LABEL, ""),
            "phase": status.get("phase") or "Unknown", "node": (pod.get("spec") or {}).get("nodeName"),
            "restarts": sum(int(item.get("restartCount") or 0) for item in containers),
            "exit_code": ended.get("exitCode") if ended else None,
            "reason": (problem.reason if problem else None) or ended.get("reason") or (state.get("waiting") or {})
            .get("reason"),
            "started": parse_time((state.get("running") or {}).get("startedAt") or ended.get("startedAt")
                                  or status.get("startTime")),
            "finished": parse_time(ended.get("finishedAt")),
            "first_failure": metadata.get("name") == first and len(problems) > 0,
        })
    return sorted(rows, key=lambda row: (row["task"] != main_task, row["task"], row["name"] or ""))


def log_tail(pod: str, raw: bytes | Iterable[bytes], redact: Redact) -> dict[str, Any]:
    """A pod's last lines as the task log shows them: escaped (no control characters), the provider's
    own lines (heartbeats, stack requests) left out, secrets masked."""
    lines = PodLogTail.from_raw(iter_lines([raw] if isinstance(raw, bytes) else raw)).lines[-LOG_TAIL_LINES:]
    return {"pod": pod, "lines": [redact(line) for line in lines]}


def progress_from_log(raw: bytes | Iterable[bytes]) -> Progress | None:
    """The progress the main pod's recent log reports (its progress lines, read with timestamps)."""
    progress: Progress | None = None
    for raw_line in iter_lines([raw] if isinstance(raw, bytes) else raw):
        if (line := stamped_line(raw_line)) is None:
            continue
        at, message = line
        if PROGRESS_MARKER in message:
            progress = progress or Progress()
            progress.observe(message, at)
    return progress if progress is not None and progress.first_done is not None else None


def panel(
    *,
    job: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]] = (),
    main_task: str | None = None,
    logs: Mapping[str, PodLogTail] | None = None,
    volcano_release: str | None = None,
    now: float | None = None,
    waiting: WaitingReport | None = None,
    progress: Progress | None = None,
    timeline: RunTimeline | None = None,
    failure: str | None = None,
    stacks: Sequence[str] = (),
    log: Mapping[str, Any] | None = None,
    links: Mapping[str, str] | None = None,
    redact: Redact = lambda value: value,
    preemptions: Sequence[Preemption] | None = None,
) -> dict[str, Any]:
    """The panel's data. A Job still running has its time so far (to `now`). `logs`: the failed pods' log
    tails, which tell the pod that failed first from its peers within a second (as the failure report).
    `preemptions`: as the wait said them (None: as kept on the Job)."""
    summary = job_summary(job, volcano_release, now, timeline) if job is not None else None
    spent = None
    kept = preemption_rows(job, preemptions) if job is not None else []
    if job is not None:
        # Read from the cluster (no waiter's timeline): its preemptions are those kept on the Job.
        timeline = timeline or RunTimeline(preempted=[row["at"] for row in kept])
        running = not job_state(job).finished and now is not None and timeline.ended_at is None
        so_far = dataclasses.replace(timeline, ended_at=now) if running else timeline
        figures = goodput(job, so_far, progress)
        spent = figures.result() if figures is not None else None
    name = f"{summary['namespace']}/{summary['name']}" if summary else None
    return {
        "job": summary,
        "waiting": redact(waiting.describe(name or "")) if waiting is not None and name else None,
        "preemptions": [{key: _redact_texts(value, redact) for key, value in row.items()} for row in kept],
        "pods": pod_rows(pods, main_task, logs),
        "progress": progress.result() | {"text": progress.describe()} if progress is not None else None,
        "goodput": spent,
        "failure": redact(failure) if failure else None,
        "stacks": [redact(line) for line in stacks],
        "log": dict(log) if log is not None else None,
        "links": dict(links or {}),
    }
