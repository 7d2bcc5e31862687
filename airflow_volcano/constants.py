"""Names the provider's modules share: the Volcano APIs it calls, the labels and annotations Volcano and
the provider put on Jobs and pods, the phases it reads, and the choices its arguments take.

Standard library only: operators import it at DAG parse.
"""

from __future__ import annotations

from enum import StrEnum

# -- Volcano's APIs ----------------------------------------------------------------------------------------

JOB_GROUP, JOB_VERSION, JOB_PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"
JOB_API_VERSION = f"{JOB_GROUP}/{JOB_VERSION}"
PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"
QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL = "scheduling.volcano.sh", "v1beta1", "queues"  # cluster-scoped

# Labels Volcano puts on the pods of a Job.
JOB_NAME_LABEL = "volcano.sh/job-name"
TASK_LABEL = "volcano.sh/task-spec"

# -- the provider's labels and annotations (users may not set these) ---------------------------------------

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "airflow-volcano"
LABEL_PREFIX = "airflow-volcano.io/"
TRY_NUMBER_LABEL = f"{LABEL_PREFIX}try-number"
# Set on a Job kept after a try reported its result, so later tries never mistake it for theirs.
CHECKED_LABEL = f"{LABEL_PREFIX}checked"
# The Airflow deployment a Job belongs to (deployment.py): two Airflows sharing a namespace never take each
# other's Jobs for their own.
DEPLOYMENT_LABEL = f"{LABEL_PREFIX}deployment"
# The labels that name a task instance of a deployment across its tries (run labels minus the try number).
IDENTITY_KEYS = (MANAGED_BY_LABEL, DEPLOYMENT_LABEL,
                 *(f"{LABEL_PREFIX}{key}" for key in ("dag-id", "task-id", "run-id", "map-index")))
# A debug-mode pod's original command (debug mode: the pods sleep instead of running it).
DEBUG_ANNOTATION = f"{LABEL_PREFIX}debug-command"
# What built a Job (its spec and script, hashed): a later try reattaches only to a Job of its own request.
REQUEST_HASH_ANNOTATION = f"{LABEL_PREFIX}request-hash"
# The task instance a Job belongs to, exactly (JSON; labels hold sanitized forms), and its on_kill_action:
# what the orphan sweep (orphans.py) asks Airflow about.
TASK_INSTANCE_ANNOTATION = f"{LABEL_PREFIX}task-instance"
# The preemptions the waiters counted (JSON, preemption.Preemption's to_dict): a waiter that takes over
# (a reattach, another triggerer) counts on from them.
PREEMPTIONS_ANNOTATION = f"{LABEL_PREFIX}preemptions"
# The Job's two restart budgets as the task asked for them (JSON: max_retry, max_preemptions); Volcano's
# maxRetry is their sum, and the waiter holds the restarts that are not preemptions to max_retry.
RETRY_BUDGET_ANNOTATION = f"{LABEL_PREFIX}retry-budget"
# The restarts the waiters counted against max_retry (not preemptions): a waiter that takes over counts on.
RETRIES_ANNOTATION = f"{LABEL_PREFIX}retries"
# When a sweep first found the Job orphaned (epoch seconds): a later sweep deletes it after the grace below.
ORPHANED_AT_ANNOTATION = f"{LABEL_PREFIX}orphaned-at"
# How long a training container holds back a failure the Job's policies end it on, so that a peer's
# retryable failure (an OOM kill, a preemption: the gang's other ranks then fail with a lost
# connection) reaches Volcano first and restarts the gang (shell/forward-signals.sh).
HOLD_NONRETRYABLE_EXIT_SECONDS = 10
# Where the training script's ConfigMap is mounted in the pods.
SCRIPT_MOUNT_PATH = "/opt/airflow-volcano/script"

# -- phases ------------------------------------------------------------------------------------------------


class JobPhase(StrEnum):
    """A Volcano Job's `status.state.phase`."""

    PENDING = "Pending"
    ABORTING = "Aborting"
    ABORTED = "Aborted"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETING = "Completing"
    COMPLETED = "Completed"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"
    FAILED = "Failed"


SUCCEEDED_PHASES = frozenset({JobPhase.COMPLETED})
# Aborted is not terminal for Volcano (it can be resumed), but nothing resumes it on its own: for a task
# waiting on the Job it is an end.
FAILED_PHASES = frozenset({JobPhase.FAILED, JobPhase.TERMINATED, JobPhase.ABORTED})


class PodPhase(StrEnum):
    """A pod's `status.phase`."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


# A pod that has run (its log and its containers' ends are there to read).
STARTED_POD_PHASES = frozenset({PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED})
ENDED_POD_PHASES = frozenset({PodPhase.SUCCEEDED, PodPhase.FAILED})

# -- the choices of the operators' arguments -----------------------------------------------------------------


class OnFinishAction(StrEnum):
    """`on_finish_action`: what becomes of a Job once it ended."""

    DELETE_JOB = "delete_job"
    DELETE_SUCCEEDED_JOB = "delete_succeeded_job"  # failed Jobs are kept for debugging
    KEEP_JOB = "keep_job"


class OnKillAction(StrEnum):
    """`on_kill_action`: what killing the task (or a timeout with no try left) does to its Job."""

    DELETE_JOB = "delete_job"
    KEEP_JOB = "keep_job"


class StallAction(StrEnum):
    """`stall_action`: what a stall (no output for stall_timeout) does once the stacks are shown."""

    FAIL = "fail"  # delete the Job, fail the task with the stacks
    RESTART = "restart"  # a gang restart (Volcano's RestartJob command), under the Job's retry budget


# -- the operators' defaults (seconds for every duration) ---------------------------------------------------

DEFAULT_CONN_ID = "kubernetes_default"  # the cncf-kubernetes `kubernetes` connection
DEFAULT_STARTUP_TIMEOUT = 900.0  # pods may stay unscheduled this long
DEFAULT_POLL_INTERVAL = 5.0  # pods of a Job that has not started are looked at this often
DEFAULT_NODE_LOST_TIMEOUT = 180.0  # the pods of a node that stopped answering may stay lost this long
DEFAULT_IMAGE_PULL_TIMEOUT = 300.0  # a pod may stay in image pull back-off that may clear this long
# stall_timeout's floor: output is judged no finer (the pod's shell passes a heartbeat on every 10 s,
# a deferred wait copies the log every quarter of stall_timeout).
MIN_STALL_TIMEOUT = 30.0
MAX_STALL_RESTARTS = 3  # stall_action="restart": a stall after this many restarts fails the task
DEFAULT_DEBUG_TIMEOUT = 3600.0  # debug mode keeps the pods up this long
# /dev/shm of every training pod: a memory-backed emptyDir this large at most (a DataLoader with
# workers passes each batch through it; a container's own /dev/shm is 64 MiB).
DEFAULT_SHM_SIZE = "2Gi"
DEFAULT_LOG_INTERVAL = 30.0  # a deferred wait copies the followed logs this often (a quarter of stall_timeout at most)


class IfJobExists(StrEnum):
    """`if_job_exists`: what a try does with a Job an earlier try of its task instance submitted."""

    REATTACH = "reattach"
    FAIL = "fail"
    REPLACE = "replace"
