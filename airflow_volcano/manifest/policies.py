"""Volcano lifecycle policies: the ones the operator writes (restart on retryable exit codes and
evictions, end the Job on any other failure), reading them back, and Volcano's webhook's rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_volcano.exceptions import JobSpecError

DEFAULT_MASTER_POLICIES = [{"event": "TaskCompleted", "action": "CompleteJob"}]
# DDP cannot lose a rank: an evicted pod, or one killed by a signal (the retryable exit codes of T9k's
# PyTorchTrainingJob; T9k is a Kubernetes platform for ML training:
# SIGINT 130, SIGKILL/OOM 137, SIGUSR2 138, SIGTERM 143), restarts the whole gang within
# max_retry; any other failure is a bug that a restart would only repeat, so it ends the Job at
# once. Pods default to restartPolicy Never so that Volcano sees every failure (a kubelet restart
# of one pod in place would leave the others hanging at the rendezvous).
DEFAULT_RETRYABLE_EXIT_CODES = (130, 137, 138, 143)
RESTART_SCOPES = {"job": "RestartJob", "task": "RestartTask"}


EVENTS = {"*", "PodFailed", "PodEvicted", "PodPending", "PodRunning", "Unknown", "TaskCompleted", "TaskFailed",
          "JobUpdated"}
ACTIONS = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "TerminateJob", "CompleteJob", "ResumeJob"}


def exit_code_policies(codes: Sequence[int], scope: str) -> list[dict]:
    """Volcano policies: these exit codes restart the gang (or the pod's task), any other failure
    ends the Job at once; an eviction restarts it. Volcano takes the first policy that matches,
    so the exit codes come before PodFailed."""
    restart = RESTART_SCOPES[scope]
    return [*({"exitCode": code, "action": restart} for code in codes),
            {"event": "PodEvicted", "action": restart}, {"event": "PodFailed", "action": "TerminateJob"}]


def retryable_exit_codes(job: Mapping[str, Any]) -> list[int] | None:
    """The exit codes a Job's policies restart; None if its policies do not end it on other failures."""
    policies = (job.get("spec") or {}).get("policies") or []
    terminates = any(policy.get("action") in ("TerminateJob", "AbortJob") and
                     "PodFailed" in [policy.get("event"), *(policy.get("events") or [])] for policy in policies)
    if not terminates:
        return None
    return sorted(policy["exitCode"] for policy in policies
                  if policy.get("exitCode") is not None and str(policy.get("action", "")).startswith("Restart"))


def _events(policy: Mapping[str, Any]) -> list[Any]:
    return [policy.get("event"), *(policy.get("events") or [])]


def held_exit_codes(task: Mapping[str, Any], job: Mapping[str, Any]) -> list[int] | None:
    """Whether a non-retryable exit of this task's pods should wait for a peer's retryable one: the
    exit codes that restart (Volcano reads the task's policies first, then the Job's, and takes the
    first that matches), when the policies both restart on something (an exit code, or an eviction)
    and end the Job on any other failure; None when they do not."""
    policies = [policy for policy in [*(task.get("policies") or []), *((job.get("spec") or {}).get("policies") or [])]
                if isinstance(policy, Mapping)]
    codes: list[int] = []
    seen: set[Any] = set()
    evicted = failed = None
    for policy in policies:
        action = str(policy.get("action", ""))
        code = policy.get("exitCode")
        if isinstance(code, int) and failed is None and code not in seen:  # after PodFailed's: never reached
            seen.add(code)
            if action.startswith("Restart"):
                codes.append(code)
        events = _events(policy)
        if evicted is None and ("PodEvicted" in events or "*" in events):
            evicted = action
        if failed is None and ("PodFailed" in events or "*" in events):
            failed = action
    restarts = bool(codes) or (evicted or "").startswith("Restart")
    return sorted(codes) if restarts and failed in ("TerminateJob", "AbortJob") else None


def restarts_on_eviction(job: Mapping[str, Any]) -> bool:
    """Whether the Job's policies (its own or a task's) answer an evicted pod with a restart: what
    stall_action="restart" relies on (it deletes the stalled pods)."""
    spec = job.get("spec") or {}
    policies = [*(spec.get("policies") or []),
                *(policy for task in spec.get("tasks") or [] for policy in (task.get("policies") or []))]
    return any(str(policy.get("action", "")).startswith("Restart") and
               {"PodEvicted", "*"} & {policy.get("event"), *(policy.get("events") or [])} for policy in policies)


def validate_policies(parameter: str, policies: Any) -> None:
    """Volcano's webhook rules: event(s) xor exitCode, known names, no duplicates, `*` alone."""
    if policies is None:
        return
    if not isinstance(policies, list):
        raise JobSpecError(f"{parameter} must be a list of policies, got {policies!r}")
    seen_events: set[str] = set()
    seen_codes: set[int] = set()
    for policy in policies:
        if not isinstance(policy, dict):
            raise JobSpecError(f"{parameter}: a policy must be a mapping, got {policy!r}")
        extra = policy.get("events") or []
        if not isinstance(extra, list):
            raise JobSpecError(f"{parameter}: events must be a list, got {extra!r}")
        events = list(dict.fromkeys(([policy["event"]] if policy.get("event") else []) + extra))
        exit_code = policy.get("exitCode")
        if events and exit_code is not None:
            raise JobSpecError(f"{parameter}: policy {policy!r} has both an event and exitCode; give one")
        if not events and exit_code is None:
            raise JobSpecError(f"{parameter}: policy {policy!r} needs an event, events or an exitCode")
        if exit_code is not None:
            if isinstance(exit_code, bool) or not isinstance(exit_code, int) or exit_code == 0:
                raise JobSpecError(f"{parameter}: exitCode must be a non-zero integer, got {exit_code!r}")
            if exit_code in seen_codes:
                raise JobSpecError(f"{parameter}: duplicate exitCode {exit_code!r}")
            seen_codes.add(exit_code)
        for event in events:
            if event not in EVENTS:
                raise JobSpecError(f"{parameter}: unknown event {event!r} (one of {', '.join(sorted(EVENTS))})")
            if event in seen_events:
                raise JobSpecError(f"{parameter}: duplicate event {event!r} (it appears in more than one policy)")
            seen_events.add(event)
        if policy.get("action") not in ACTIONS:
            raise JobSpecError(f"{parameter}: unknown action {policy.get('action')!r} "
                               f"(one of {', '.join(sorted(ACTIONS))})")
    if "*" in seen_events and len(seen_events) > 1:
        raise JobSpecError(f"{parameter}: event '*' must be the only event, got {sorted(seen_events)!r}")
