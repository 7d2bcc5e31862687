"""The waiting engine: what to do next while a Volcano Job runs. Pure: no I/O, no clock, no sleep.

Fed what a driver observed (the Job it read, each change a watch delivered, the pods, the end of a
watch) with the time it observed it, the engine answers with the next action:

- `Done`: a verdict (finished, job_timeout, the task's deadline, a pod that cannot start, deleted);
- `CheckPods`: list the pods (and, while scheduling matters, the PodGroup and its events);
- `Watch`: watch the Job from a resourceVersion for at most so many seconds, feeding each change;
- `Reread`: the watch ended early (dropped, refused, 410 Gone): read the Job again after a back-off
  with jitter, so many waiters do not hammer an apiserver that is struggling;
- `DeletePods`: pods whose node stopped answering for node_lost_timeout: delete them at once
  (the kubelet cannot confirm), which Volcano handles as an eviction; then `pods_deleted`;
- `CollectStacks`: a Running Job gave no output and no change for stall_timeout (a stall): ask
  its pods for their Python stacks and show them; then `stacks_collected`;
- `RestartJob`: stall_action="restart": ask Volcano for a gang restart; then `restart_requested`.

Output (for stall_timeout) is observed through `last_output`, which a driver gives the engine: the
newest line its log copies have seen.

The worker's loop (`job_runner.wait_for_job`, blocking) and the trigger's (`VolcanoJobTrigger`,
asyncio) are thin drivers of this one engine: the same policy, contract and deadlines in both.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_volcano.constants import JobPhase, StallAction
from airflow_volcano.logs import Emit, LogCursor
from airflow_volcano.manifest import optional_seconds, seconds, stall_seconds
from airflow_volcano.manifest.checks import choice
from airflow_volcano.status import (
    JobProgress,
    JobState,
    LostPod,
    image_pull_problem,
    job_state,
    lost_pods,
    unschedulable_message,
    unstarted_pods,
)

if TYPE_CHECKING:
    from airflow_volcano.job_ref import JobRef

# A gang's pods share one scheduling story: the events of this many of them (one read each) tell it.
SCHEDULING_EVENT_PODS = 3
RUNNING_WATCH_SECONDS = 300.0  # a Running Job costs one watch request per five minutes
MAX_BACKOFF_SECONDS = 30.0


@dataclass(frozen=True)
class WaitLimits:
    """Client-side deadlines (Volcano has no job deadline of its own) and the pod check interval,
    in seconds: the operator's arguments of the same names. Travels to the trigger as `to_dict()`."""

    startup_timeout: float | None = 900.0
    job_timeout: float | None = None
    poll_interval: float = 5.0  # how often to look at pods while the Job has not started
    # How long pods on a node that stopped answering stay before they are deleted (None: never
    # looked for; a sensor, which does not own the Job, leaves it None).
    node_lost_timeout: float | None = None
    # Seconds a Running Job may give no output (log line, heartbeat) and no change (None: never a stall).
    stall_timeout: float | None = None
    stall_action: str = StallAction.FAIL

    @classmethod
    def checked(cls, *, startup_timeout: Any, job_timeout: Any, poll_interval: Any,
                node_lost_timeout: Any = None, stall_timeout: Any = None,
                stall_action: Any = StallAction.FAIL) -> WaitLimits:
        """From the operator's arguments (stall_timeout in minutes or a timedelta); a bad value
        raises JobSpecError naming its parameter."""
        choice("stall_action", stall_action, set(StallAction))
        return cls(startup_timeout=optional_seconds("startup_timeout", startup_timeout),
                   job_timeout=optional_seconds("job_timeout", job_timeout),
                   poll_interval=seconds("poll_interval", poll_interval),
                   node_lost_timeout=optional_seconds("node_lost_timeout", node_lost_timeout),
                   stall_timeout=stall_seconds("stall_timeout", stall_timeout),
                   stall_action=str(StallAction(stall_action)))

    def to_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WaitLimits:
        return cls(**data)


@dataclass
class WaitResult:
    state: JobState
    job: dict | None
    timed_out: str | None = None  # why the wait gave up, if it did
    problem: str | None = None  # a failure found before the Job itself failed (e.g. image pull)
    log_cursor: LogCursor = field(default_factory=LogCursor)
    deleted: str | None = None  # the Job disappeared while waited for
    lost_nodes: tuple[str, ...] = ()  # nodes whose pods were deleted after node_lost_timeout
    stalled: str | None = None  # the Job stalled (and was to be deleted): what the stacks showed, briefly
    stalls: int = 0  # stalls seen (each restarted the gang, with stall_action="restart", but the last)
    # Pods seen failed during the wait, by name (`status.pod_view`): Volcano may remove them before the end.
    failed_pods: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Done:
    result: WaitResult


@dataclass(frozen=True)
class CheckPods:
    scheduling: bool  # also read the PodGroup and the events that explain scheduling


@dataclass(frozen=True)
class Watch:
    resource_version: str
    seconds: int


@dataclass(frozen=True)
class Reread:
    after: float  # seconds to back off before reading the Job again


@dataclass(frozen=True)
class DeletePods:
    pods: tuple[str, ...]  # delete now (no grace period: their kubelet cannot confirm), then pods_deleted


@dataclass(frozen=True)
class CollectStacks:
    silent_for: float  # seconds without output or change


@dataclass(frozen=True)
class RestartJob:
    pass


Action = Done | CheckPods | Watch | Reread | DeletePods | CollectStacks | RestartJob


@dataclass(frozen=True)
class WaitStep:
    """What the policy says about the Job just read."""

    done: WaitResult | None = None
    check_pods: bool = False  # look for image pull errors / an expired startup_timeout
    wait_seconds: float = RUNNING_WATCH_SECONDS  # how long to watch for the next change at most


def backoff_after_drops(drops: int, jitter: float) -> float:
    """Seconds to wait after `drops` consecutive dropped watches: 0.5 s doubling per drop, at most
    30 s, with jitter in [0, 1) spreading it over the upper half (so many waiters do not retry in step)."""
    ceiling = min(MAX_BACKOFF_SECONDS, 0.5 * 2 ** min(drops, 6))
    return ceiling / 2 + jitter * ceiling / 2


def pod_check_interval(limits: WaitLimits, elapsed: float) -> float:
    """How often to look at pods of a Job that has not started: often at first (image pull errors
    show up early), then backing off to once a minute for a Job waiting long in a busy queue."""
    return min(60.0, max(limits.poll_interval, elapsed / 10))


def node_check_interval(limits: WaitLimits) -> float | None:
    """How often to look for pods on lost nodes while the Job runs: a third of node_lost_timeout,
    between 10 s and a minute (one pod list per check in a worker; none in a triggerer, where the
    shared pod watch keeps the pods current)."""
    if limits.node_lost_timeout is None:
        return None
    return min(60.0, max(10.0, limits.node_lost_timeout / 3))


def next_step(job: dict, limits: WaitLimits, elapsed: float, since_pod_check: float) -> WaitStep:
    """The waiting policy for one reading of the Job."""
    state = job_state(job)
    if state.finished:
        return WaitStep(done=WaitResult(state=state, job=job))
    if limits.job_timeout is not None and elapsed >= limits.job_timeout:
        return WaitStep(done=WaitResult(
            state=state, job=job, timed_out=f"job_timeout of {limits.job_timeout:.0f}s passed (phase {state.phase})"
        ))
    # Pods changing state do not always change the Job (an image pull error leaves it Pending),
    # so pods are looked at while some are pending; after that the watch alone suffices.
    wait = RUNNING_WATCH_SECONDS
    check_pods = False
    if _has_pending(job):
        interval = pod_check_interval(limits, elapsed)
        check_pods = since_pod_check >= interval
        wait = interval if check_pods else interval - since_pod_check
        if limits.startup_timeout is not None and elapsed < limits.startup_timeout:
            wait = min(wait, limits.startup_timeout - elapsed)
    elif (interval := node_check_interval(limits)) is not None and state.phase == JobPhase.RUNNING:
        check_pods = since_pod_check >= interval
        wait = interval if check_pods else interval - since_pod_check
    if limits.job_timeout is not None:
        wait = min(wait, limits.job_timeout - elapsed)
    return WaitStep(check_pods=check_pods, wait_seconds=max(1.0, wait))


class WaitEngine:
    """One wait for one Job. Drivers call `job_read` first, then do what each answer says.

    :param ref: the Job waited for.
    :param limits: startup_timeout, job_timeout, pod check interval.
    :param started_at: epoch seconds the Job's clock starts from (its creation).
    :param report: told each change of phase and the scheduler's reason while Pending.
    :param deadline: epoch seconds at which the wait gives up (a deferred task's execution_timeout).
    :param jitter: a number in [0, 1) per back-off (random by default; fixed in tests).
    :param last_output: when the followed logs last gave a line (epoch seconds), if ever: what
        the driver's log copies have seen so far (stall_timeout).
    """

    def __init__(self, ref: JobRef, limits: WaitLimits, *, started_at: float, report: Emit,
                 deadline: float | None = None, jitter: Callable[[], float] = random.random,
                 last_output: Callable[[], float | None] = lambda: None) -> None:
        self.ref, self.limits, self.started_at = ref, limits, started_at
        self.report, self.deadline, self.jitter = report, deadline, jitter
        self.last_output = last_output
        self.job: dict | None = None
        self._progress = JobProgress()
        self._last_pod_check = float("-inf")
        self._drops = 0
        self._watch: tuple[float, float] | None = None  # (opened at, for how long)
        self._scheduling = False  # the pending CheckPods asked for the scheduler's view
        self._lost: dict[str, tuple[str, ...]] = {}  # node -> its pods, as last reported lost
        self._lost_seen: dict[str, float] = {}  # pod -> when this wait first saw it lost
        self.lost_nodes: list[str] = []  # nodes whose pods were deleted after node_lost_timeout
        self._progress_at: float | None = None  # last output or change while Running (None: not Running)
        self._progress_version = ""  # the Job's resourceVersion at the last change
        self.stalls = 0

    def job_read(self, job: dict | None, now: float) -> Action:
        """The Job as a read (GET) returned it; None if it does not exist."""
        if job is None:
            return Done(WaitResult(state=job_state({}), job=None,
                                   deleted=f"Volcano Job {self.ref.namespace}/{self.ref.name} was deleted"))
        self._observe(job, now)
        return self._decide(now)

    def output_seen(self, at: float | None) -> None:
        """The time a followed log last gave a new line (a heartbeat too), if it ever did."""
        if at is not None and self._progress_at is not None:
            self._progress_at = max(self._progress_at, at)

    def stacks_collected(self, where: str, now: float) -> Action:
        """The answer to CollectStacks: `where` says briefly where each process was (the stacks
        themselves were shown)."""
        self.stalls += 1
        silent = _minutes(self.limits.stall_timeout or 0)
        if self.limits.stall_action == StallAction.RESTART:
            self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name} stalled: no output for {silent}; "
                        "restarting the gang (stall_action='restart'), under the Job's retry budget")
            return RestartJob()
        return Done(self._result(stalled=f"stalled: no output for {silent}{where and '; ' + where}"))

    def restart_requested(self, now: float) -> Action:
        """The answer to RestartJob: the stall's clock starts again."""
        self._progress_at = now
        return self._decide(now)

    def job_changed(self, job: dict, now: float) -> Action | None:
        """A change the open watch delivered: None to keep watching, else end the watch and act."""
        self._observe(job, now)
        step = next_step(job, self.limits, now - self.started_at, now - self._last_pod_check)
        if step.done is not None or (step.check_pods and self.starting) or self._past_deadline(now):
            self._watch = None
            return self._decide(now)
        return None

    def watch_ended(self, now: float) -> Action:
        """The watch request ended by itself: at its timeout, or early (dropped, refused, 410, deleted)."""
        opened, seconds = self._watch or (now, 0.0)
        self._watch = None
        if now - opened < seconds - 1:
            self._drops += 1
            return Reread(after=backoff_after_drops(self._drops, self.jitter()))
        self._drops = 0
        return self._decide(now)

    def pods_seen(self, pods: list[dict], podgroup: dict | None, events: list[dict], now: float) -> Action:
        """The answer to CheckPods (podgroup None and events empty unless it asked for scheduling)."""
        assert self.job is not None
        self._last_pod_check = now
        waited = now - self.started_at
        if self._scheduling:
            line = self._progress.scheduler_reason(self.job, unschedulable_message(podgroup, events))
            if line is not None:
                self.report(line)
        problem = startup_problem(self.ref, pods, podgroup, self.limits, waited, events)
        if problem is not None:
            return Done(self._result(problem=problem))
        if self.limits.node_lost_timeout is not None:
            expired = self._lost_node_pods(pods, now, self.limits.node_lost_timeout)
            if expired:
                return DeletePods(pods=expired)
        return self._decide(now)

    def pods_deleted(self, now: float) -> Action:
        """The answer to DeletePods (whether or not every delete succeeded: the next check retries)."""
        self._last_pod_check = now
        return self._decide(now)

    def _lost_node_pods(self, pods: list[dict], now: float, timeout: float) -> tuple[str, ...]:
        """Report each node that stops (or resumes) answering once; the pods lost for `timeout`,
        counted from when this wait first saw them lost (the apiserver's timestamps come from
        another clock, which may be skewed against this one)."""
        by_node: dict[str, list[LostPod]] = {}
        for pod in lost_pods(pods):
            by_node.setdefault(pod.node, []).append(pod)
        for node in [node for node in self._lost if node not in by_node]:
            self.report(f"Node {node} answers again: pod(s) {', '.join(self._lost.pop(node))} are ready")
        seen = {pod.pod for lost in by_node.values() for pod in lost}
        self._lost_seen = {pod: at for pod, at in self._lost_seen.items() if pod in seen}
        expired: list[str] = []
        for node, lost in by_node.items():
            names = tuple(pod.pod for pod in lost)
            if self._lost.get(node) != names:
                self._lost[node] = names
                self.report(f"Node {node} stopped answering: its pod(s) {', '.join(names)} of Volcano Job "
                            f"{self.ref.namespace}/{self.ref.name} were marked not ready at "
                            f"{lost[0].since_text}; unless it is back within node_lost_timeout ({timeout:.0f}s), "
                            "they are deleted and handled like an eviction")
            first_seen = min(self._lost_seen.setdefault(name, now) for name in names)
            if now - first_seen >= timeout:
                if node not in self.lost_nodes:  # said once; a delete that failed is retried quietly
                    self.lost_nodes.append(node)
                    self.report(f"Node {node} has not come back within node_lost_timeout ({timeout:.0f}s): "
                                f"deleting its pod(s) {', '.join(names)}; Volcano handles that like an eviction "
                                "(the Job restarts if its retry budget allows)")
                expired += names
        return tuple(expired)

    def _result(self, **fields: Any) -> WaitResult:
        assert self.job is not None
        return WaitResult(state=job_state(self.job), job=self.job, lost_nodes=tuple(self.lost_nodes),
                          stalls=self.stalls, **fields)

    @property
    def starting(self) -> bool:
        """Whether the Job has pods still to start (its pods are looked at until it has none)."""
        return self.job is not None and _has_pending(self.job)

    def _observe(self, job: dict, now: float) -> None:
        self.job = job
        if (line := self._progress.observe(job)) is not None:
            self.report(line)
        state = job_state(job)
        if state.phase != JobPhase.RUNNING:
            self._progress_at = None
        elif self._progress_at is None or state.resource_version != self._progress_version:
            self._progress_at = now  # started running, or changed (a pod ended, a restart): progress
        self._progress_version = state.resource_version

    def _stall_left(self, now: float) -> float | None:
        """Seconds until the Running Job counts as stalled (<= 0: it has); None if it cannot."""
        if self.limits.stall_timeout is None or self._progress_at is None:
            return None
        self.output_seen(self.last_output())
        return self._progress_at + self.limits.stall_timeout - now

    def _past_deadline(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline

    def _decide(self, now: float) -> Action:
        assert self.job is not None
        waited = now - self.started_at
        step = next_step(self.job, self.limits, waited, now - self._last_pod_check)
        if step.done is not None:
            return Done(dataclasses.replace(step.done, lost_nodes=tuple(self.lost_nodes), stalls=self.stalls))
        if self._past_deadline(now):
            return Done(self._result(timed_out="the task's execution_timeout passed"))
        stall_left = self._stall_left(now)
        if stall_left is not None and stall_left <= 0:
            assert self._progress_at is not None
            return CollectStacks(silent_for=now - self._progress_at)
        if step.check_pods:
            # The scheduler's view (PodGroup, events: two reads) once the Job has been Pending a while:
            # one that starts within a check interval needs no explaining.
            # (A running Job's pods are checked for lost nodes only.)
            self._scheduling = self.starting and (startup_timed_out(self.limits, waited) or (
                job_state(self.job).phase == JobPhase.PENDING and waited >= self.limits.poll_interval))
            return CheckPods(scheduling=self._scheduling)
        seconds = step.wait_seconds
        if self.deadline is not None:
            seconds = min(seconds, max(1.0, self.deadline - now))
        if stall_left is not None:
            seconds = min(seconds, max(1.0, stall_left))
        self._watch = (now, float(max(1, round(seconds))))
        return Watch(resource_version=job_state(self.job).resource_version, seconds=max(1, round(seconds)))


def _minutes(seconds: float) -> str:
    minutes = seconds / 60
    return f"{minutes:g} minute{'' if minutes == 1 else 's'}"


def _has_pending(job: dict) -> bool:
    status = job.get("status") or {}
    started = status.get("running") or status.get("succeeded") or status.get("failed")
    return int(status.get("pending") or 0) > 0 or not started


def startup_timed_out(limits: WaitLimits, waited: float) -> bool:
    return limits.startup_timeout is not None and waited >= limits.startup_timeout


def scheduling_subjects(podgroup: dict | None, pods: list[dict]) -> set[str]:
    """Names of the objects whose events explain scheduling: the PodGroup and a few pods not
    started (their events say the same thing for every pod of a gang; one read each)."""
    names = set(unstarted_pods(pods)[:SCHEDULING_EVENT_PODS])
    if podgroup is not None:
        names.add(podgroup["metadata"]["name"])
    return names


def startup_problem(
    ref: JobRef, pods: list[dict], podgroup: dict | None, limits: WaitLimits, waited: float,
    events: list[dict] | None = None,
) -> str | None:
    """Why the Job cannot start: a pod that cannot pull its image (at once), or pods still not
    scheduled after startup_timeout (with the scheduler's reason from the PodGroup)."""
    pull = image_pull_problem(pods)
    if pull is not None:
        return f"Volcano Job {ref.namespace}/{ref.name} cannot start: {pull.describe()}"
    if not startup_timed_out(limits, waited):
        return None
    pending = unstarted_pods(pods)
    if pods and not pending:
        return None
    reason = unschedulable_message(podgroup, events or [])
    text = (f"Volcano Job {ref.namespace}/{ref.name} did not start within startup_timeout "
            f"({limits.startup_timeout:.0f}s)")
    text += f": {reason}" if reason else ": pods were not scheduled"
    if pending:
        text += f" (pending pods: {', '.join(pending)})"
    return text
