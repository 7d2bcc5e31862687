"""Submitting a task's Volcano Job: reattach to the Job of an earlier try of the same task instance,
replace it, or submit anew; never two Jobs for one task instance, never someone else's objects.

How an earlier try's Job is found: on Airflow 3.3+ a try records the Job's name and uid in the task
instance's durable task state store right after submitting; the labels naming the task instance
(dag, task, run, map index) find it too (older Airflow, or a try that died between creating the Job
and recording it, after an earlier try recorded its own). A Job labelled reported (`checked`) is
history, not a try's to take over; a Job built from another request (its hash differs: the DAG
changed between tries) is not reattached to.

No Airflow operator state lives here: the operator passes what it knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import (
    CHECKED_LABEL,
    DEPLOYMENT_LABEL,
    JOB_GROUP,
    JOB_VERSION,
    ORPHANED_AT_ANNOTATION,
    REQUEST_HASH_ANNOTATION,
    TRY_NUMBER_LABEL,
    IfJobExists,
)
from airflow_volcano.exceptions import JobSpecError, VolcanoApiError, VolcanoJobError
from airflow_volcano.hooks import calls
from airflow_volcano.job_ref import JobRef
from airflow_volcano.manifest import JobManifests, identity_labels, is_debug_job, script_configmap_name
from airflow_volcano.manifest.build import REQUEST_HASH_SCHEME
from airflow_volcano.ownership import STATE_STORE_KEY, delete_job_and_script
from airflow_volcano.ownership.deployment import deployment_of
from airflow_volcano.status import job_state
from airflow_volcano.waiting.queueing import QUEUE_READER, queue_refusal

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")


def submit_or_reattach(hook: VolcanoHook, manifests: JobManifests, namespace: str, *, if_job_exists: IfJobExists,
                       state_store: Any = None, on_found: Callable[[JobRef], None] = lambda ref: None) -> JobRef:
    """The Job this try waits on: an earlier try's (as `if_job_exists` says), or a new one.
    `on_found` is told the Job the moment this try is answerable for it (a new one the moment it
    exists; an earlier try's that this try refuses, so that the task's failure settles it)."""
    job = manifests.job
    job["metadata"]["namespace"] = namespace
    main = manifests.main_task
    wanted = manifests.request_hash
    stored = _stored_job(hook, state_store)
    identity = identity_labels(job["metadata"]["labels"])
    selector = ",".join(f"{key}={value}" for key, value in sorted(identity.items()))
    # Jobs of earlier releases carry no deployment label: found by the rest of their identity, and taken over
    # (labelled) by the first deployment to reattach, as before those deployments could be told apart.
    legacy = ",".join([*(f"{key}={value}" for key, value in sorted(identity.items()) if key != DEPLOYMENT_LABEL),
                       f"!{DEPLOYMENT_LABEL}"]) if DEPLOYMENT_LABEL in identity else None
    # The labels too when the store names a Job: a later try may have died (or been cleared) between
    # creating its own and recording it, so the store names an older one, reported since.
    candidates = [(stored, "the task state store")] if stored is not None else []
    labelled_jobs = hook.list_jobs(namespace, selector) + (hook.list_jobs(namespace, legacy) if legacy else [])
    candidates += [(labelled, "its labels") for labelled in labelled_jobs
                   if stored is None or labelled["metadata"].get("uid") != stored["metadata"].get("uid")]
    for existing, found_by in candidates:
        if (existing["metadata"].get("labels") or {}).get(CHECKED_LABEL) == "true":
            continue  # an earlier try already reported this Job's result: history, not this try's
        # Unchecked: submitted by a try that died before reporting; running or finished since.
        ref = JobRef.from_job(existing, main, script_configmap_name(existing["metadata"]["name"]))
        phase = job_state(existing).phase
        built_from = (existing["metadata"].get("annotations") or {}).get(REQUEST_HASH_ANNOTATION)
        if built_from is not None and not built_from.startswith(REQUEST_HASH_SCHEME):
            # Hashed by a release before the request was (it hashed the built Job, the provider's own
            # shell included): it cannot be compared, and refusing it would leave it training unwatched.
            log.info("Volcano Job %s/%s was submitted by an earlier release of airflow-volcano, whose record of "
                     "its arguments cannot be compared with this try's: taking it as this try's", namespace, ref.name)
            built_from = None
        if built_from is not None and built_from != wanted and if_job_exists != IfJobExists.REPLACE:
            # Another request: the arguments, the script or debug mode changed since that try.
            if not is_debug_job(existing):
                on_found(ref)  # the failure settles it: kept for a later try, else deleted if it still runs
                raise VolcanoJobError(
                    f"an earlier try of this task instance submitted Volcano Job {namespace}/{ref.name} (phase "
                    f"{phase}) from other arguments, script or debug mode than this try's. Set "
                    "if_job_exists='replace' to replace it with this try's, or delete it; or run the task with "
                    "the arguments that built it")
            log.info("Replacing Volcano Job %s/%s of an earlier try: a debug session, not this try's request "
                     "(nothing trains in it)", namespace, ref.name)
            delete_job_and_script(hook, ref)
            continue
        if if_job_exists == IfJobExists.REATTACH:
            adopted = _adopt(hook, existing, job)
            if adopted is None:
                continue  # an earlier try's kill was deleting it: gone now, and this try submits anew
            existing, ref = adopted, JobRef.from_job(adopted, main, ref.script_configmap)
            log.info("Reattaching to Volcano Job %s/%s submitted by an earlier try (%s; found by %s)", namespace,
                     ref.name, phase, found_by)
            if manifests.configmap is not None and not job_state(existing).finished:
                # That try may have died between creating the Job and its script: its pods wait for it.
                hook.ensure_configmap(namespace, _owned_script(manifests.configmap, existing))
            if ORPHANED_AT_ANNOTATION in (existing["metadata"].get("annotations") or {}):
                # Its task instance had ended (a sweep marked it orphaned) and runs again: watched now.
                hook.annotate_job(ref.name, namespace, {ORPHANED_AT_ANNOTATION: None})
            return ref
        if if_job_exists == IfJobExists.FAIL:
            raise VolcanoJobError(f"if_job_exists='fail': an earlier try of this task instance submitted Volcano Job "
                                  f"{namespace}/{ref.name} (phase {phase}); it is left as it is")
        log.info("Replacing Volcano Job %s/%s of an earlier try", namespace, ref.name)
        delete_job_and_script(hook, ref)
    ref = submit(hook, manifests, namespace, on_found)
    if state_store is not None:
        state_store.set(STATE_STORE_KEY, {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid})
    return ref


def submit(hook: VolcanoHook, manifests: JobManifests, namespace: str,
           on_created: Callable[[JobRef], None] = lambda ref: None) -> JobRef:
    """Create the script's ConfigMap and the Job (annotated with its request's hash), once its queue is
    known to take it."""
    job = manifests.job
    name = job["metadata"]["name"]
    check_queue(hook, job)
    existing = hook.get_job(name, namespace)
    if existing is not None:
        if not same_task_instance(existing, job):
            theirs, ours = deployment_of(existing), deployment_of(job)
            if theirs and ours and theirs != ours and same_task_instance(existing, job, across_deployments=True):
                raise JobSpecError(
                    f"name: Volcano Job {namespace}/{name} belongs to another Airflow deployment (its "
                    f"{DEPLOYMENT_LABEL} is {theirs!r}; this one's is {ours!r}), which runs the same task instance: "
                    "it is not taken over. Give the two deployments different namespaces or Job names")
            raise JobSpecError(f"name: a Volcano Job {namespace}/{name} already exists and was not submitted by this "
                               "task; choose another name or delete it")
        # The same name, finished by an earlier try (unfinished ones were reattached): make room.
        log.info("Deleting finished Volcano Job %s/%s of an earlier try", namespace, name)
        uid = existing["metadata"].get("uid")
        hook.delete_job(name, namespace, uid=uid)
        hook.wait_job_deleted(name, namespace, uid=uid)
    # Which request built it: a later try reattaches only to a Job of its own request.
    job["metadata"].setdefault("annotations", {})[REQUEST_HASH_ANNOTATION] = manifests.request_hash
    configmap = manifests.configmap
    try:
        created = hook.create_job(namespace, job)
    except VolcanoApiError as error:
        if error.status in (400, 422):  # the CRD schema or Volcano's admission webhook said no
            raise JobSpecError(f"the cluster rejected Volcano Job {namespace}/{name}: "
                               f"{error.message or error.reason}") from None
        raise
    if not job["metadata"]["labels"].items() <= (created["metadata"].get("labels") or {}).items():
        # Someone else created a Job of this name between our check and our create.
        raise JobSpecError(f"name: a Volcano Job {namespace}/{name} was created by someone else meanwhile")
    ref = JobRef.from_job(created, manifests.main_task, configmap["metadata"]["name"] if configmap else None)
    on_created(ref)
    if configmap is not None:
        # The Job first, then its script, owned by it from the start: a try that dies in between leaves a
        # Job (reattached by the next try, which makes the script, or swept as an orphan: orphans.py), never
        # a ConfigMap nothing owns (found by the chaos soak). The pods wait for the script to mount.
        try:
            hook.create_configmap(namespace, _owned_script(configmap, created),
                                  replace_if=lambda found: same_task_instance(found, job))
        except VolcanoApiError as error:
            if error.status != 409:
                raise
            hook.delete_job(name, namespace, uid=ref.uid)
            raise JobSpecError(f"name: a ConfigMap {namespace}/{configmap['metadata']['name']} already exists and was "
                               "not created by this task; choose another Job name or delete it") from None
    log.info("Submitted Volcano Job %s/%s (master pod %s)", namespace, name, ref.main_pod)
    return ref


def _adopt(hook: VolcanoHook, existing: dict, job: dict) -> dict | None:
    """Take an earlier try's Job over for this try (calls.adopt_job); None if a kill of that try is
    deleting it, once it is gone (this try then submits anew: what the kill asked for)."""
    try_number = int(job["metadata"]["labels"].get(TRY_NUMBER_LABEL) or 0)
    deployment = deployment_of(job)
    adopted = hook.drive(calls.adopt_job(existing, try_number, deployment)) if try_number else existing
    if adopted is None:
        metadata = existing["metadata"]
        log.info("Volcano Job %s/%s of an earlier try is being deleted (that try was killed): waiting for it to go, "
                 "then submitting anew", metadata["namespace"], metadata["name"])
        hook.wait_job_deleted(metadata["name"], metadata["namespace"], uid=metadata.get("uid"))
    return adopted


def _owned_script(configmap: dict, job: dict) -> dict:
    """The script's ConfigMap as `job` mounts it (named after it: a reattached Job has an earlier try's
    name), in its namespace, owned by it: deleting the Job (or its TTL) removes it too."""
    reference = {"apiVersion": f"{JOB_GROUP}/{JOB_VERSION}", "kind": "Job", "name": job["metadata"]["name"],
                 "uid": job["metadata"]["uid"], "blockOwnerDeletion": False}
    metadata = {**configmap["metadata"], "name": script_configmap_name(job["metadata"]["name"]),
                "namespace": job["metadata"]["namespace"], "ownerReferences": [reference]}
    return {**configmap, "metadata": metadata}


def check_queue(hook: VolcanoHook, job: dict) -> None:
    """Refuse, before submitting, a Job its queue would never take: a queue that does not exist or is not
    Open (Volcano's webhook would refuse it with fewer words), a gang larger than its capability (it
    would wait forever). A queue that cannot be read (no deploy/queue-reader.yaml) is not checked."""
    name = (job.get("spec") or {}).get("queue") or "default"
    try:
        queue = hook.get_queue(name)
    except VolcanoApiError as error:
        log.info("Volcano queue %s was not checked before submitting (%s; %s grants reading queues)", name,
                 error.brief(), QUEUE_READER)
        return
    refusal = queue_refusal(name, queue, job)
    if refusal is not None:
        raise JobSpecError(refusal)


def _stored_job(hook: VolcanoHook, state_store: Any) -> dict | None:
    """The Job an earlier try of this task instance stored, if it still exists (same uid)."""
    saved = state_store.get(STATE_STORE_KEY) if state_store is not None else None
    if not isinstance(saved, dict) or not saved.get("name"):
        return None
    # The connection's credentials created that Job: a 401 now means they expired (retried, not failed at once).
    hook.note_credentials_accepted()
    job = hook.get_job(saved["name"], saved["namespace"])
    return job if job is not None and job["metadata"].get("uid") == saved.get("uid") else None


def same_task_instance(found: dict, job: dict, *, across_deployments: bool = False) -> bool:
    """Whether an object (a Job, a ConfigMap) was made for the same task instance as `job`, by the same
    Airflow deployment (or by any, with `across_deployments`)."""
    theirs = identity_labels(found["metadata"].get("labels") or {})
    ours = identity_labels(job["metadata"]["labels"])
    if across_deployments:
        theirs.pop(DEPLOYMENT_LABEL, None)
        ours.pop(DEPLOYMENT_LABEL, None)
    return bool(theirs) and theirs == ours
