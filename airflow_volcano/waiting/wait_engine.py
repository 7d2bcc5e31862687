"""The waiting engine: what to do next while a Volcano Job runs. Pure: no I/O, no clock, no sleep.

Fed what a driver observed (the Job it read, each change a watch delivered, the pods, the end of a
watch, what the followed logs showed) with the time it observed it on its own clock, the engine
answers with the next action:

- `ReadClock`: read the apiserver's clock (a response's Date header); then `clock_read`. Every
  decision on the Job's age (job_timeout; startup_timeout of a Job that has not run yet) is taken on
  that clock, never on the waiter's own, which may be skewed against it;
- `Done`: the verdict (`events.WaitOutcome`: finished, job_timeout, the task's deadline, a pod that
  cannot start, a stall, a spent restart budget, deleted);
- `CheckPods`: list the pods (and, while scheduling matters, the PodGroup and its events);
- `ReadQueue`: while the Job waits to start, read its queue (`queueing.QueueSnapshot`: the queue, the
  PodGroups that may be in it, the PriorityClasses), at most every QUEUE_REFRESH_SECONDS; then
  `queue_seen`, from which the task log says why the Job waits;
- `Watch`: watch the Job from a resourceVersion for at most so many seconds, feeding each change;
- `Reread`: the watch ended early (dropped, refused, 410 Gone): read the Job again after a back-off
  with jitter, so many waiters do not hammer an apiserver that is struggling;
- `DeletePods`: pods whose node stopped answering for node_lost_timeout: delete them at once (their
  kubelet cannot confirm), each only as the pod it was seen as (its uid); then `pods_deleted`;
- `ProbeOutput`: read the newest line of pods whose output counts for stall_timeout but is not copied
  (log_tasks' pods in the triggerer, the ranks' pods of a DeepSpeed/mpirun launch); then `output_probed`;
- `CollectStacks`: a Running Job gave no output and no change for stall_timeout (a stall): ask
  its pods for their Python stacks and show them; then `stacks_collected`;
- `RestartJob`: stall_action="restart": delete the Job's training pods, which its policies answer
  with a gang restart; then `restart_requested` (refused: the stall fails the task instead);
- `RecordPreemptions`: keep the preemptions and the retries counted on the Job, for a waiter that takes
  over; then `preemptions_recorded`. Each restart is a preemption (the scheduler's evictions say so) or a
  retry; when the Job's restart budgets (manifest/retry_budget.py) are spent, the waiter that owns it
  ends it.

The `now` of every observation is the waiter's own monotonic clock: intervals (the pod checks, a
stall's silence, a restart's start, a pull's back-off) are measured on it from when this waiter first
saw what they measure. Timestamps the cluster writes (the Job's creation, a pod's) are compared only
with the apiserver's time, which the engine knows as an offset from that clock (`clock_read`). When it
does not know it yet, no decision rests on it: the engine waits and reads the clock again.

Output is what the followed logs showed, on the waiter's own clock (`OutputClock`, which the
driver's log readers keep): a node's timestamps come from another clock. While the waiter cannot
see a followed log (a read that fails, or before its first read after the waiter itself started),
the stall's clock does not run: the engine acts only on what it is sure of.

The worker's loop (`wait_worker`, blocking) and the trigger's (`VolcanoJobTrigger`, asyncio) are
thin drivers of this one engine: the same policy, contract and deadlines in both; what they do at
the cluster for an action is written once in `wait_steps`.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_volcano.constants import (
    DEFAULT_IMAGE_PULL_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_STARTUP_TIMEOUT,
    MAX_STALL_RESTARTS,
    PREEMPTIONS_ANNOTATION,
    RETRIES_ANNOTATION,
    JobPhase,
    StallAction,
)
from airflow_volcano.hooks.calls import owned_by
from airflow_volcano.hooks.retry import backoff
from airflow_volcano.manifest import optional_seconds, seconds, stall_seconds
from airflow_volcano.manifest.checks import choice
from airflow_volcano.manifest.retry_budget import RetryBudget, kept_retries
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.logs import Emit, LogCursor
from airflow_volcano.status import (
    IMAGE_PULL_REASONS,
    JobProgress,
    LostPod,
    gang_cannot_form,
    gated_pods,
    gates_text,
    job_state,
    lost_pods,
    pod_problem,
    pod_waiting_reason,
    pull_is_final,
    unschedulable_message,
    unstarted_pods,
)
from airflow_volcano.timestamps import parse_time
from airflow_volcano.waiting.events import Verdict, WaitOutcome
from airflow_volcano.waiting.preemption import Preemption, evictions, name_preemptor, preemptions_of, record, recorded
from airflow_volcano.waiting.queueing import INQUEUE, QueueSnapshot, WaitingReport, queue_of, waiting_report
from airflow_volcano.waiting.stalls import describe_silence, kept_lines

if TYPE_CHECKING:
    from airflow_volcano.job_ref import JobRef

# A gang's pods share one scheduling story: the events of this many of them (one read each) tell it.
SCHEDULING_EVENT_PODS = 3
RUNNING_WATCH_SECONDS = 300.0  # a Running Job costs one watch request per five minutes
MAX_BACKOFF_SECONDS = 30.0
# While a followed log cannot be read, the engine looks again this often (it decides nothing meanwhile).
BLIND_RECHECK_SECONDS = 10.0
BLIND = "blind"  # what ProbeOutput's answer says of a pod whose log could not be read
# Why a Job waits is said on each change; unchanged, it is said again this often.
WAITING_REPEAT_SECONDS = 600.0
# A waiting Job's queue is read at most this often (in a worker a read lists every namespace's PodGroups).
QUEUE_REFRESH_SECONDS = 15.0
# The scheduler's view (the PodGroup and the events about it and its pods: reads of the Job's own) is
# read again at most this often while the Job waits; always at startup_timeout, whose failure quotes it.
SCHEDULER_VIEW_SECONDS = 60.0
# A restart's cause is looked for in this many reads of the events, the first as soon as it is seen.
CAUSE_READS = 2
CAUSE_RETRY_SECONDS = 5.0  # the second read: the scheduler's events are recorded asynchronously
# The evictions behind a restart are recorded this long before the waiter sees the Job restart, at most.
CAUSE_LOOKBACK_SECONDS = 60.0
# The Job that preempted is looked for in the queue this often, for this long: it is placed once the
# evicted pods are gone (their grace period), moments after the restart is seen.
NAMING_REREAD_SECONDS = 5.0
NAMING_SECONDS = 60.0
# Volcano's job controller creates a Job's pods as soon as the scheduler admits its PodGroup (Inqueue).
# Admitted and still without a pod this long (by the waiter's clock, from its first such sight), the
# controller missed that change, as it can when it loses the apiserver at that moment (found by the chaos
# soak: a Job submitted during an apiserver restart stayed Pending with no pod until startup_timeout).
ADMITTED_WITHOUT_PODS_SECONDS = 120.0
ADMITTED_PHASES = (INQUEUE, "Running")
# The phases in which a gang is starting (its first start, or again after a restart), which
# startup_timeout bounds.
RESTART_PHASES = (JobPhase.PENDING, JobPhase.RESTARTING)


@dataclass(frozen=True)
class WaitLimits:
    """Client-side deadlines (Volcano has no job deadline of its own) and the pod check interval,
    in seconds: the operator's arguments of the same names. Travels to the trigger as `to_dict()`."""

    startup_timeout: float | None = DEFAULT_STARTUP_TIMEOUT
    job_timeout: float | None = None
    # How long a pod of the gang may stay in image pull back-off that may clear (a 429, a 5xx, an
    # unreachable registry) before the Job counts as unable to start; an image that cannot exist or
    # cannot be read ends it at once. None: waited for as long as startup_timeout allows.
    image_pull_timeout: float | None = DEFAULT_IMAGE_PULL_TIMEOUT
    poll_interval: float = DEFAULT_POLL_INTERVAL  # how often to look at pods while the Job has not started
    # How long pods on a node that stopped answering stay before they are deleted (None: never
    # looked for; a sensor, which does not own the Job, leaves it None).
    node_lost_timeout: float | None = None
    # Seconds a Running Job may give no output (log line, heartbeat) and no change (None: never a stall).
    stall_timeout: float | None = None
    stall_action: str = StallAction.FAIL
    # Whether the waiter owns the Job (the operator's): it keeps the preemptions it counted on it. A sensor,
    # which does not, only says them.
    owns_job: bool = False

    @classmethod
    def checked(cls, *, startup_timeout: Any, job_timeout: Any, poll_interval: Any,
                node_lost_timeout: Any = None, stall_timeout: Any = None,
                stall_action: Any = StallAction.FAIL,
                image_pull_timeout: Any = DEFAULT_IMAGE_PULL_TIMEOUT, owns_job: bool = False) -> WaitLimits:
        """From the operator's arguments (each seconds or a timedelta); a bad value raises
        JobSpecError naming its parameter."""
        choice("stall_action", stall_action, set(StallAction))
        return cls(startup_timeout=optional_seconds("startup_timeout", startup_timeout),
                   job_timeout=optional_seconds("job_timeout", job_timeout),
                   image_pull_timeout=optional_seconds("image_pull_timeout", image_pull_timeout),
                   poll_interval=seconds("poll_interval", poll_interval),
                   node_lost_timeout=optional_seconds("node_lost_timeout", node_lost_timeout),
                   stall_timeout=stall_seconds("stall_timeout", stall_timeout),
                   stall_action=str(StallAction(stall_action)), owns_job=owns_job)

    def to_dict(self) -> dict[str, float | str | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WaitLimits:
        known = {item.name for item in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass(frozen=True)
class OutputView:
    """What the waiter knows of the followed logs' output at one moment (see OutputClock)."""

    last_seen: float | None  # when new output was last read (the waiter's clock)
    blind_at_last_seen: float  # the blind seconds counted up to then
    blind_total: float  # the blind seconds counted up to now
    blind: bool  # some followed log cannot be read now


class OutputClock:
    """What a waiter has seen of the output of the pods it follows, on its own clock. The driver's log
    readers (threads in a worker, tasks in the triggerer) tell it: `seen` (a new line, a heartbeat
    too), `blind` (reading a source failed: what it prints is not seen), `sighted` (reading the source
    works: it reached the log's end, or the pod has no log yet). A source starts blind when it is
    `expected` and is seen only once read: a waiter that just started (a reattach, a triggerer's
    restart) does not count the time before its first read as silence. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_seen: float | None = None
        self._blind_at_last_seen = 0.0
        self._blind: dict[str, float] = {}  # source -> since when it cannot be read
        self._blind_since: float | None = None  # since when some source cannot be read
        self._blind_total = 0.0  # blind seconds of the intervals that ended

    def expected(self, source: str, now: float) -> None:
        self.blind(source, now)

    def blind(self, source: str, now: float) -> None:
        with self._lock:
            if source not in self._blind:
                if not self._blind:
                    self._blind_since = now
                self._blind[source] = now

    def sighted(self, source: str, now: float) -> None:
        with self._lock:
            if self._blind.pop(source, None) is not None and not self._blind and self._blind_since is not None:
                self._blind_total += max(0.0, now - self._blind_since)
                self._blind_since = None

    def seen(self, now: float) -> None:
        with self._lock:
            if self._last_seen is None or now >= self._last_seen:
                self._last_seen = now
                self._blind_at_last_seen = self._total(now)

    def view(self, now: float) -> OutputView:
        with self._lock:
            return OutputView(self._last_seen, self._blind_at_last_seen, self._total(now), bool(self._blind))

    def _total(self, now: float) -> float:
        ongoing = max(0.0, now - self._blind_since) if self._blind_since is not None else 0.0
        return self._blind_total + ongoing


@dataclass(frozen=True)
class Done:
    outcome: WaitOutcome


@dataclass(frozen=True)
class ReadClock:
    """Read the apiserver's time (a response's Date header), then `clock_read`."""


@dataclass(frozen=True)
class CheckPods:
    scheduling: bool  # also read the PodGroup and the events that explain scheduling
    # ...and those of the gang's first pods by name (`restart_subjects`): a restart's cause (an eviction
    # to preempt) is recorded on pods that may be gone, and their successors have their names.
    restart: bool = False


@dataclass(frozen=True)
class ReadQueue:
    queue: str  # the queue the Job waits in: read it, then queue_seen


@dataclass(frozen=True)
class Watch:
    resource_version: str
    seconds: int


@dataclass(frozen=True)
class Reread:
    after: float  # seconds to back off before reading the Job again


@dataclass(frozen=True)
class PodRef:
    """One pod exactly: its name and its uid (a replacement of the same name is another pod)."""

    name: str
    uid: str


@dataclass(frozen=True)
class DeletePods:
    pods: tuple[PodRef, ...]  # delete now (no grace period: their kubelet cannot confirm), then pods_deleted


@dataclass(frozen=True)
class FollowedLog:
    """A pod whose output counts for stall_timeout: its log copied by the driver (`cursor`: how far,
    the node's nanoseconds), or only probed (`cursor` None: log_tasks' pods in the triggerer, the
    ranks' pods of a DeepSpeed/mpirun launch)."""

    pod: str
    container: str | None
    cursor: LogCursor | None = None


@dataclass(frozen=True)
class ProbeOutput:
    pods: tuple[tuple[str, str | None], ...]  # (pod, container): read each one's newest line


@dataclass(frozen=True)
class CollectStacks:
    silent_for: float  # seconds without output or change
    requested_at: float  # epoch seconds (the apiserver's, as far as known): the request's id and log start


@dataclass(frozen=True)
class RestartJob:
    """Delete these pods gracefully (they may save a checkpoint): the Job's policies restart the gang."""

    pods: tuple[PodRef, ...]


@dataclass(frozen=True)
class RecordPreemptions:
    """Keep the preemptions and retries counted on the Job (its annotations), for a waiter that takes over."""

    annotations: dict[str, str]


# What the engine asks of a driver: a step to do at the cluster (each a method of wait_steps.DriverSteps, found
# through wait_steps.STEPS), or Done.
Step = (ReadClock | CheckPods | ReadQueue | Watch | Reread | DeletePods | ProbeOutput | CollectStacks | RestartJob
        | RecordPreemptions)
Action = Done | Step


@dataclass(frozen=True)
class WaitStep:
    """What the policy says about the Job just read."""

    done: WaitOutcome | None = None
    check_pods: bool = False  # look for image pull errors / an expired startup_timeout
    wait_seconds: float = RUNNING_WATCH_SECONDS  # how long to watch for the next change at most


def backoff_after_drops(drops: int, jitter: float) -> float:
    """Seconds to wait after `drops` consecutive dropped watches: 0.5 s doubling per drop, at most
    30 s, with jitter in [0, 1) spreading it over the upper half (so many waiters do not retry in step)."""
    return backoff(drops, 0.5, MAX_BACKOFF_SECONDS, jitter)


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


def output_probe_interval(limits: WaitLimits) -> float | None:
    """How often the newest line of a pod whose output counts but is not copied is read: a quarter of
    stall_timeout, at most every 30 s."""
    return None if limits.stall_timeout is None else min(30.0, limits.stall_timeout / 4)


@dataclass
class _Progress:
    """The last sign of life of a Running Job (an output, or a change of the Job), and the blind
    seconds counted up to it: the stall's clock runs from there, blind time excluded."""

    at: float
    blind_at: float


@dataclass
class _Probes:
    """The newest line of each probed pod, the pods whose last probe failed, and when probes are next due."""

    newest: dict[str, int | None] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)
    due: float = float("-inf")


class WaitEngine:
    """One wait for one Job. Drivers call `job_read` first, then do what each answer says.

    :param ref: the Job waited for (its uid: only that Job's reads, changes and pods count).
    :param limits: startup_timeout, job_timeout, image_pull_timeout, pod check interval,
        node_lost_timeout, stall_timeout.
    :param report: told each change of phase and the scheduler's reason while Pending.
    :param server_offset: the apiserver's epoch time minus the waiter's `now` clock, if the driver read
        it before starting (else the engine asks, `ReadClock`).
    :param epoch_offset: the waiter's own epoch time minus its `now` clock: where the run's timeline is
        placed while the apiserver's time is not known.
    :param deadline: epoch seconds at which the wait gives up (a deferred task's execution_timeout),
        compared with the apiserver's time.
    :param jitter: a number in [0, 1) per back-off (random by default; fixed in tests).
    :param output: what the driver's log readers have seen (stall_timeout), on the `now` clock.
    :param followed: the pods whose output counts for stall_timeout.
    :param timeline: where what the wait sees of the run goes (the driver adds the pods' placements).
    """

    def __init__(self, ref: JobRef, limits: WaitLimits, *, report: Emit, server_offset: float | None = None,
                 epoch_offset: float = 0.0, deadline: float | None = None,
                 jitter: Callable[[], float] = random.random, output: OutputClock | None = None,
                 followed: tuple[FollowedLog, ...] = (), timeline: RunTimeline | None = None) -> None:
        self.ref, self.limits = ref, limits
        self.report, self.deadline, self.jitter = report, deadline, jitter
        self._server_offset, self._epoch_offset = server_offset, epoch_offset
        self._clock_asked = float("-inf")  # when the apiserver's clock was last asked for (unknown: again)
        self._clock_unknown_said = False
        self.output = output or OutputClock()
        self.followed = followed
        self.job: dict | None = None
        self._progress = JobProgress()
        self._last_pod_check = float("-inf")
        self._drops = 0
        self._watch: tuple[float, float] | None = None  # (opened at, for how long)
        self._scheduling = False  # the pending CheckPods asked for the scheduler's view
        self._lost: dict[str, tuple[str, ...]] = {}  # node -> its pods, as last reported lost
        self._lost_seen: dict[str, float] = {}  # pod -> when this wait first saw it lost
        self.lost_nodes: list[str] = []  # nodes whose pods were deleted after node_lost_timeout
        self._alive: _Progress | None = None  # last output or change while Running (None: not Running)
        self._alive_version = ""  # the Job's resourceVersion at the last change
        self._probes = _Probes()
        self.stalls = 0
        self.stack_lines: tuple[str, ...] = ()  # the last stall's report (STACKS_KEPT_BYTES of it)
        self.timeline = timeline or RunTimeline()
        self._stalled_since: float | None = None  # when the output stopped, for a stall being handled
        self._admitted_without_pods: float | None = None  # first seen admitted by the scheduler with no pod
        self.waiting: WaitingReport | None = None  # why the Job waits, as last read (while it does)
        self._queue_read = float("-inf")  # when the queue was last read
        self._scheduler_read = float("-inf")  # when the scheduler's view was last read
        self._podgroup: dict | None = None  # the PodGroup as the scheduler's view last read it
        self._waiting_said: tuple[str, float] | None = None  # the last such line, and when it was said
        self._pending_since: float | None = None  # when this wait first saw pods still to start (None: none)
        self._ran = False  # this wait saw the gang run
        self._restart_since: float | None = None  # when this wait first saw a restart's pods still to start
        self._pulls: dict[str, float] = {}  # pod uid (or name) -> since when it is in image pull back-off
        self._pulls_said: dict[str, str] = {}  # pod -> what was last said of its pull
        self._pulls_final: set[str] = set()  # pods the kubelet said can never pull their image
        self._outside_said: str | None = None  # what was last said of pods outside the running gang
        self._gated_said: str | None = None  # what was last said of pods held by scheduling gates
        self._unseen_said: str | None = None  # why the Job cannot be seen, as last said
        self.preemptions: list[Preemption] = []  # this wait's, oldest first
        self._restarts_seen: int | None = None  # the Job's restart count when last looked at
        self._restart_at: float | None = None  # when this wait saw the restart whose cause is looked for
        self._cause_reads = 0  # event reads left to find a restart's cause in
        self._cause_due = float("-inf")  # when the next of them is due
        self._evidence_until = float("-inf")  # the last eviction counted (epoch seconds, apiserver's clock)
        self._naming: Preemption | None = None  # a preemption whose preemptor the queue's reads may name
        self._naming_until = float("-inf")  # when it is said without one
        self.retries = 0  # restarts that spent max_retry (not preemptions), earlier waiters' included
        self._budget: RetryBudget | None = None  # the Job's restart budgets, as last read (None: it has none)
        self._unexplained: list[float] = []  # when this wait saw each restart whose cause it looks for
        self._unrecorded = False  # preemptions or retries counted and not yet kept on the Job
        self._restart_asked = False  # this wait restarted the gang (a stall): the next restart is that one

    # -- observations ---------------------------------------------------------------------------

    def job_read(self, job: dict | None, now: float) -> Action:
        """The Job as a read (GET) returned it; None if the apiserver says it does not exist. A Job of
        the same name with another uid means this one is gone (deleted, its name taken since)."""
        self._unseen_said = None
        if job is not None and not self._ours(job):
            uid = (job.get("metadata") or {}).get("uid")
            return self._finish(WaitOutcome(Verdict.DELETED, job=None, message=(
                f"Volcano Job {self.ref.namespace}/{self.ref.name} (uid {self.ref.uid}) was deleted: a Job of that "
                f"name with another uid ({uid}) exists now")), now)
        if job is None:
            return self._finish(WaitOutcome(Verdict.DELETED, job=None, message=(
                f"Volcano Job {self.ref.namespace}/{self.ref.name} was deleted")), now)
        self._observe(job, now)
        return self._decide(now)

    def job_changed(self, job: dict, now: float) -> Action | None:
        """A change the open watch delivered: None to keep watching, else end the watch and act. A
        change of another Job of the same name (another uid) says nothing sure of this one: it is
        read again."""
        if not self._ours(job):
            self._watch = None
            return Reread(after=0.0)
        self._observe(job, now)
        step = self._step(job, now)
        if (step.done is not None or (step.check_pods and self.starting) or self._past_deadline(now)
                or self._cause_reads):
            self._watch = None
            return self._decide(now)
        return None

    def job_deleted(self, uid: str | None, now: float) -> Action | None:
        """The watch delivered the deletion of a Job of this name: the end if it is this one (its uid),
        else nothing (an older Job of the same name: keep watching)."""
        if self.ref.uid and uid and uid != self.ref.uid:
            return None
        self._watch = None
        return self.job_read(None, now)

    def job_unseen(self, reason: str, now: float) -> Action:
        """The Job could not be read for a reason that says nothing of it (the apiserver does not serve
        Volcano Jobs just now: Volcano being upgraded): the wait goes on, read again after a back-off."""
        if self._unseen_said != reason:
            self._unseen_said = reason
            self.report(f"Cannot see Volcano Job {self.ref.namespace}/{self.ref.name}: {reason}. Nothing is "
                        "decided meanwhile; the task reads it again")
        self._drops += 1
        return Reread(after=backoff_after_drops(self._drops, self.jitter()))

    def clock_read(self, server_time: float | None, now: float) -> Action:
        """The answer to ReadClock: the apiserver's epoch time at `now` (its Date header), None if it
        could not be read (job_timeout and startup_timeout then wait, said once)."""
        self._clock_asked = now
        if server_time is not None:
            self._server_offset = server_time - now
        elif not self._clock_unknown_said:
            self._clock_unknown_said = True
            self.report("Cannot read the apiserver's clock: job_timeout and startup_timeout, which count from the "
                        "Job's creation on that clock, wait until it can be read")
        return self._decide(now)

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
        """The answer to CheckPods (podgroup None and events empty unless it asked for scheduling). Only
        this Job's own pods count (its uid in their owner references)."""
        assert self.job is not None
        if self.ref.uid:
            pods = [pod for pod in pods if owned_by(pod, self.ref.uid)]
        self._last_pod_check = now
        self._report_gated(pods)
        if self._cause_reads and self._scheduling and self._preempted(events, queue_of(self.job, podgroup), now):
            self._scheduling, self._podgroup, self._scheduler_read = False, podgroup, now
            return ReadQueue(queue=queue_of(self.job, podgroup))
        if self._scheduling:
            line = self._progress.scheduler_reason(self.job, unschedulable_message(podgroup, events))
            if line is not None:
                self.report(line)
        problem = self._start_problem(pods, podgroup, events, now) or self._pods_never_created(pods, podgroup, now)
        if problem is not None:
            return self._finish(self._outcome(Verdict.CANNOT_START, message=problem), now)
        if self.limits.node_lost_timeout is not None:
            expired = self._lost_node_pods(pods, now, self.limits.node_lost_timeout)
            if expired:
                return DeletePods(pods=expired)
        if self._scheduling:
            self._scheduler_read, self._podgroup, self._scheduling = now, podgroup, False
        if self._waits_in_queue(now) and now - self._queue_read >= QUEUE_REFRESH_SECONDS:
            return ReadQueue(queue=queue_of(self.job, self._podgroup))
        return self._decide(now)

    def queue_seen(self, queue: QueueSnapshot, now: float) -> Action:
        """The answer to ReadQueue: say why the Job waits; one that can never fit its queue ends now."""
        self._queue_read = now
        if self._naming is not None and self.job is not None:
            named = name_preemptor(self._naming, self.job, queue)
            if named.preemptor or now >= self._naming_until:
                # Said once named, or once the preemptor would have been placed: one line with everything.
                self._naming = None
                self._say_preemption(named)
            else:
                self._naming = named  # its reason so far: what the line says if the wait ends first
        never = self._queue_report(self._podgroup, queue, now)
        if never is not None:
            return self._finish(self._outcome(Verdict.CANNOT_START, message=never), now)
        return self._decide(now)

    def pods_deleted(self, now: float) -> Action:
        """The answer to DeletePods (whether or not every delete succeeded: the next check retries)."""
        self._last_pod_check = now
        return self._decide(now)

    def output_probed(self, newest: Mapping[str, int | str | None], now: float) -> Action:
        """The answer to ProbeOutput: each pod's newest line's timestamp (the node's nanoseconds, only
        compared with the same pod's), None if it has no log yet, or BLIND (the read failed)."""
        # A read of every followed pod just now: what a stall must be confirmed by before it is acted on.
        confirming = {log.pod for log in self.followed} <= set(newest)
        new_output = False
        cursors = {log.pod: log.cursor for log in self.followed}
        for pod, stamp in newest.items():
            source = f"probe:{pod}"
            if stamp == BLIND:
                self.output.blind(source, now)
                self._probes.failed.add(pod)
                continue
            self.output.sighted(source, now)
            self._probes.failed.discard(pod)
            number = stamp if isinstance(stamp, int) else None
            cursor = cursors.get(pod)
            if cursor is not None:  # copied: output the copy has not reached yet is output all the same
                new_output |= number is not None and number > cursor.last_ns
            else:
                new_output |= pod in self._probes.newest and number is not None and number != self._probes.newest[pod]
                self._probes.newest[pod] = number
        if new_output:
            self.output.seen(now)
        # A read that failed is tried again soon: until it works, no stall can be decided.
        interval = BLIND_RECHECK_SECONDS if self._probes.failed else output_probe_interval(self.limits)
        self._probes.due = now + (interval or RUNNING_WATCH_SECONDS)
        stall_left = self._stall_left(now)
        if confirming and stall_left is not None and stall_left <= 0:
            return self._collect_stacks(now)
        return self._decide(now)

    def stacks_collected(self, where: str, now: float, running: tuple[PodRef, ...] = (),
                         lines: Sequence[str] = ()) -> Action:
        """The answer to CollectStacks: `where` says briefly where each process was (the stacks
        themselves were shown: `lines`, kept for the outcome); `running`, the training pods a restart
        would delete."""
        self.stalls += 1
        self.stack_lines = kept_lines(lines)
        silent = describe_silence(self.limits.stall_timeout or 0)
        if self.limits.stall_action == StallAction.RESTART and running:
            if self.stalls <= MAX_STALL_RESTARTS:
                self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name} stalled: no output for {silent}; "
                            "restarting the gang (stall_action='restart'), under the Job's retry budget")
                return RestartJob(pods=running)
            where = (f"it stalled again after {MAX_STALL_RESTARTS} restarts (stall_action='restart' restarts at most "
                     f"{MAX_STALL_RESTARTS} times)" + (f"; {where}" if where else ""))
        return self._finish(self._outcome(
            Verdict.STALLED, message=f"stalled: no output for {silent}{where and '; ' + where}"), now)

    def restart_requested(self, now: float, refused: str | None = None) -> Action:
        """The answer to RestartJob: the stall's clock starts again; a refused restart ends the wait
        as stall_action="fail" would, saying why."""
        if refused is not None:
            silent = describe_silence(self.limits.stall_timeout or 0)
            return self._finish(self._outcome(Verdict.STALLED, message=(
                f"stalled: no output for {silent}; stall_action='restart' could not restart it ({refused})")), now)
        self._end_stall(now)
        self._restart_asked = True  # its cause is known: no preemption to look for
        if self._alive is not None:
            self._alive = _Progress(now, self.output.view(now).blind_total)
        return self._decide(now)

    def preemptions_recorded(self, refused: str | None, now: float) -> Action:
        """The answer to RecordPreemptions: kept on the Job, or why not (said; this wait counts on)."""
        if refused is not None:
            self.report(f"Could not keep the preemptions and retries counted on Volcano Job "
                        f"{self.ref.namespace}/{self.ref.name} ({refused}): a waiter that takes over looks for their "
                        "causes again")
        return self._decide(now)

    def _preempted(self, events: list[dict], queue: str, now: float) -> bool:
        """Whether the restart being explained was a preemption: evictions to preempt recorded since
        shortly before this wait saw it restart, and after any counted before. A restart that a read at
        least CAUSE_RETRY_SECONDS after it finds without one had another cause (a failed pod, a lost node)."""
        self._cause_reads -= 1
        self._cause_due = now + CAUSE_RETRY_SECONDS
        since = self._evidence_until
        if self._restart_at is not None:
            since = max(since, self._restart_at - CAUSE_LOOKBACK_SECONDS)
        found = evictions(events, since=since)
        if not found:
            # No eviction to preempt recorded CAUSE_RETRY_SECONDS after a restart (the scheduler records it
            # before it deletes the pods): that restart spent max_retry. A later one is looked into again.
            settled = [seen for seen in self._unexplained if now - seen >= CAUSE_RETRY_SECONDS]
            self._unexplained = self._unexplained[len(settled):]
            self._count_retries(len(settled))
            if self._unexplained:
                self._cause_reads = max(self._cause_reads, 1)
                self._cause_due = self._unexplained[0] + CAUSE_RETRY_SECONDS
            return False
        self._cause_reads = 0
        self._evidence_until = max(eviction.at for eviction in found)
        new = [dataclasses.replace(preemption, queue=queue) for preemption in preemptions_of(found)]
        self._count_retries(len(self._unexplained) - len(new))
        self._unexplained = []
        self.preemptions += new
        self.timeline.preempted += [preemption.at for preemption in new]
        self._naming, self._naming_until = new[-1], now + NAMING_SECONDS
        return True

    def _count_retries(self, count: int) -> None:
        """Restarts whose cause is known not to be a preemption: they spend max_retry (kept on the Job too)."""
        if count > 0:
            self.retries += count
            self._unrecorded = self._unrecorded or self.limits.owns_job

    def _say_preemption(self, preemption: Preemption) -> None:
        """The preemption's one line, and kept as said (on the Job too, by the waiter that owns it)."""
        self.preemptions[-1] = preemption
        self._unrecorded = self.limits.owns_job
        self.report(preemption.describe(f"{self.ref.namespace}/{self.ref.name}", len(self.preemptions),
                                        self._budget.max_preemptions if self._budget else None))

    def _queue_report(self, podgroup: dict | None, queue: QueueSnapshot, now: float) -> str | None:
        """Say why the Job waits, when it changed (or every WAITING_REPEAT_SECONDS); returns why it can
        never start if its gang needs more than its queue's capability."""
        report = waiting_report(podgroup, queue, self.ref.uid)
        self.waiting = report
        job = f"{self.ref.namespace}/{self.ref.name}"
        if (never := report.never_fits) is not None:
            return f"Volcano Job {job} can never start: it {never.describe(report.queue)}"
        text = report.describe(job)
        said = self._waiting_said
        if said is None or said[0] != text or now - said[1] >= WAITING_REPEAT_SECONDS:
            self._waiting_said = (text, now)
            self.report(text)
        return None

    # -- the decision -----------------------------------------------------------------------------

    @property
    def starting(self) -> bool:
        """Whether the Job has pods still to start (its pods are looked at until it has none)."""
        return self.job is not None and _has_pending(self.job)

    def _outcome(self, verdict: Verdict, **fields: Any) -> WaitOutcome:
        assert self.job is not None
        return WaitOutcome(verdict, phase=job_state(self.job).phase, job=self.job, **fields)

    def _finish(self, outcome: WaitOutcome, now: float) -> Done:
        """The wait's end: the outcome, with what this wait saw (lost nodes, stalls, the run's timeline)."""
        if self._naming is not None:  # a preemption not said yet (its preemptor not found so far): said now
            unnamed, self._naming = self._naming, None
            self._say_preemption(unnamed)
        if outcome.ends_the_job:
            self.timeline.ended_at = self._epoch(now)  # the Job is deleted now: its run ends here
        self._end_stall(now)
        return Done(dataclasses.replace(outcome, lost_nodes=tuple(self.lost_nodes), stalls=self.stalls,
                                        timeline=self.timeline, stacks=self.stack_lines,
                                        preemptions=tuple(self.preemptions)))

    def _end_stall(self, now: float) -> None:
        if self._stalled_since is not None:
            self.timeline.stalls.append((self._epoch(self._stalled_since), self._epoch(now)))
            self._stalled_since = None

    # -- clocks: the waiter's `now`, the apiserver's time -------------------------------------------

    def _server_time(self, now: float) -> float | None:
        """The apiserver's epoch time at `now`, if its clock has been read."""
        return None if self._server_offset is None else now + self._server_offset

    def _epoch(self, now: float) -> float:
        """An epoch time for the run's timeline: the apiserver's (its pods' timestamps are), else the waiter's."""
        return now + (self._server_offset if self._server_offset is not None else self._epoch_offset)

    def _job_age(self, job: dict, now: float) -> float | None:
        """Seconds since the Job's creation, both on the apiserver's clock; None while that is unknown."""
        created = parse_time((job.get("metadata") or {}).get("creationTimestamp")) or self.ref.created_at
        server = self._server_time(now)
        return None if created is None or server is None else max(0.0, server - created)

    def _ours(self, job: dict) -> bool:
        uid = (job.get("metadata") or {}).get("uid")
        return not self.ref.uid or not uid or uid == self.ref.uid

    # -- the Job's state ----------------------------------------------------------------------------

    def _observe(self, job: dict, now: float) -> None:
        self.job = job
        self.timeline.job_seen(job)
        if (line := self._progress.observe(job)) is not None:
            self.report(line)
        state = job_state(job)
        self._budget = state.budget
        if _has_pending(job):
            self._pending_since = now if self._pending_since is None else self._pending_since
        else:
            self._pending_since = None
            self.waiting = None
        if self._restarts_seen is None:
            # The preemptions earlier waiters counted; restarts since are looked into as this wait's own.
            kept = ((job.get("metadata") or {}).get("annotations") or {}).get(PREEMPTIONS_ANNOTATION)
            self.preemptions = recorded(kept)
            self.timeline.preempted += [preemption.at for preemption in self.preemptions
                                        if preemption.at not in self.timeline.preempted]
            self._evidence_until = max((preemption.at for preemption in self.preemptions), default=float("-inf"))
            self.retries = kept_retries(job)
            # Restarts no waiter explained are looked into; any not found to be a preemption then counts
            # against neither budget (its evidence may have expired): Volcano's maxRetry still bounds it.
            if state.retry_count > len(self.preemptions) + self.retries:
                created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
                self._cause_reads, self._cause_due, self._restart_at = CAUSE_READS, now, None
                self._evidence_until = max(self._evidence_until, created or float("-inf"))
        elif state.retry_count > self._restarts_seen and self._restart_asked:
            self._restart_asked = False
            self._count_retries(state.retry_count - self._restarts_seen)  # a stall's restart
        elif state.retry_count > self._restarts_seen:
            # A restart this wait saw happen: its cause is looked for in the events (a preemption?), since
            # shortly before the first restart not explained yet.
            self._unexplained += [now] * (state.retry_count - self._restarts_seen)
            self._cause_reads, self._cause_due = CAUSE_READS, now
            self._restart_at = self._epoch(self._unexplained[0])
        self._restarts_seen = state.retry_count
        if state.phase == JobPhase.RUNNING:
            self._ran, self._restart_since = True, None
        elif (state.phase in RESTART_PHASES and self._restart_since is None
              and (self._ran or state.retry_count > 0)):
            # A gang that ran (or was restarted before this wait began) is starting again: its new pods
            # are waited for from now, not from the Job's creation.
            self._restart_since = now
        if state.phase != JobPhase.RUNNING:
            self._alive = None
        elif self._alive is None or state.resource_version != self._alive_version:
            # Started running, or changed (a pod ended, a restart): a sign of life.
            self._alive = _Progress(now, self.output.view(now).blind_total)
        self._alive_version = state.resource_version

    def _budget_spent(self) -> str | None:
        """Why the Job must end, if the waiter that owns it counted more restarts after failures than
        max_retry allows, or more preemptions than max_preemptions (their budgets: manifest/retry_budget.py).
        A preemption ends it once said (its preemptor named, or known unnamed)."""
        budget = self._budget
        if not self.limits.owns_job or budget is None:
            return None
        job = f"Volcano Job {self.ref.namespace}/{self.ref.name}"
        if self.retries >= budget.max_retry:
            return (f"{job} was restarted {self.retries} time(s) after a failure, an eviction, a lost node or a stall: "
                    f"the retry budget is exhausted (max_retry {budget.max_retry}: Volcano counts the restart that "
                    f"finds it spent); its {len(self.preemptions)} preemption(s) did not spend it")
        if len(self.preemptions) > budget.max_preemptions and self._naming is None:
            return (f"{job} was preempted {len(self.preemptions)} times, more than max_preemptions "
                    f"({budget.max_preemptions}); the last at {self.preemptions[-1].summary()}")
        return None

    def _step(self, job: dict, now: float) -> WaitStep:
        """The waiting policy for one reading of the Job."""
        state = job_state(job)
        if state.finished:
            return WaitStep(done=WaitOutcome(Verdict.FINISHED, phase=state.phase, job=job))
        age = self._job_age(job, now)
        timeout = self.limits.job_timeout
        if timeout is not None and age is not None and age >= timeout:
            return WaitStep(done=WaitOutcome(
                Verdict.JOB_TIMEOUT, message=f"job_timeout of {timeout:.0f}s passed (phase {state.phase})",
                phase=state.phase, job=job))
        # Pods changing state do not always change the Job (an image pull error leaves it Pending),
        # so pods are looked at while some are pending; after that the watch alone suffices.
        wait = RUNNING_WATCH_SECONDS
        check_pods = False
        since_pod_check = now - self._last_pod_check
        interval: float | None
        if _has_pending(job):
            interval = pod_check_interval(self.limits, now - (self._pending_since or now))
            check_pods = since_pod_check >= interval
            wait = interval if check_pods else interval - since_pod_check
            if (left := self._startup_left(job, now)) is not None and left > 0:
                wait = min(wait, left)
        elif (interval := node_check_interval(self.limits)) is not None and state.phase == JobPhase.RUNNING:
            check_pods = since_pod_check >= interval
            wait = interval if check_pods else interval - since_pod_check
        if timeout is not None and age is not None:
            wait = min(wait, timeout - age)
        return WaitStep(check_pods=check_pods, wait_seconds=max(1.0, wait))

    def _startup_left(self, job: dict, now: float) -> float | None:
        """Seconds until the gang counts as unable to start (<= 0: it does); None while nothing bounds
        it: no startup_timeout, the gang runs, or (for a first start, counted from the Job's creation)
        the apiserver's time is not known. A restart's start counts from when this wait first saw it."""
        timeout = self.limits.startup_timeout
        if timeout is None or job_state(job).phase not in RESTART_PHASES or not _has_pending(job):
            return None
        if self._restart_since is not None:
            return timeout - (now - self._restart_since)
        age = self._job_age(job, now)
        return None if age is None else timeout - age

    def _start_problem(self, pods: list[dict], podgroup: dict | None, events: list[dict], now: float) -> str | None:
        """Why the gang cannot start: a pod it needs that cannot pull its image (at once when the image
        cannot exist or cannot be read, after image_pull_timeout of back-off otherwise), or the gang not
        running when startup_timeout has passed (with the scheduler's reason). Pods outside the gang (a
        TensorBoard, replicas above minAvailable) never end the Job: they are reported."""
        assert self.job is not None
        state = job_state(self.job)
        gang_runs = state.phase == JobPhase.RUNNING
        hopeless = self._image_pulls(pods, now, gang_runs)
        job = f"Volcano Job {self.ref.namespace}/{self.ref.name}"
        if gang_runs:
            self._report_outside_gang(pods)
            return None
        self._outside_said = None
        if hopeless and gang_cannot_form(self.job, [pod for pod, _ in hopeless]):
            # Named: a pod the gang cannot do without, rather than one outside it.
            _, cause = next((item for item in hopeless if gang_cannot_form(self.job, [item[0]])), hopeless[0])
            return f"{job} cannot start: {cause}"
        left = self._startup_left(self.job, now)
        if left is None or left > 0:
            return None
        pending = unstarted_pods(pods)
        if pods and not pending:
            return None
        reason = unschedulable_message(podgroup, events)
        timeout = self.limits.startup_timeout or 0
        if self._restart_since is not None:
            text = (f"{job} was restarted (restarts so far: {state.retry_count}) and its pods did not start again "
                    f"within startup_timeout ({timeout:.0f}s) of the restart")
        else:
            text = f"{job} did not start within startup_timeout ({timeout:.0f}s)"
        text += f": {reason}" if reason else ": pods were not scheduled"
        if gated := gated_pods(pods):
            text += "; held by scheduling gates: " + "; ".join(f"{pod}: {gates_text(gates)}"
                                                             for pod, gates in sorted(gated.items()))
        if pending:
            text += f" (pending pods: {', '.join(pending)})"
        return text

    def _image_pulls(self, pods: list[dict], now: float, gang_runs: bool) -> list[tuple[dict, str]]:
        """The pods that cannot pull their image, with what the kubelet says: at once when the image cannot
        exist or cannot be read; after image_pull_timeout of back-off otherwise (from when this wait first
        saw it back off; a pull that works again starts it anew), said while the kubelet retries."""
        hopeless: list[tuple[dict, str]] = []
        backing_off: dict[str, float] = {}
        timeout = self.limits.image_pull_timeout
        for pod in pods:
            problem = pod_problem(pod)
            if problem is None or problem.reason not in IMAGE_PULL_REASONS:
                continue
            key = (pod.get("metadata") or {}).get("uid") or problem.pod
            since = backing_off[key] = self._pulls.get(key, now)
            final = pull_is_final(problem) or key in self._pulls_final
            if final:
                self._pulls_final.add(key)  # the kubelet's back-off message may not repeat the cause
                hopeless.append((pod, problem.describe()))
            elif timeout is not None and now - since >= timeout:
                hopeless.append((pod, f"{problem.describe()} (still failing after image_pull_timeout, {timeout:.0f}s, "
                                      "of the kubelet's retries)"))
            elif not gang_runs and key not in self._pulls_said:  # once per back-off (its reason flips with each retry)
                self._pulls_said[key] = problem.reason or ""
                limit = f"image_pull_timeout ({timeout:.0f}s)" if timeout is not None else "startup_timeout"
                self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name}: {problem.describe()}; the kubelet "
                            f"retries (a registry error may pass), and the task waits up to {limit}")
        self._pulls = backing_off
        self._pulls_said = {key: said for key, said in self._pulls_said.items() if key in backing_off}
        self._pulls_final &= set(backing_off)
        return hopeless

    def _report_gated(self, pods: list[dict]) -> None:
        """Pods that scheduling gates hold back (Kubernetes schedules none of them until each gate is
        removed): said when that changes."""
        gated: dict[tuple[str, ...], list[str]] = {}
        for pod, gates in gated_pods(pods).items():
            gated.setdefault(gates, []).append(pod)
        text = "; ".join(f"{', '.join(sorted(names))} held by scheduling gate {gates_text(gates)}"
                         for gates, names in sorted(gated.items(), key=lambda item: sorted(item[1])))
        if text and text != self._gated_said:
            self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name}: {text}; Kubernetes schedules a pod "
                        "only once its gates are removed")
        self._gated_said = text or None

    def _report_outside_gang(self, pods: list[dict]) -> None:
        """The gang runs: pods still to start are outside what it needs; said when that changes."""
        started = set(unstarted_pods(pods))
        waiting = [f"{name} ({why})" if (why := pod_waiting_reason(pod)) else name for pod in pods
                   if (name := (pod.get("metadata") or {}).get("name", "")) in started]
        text = "; ".join(sorted(waiting))
        if text and text != self._outside_said:
            self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name} runs; pod(s) outside its gang (not needed "
                        f"to run it) still wait: {text}")
        self._outside_said = text or None

    def _stall_left(self, now: float) -> float | None:
        """Seconds until the Running Job counts as stalled (<= 0: it has); None if it cannot (off, not
        Running, or a followed log cannot be read now: the engine does not guess)."""
        if self.limits.stall_timeout is None or self._alive is None:
            return None
        view = self.output.view(now)
        if view.last_seen is not None and view.last_seen > self._alive.at:
            self._alive = _Progress(view.last_seen, view.blind_at_last_seen)
        if view.blind:
            return None
        silent = now - self._alive.at - (view.blind_total - self._alive.blind_at)
        return self.limits.stall_timeout - silent

    def _silent_for(self, now: float) -> float:
        assert self._alive is not None
        return now - self._alive.at - (self.output.view(now).blind_total - self._alive.blind_at)

    def _pods_never_created(self, pods: list[dict], podgroup: dict | None, now: float) -> str | None:
        """Volcano admitted the Job (its PodGroup) but its controller has created no pod since: said once,
        then, ADMITTED_WITHOUT_PODS_SECONDS after it was first seen, the Job cannot start (it never would)."""
        if podgroup is None:  # this check did not read the scheduler's view: nothing new is known
            return None
        phase = (podgroup.get("status") or {}).get("phase")
        if pods or phase not in ADMITTED_PHASES:
            self._admitted_without_pods = None
            return None
        if self._admitted_without_pods is None:
            self._admitted_without_pods = now
            self.report(f"Volcano Job {self.ref.namespace}/{self.ref.name}: the scheduler admitted it (PodGroup "
                        f"{phase}) but Volcano's job controller has created no pod; the task gives it "
                        f"{ADMITTED_WITHOUT_PODS_SECONDS:.0f}s")
            return None
        if now - self._admitted_without_pods < ADMITTED_WITHOUT_PODS_SECONDS:
            return None
        return (f"Volcano Job {self.ref.namespace}/{self.ref.name} cannot start: the scheduler admitted it (PodGroup "
                f"{phase}) but Volcano's job controller created no pod in {now - self._admitted_without_pods:.0f}s: it "
                "missed the PodGroup's change, as it can when it loses the apiserver at that moment (an apiserver "
                "restart), and would never create them. The Job is deleted; the task's next try submits it again "
                "(restarting vc-controller-manager also recovers such Jobs)")

    def _waits_in_queue(self, now: float) -> bool:
        """Pending long enough to be explained: one that starts within poll_interval needs no explaining."""
        assert self.job is not None
        return (self.starting and job_state(self.job).phase == JobPhase.PENDING and self._pending_since is not None
                and now - self._pending_since >= self.limits.poll_interval)

    def _collect_stacks(self, now: float) -> CollectStacks:
        """A stall: its time runs from the last output until it is handled (a restart, or the end)."""
        silent_for = self._silent_for(now)
        self._stalled_since = now - silent_for
        return CollectStacks(silent_for=silent_for, requested_at=self._epoch(now))

    def _past_deadline(self, now: float) -> bool:
        """Whether the task's execution_timeout (an epoch time) has passed, by the apiserver's clock."""
        server = self._server_time(now)
        return self.deadline is not None and server is not None and server >= self.deadline

    def _probed(self) -> tuple[tuple[str, str | None], ...]:
        """The pods read by probes: those no log reader follows, and any whose last probe failed."""
        return tuple((log.pod, log.container) for log in self.followed
                     if log.cursor is None or log.pod in self._probes.failed)

    def _probe_due(self, now: float) -> bool:
        return bool(self._probed()) and self._alive is not None and self.limits.stall_timeout is not None \
            and now >= self._probes.due

    def _decide(self, now: float) -> Action:
        assert self.job is not None
        if self._server_offset is None and now - self._clock_asked >= BLIND_RECHECK_SECONDS:
            return ReadClock()
        step = self._step(self.job, now)
        if step.done is not None:
            return self._finish(step.done, now)
        if self._unrecorded:
            self._unrecorded = False
            return RecordPreemptions(annotations={PREEMPTIONS_ANNOTATION: record(self.preemptions),
                                                  RETRIES_ANNOTATION: str(self.retries)})
        if (spent := self._budget_spent()) is not None:
            return self._finish(self._outcome(Verdict.BUDGET_SPENT, message=spent), now)
        if self._past_deadline(now):
            return self._finish(self._outcome(Verdict.DEADLINE, message="the task's execution_timeout passed"), now)
        if self._probe_due(now):
            return ProbeOutput(pods=self._probed())
        stall_left = self._stall_left(now)
        if stall_left is not None and stall_left <= 0:
            if not self.followed:
                return self._collect_stacks(now)
            # Silent as far as the waiter saw: before acting, a fresh read of every followed log (a
            # stream may hang without failing, a copy may lag) must confirm it.
            return ProbeOutput(pods=tuple((log.pod, log.container) for log in self.followed))
        if self._naming is not None and now - self._queue_read >= NAMING_REREAD_SECONDS:
            return ReadQueue(queue=queue_of(self.job, self._podgroup))
        if self._cause_reads and now >= self._cause_due:
            # A restart just seen: its cause (an eviction to preempt) is in the events of the Job's
            # pods and PodGroup, read now (the scheduler records them before deleting the pods).
            self._scheduling = True
            return CheckPods(scheduling=True, restart=True)
        if step.check_pods:
            # The scheduler's view (PodGroup, events: two reads) once the Job has been Pending a while:
            # one that starts within a check interval needs no explaining.
            # (A running Job's pods are checked for lost nodes only.)
            left = self._startup_left(self.job, now)
            self._scheduling = self.starting and ((left is not None and left <= 0) or (
                self._waits_in_queue(now) and now - self._scheduler_read >= SCHEDULER_VIEW_SECONDS))
            return CheckPods(scheduling=self._scheduling)
        seconds = step.wait_seconds
        if self.deadline is not None and (server := self._server_time(now)) is not None:
            seconds = min(seconds, max(1.0, self.deadline - server))
        if self._server_offset is None:
            seconds = min(seconds, BLIND_RECHECK_SECONDS)  # the apiserver's clock unknown: ask again soon
        if self._cause_reads:
            seconds = min(seconds, max(1.0, self._cause_due - now))
        if self._naming is not None:
            seconds = min(seconds, max(1.0, self._queue_read + NAMING_REREAD_SECONDS - now))
        if stall_left is not None:
            seconds = min(seconds, max(1.0, stall_left))
        elif self._alive is not None and self.limits.stall_timeout is not None:
            seconds = min(seconds, BLIND_RECHECK_SECONDS)  # blind: look again soon
        if self._probed() and self._alive is not None and self.limits.stall_timeout is not None:
            seconds = min(seconds, max(1.0, self._probes.due - now))
        self._watch = (now, float(max(1, round(seconds))))
        return Watch(resource_version=job_state(self.job).resource_version, seconds=max(1, round(seconds)))

    def _lost_node_pods(self, pods: list[dict], now: float, timeout: float) -> tuple[PodRef, ...]:
        """Report each node that stops (or resumes) answering once; delete a lost pod only once the
        cluster's own eviction of it has begun (its toleration of the node's taint ran out: the taint
        manager deleted it, which its silent kubelet cannot finish) and it has been lost for `timeout`,
        counted from when this wait first saw it lost (on this wait's clock). Never before Kubernetes
        would give it up itself; only this Job's own pods count."""
        by_node: dict[str, list[LostPod]] = {}
        for pod in lost_pods(pods, owner_uid=self.ref.uid):
            by_node.setdefault(pod.node, []).append(pod)
        present = {(pod.get("metadata") or {}).get("name") for pod in pods}
        for node in [node for node in self._lost if node not in by_node]:
            names = self._lost.pop(node)
            back = [name for name in names if name in present]
            if back:  # not when its pods are gone (deleted after node_lost_timeout, or by Volcano)
                self.report(f"Node {node} answers again: pod(s) {', '.join(back)} are ready")
        seen = {pod.pod for lost in by_node.values() for pod in lost}
        self._lost_seen = {pod: at for pod, at in self._lost_seen.items() if pod in seen}
        expired: list[PodRef] = []
        for node, lost in by_node.items():
            names = tuple(pod.pod for pod in lost)
            if self._lost.get(node) != names:
                self._lost[node] = names
                self.report(f"Node {node} stopped answering: its pod(s) {', '.join(names)} of Volcano Job "
                            f"{self.ref.namespace}/{self.ref.name} were marked not ready at "
                            f"{lost[0].since_text}; {_lost_plan(lost, timeout)}")
            first_seen = min(self._lost_seen.setdefault(name, now) for name in names)
            evicted = [pod for pod in lost if pod.evicting]
            if now - first_seen < timeout or not evicted:
                continue
            if node not in self.lost_nodes:  # said once; a delete that failed is retried quietly
                self.lost_nodes.append(node)
                since = min((pod.since for pod in lost if pod.since), default=self._epoch(first_seen))
                self.timeline.lost.append((min(since, self._epoch(first_seen)), self._epoch(now)))
                self.report(f"Node {node} has not come back within node_lost_timeout ({timeout:.0f}s) and the cluster "
                            f"is evicting its pod(s) {', '.join(pod.pod for pod in evicted)}, which its silent kubelet "
                            "cannot finish: deleting them; Volcano handles that like an eviction (the Job restarts "
                            "if its retry budget allows)")
            expired += [PodRef(pod.pod, pod.uid) for pod in evicted]
        return tuple(expired)


def _lost_plan(lost: Sequence[LostPod], timeout: float) -> str:
    """What happens to the pods of a lost node, as the task log says it when the node goes silent."""
    tolerated = [pod.tolerated_seconds for pod in lost]
    if any(seconds is None for seconds in tolerated):
        return ("they tolerate the node's unreachable taint without limit, so the cluster never evicts them: the "
                "task waits for the node to come back")
    longest = max((seconds or 0.0) for seconds in tolerated)
    return (f"unless it is back first, the cluster evicts them after their toleration of its unreachable taint "
            f"({longest:.0f}s), and once that has begun and node_lost_timeout ({timeout:.0f}s) has passed they are "
            "deleted and handled like an eviction")


def _has_pending(job: dict) -> bool:
    status = job.get("status") or {}
    started = status.get("running") or status.get("succeeded") or status.get("failed")
    return int(status.get("pending") or 0) > 0 or not started


def scheduling_subjects(podgroup: dict | None, pods: list[dict]) -> set[str]:
    """Names of the objects whose events explain scheduling: the PodGroup and a few pods not
    started (their events say the same thing for every pod of a gang; one read each)."""
    names = set(unstarted_pods(pods)[:SCHEDULING_EVENT_PODS])
    if podgroup is not None:
        names.add(podgroup["metadata"]["name"])
    return names


def restart_subjects(job: dict | None) -> set[str]:
    """The names of the first pods of each of the Job's tasks (`<job>-<task>-<index>`, Volcano's naming), at
    most SCHEDULING_EVENT_PODS: whose events say why the gang was restarted."""
    if job is None:
        return set()
    name = (job.get("metadata") or {}).get("name") or ""
    names = [f"{name}-{task.get('name')}-{index}" for task in (job.get("spec") or {}).get("tasks") or []
             for index in range(min(int(task.get("replicas") or 0), SCHEDULING_EVENT_PODS))]
    return set(names[:SCHEDULING_EVENT_PODS])


def startup_problem(
    ref: JobRef, pods: list[dict], podgroup: dict | None, limits: WaitLimits, waited: float,
    events: list[dict] | None = None,
) -> str | None:
    """For a short wait that polls (debug mode's pods come up): why they cannot start, `waited` seconds
    on the caller's clock after it began. A pod whose image cannot exist or cannot be read (at once), one
    still in image pull back-off after image_pull_timeout, or pods not scheduled after startup_timeout
    (with the scheduler's reason from the PodGroup)."""
    for pod in pods:
        problem = pod_problem(pod)
        if problem is None or problem.reason not in IMAGE_PULL_REASONS:
            continue
        if pull_is_final(problem) or (limits.image_pull_timeout is not None and waited >= limits.image_pull_timeout):
            return f"Volcano Job {ref.namespace}/{ref.name} cannot start: {problem.describe()}"
    if limits.startup_timeout is None or waited < limits.startup_timeout:
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
