"""Who owns a Volcano Job, and what becomes of it: the rules the operator, its trigger, the sensor and
the orphan sweep share.

A try owns the Job it submitted (or reattached to) until it reports it (labelled checked) or deletes
it; a later try of the same task instance reattaches to it (`later_try_will_reattach`); a sensor only
watches (`watched_only`). What a kill or a cancellation does depends on Airflow's state of the task
instance, read in one place (`task_state`, `ask_task_state`, `state_in`): a user's "Mark failed/success"
or "Clear" ends the Job, a worker or triggerer stopping with a try left keeps it for that try
(`kill_keeps_job`, `ended_on_server`, `cancellation_ends_job`). The operator holds its try's side in a
`TryOwnership`; the trigger asks the same rules. Jobs no try will watch again are swept by later
submissions (`ownership.orphans`). Submitting and reattaching (`submission`), the end of every wait and
its cleanup (`finalize`) and this deployment's identity (`deployment`) live beside it. Deleting takes
only the Job this try owns (its uid), never one a later try reattached to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard

import structlog

from airflow_volcano.compat import AirflowFailException
from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEPLOYMENT_LABEL,
    TASK_INSTANCE_ANNOTATION,
    OnFinishAction,
    OnKillAction,
)
from airflow_volcano.exceptions import ApiserverUnreachable, VolcanoJobError
from airflow_volcano.job_ref import JobRef
from airflow_volcano.status import job_state

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.manifest import JobManifests
    from airflow_volcano.ownership.orphans import TaskInstanceId

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")
# How long a cleanup keeps retrying an apiserver it cannot reach before the task fails (and its next
# try, if any, reattaches and cleans up).
CLEANUP_RETRY_SECONDS = 120.0
# The task state store key (Airflow 3.3+) under which a try records the Job it submitted.
STATE_STORE_KEY = "volcano_job"
# The states in which a deferred task's cancelled trigger was ended by a user ("none": cleared).
USER_ENDED_STATES = frozenset({"none", "failed", "success", "skipped", "removed", "upstream_failed"})
# The state the scheduler gives a try it failed with a try left (an executor reporting its worker
# gone): a later try follows, whatever the task's own process is still doing.
SYSTEM_RETRY_STATE = "up_for_retry"


# -- the task instance's state ---------------------------------------------------------------------------


def task_state_key(task_id: str, map_index: int | None) -> str:
    """How Airflow's get_task_states names a task instance: mapped ones carry their index."""
    return task_id if map_index is None or map_index < 0 else f"{task_id}_{map_index}"


def state_in(run_states: Mapping[str, Any] | None, task_id: str, map_index: int | None) -> str:
    """A task instance's state in one run's part of Airflow's `get_task_states` answer, as its value
    ("running", "failed", ...); "none" when it has none (cleared) or is not in it."""
    state = (run_states or {}).get(task_state_key(task_id, map_index))
    return str(getattr(state, "value", state)).lower()


def ask_task_state(get_task_states: Callable[..., Mapping[str, Mapping[str, Any]]], ti: Any) -> str:
    """Airflow's state of the task instance `ti`, asked through `get_task_states` (the task instance's
    own, or the triggerer's); raises what the asking raises."""
    states = get_task_states(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index)
    return state_in(states.get(ti.run_id), ti.task_id, ti.map_index)


def task_state(ti: Any) -> str:
    """Airflow's state of the task instance `ti` on the API server, wherever it runs: a worker's task
    instance asks through its own `get_task_states`; the triggerer's has none and asks through
    RuntimeTaskInstance's, which the triggerer's supervisor answers. Raises what the asking raises."""
    get_task_states = getattr(ti, "get_task_states", None)
    if get_task_states is None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        get_task_states = RuntimeTaskInstance.get_task_states
    return ask_task_state(get_task_states, ti)


def state_on_server(ti: Any, log: Any) -> str | None:
    """`task_state`, or None (said in `log`, the task's logger) when there is no task instance or its
    state cannot be read: the rules below treat an unknown state as no kill."""
    if ti is None:
        return None
    try:
        return task_state(ti)
    except Exception as error:  # noqa: BLE001 - an unknown state is reported as such
        log.warning("Could not read the task instance's state: %s", error)
        return None


def ended_on_server(state: str | None) -> TypeGuard[str]:
    """Whether a task about to defer was ended on the server since Airflow's last heartbeat (a user's
    "Mark failed" or "Clear", or the scheduler failing the try: `who_ended`): any known state but
    `running`. Unknown is no kill: the task defers."""
    return state not in (None, "running")


def who_ended(state: str) -> str:
    """Who gave a task instance `state` while its try still ran, as the task log says it: the scheduler
    (`SYSTEM_RETRY_STATE`), else a user's "Mark" or "Clear" (a cleared task is `restarting`, `none`, or
    already `scheduled` or `queued` for its next try)."""
    if state == SYSTEM_RETRY_STATE:
        return "the scheduler failed this try, its worker reported lost; the next try reattaches"
    return "a user marked it, or cleared it"


def cancellation_ends_job(state: str) -> bool:
    """Whether a deferred task's cancelled trigger (before Airflow 3.3, which has no on_kill for
    triggers) was a user's kill: the task's state says a user ended it. Anything else (a triggerer
    stopping or handing over, the task resumed by another) keeps the Job."""
    return state in USER_ENDED_STATES


def nothing_to_stop(job: Mapping[str, Any] | None, ref: JobRef) -> str | None:
    """Why `job` (read now) is not `ref`'s to stop: "gone" (deleted by a try, or its name is a later
    try's Job now), "ended" (finished, or a try reported it); None when it still runs unreported."""
    if job is None or (ref.uid and job["metadata"].get("uid") != ref.uid):
        return "gone"
    if job_state(job).finished or (job["metadata"].get("labels") or {}).get(CHECKED_LABEL) == "true":
        return "ended"
    return None


def later_try_will_reattach(ti: Any, error: BaseException | None) -> bool:
    """Whether Airflow will run another try of this task instance (which reattaches to the Job): the
    server's own answer (`should_retry`), else the try count against max_tries."""
    if isinstance(error, AirflowFailException) or ti is None:
        return False
    context = getattr(ti, "_ti_context_from_server", None)
    if context is not None and getattr(context, "should_retry", None) is not None:
        return bool(context.should_retry)
    return int(getattr(ti, "try_number", 1) or 1) <= int(getattr(ti, "max_tries", 0) or 0)


def watched_only(job: dict, main_task: str) -> JobRef:
    """A Job this task watches but does not own (the sensor's): never deleted, relabelled or adopted."""
    return replace(JobRef.from_job(job, main_task), owned=False)


def kill_keeps_job(ref: JobRef, ti: Any, on_kill_action: str, state_on_server: Callable[[], str | None],
                   log: Any) -> bool:
    """Whether a kill (the operator's on_kill) keeps the Job rather than deleting it.

    Airflow calls on_kill when a user marks the task failed/success or clears it, when the worker shuts
    down (apache/airflow#39791) and when execution_timeout passes. In the last two the task instance is
    still `running` on the server, or already `up_for_retry` when its worker was lost (a worker pod deleted)
    and the scheduler failed the try before the task's SIGTERM handler read the state: no user sets that
    state. If the task has a try left, that try reattaches to the Job, so deleting
    it would throw the training away; with no try left, nobody would ever watch it again. When the state
    cannot be read (`state_on_server` says None) and a try is left, the Job is kept: a training is not
    deleted on a guess (the next try, or the user, finds it by its labels). `log`: the task's logger."""
    if on_kill_action == OnKillAction.KEEP_JOB:
        return True
    if not later_try_will_reattach(ti, None):
        return False
    state = state_on_server()
    if state is None:
        log.warning("Keeping Volcano Job %s/%s: whether this is a kill or a worker stopping is unknown, and a later "
                    "try would reattach to it. If the task was killed, delete it: kubectl delete vcjob -n %s %s",
                    ref.namespace, ref.name, ref.namespace, ref.name)
        return True
    if state == "running":
        log.info("Worker stopping while the task instance is still running: keeping Volcano Job %s/%s for the next "
                 "try to reattach", ref.namespace, ref.name)
        return True
    if state == SYSTEM_RETRY_STATE:
        log.info("The task instance is up_for_retry on the server (its worker was lost, and the scheduler has "
                 "already failed this try): keeping Volcano Job %s/%s for the next try to reattach",
                 ref.namespace, ref.name)
        return True
    return False


def settle_after_failure(hook: Callable[[], VolcanoHook], ref: JobRef | None, ti: Any, error: BaseException,
                         on_kill_action: str, log: Any) -> None:
    """A task failing with its Job submitted: keep the Job when a later try of this task will reattach to
    it (or on_kill_action keeps it); otherwise delete it if it still runs. `log`: the task's logger."""
    if ref is None or on_kill_action == OnKillAction.KEEP_JOB:
        return
    if later_try_will_reattach(ti, error):
        log.info("Keeping Volcano Job %s/%s for the next try of this task to reattach", ref.namespace, ref.name)
        return
    delete_if_still_running(hook(), ref)


def sweep_orphans_before_submitting(hook: VolcanoHook, namespace: str, own: TaskInstanceId, ti: Any,
                                    deployment: str, log: Any) -> None:
    """Mark, then delete, the Jobs no try will watch again (orphans.py), freeing what they hold before
    this task's Job queues. A sweep that cannot read or ask deletes nothing and never fails the task,
    unless the apiserver does not answer at all: then submitting could not either, and says so at once."""
    from airflow_volcano.ownership.orphans import sweep_orphans

    if not hasattr(ti, "get_task_states"):
        return
    try:
        sweep_orphans(hook, namespace, own, lambda dag_id, task_ids, run_ids: ti.get_task_states(
            dag_id=dag_id, task_ids=task_ids, run_ids=run_ids), time.time(), deployment)
    except ApiserverUnreachable:
        raise
    except Exception as error:  # noqa: BLE001 - the sweep is a courtesy; this task's own Job comes first
        log.warning("Could not look for orphaned Volcano Jobs in %s (left as they are): %s", namespace, error)


def claim(manifests: JobManifests, own: TaskInstanceId, on_kill_action: str, deployment: str) -> None:
    """Mark the Job (and its script) as this task instance's and this deployment's, as it is submitted:
    the task instance named exactly, for the orphan sweep of later tasks; the deployment, so that
    reattach, the sweep and cleanup take only their own (deployment.py). At submission, as the request's
    hash is: the rendered manifest the UI shows stays the Job as built (and within Airflow's field limit)."""
    manifests.job["metadata"].setdefault("annotations", {})[TASK_INSTANCE_ANNOTATION] = own.annotation(
        on_kill_action)
    for manifest in (manifests.job, manifests.configmap):
        if manifest is not None:
            manifest["metadata"].setdefault("labels", {})[DEPLOYMENT_LABEL] = deployment


# -- one try's hold on its Job (the operator's side) -----------------------------------------------------


@dataclass
class TryOwnership:
    """What one try of the operator answers for: its Job once known (`ref`), its task instance (`ti`),
    and whether a kill came (`kill_requested`). The operator keeps one from construction on, since
    Airflow may call on_kill before execute knows anything. Each rule takes `hook` (makes the hook only
    when a call is needed), the task's `on_kill_action` and `log` (the task's logger) when it runs, so
    the operator's rendered values are the ones used."""

    ref: JobRef | None = None
    ti: Any = None
    kill_requested: bool = False

    def watching(self, ref: JobRef) -> None:
        """This try's Job (or an earlier try's it found): from now on a failure or a kill settles what
        becomes of it."""
        self.ref = ref

    def kill(self, hook: Callable[[], VolcanoHook], on_kill_action: str, log: Any) -> None:
        """The operator's on_kill: delete the Job when a user killed the task, or when no later try will
        reattach to it; a worker stopping, or a timeout, with a try left keeps it for that try
        (`kill_keeps_job`)."""
        self.kill_requested = True
        ref = self.ref
        if ref is None or kill_keeps_job(ref, self.ti, on_kill_action, lambda: state_on_server(self.ti, log), log):
            return
        self.ref = None
        log.info("Task killed: deleting Volcano Job %s/%s", ref.namespace, ref.name)
        delete_job_and_script(hook(), ref)

    def stop_if_killed(self, kill: Callable[[], None]) -> None:
        """Airflow's SIGTERM handler only calls on_kill: the task runs on until it is SIGKILLed. A kill that
        came before the Job was known (a user's "Mark failed" while the try was starting, or submitting)
        must not be followed by a submission, nor by a Job left running: it is settled as on_kill (`kill`)
        settles it."""
        if not self.kill_requested:
            return
        if self.ref is not None:
            kill()
        raise VolcanoJobError("The task was killed while it was starting: nothing more is submitted")

    def stop_if_ended_on_server(self, ref: JobRef, kill: Callable[[], None], on_kill_action: str, log: Any) -> None:
        """A user's "Mark failed" or "Clear" that changed the task instance's state after Airflow's last
        heartbeat has not reached this process yet (no SIGTERM): Airflow would refuse the deferral ("not
        in the running state") and call nothing of the task after it, neither a trigger nor on_kill, so
        the Job would train on with nobody to delete it (found by the chaos soak). Settled here as
        on_kill (`kill`) settles a kill. A state that cannot be read is no kill: the task defers."""
        state = state_on_server(self.ti, log)
        if not ended_on_server(state):
            return
        kill()
        kept = " and kept (on_kill_action='keep_job')" if on_kill_action == OnKillAction.KEEP_JOB else ""
        raise VolcanoJobError(f"The task instance is {state} on the server ({who_ended(state)}) as "
                              f"it was about to defer: Airflow would run no trigger for Volcano Job "
                              f"{ref.namespace}/{ref.name}{kept}")

    def settle_after_failure(self, hook: Callable[[], VolcanoHook], error: BaseException, on_kill_action: str,
                             log: Any) -> None:
        """The task is failing with its Job submitted: `settle_after_failure`. The Job is let go first:
        on_kill, called next on a timeout, has nothing left to do."""
        ref, self.ref = self.ref, None
        settle_after_failure(hook, ref, self.ti, error, on_kill_action, log)


# -- ending the Job ---------------------------------------------------------------------------------------


def cleanup(hook: VolcanoHook, ref: JobRef, *, succeeded: bool, action: OnFinishAction) -> bool:
    """Apply `on_finish_action`; returns whether the Job was deleted. A Job kept is labelled as
    reported, so no later try takes it for its own; a Job to delete is not labelled first: if the
    delete fails, the task fails, and its next try reattaches to the finished Job and deletes it
    (never trains again, never leaves it behind)."""
    delete = action is OnFinishAction.DELETE_JOB or (action is OnFinishAction.DELETE_SUCCEEDED_JOB and succeeded)
    if not delete or not ref.owned:
        if ref.owned:
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
    up to CLEANUP_RETRY_SECONDS: a Job nobody deletes trains on unwatched. Only that Job (its uid), and
    only while this try owns it: a Job of the same name made since, or this one once a later try of the
    task reattached to it, is not touched."""
    from airflow_volcano.hooks import calls

    done = hook.drive(calls.delete_owned_job(ref.name, ref.namespace, ref.uid, ref.owner_try,
                                             retry_for=CLEANUP_RETRY_SECONDS))
    if done == "adopted":
        log.info("Leaving Volcano Job %s/%s: a later try of this task reattached to it and owns it now", ref.namespace,
                 ref.name)
        return
    # The ConfigMap is owned by the Job, but a cluster without the garbage collector would leave it
    # behind: delete it explicitly (only the one this Job owns).
    if ref.script_configmap:
        hook.delete_script_configmap(ref.script_configmap, ref.namespace, ref.uid)
    if done == "deleted":
        log.info("Deleted Volcano Job %s/%s", ref.namespace, ref.name)
    else:
        log.info("Volcano Job %s/%s (uid %s) was gone already", ref.namespace, ref.name, ref.uid)


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
    if job and ref.uid and job["metadata"].get("uid") != ref.uid:
        return  # its name is another Job's now (a later try's): not this try's to delete
    log.info("No later try of this task will reattach: deleting Volcano Job %s/%s (%s), which would otherwise run "
             "unwatched", ref.namespace, ref.name, job_state(job).phase if job else "unreadable")
    try:
        delete_job_and_script(hook, ref)
    except Exception as error:  # noqa: BLE001 - see above
        log.error("Could not delete Volcano Job %s/%s (%s): delete it by hand (kubectl -n %s delete vcjob %s)",
                  ref.namespace, ref.name, error, ref.namespace, ref.name)
