"""Interpret a Volcano Job's state: running, succeeded, or failed and why.

Pure functions over plain dicts (the JSON the API returns), shared by the operator, the sensor
and the trigger so every path says the same thing. Volcano never fills `status.state.reason`, so
a failure is explained from the pods' container statuses, the PodGroup and the Events.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, overload

from airflow_volcano.constants import (
    FAILED_PHASES,
    PREEMPTIONS_ANNOTATION,
    RETRIES_ANNOTATION,
    RETRY_BUDGET_ANNOTATION,
    STARTED_POD_PHASES,
    SUCCEEDED_PHASES,
    TASK_LABEL,
    JobPhase,
    PodPhase,
)
from airflow_volcano.manifest import retryable_exit_codes
from airflow_volcano.manifest.retry_budget import RetryBudget
from airflow_volcano.observability.logs import hidden, stamped_line
from airflow_volcano.timestamps import clock_text, parse_time

# The annotations a wait reads: the preemptions and retries counted so far (a waiter that takes over counts
# on), and the budgets they are held to.
WAITED_ANNOTATIONS = (PREEMPTIONS_ANNOTATION, RETRY_BUDGET_ANNOTATION, RETRIES_ANNOTATION)
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
# An image that cannot exist or cannot be read with the pod's credentials: the kubelet's retries cannot
# help. Any other pull error (429, 5xx, a dropped connection, a registry that cannot be reached) may
# clear by itself as the kubelet retries.
FINAL_PULL_REASONS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
FINAL_PULL_SIGNS = (
    "not found", "manifest unknown", "name unknown", "unauthorized", "access denied", "denied:", "forbidden",
    "insufficient_scope", "invalid reference format", "repository does not exist", "401 ", "403 ",
)
LOG_TAIL_LINES = 20  # shown in a failure report
LOG_SCAN_LINES = 200  # read for what they say of the cause (failure_hints)


class Outcome(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class JobState:
    """Where a Job stands, as far as a task waiting on it cares."""

    name: str
    namespace: str
    phase: str
    outcome: Outcome
    retry_count: int
    resource_version: str
    max_retry: int | None = None  # Volcano's maxRetry
    # The budgets the task submitted it with (max_retry, max_preemptions: maxRetry has room for both), if it did.
    budget: RetryBudget | None = None
    # The exit codes the Job's policies restart, when any other failure ends it (else None).
    retryable_exit_codes: tuple[int, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.outcome in (Outcome.SUCCEEDED, Outcome.FAILED)


def job_state(job: Mapping[str, Any]) -> JobState:
    metadata = job.get("metadata") or {}
    status = job.get("status") or {}
    phase = (status.get("state") or {}).get("phase") or ""
    if phase in SUCCEEDED_PHASES:
        outcome = Outcome.SUCCEEDED
    elif phase in FAILED_PHASES:
        outcome = Outcome.FAILED
    elif phase in ("", JobPhase.PENDING):
        outcome = Outcome.PENDING
    else:
        outcome = Outcome.RUNNING
    return JobState(
        name=metadata.get("name", ""),
        namespace=metadata.get("namespace", ""),
        phase=phase or JobPhase.PENDING,
        outcome=outcome,
        retry_count=int(status.get("retryCount") or 0),
        resource_version=metadata.get("resourceVersion", ""),
        max_retry=(job.get("spec") or {}).get("maxRetry"),
        budget=RetryBudget.of(job),
        retryable_exit_codes=None if (codes := retryable_exit_codes(job)) is None else tuple(codes),
    )


@overload
def waited_view(job: Mapping[str, Any]) -> dict[str, Any]: ...


@overload
def waited_view(job: None) -> None: ...


def waited_view(job: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The part of a Job that waiting on it reads (`job_state`, `describe_progress`, the PodGroup's
    owner uid, the priority a preemptor is weighed against): a triggerer keeps one per deferred task,
    and a whole Job with its pod templates and conditions is many times larger."""
    if job is None:
        return None
    metadata, spec = job.get("metadata") or {}, job.get("spec") or {}
    status = {key: value for key, value in (job.get("status") or {}).items() if key != "conditions"}
    tasks = [{key: task[key] for key in ("name", "replicas", "minAvailable") if key in task}
             for task in spec.get("tasks") or [] if isinstance(task, Mapping)]
    kept = {key: value for key, value in (metadata.get("annotations") or {}).items() if key in WAITED_ANNOTATIONS}
    return {
        "metadata": {key: metadata[key] for key in ("name", "namespace", "uid", "resourceVersion",
                                                    "creationTimestamp") if key in metadata}
        | ({"annotations": kept} if kept else {}),
        "spec": {key: spec[key] for key in ("maxRetry", "policies", "queue", "minAvailable", "priorityClassName")
                 if key in spec}
        | {"tasks": tasks},
        "status": status,
    }


@dataclass(frozen=True)
class PodProblem:
    """One pod's failure, as a user would read it in `kubectl describe pod`."""

    pod: str
    task: str
    phase: str
    container: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    finished_at: float | None = None  # epoch seconds (whole: the kubelet's resolution)
    # The termination message when it is the log's tail (FallbackToLogsOnError: several lines).
    log_tail: tuple[str, ...] = ()

    def describe(self) -> str:
        parts = [f"pod {self.pod} (task {self.task or '?'}) {self.phase}"]
        if self.container:
            parts.append(f"container {self.container}")
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.reason:
            parts.append(f"reason {self.reason}")
        if self.finished_at is not None:
            parts.append(f"at {clock_text(self.finished_at)}")
        text = ", ".join(parts)
        return f"{text}: {self.message}" if self.message else text

    @property
    def evicted(self) -> bool:
        return self.reason == "Evicted"


def _task_name(pod: Mapping[str, Any]) -> str:
    return ((pod.get("metadata") or {}).get("labels") or {}).get(TASK_LABEL, "")


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The first non-zero container termination or image pull error of a pod, if any."""
    name = (pod.get("metadata") or {}).get("name", "")
    status = pod.get("status") or {}
    phase = status.get("phase") or "Unknown"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        last = container.get("lastState") or {}
        terminated = state.get("terminated") or last.get("terminated")
        if terminated and int(terminated.get("exitCode") or 0) != 0:
            message = terminated.get("message") or None
            text = (message or "").rstrip("\n")
            # Several lines: the log's tail (FallbackToLogsOnError), not a message of the script's.
            tail = tuple(text.splitlines()) if "\n" in text else ()
            return PodProblem(
                pod=name, task=_task_name(pod), phase=phase, container=container.get("name"),
                exit_code=int(terminated["exitCode"]), reason=terminated.get("reason"),
                message=None if tail else message, finished_at=parse_time(terminated.get("finishedAt")),
                log_tail=tail,
            )
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return PodProblem(
                pod=name, task=_task_name(pod), phase=phase, container=container.get("name"),
                reason=waiting["reason"],
                message=f"cannot pull image {container.get('image')!r}: {waiting.get('message') or ''}".strip(),
            )
    if phase == PodPhase.FAILED:
        # Evicted (or refused by the kubelet): no container says when; the Ready condition's change does.
        ready = _condition(status, "Ready") or {}
        return PodProblem(pod=name, task=_task_name(pod), phase=phase, reason=status.get("reason"),
                          message=status.get("message"), finished_at=parse_time(ready.get("lastTransitionTime")))
    return None


def failed_pods(pods: Iterable[Mapping[str, Any]], main_task: str | None = None) -> list[PodProblem]:
    """Problems of all pods in the order they ended, as far as the kubelet's whole seconds tell
    (`first_failures` refines it with the logs); within a second, the master's first."""
    problems = [problem for pod in pods if (problem := pod_problem(pod)) is not None]
    return sorted(problems, key=lambda problem: (_finished_second(problem), problem.task != main_task, problem.pod))


def _finished_second(problem: PodProblem) -> float:
    return math.inf if problem.finished_at is None else problem.finished_at


# A rank whose log ends with one of these (lowercased) died because a peer went away: a consequence.
PEER_LOST_SIGNS = (
    "connection closed by peer", "connection reset by peer", "broken pipe",  # gloo, sockets
    "remote process exited or there was a network error", "ncclremoteerror",  # NCCL
)


@dataclass(frozen=True)
class PodLogTail:
    """The last lines of one failed container's log, read with timestamps."""

    lines: tuple[str, ...]  # without their timestamps
    last_ns: int | None  # when its last line was written (nanoseconds: finer than the kubelet's seconds)

    @classmethod
    def from_raw(cls, raw_lines: Iterable[str]) -> PodLogTail:
        lines, last_ns = [], None
        for raw in raw_lines:
            if (line := stamped_line(raw)) is None:  # the kubelet's word, not the container's
                continue
            last_ns, message = line
            if not hidden(message):  # a stall's stacks are shown once, by its report
                lines.append(message)
        return cls(lines=tuple(lines), last_ns=last_ns)

    @property
    def lost_a_peer(self) -> bool:
        """Whether the container's last words were about a peer that went away."""
        text = "\n".join(self.lines).lower()
        return any(sign in text for sign in PEER_LOST_SIGNS)

    @property
    def last_words(self) -> str | None:
        """Its last line that says something (a traceback's error line, usually)."""
        return next((line.strip() for line in reversed(self.lines) if line.strip()), None)


def first_failures(problems: Sequence[PodProblem], logs: Mapping[str, PodLogTail]) -> list[PodProblem]:
    """The failed pods, the likely cause first. A distributed failure cascades: one rank fails and
    its peers die of the broken connection, often before the failed rank's own process has finished
    exiting (tested: the peers' containers ended first). So a pod whose log tells of a lost peer
    comes after every pod whose log does not; then by the second the kubelet says each ended; then
    by the time each wrote its last line."""
    def key(indexed: tuple[int, PodProblem]) -> tuple[bool, float, float, int]:
        index, problem = indexed
        tail = logs.get(problem.pod)
        last = math.inf if tail is None or tail.last_ns is None else float(tail.last_ns)
        return bool(tail and tail.lost_a_peer), _finished_second(problem), last, index

    return [problem for _, problem in sorted(enumerate(problems), key=key)]


def unstarted_pods(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the pods not yet running (nor ended), sorted."""
    return sorted((pod.get("metadata") or {}).get("name", "") for pod in pods
                  if (pod.get("status") or {}).get("phase") not in STARTED_POD_PHASES)


# Volcano v1.15's own scheduling gate (feature gate SchedulingGatesQueueAdmission, and a pod annotation of
# the same name): its scheduler removes it once the pod's queue has room for it.
VOLCANO_QUEUE_GATE = "scheduling.volcano.sh/queue-allocation-gate"


def scheduling_gates(pod: Mapping[str, Any]) -> list[str]:
    """The scheduling gates holding a pod back: Kubernetes schedules no pod that still has one."""
    return [str(gate["name"]) for gate in (pod.get("spec") or {}).get("schedulingGates") or []
            if isinstance(gate, Mapping) and gate.get("name")]


def gates_text(gates: Iterable[str]) -> str:
    """Scheduling gates as a person reads them: whose each is, and who removes it."""
    return ", ".join(f"{gate} (Volcano's: removed once the pod's queue has room for it)" if gate == VOLCANO_QUEUE_GATE
                     else f"{gate} (not Volcano's: removed by whoever added it)" for gate in gates)


def gated_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Pod name -> the scheduling gates holding it, for the pods not started that have any."""
    return {(pod.get("metadata") or {}).get("name", ""): tuple(gates) for pod in pods
            if (pod.get("status") or {}).get("phase") not in STARTED_POD_PHASES and (gates := scheduling_gates(pod))}


def image_pull_problem(pods: Iterable[Mapping[str, Any]]) -> PodProblem | None:
    for pod in pods:
        problem = pod_problem(pod)
        if problem is not None and problem.reason in IMAGE_PULL_REASONS:
            return problem
    return None


def pull_is_final(problem: PodProblem) -> bool:
    """Whether the kubelet says the image cannot exist or cannot be read (not found, manifest unknown,
    unauthorized, an invalid name, a policy that forbids pulling): a passing registry error is not."""
    if problem.reason in FINAL_PULL_REASONS:
        return True
    text = (problem.message or "").lower()
    return any(sign in text for sign in FINAL_PULL_SIGNS)


def pod_waiting_reason(pod: Mapping[str, Any]) -> str | None:
    """Why a pod that has not started waits, in the words of the scheduler (its PodScheduled condition)
    or the kubelet (its first waiting container)."""
    status = pod.get("status") or {}
    scheduled = _condition(status, "PodScheduled") or {}
    if (gates := scheduling_gates(pod)) and status.get("phase") not in STARTED_POD_PHASES:
        return f"held by scheduling gate {gates_text(gates)}"
    if scheduled.get("status") == "False":
        return scheduled.get("message") or scheduled.get("reason") or "not scheduled"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{waiting['reason']}: {waiting['message']}" if waiting.get("message") else waiting["reason"]
    return None


def gang_cannot_form(job: Mapping[str, Any], hopeless: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the Job can no longer reach its gang (its minAvailable, and each task's) without the
    `hopeless` pods (ones that can never start): a pod outside the gang (TensorBoard, replicas above
    minAvailable) is not needed to start it."""
    spec = job.get("spec") or {}
    missing: dict[str, int] = {}
    for pod in hopeless:
        task = _task_name(pod)
        missing[task] = missing.get(task, 0) + 1
    total = 0
    for task in spec.get("tasks") or []:
        replicas = int(task.get("replicas") or 0)
        total += replicas
        needed = task.get("minAvailable")
        available = replicas - missing.get(task.get("name") or "", 0)
        if needed is not None and available < int(needed):
            return True
    needed = spec.get("minAvailable")
    if not spec.get("tasks") or needed is None:
        return bool(missing)  # what the gang needs is unknown: every pod is needed
    return total - sum(missing.values()) < int(needed)


@dataclass(frozen=True)
class LostPod:
    """A pod whose node stopped answering: the node controller marked it not Ready while its
    containers still read as ready (the kubelet, which would have said otherwise, is silent)."""

    pod: str
    node: str
    since: float  # epoch seconds: when it was marked not Ready
    uid: str = ""  # this pod exactly: a replacement of the same name is another pod
    # The cluster's own eviction has begun: the taint manager deleted it (gracefully) once its
    # toleration of the node's NoExecute taint ran out; its kubelet, silent, cannot finish that delete.
    evicting: bool = False
    # How long the cluster tolerates it on a lost node before evicting it (its NoExecute toleration of
    # node.kubernetes.io/unreachable or not-ready: 300 s unless the pod says otherwise); None: forever.
    tolerated_seconds: float | None = None

    @property
    def since_text(self) -> str:
        return clock_text(self.since) if self.since else "an unknown time"


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((condition for condition in status.get("conditions") or [] if condition.get("type") == kind), None)


def lost_pods(pods: Iterable[Mapping[str, Any]], owner_uid: str | None = None) -> list[LostPod]:
    """The pods on nodes that stopped answering, read from the pods alone (no Node read, so no
    cluster-wide permission): Running, on a node, condition Ready False, yet every container status
    ready and every readiness gate met. A kubelet that fails a readiness probe or sees a container exit
    says so in the container status, and one whose pod waits for a readiness gate says
    `ReadinessGatesNotReady`; only the node controller (the node's Lease expired) turns Ready False
    behind its back. With `owner_uid`, only pods that Job owns (its uid in their owner references)."""
    lost = []
    for pod in pods:
        status, spec, metadata = pod.get("status") or {}, pod.get("spec") or {}, pod.get("metadata") or {}
        containers = status.get("containerStatuses") or []
        ready = _condition(status, "Ready")
        gates = [gate.get("conditionType") for gate in spec.get("readinessGates") or []]
        if (status.get("phase") != PodPhase.RUNNING or not spec.get("nodeName") or ready is None
                or ready.get("status") != "False" or ready.get("reason") == "ReadinessGatesNotReady"
                or not containers or not all(container.get("ready") for container in containers)
                or any((_condition(status, gate) or {}).get("status") != "True" for gate in gates)):
            continue
        if owner_uid is not None and not any(owner.get("uid") == owner_uid
                                             for owner in metadata.get("ownerReferences") or []):
            continue
        since = parse_time(ready.get("lastTransitionTime"))
        lost.append(LostPod(pod=metadata.get("name", ""), node=spec["nodeName"],
                            since=since if since is not None else 0.0, uid=metadata.get("uid", ""),
                            evicting=bool(metadata.get("deletionTimestamp")),
                            tolerated_seconds=node_loss_tolerated_seconds(spec)))
    return sorted(lost, key=lambda item: (item.node, item.pod))


# The taint the node lifecycle controller puts on a node whose kubelet went silent (NoExecute: the taint
# manager evicts the pods that do not tolerate it once their tolerationSeconds run out).
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def node_loss_tolerations(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations of the taint of a node that stopped answering."""
    return [dict(toleration) for toleration in spec.get("tolerations") or []
            if toleration.get("effect") in (None, "", "NoExecute")
            and (toleration.get("key") == UNREACHABLE_TAINT
                 or (not toleration.get("key") and toleration.get("operator") == "Exists"))]


def node_loss_tolerated_seconds(spec: Mapping[str, Any]) -> float | None:
    """How long the cluster lets the pod stay on a node that stopped answering before its own eviction
    begins: its longest toleration of that taint (the DefaultTolerationSeconds admission plugin gives
    300 s to a pod that says nothing; none at all: at once); None: forever (the cluster never evicts it)."""
    tolerations = node_loss_tolerations(spec)
    if not tolerations:
        return 0.0
    if any(toleration.get("tolerationSeconds") is None for toleration in tolerations):
        return None
    return max(float(toleration["tolerationSeconds"]) for toleration in tolerations)


def failures_not_listed(pods: Iterable[Mapping[str, Any]], failed: Mapping[str, dict]) -> dict[str, dict]:
    """The failed pods seen while waiting (`failed`: their last state, by name) that `pods`, as listed now,
    no longer show: removed since, or replaced by a later attempt's pod of the same name (a restart
    re-creates them under their names) that has not failed itself."""
    listed = {(pod.get("metadata") or {}).get("name"): pod for pod in pods}
    kept: dict[str, dict] = {}
    for name, view in failed.items():
        current = listed.get(name)
        if current is None or (((current.get("metadata") or {}).get("uid") != (view.get("metadata") or {}).get("uid"))
                               and (current.get("status") or {}).get("phase") != PodPhase.FAILED):
            kept[name] = view
    return kept


def pod_view(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod that waiting reads (`pod_problem`, `unstarted_pods`, `lost_pods`, a stall's
    pods): a triggerer keeps one per pod of each waited Job, and a whole pod is many times larger."""
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = metadata.get("labels") or {}
    spec = pod.get("spec") or {}
    gates = [gate.get("conditionType") for gate in spec.get("readinessGates") or []]
    return {
        "metadata": {**{key: metadata[key] for key in ("name", "uid", "resourceVersion", "deletionTimestamp")
                        if key in metadata}, "labels": {key: labels[key] for key in (TASK_LABEL,) if key in labels},
                     "ownerReferences": [{"uid": owner.get("uid")} for owner in metadata.get("ownerReferences") or []]},
        "spec": {**({"nodeName": spec["nodeName"]} if "nodeName" in spec else {}),
                 # What holds a pod back from scheduling (pod_waiting_reason, gated_pods).
                 **({"schedulingGates": spec["schedulingGates"]} if spec.get("schedulingGates") else {}),
                 **({"readinessGates": [{"conditionType": gate} for gate in gates]} if gates else {}),
                 # How long the cluster lets it stay on a node that stopped answering (lost_pods).
                 **({"tolerations": tolerated} if (tolerated := node_loss_tolerations(spec)) else {}),
                 # The first container (the training one) by name: a stall's stacks are read from its log.
                 "containers": [{"name": container.get("name")} for container in (spec.get("containers") or [])[:1]]},
        "status": {
            **{key: status[key] for key in ("phase", "reason", "message") if key in status},
            "conditions": [condition for condition in status.get("conditions") or []
                           if condition.get("type") in ("Ready", "PodScheduled", *gates)],
            "containerStatuses": [{key: container[key] for key in ("name", "image", "ready", "state", "lastState")
                                   if key in container} for container in status.get("containerStatuses") or []],
        },
    }


GENERIC_GANG_MESSAGE = "tasks in gang unschedulable: pod group is not ready"


def unschedulable_message(
    podgroup: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]] = ()
) -> str | None:
    """The scheduler's reason a gang cannot be placed: from the PodGroup's `Unschedulable`
    condition and the Unschedulable/FailedScheduling events of the PodGroup and its pods.

    Volcano's condition often says only "0/0 tasks in gang unschedulable: pod group is not
    ready"; the event beside it says why ("overused nvidia.com/gpu", "Insufficient cpu"), so the
    specific messages are preferred."""
    messages: dict[str, None] = {}
    for condition in ((podgroup or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Unschedulable" and condition.get("status") == "True":
            messages[condition.get("message") or condition.get("reason") or "Unschedulable"] = None
    for event in events:
        if event.get("reason") in ("Unschedulable", "FailedScheduling") and event.get("message"):
            messages[event["message"]] = None
    # "pod group is ready, 3 Binding" is Volcano saying the gang fits and is being bound: not a reason.
    messages = {message: None for message in messages if "pod group is ready" not in message}
    specific = [message for message in messages if GENERIC_GANG_MESSAGE not in message]
    chosen = specific or list(messages)
    return "; ".join(chosen[-3:]) if chosen else None


def warning_events(events: Iterable[Mapping[str, Any]], limit: int = 10) -> list[str]:
    """`Kind/name: Reason: message` for Warning events, newest last, deduplicated."""
    seen: dict[str, None] = {}
    ordered = sorted(events, key=lambda event: event.get("lastTimestamp") or event.get("eventTime") or "")
    for event in ordered:
        if event.get("type") != "Warning":
            continue
        involved = event.get("involvedObject") or {}
        line = f"{involved.get('kind', '?')}/{involved.get('name', '?')}: {event.get('reason')}: {event.get('message')}"
        seen[line.strip()] = None
    return list(seen)[-limit:]


def _first_failure_clause(first: PodProblem, others: int, codes: tuple[int, ...] | None) -> str:
    """`pod x-worker-1 failed first (exit code 1 at 10:02:03 UTC); 2 pods failed after it`."""
    verb = "was evicted" if first.evicted else "failed"
    what = [f"exit code {first.exit_code}"] if first.exit_code is not None else [f"reason {first.reason or '?'}"]
    if first.finished_at is not None:
        what[0] += f" at {clock_text(first.finished_at)}"
    if codes is not None and (first.evicted or first.exit_code in codes):
        what.append("retryable")
    text = f"pod {first.pod} {verb} {'first ' if others else ''}({', '.join(what)})"
    return text + (f"; {others} pod(s) failed after it" if others else "")


def failure_message(
    state: JobState,
    *,
    pods: Sequence[Mapping[str, Any]] = (),
    events: Sequence[Mapping[str, Any]] = (),
    main_task: str | None = None,
    logs: Mapping[str, PodLogTail] | None = None,
    log_pod: str | None = None,
    headline: str | None = None,
    lost_nodes: Sequence[str] = (),
) -> str:
    """The text a user reads when the task fails: which pod failed first (the likely cause: a
    distributed failure cascades), its exit code, reason and last log lines; then the pods that
    failed after it, a line each; then warning events.

    :param logs: the tails of failed pods' logs (and of `log_pod`'s), by pod.
    :param log_pod: whose log to show when no pod failed (the master's, after a timeout).
    """
    logs = logs or {}
    problems = first_failures(failed_pods(pods, main_task), logs)
    codes = state.retryable_exit_codes
    lines = [headline or f"Volcano Job {state.namespace}/{state.name} ended in phase {state.phase}"]
    if state.retry_count:
        lines[0] += f" after {state.retry_count} restart(s)"
        if state.phase == JobPhase.FAILED and state.max_retry and state.retry_count >= state.max_retry:
            lines[0] += f": the retry budget is exhausted ({budget_text(state)})"
    if problems and headline is None:
        lines[0] += f": {_first_failure_clause(problems[0], len(problems) - 1, codes)}"
    if lost_nodes:
        lines[0] += (f"; node {', '.join(lost_nodes)} stopped answering, and its pods were deleted after "
                     "node_lost_timeout (handled like an eviction)")
    shown_pod = problems[0].pod if problems else log_pod
    tail = logs.get(shown_pod) if shown_pod else None
    if tail is not None:
        lines.extend(failure_hints(tail.lines))
    fatal = [problem for problem in problems if codes is not None and problem.exit_code not in (None, *codes)]
    if fatal:
        lines.append(f"Exit code {fatal[0].exit_code} of pod {fatal[0].pod} is not one of retryable_exit_codes "
                     f"({', '.join(map(str, codes or ())) or 'none'}): the Job was ended without a restart.")
    if tail is not None and tail.lines:
        shown = tail.lines[-LOG_TAIL_LINES:]
        lines.append(f"Last {len(shown)} log lines of {shown_pod}:")
        lines.extend(f"  | {line}" for line in shown)
    if problems:
        lines.append("Failed pods, in the order they ended:" if len(problems) > 1 else "Failed pod:")
        for index, problem in enumerate(problems):
            line = f"  - {problem.describe()}"
            if index == 0 and len(problems) > 1:
                line += " (first: the likely cause)"
            elif index and (words := (other := logs.get(problem.pod)) and other.last_words):
                line += f"; its last line: {words[:300]}"
            lines.append(line)
    warnings = warning_events(events)
    if warnings:
        lines.append("Warning events:")
        lines.extend(f"  - {warning}" for warning in warnings)
    return "\n".join(lines)


# Any of these in the failed pod's log (lowercased) says it ran out of shared memory.
SHM_SIGNS = ("bus error", "unable to write to file </torch_", "/dev/shm")


def shared_memory_hint(log_tail: Sequence[str]) -> str | None:
    """One sentence when the log shows the training ran out of shared memory (PyTorch's DataLoader
    workers pass batches through /dev/shm and die with "bus error" or "unable to write to file")."""
    text = "\n".join(log_tail).lower()
    if any(sign in text for sign in SHM_SIGNS) or ("shm" in text and "no space left on device" in text):
        return ("The training ran out of shared memory (/dev/shm): PyTorch's DataLoader workers pass batches "
                "through it; raise shm_size (None turns it off and leaves the container's 64 MiB).")
    return None


def failure_hints(log_lines: Sequence[str]) -> list[str]:
    """What the failed pod's log says about the cause, in a sentence each (for now: shared memory)."""
    return [hint for hint in (shared_memory_hint(log_lines),) if hint]


def _pod_counts(job: Mapping[str, Any]) -> tuple[int, int]:
    """(pods running, pods the Job asks for)."""
    status = job.get("status") or {}
    tasks = (job.get("spec") or {}).get("tasks") or []
    total = sum(int(task.get("replicas") or 0) for task in tasks if isinstance(task, Mapping))
    return int(status.get("running") or 0), total


def describe_progress(job: Mapping[str, Any]) -> str:
    """One line on where a Job stands, as a person watching `kubectl get vcjob -w` would say it."""
    state = job_state(job)
    running, total = _pod_counts(job)
    line = f"Volcano Job {state.namespace}/{state.name} is {state.phase}"
    if state.phase in (JobPhase.PENDING, JobPhase.RUNNING):
        line += f": {running}/{total} pods running"
    if state.phase == JobPhase.RESTARTING or state.retry_count:
        line += f" ({state.retry_count} restart(s) so far" + (f"; {budget_text(state)})" if state.max_retry else ")")
    return line


def budget_text(state: JobState) -> str:
    """Volcano's maxRetry, and the task's two budgets it makes room for: "maxRetry 14 for max_retry 3,
    max_preemptions 10"; "max_retry 3" for a Job submitted without them."""
    if state.budget is None:
        return f"max_retry {state.max_retry}"
    return f"maxRetry {state.max_retry} for {state.budget.describe()}"


@dataclass
class JobProgress:
    """What a waiting loop tells the task log: one line per change of phase or restart count, and
    the scheduler's reason while the Job is Pending, each only when it changes."""

    _last: tuple[str, int] | None = None
    _last_reason: str | None = None

    def observe(self, job: Mapping[str, Any]) -> str | None:
        state = job_state(job)
        key = (state.phase, state.retry_count)
        if key == self._last:
            return None
        self._last = key
        if state.phase != JobPhase.PENDING:
            self._last_reason = None
        return describe_progress(job)

    def scheduler_reason(self, job: Mapping[str, Any], reason: str | None) -> str | None:
        state = job_state(job)
        if state.phase != JobPhase.PENDING or not reason or reason == self._last_reason:
            return None
        self._last_reason = reason
        return f"Volcano Job {state.namespace}/{state.name} is Pending, the scheduler says: {reason}"


def termination_result(pod: Mapping[str, Any] | None, container: str) -> Any:
    """What the container left in its termination message (`/dev/termination-log`, at most 4 KiB,
    read by the kubelet): the parsed JSON if it is JSON, else the text; None if it left nothing."""
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        terminated = (status.get("state") or {}).get("terminated") or {}
        message = terminated.get("message")
        if not message:
            return None
        try:
            return json.loads(message)
        except ValueError:
            return message.strip()
    return None
