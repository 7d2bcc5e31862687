"""Debug mode (T9k's): the Job's pods come up as configured but sleep instead of training; the task
log says how to open a shell in each and what it would have run, and the pods stay up for
debug_timeout (or until the task is marked success or failed), then the Job is deleted."""

from __future__ import annotations

import json
import shlex
import time
from typing import TYPE_CHECKING, Any

import structlog

from airflow_volcano.constants import DEBUG_ANNOTATION, ENDED_POD_PHASES, PodPhase
from airflow_volcano.exceptions import VolcanoJobError
from airflow_volcano.manifest import TENSORBOARD_TASK, task_pods
from airflow_volcano.manifest.names import pod_task
from airflow_volcano.ownership import delete_job_and_script
from airflow_volcano.waiting.wait_engine import WaitLimits, startup_problem

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")


def wait_until_running(hook: VolcanoHook, ref: JobRef, pods: list[str], limits: WaitLimits) -> None:
    """Return once every named pod runs; raise with the reason if one cannot start.

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
    """Once every pod runs, say how to open a shell in each and what it would have run, keep the pods
    up for `seconds` (or until the Job is deleted: a kill of the task does that), then delete the Job.
    Returns the task's summary."""
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
            task = pod_task(ref.name, name)
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
    return {"job_name": ref.name, "namespace": ref.namespace, "phase": "Debug", "main_pod": ref.main_pod,
            "master_pod": ref.main_pod, "pods": [name for name, _ in pods]}
