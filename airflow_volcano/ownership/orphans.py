"""Jobs no try of their task will ever watch again: left running (or finished and never cleaned up) because
the task instance ended while no process of it was alive to hear it. A worker killed outright, then the
task marked failed (or success) before Airflow retried it: nothing calls on_kill, no later try reattaches,
and the Job trains on unwatched, then stays (found by the chaos soak).

Each submission sweeps its namespace for such Jobs, before it submits its own. A Job is one only when
Airflow itself says so: the Job names its task instance (an annotation written at submission), Airflow
reports that task instance in a finished state, the Job was not kept on purpose (reported by a try, or
`on_kill_action="keep_job"`), and it is not being deleted already. Anything the sweep cannot read or
Airflow does not know is left alone. And not at first sight: a task instance just marked failed may still
have a process settling its Job (a worker's or a trigger's on_kill, whose delete retries for up to two
minutes), whose words the task log should keep (found by the chaos soak, when an immediate sweep beat a
trigger's on_kill). The first sweep to find it marks the Job (`orphaned-at`); one at least ORPHAN_GRACE
later, finding its task instance still finished, deletes it. A try that reattaches removes the mark.
Pure, but for `sweep_orphans`, which reads and deletes through the hook.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEPLOYMENT_LABEL,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    ORPHANED_AT_ANNOTATION,
    TASK_INSTANCE_ANNOTATION,
    OnKillAction,
)
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.ownership import state_in
from airflow_volcano.status import job_state
from airflow_volcano.timestamps import clock_text
from airflow_volcano.waiting.progress import duration_text

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook

log = structlog.get_logger(f"airflow.task.{__name__}")

# The task instance states no try follows without a user's "Clear" (Airflow's `State.finished`, less
# up_for_retry and up_for_reschedule, which a later try follows).
FINISHED_TASK_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})

# How long after a sweep first finds a Job orphaned a later one may delete it: beyond any process of its
# task still settling it (a kill's delete retries for CLEANUP_RETRY_SECONDS, 120 s), and beyond any skew
# between the clocks of the workers that mark and delete.
ORPHAN_GRACE = 300.0

# Airflow's answer to "what state are these task instances in": {run_id: {task_id or task_id_mapindex: state}}.
TaskStates = Callable[[str, list[str], list[str]], Mapping[str, Mapping[str, Any]]]


@dataclass(frozen=True)
class TaskInstanceId:
    """A task instance, exactly (labels hold sanitized, hashed forms), as its Job's annotation names it."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    def annotation(self, on_kill_action: str) -> str:
        return json.dumps({**asdict(self), "on_kill_action": str(on_kill_action)}, sort_keys=True)

    @classmethod
    def from_job(cls, job: Mapping[str, Any]) -> tuple[TaskInstanceId, str] | None:
        """The task instance a Job names and its on_kill_action; None when it names none (or not clearly)."""
        text = ((job.get("metadata") or {}).get("annotations") or {}).get(TASK_INSTANCE_ANNOTATION)
        try:
            value = json.loads(text) if isinstance(text, str) else {}
            ti = cls(str(value["dag_id"]), str(value["task_id"]), str(value["run_id"]), int(value["map_index"]))
            return ti, str(value["on_kill_action"])
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class Orphan:
    name: str
    namespace: str
    uid: str
    phase: str
    task_instance: TaskInstanceId
    task_state: str
    orphaned_at: float | None  # when a sweep first found it so (its mark), if one did

    def due(self, now: float) -> bool:
        """Whether it may be deleted now: marked at least ORPHAN_GRACE ago."""
        return self.orphaned_at is not None and now - self.orphaned_at >= ORPHAN_GRACE

    def describe(self) -> str:
        ti = self.task_instance
        index = f"[{ti.map_index}]" if ti.map_index >= 0 else ""
        return (f"Volcano Job {self.namespace}/{self.name} ({self.phase or 'no phase yet'}) of task instance "
                f"{ti.dag_id}.{ti.task_id}{index} in run {ti.run_id}, which is {self.task_state} with no try "
                "left watching it")


def candidates(jobs: Iterable[Mapping[str, Any]], own: TaskInstanceId) -> list[tuple[Mapping[str, Any],
                                                                                  TaskInstanceId]]:
    """The Jobs that may be orphans, before Airflow is asked: another task instance's, not kept on purpose,
    not being deleted."""
    found = []
    for job in jobs:
        metadata = job.get("metadata") or {}
        labels = metadata.get("labels") or {}
        named = TaskInstanceId.from_job(job)
        if (labels.get(MANAGED_BY_LABEL) != MANAGED_BY_VALUE or labels.get(CHECKED_LABEL) == "true"
                or metadata.get("deletionTimestamp") or named is None):
            continue
        ti, on_kill_action = named
        if ti != own and on_kill_action == OnKillAction.DELETE_JOB:
            found.append((job, ti))
    return found


def orphans(found: Iterable[tuple[Mapping[str, Any], TaskInstanceId]],
            states: Mapping[tuple[str, str], Mapping[str, Any]]) -> list[Orphan]:
    """Of the candidates, those whose task instance Airflow reports finished. `states`: per (dag_id,
    run_id), Airflow's states of that run's task instances; a task instance missing from it is unknown
    (another Airflow's, or deleted from this one): not an orphan."""
    result = []
    for job, ti in found:
        state = state_in(states.get((ti.dag_id, ti.run_id)), ti.task_id, ti.map_index)
        if state in FINISHED_TASK_STATES:
            metadata = job["metadata"]
            result.append(Orphan(metadata["name"], metadata.get("namespace", ""), metadata.get("uid", ""),
                                 job_state(job).phase if job.get("status") else "", ti, state,
                                 orphaned_at(job)))
    return result


def orphaned_at(job: Mapping[str, Any]) -> float | None:
    text = ((job.get("metadata") or {}).get("annotations") or {}).get(ORPHANED_AT_ANNOTATION)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def sweep_orphans(hook: VolcanoHook, namespace: str, own: TaskInstanceId, task_states: TaskStates,
                  now: float, deployment: str) -> list[Orphan]:
    """Mark the namespace's orphaned Jobs of this Airflow `deployment` found for the first time (only its
    own: another deployment's task instances are not this Airflow's to ask about); delete those marked
    ORPHAN_GRACE ago or more (each with its script's ConfigMap); returns the orphans found. The task log names
    the Jobs of this task's DAG, and only counts those of other DAGs (whose names are not this DAG's users'
    to read). Raises what a read raises: the caller logs it and goes on, as a sweep that cannot see deletes
    nothing."""
    from airflow_volcano.manifest import script_configmap_name

    selector = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE},{DEPLOYMENT_LABEL}={deployment}"
    found = candidates(hook.list_jobs(namespace, selector), own)
    wanted: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))  # dag -> run -> task ids
    for _, ti in found:
        wanted[ti.dag_id][ti.run_id].add(ti.task_id)
    states: dict[tuple[str, str], Mapping[str, Any]] = {}
    for dag_id, runs in wanted.items():
        answer = task_states(dag_id, sorted({task for tasks in runs.values() for task in tasks}), sorted(runs))
        states.update({(dag_id, run_id): run_states for run_id, run_states in answer.items()})
    swept = []
    elsewhere = {"marked": 0, "deleted": 0, "failed": 0}  # other DAGs' orphans: counted, not named
    for listed in orphans(found, states):
        ours = listed.task_instance.dag_id == own.dag_id
        try:
            # Read again, after Airflow's answer: the list may predate the end of the task's own try, which
            # deletes its Job or labels it reported before its state changes (found by the chaos soak: a Job
            # listed Running, its try ending as it was read, was taken for an orphan).
            fresh = hook.get_job(listed.name, namespace)
            if fresh is None or fresh["metadata"].get("uid") != listed.uid or not candidates([fresh], own):
                continue
            orphan = replace(listed, orphaned_at=orphaned_at(fresh))
            swept.append(orphan)
            if orphan.orphaned_at is None:
                hook.annotate_job(orphan.name, namespace, {ORPHANED_AT_ANNOTATION: f"{now:.0f}"})
                if ours:
                    log.info("Found %s: a submission in %s deletes it from %s on (unless the task instance runs "
                             "again)", orphan.describe(), namespace, clock_text(now + ORPHAN_GRACE))
                else:
                    elsewhere["marked"] += 1
            elif orphan.due(now):
                if hook.delete_job(orphan.name, namespace, uid=orphan.uid):
                    if ours:
                        log.info("Deleted %s", orphan.describe())
                    else:
                        elsewhere["deleted"] += 1
                hook.delete_script_configmap(script_configmap_name(orphan.name), namespace, orphan.uid)
        except VolcanoApiError as error:  # one not marked or deleted (replaced since, refused): the others still are
            if ours:
                log.warning("Could not mark or delete %s: %s", listed.describe(), error)
            else:
                elsewhere["failed"] += 1
    if any(elsewhere.values()):
        log.info("Orphaned Volcano Jobs of other DAGs' task instances in %s: %d found and marked (a submission "
                 "deletes each %s after), %d deleted, %d could not be marked or deleted", namespace,
                 elsewhere["marked"], duration_text(ORPHAN_GRACE), elsewhere["deleted"], elsewhere["failed"])
    return swept
