"""Where a run's time went, from submit to end: queued, starting, running, restarting, stalled, and work
redone after resumes; the accelerator-hours it held and the share of them that was useful (goodput).

Pure: from the Job as the API returns it at the end (its `status.conditions`, a condition per change
of phase, each with its time), what the waiter saw that the Job does not keep (`RunTimeline`: the
phases it saw the Job enter, when each generation of its pods was placed on nodes, the stalls, the
nodes lost), and the progress the training reported. No I/O, no clock.

Volcano before v1.15 appends a condition at every change of phase; from v1.15 it keeps one condition
per phase, the latest (`appendJobCondition`), so after a restart the first run's Running and Pending
are gone from the Job. The phases the waiter saw (each with the controller's own
`state.lastTransitionTime`, so one clock with the conditions) fill them back in.

The buckets split the wall time exactly: every second from the Job's creation to its end is in one.

- queued: submitted, its gang not placed yet (until the first pods are scheduled);
- starting: placed, not running yet (image pulls, init containers, until the Job is Running);
- running: Running, but for what the next buckets take;
- restarting: from a failure (the Job Restarting) or a lost node to Running again;
- preempted: from a preemption (the scheduler evicted the gang for a higher-priority Job) to Running again;
- stalled: from the last output to the stall's end (a restart, or the task's failure);
- redone: the share of running time spent on steps done again after resuming from an earlier step
  (only when the script reports progress: `progress.Progress.redone` of its executed steps).

The Volcano controller's times and the waiter's (stalls, lost nodes, the end of a wait it ended) are
taken as one clock: a skew between the two moves seconds between buckets, never out of the total.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_volcano.constants import FAILED_PHASES, SUCCEEDED_PHASES, JobPhase
from airflow_volcano.timestamps import parse_time
from airflow_volcano.waiting.progress import Progress, duration_text
from airflow_volcano.waiting.queueing import pod_requests

BUCKETS = ("queued", "starting", "running", "restarting", "preempted", "stalled", "redone")
# A restart is a preemption's when the eviction was recorded at most this long before the Job left Running
# (the controller restarts the gang once the evicted pods are gone: their grace period).
PREEMPTED_BEFORE_RESTART_SECONDS = 120.0
JOB_VERSION_ANNOTATION = "volcano.sh/job-version"  # which restart of the Job a pod belongs to
# Resources counted as accelerators (a GPU and its kin), by name or by the suffix of an extended name.
ACCELERATOR_SUFFIXES = ("/gpu", "/tpu", "/npu", "/neuron", "/neuroncore", "/gaudi", "/mlu", "/dcu")

Span = tuple[float, float]


@dataclass
class RunTimeline:
    """What the waiter saw of a run that the Job does not keep; travels with the wait's outcome.

    :param phases: each phase the waiter saw the Job enter, with when it entered it (the controller's
        `status.state.lastTransitionTime`, epoch seconds).
    :param placed: for each generation of the Job's pods (Volcano's job version, bumped at each
        restart), when the last of them was scheduled onto a node (epoch seconds).
    :param stalls: (from the last output, to the stall's end) of each stall.
    :param lost: (since a node stopped answering, to when its pods were deleted) of each lost node.
    :param preempted: when each preemption's eviction was recorded (epoch seconds, the scheduler's events).
    :param ended_at: when the wait ended the run itself (job_timeout, a stall, pods that cannot start).
    """

    placed: dict[str, float] = field(default_factory=dict)
    phases: list[tuple[str, float]] = field(default_factory=list)
    stalls: list[Span] = field(default_factory=list)
    lost: list[Span] = field(default_factory=list)
    preempted: list[float] = field(default_factory=list)
    ended_at: float | None = None

    def pod_seen(self, pod: Mapping[str, Any]) -> None:
        """A pod, as a list or a watch gave it: note when its generation was placed."""
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        version = str((metadata.get("annotations") or {}).get(JOB_VERSION_ANNOTATION, "0"))
        for condition in status.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "True":
                at = parse_time(condition.get("lastTransitionTime"))
                if at is not None:
                    self.placed[version] = max(at, self.placed.get(version, at))

    def job_seen(self, job: Mapping[str, Any]) -> None:
        """The Job, as a read or a watch gave it: note the phase it is in and since when."""
        state = (job.get("status") or {}).get("state") or {}
        phase, at = state.get("phase"), parse_time(state.get("lastTransitionTime"))
        if phase and at is not None and (not self.phases or self.phases[-1] != (phase, at)):
            self.phases.append((str(phase), at))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RunTimeline:
        data = data or {}
        return cls(placed={str(key): float(value) for key, value in (data.get("placed") or {}).items()},
                   phases=[(str(phase), float(at)) for phase, at in data.get("phases") or []],
                   stalls=[(float(start), float(end)) for start, end in data.get("stalls") or []],
                   lost=[(float(start), float(end)) for start, end in data.get("lost") or []],
                   preempted=[float(at) for at in data.get("preempted") or []], ended_at=data.get("ended_at"))


@dataclass(frozen=True)
class Goodput:
    """Seconds by bucket (BUCKETS), the wall time they split, and the accelerators held."""

    seconds: Mapping[str, float]
    wall: float
    accelerators: Mapping[str, float]  # resource -> how many the Job's pods ask for, all pods together
    preemptions: int = 0

    @property
    def held(self) -> float:
        """Seconds the gang held its nodes: from its first placement to the end."""
        return self.wall - self.seconds["queued"]

    @property
    def useful_share(self) -> float | None:
        """The share of the held time spent running useful steps (goodput); None for a run that never started."""
        return self.seconds["running"] / self.held if self.held > 0 else None

    @property
    def accelerator_hours(self) -> float:
        return sum(self.accelerators.values()) * self.held / 3600

    def result(self) -> dict[str, Any]:
        """What the task's return value (XCom) holds: `<bucket>_seconds`, `wall_seconds`, the accelerators."""
        values: dict[str, Any] = {f"{bucket}_seconds": round(self.seconds[bucket], 3) for bucket in BUCKETS}
        values.update(wall_seconds=round(self.wall, 3), accelerators=dict(self.accelerators),
                      preemptions=self.preemptions, accelerator_hours=round(self.accelerator_hours, 6),
                      useful_accelerator_hours=round(self.accelerator_hours * (self.useful_share or 0), 6),
                      goodput=None if self.useful_share is None else round(self.useful_share, 4))
        return values

    def table(self, job: str) -> list[str]:
        """The lines the task log shows: a line per bucket that had time (the return value has them all)."""
        lines = [f"Where the time went (Volcano Job {job}, {duration_text(self.wall)} from submit to end):"]
        for bucket in BUCKETS:
            if self.seconds[bucket] <= 0:
                continue
            share = 100 * self.seconds[bucket] / self.wall if self.wall > 0 else 0.0
            times = f" ({self.preemptions} preemption(s))" if bucket == "preempted" and self.preemptions else ""
            lines.append(f"  {bucket:<10} {duration_text(self.seconds[bucket]):>8} {share:5.1f}%{times}")
        held = f"held {duration_text(self.held)}"
        if self.accelerators:
            what = ", ".join(f"{count:g} {name}" for name, count in sorted(self.accelerators.items()))
            held = f"{what} {held}: {self.accelerator_hours:.3g} accelerator-hours"
        else:
            held = f"the pods' nodes {held} (no accelerators requested)"
        if self.useful_share is not None:
            held += f", {100 * self.useful_share:.1f}% of it useful (goodput)"
        lines.append(f"  {held}")
        return lines


def accelerators(job: Mapping[str, Any]) -> dict[str, float]:
    """The accelerators (GPUs and kin) a Job's pods ask for, all replicas of all tasks together."""
    found: dict[str, float] = {}
    for task in (job.get("spec") or {}).get("tasks") or []:
        per_pod = pod_requests(((task.get("template") or {}).get("spec")) or {})
        for name, value in per_pod.items():
            if name.endswith(ACCELERATOR_SUFFIXES):
                found[name] = found.get(name, 0.0) + float(value) * int(task.get("replicas") or 0)
    return found


def phase_changes(job: Mapping[str, Any], timeline: RunTimeline | None = None) -> list[tuple[str, float]]:
    """The Job's phases in order, with when each began: its conditions and the phases the waiter saw
    (`timeline`), repeats merged."""
    changes: list[tuple[str, float]] = []
    # The waiter's own sequence first: Volcano keeps only the latest condition of each phase, and its times
    # are whole seconds, so a Job that turned Pending -> Running within one second has a Running condition
    # of the same second as the Pending the waiter saw before it; taken in the conditions' order, the
    # Pending came after, and the Running span until the next restart counted as a restart.
    watched: list[tuple[str, float | None]] = list(timeline.phases) if timeline is not None else []
    conditions = [(condition.get("status") or "", parse_time(condition.get("lastTransitionTime")))
                  for condition in (job.get("status") or {}).get("conditions") or []]
    seen = watched + [(phase, at) for phase, at in conditions
                      if not _an_update_within_a_watched_phase(phase, at, watched, conditions)]
    # In time order; at the same second, in the order seen (the waiter's, then Volcano's: Completing before
    # Completed), except that Pending comes first (what else happened in that second came out of it) and a
    # final phase last.
    final = SUCCEEDED_PHASES | FAILED_PHASES
    for phase, at in sorted(dict.fromkeys(seen), key=lambda item: (
            item[1] or 0.0, item[0] != JobPhase.PENDING, item[0] in final)):
        if at is not None and phase and (not changes or changes[-1][0] != phase):
            changes.append((phase, at))
    return changes


def _an_update_within_a_watched_phase(phase: str, at: float | None, watched: list[tuple[str, float | None]],
                                      conditions: list[tuple[str, float | None]]) -> bool:
    """Whether a condition of `phase` is a later update of a phase the waiter saw begin, with nothing else
    seen or kept in between: Volcano (v1.15) moves a phase's one condition to its latest status update
    within that phase, so a Running condition can be seconds after the Running the waiter saw begin; taken
    as a new entry into Running, the time between counted as whatever came before it."""
    if at is None:
        return False
    began = [when for seen, when in watched if seen == phase and when is not None and when <= at]
    if not began:
        return False
    since = max(began)
    return not any(other != phase and when is not None and since < when < at for other, when in (*watched, *conditions))


def end_of(job: Mapping[str, Any], timeline: RunTimeline) -> float | None:
    """When the run ended: when the wait ended it, else when the Job reached its last phase."""
    if timeline.ended_at is not None:
        return timeline.ended_at
    state = (job.get("status") or {}).get("state") or {}
    return (parse_time(state.get("lastTransitionTime"))
            or next(reversed([at for _, at in phase_changes(job, timeline)]), None))


def goodput(job: Mapping[str, Any], timeline: RunTimeline, progress: Progress | None = None) -> Goodput | None:
    """The run's time by bucket; None when it cannot be told (no creation time or end)."""
    created = parse_time((job.get("metadata") or {}).get("creationTimestamp"))
    end = end_of(job, timeline)
    if created is None or end is None or end < created:
        return None
    seconds = dict.fromkeys(BUCKETS, 0.0)
    changes = [(phase, min(max(at, created), end)) for phase, at in phase_changes(job, timeline)]
    first_running = next((at for phase, at in changes if phase == JobPhase.RUNNING), None)
    # Before it first ran: queued until its first pods were placed, then starting. A preemption before the
    # first Running the wait knows of (it ran and was preempted before the wait began: Volcano v1.15 keeps
    # only the latest Running condition) is preempted time from its eviction on.
    started_by = first_running if first_running is not None else end
    unseen = [at for at in timeline.preempted if created <= at < started_by]
    if unseen:
        seconds["preempted"] += started_by - min(unseen)
        started_by = min(unseen)
    placed = min(timeline.placed.values(), default=None)
    if placed is None or not created <= placed <= started_by:
        placed = started_by
    seconds["queued"] = placed - created
    seconds["starting"] = started_by - placed
    running: list[Span] = []
    restarts: list[Span] = []
    if first_running is not None:
        for index, (phase, at) in enumerate(changes):
            stop = changes[index + 1][1] if index + 1 < len(changes) else end
            if stop <= at or at < first_running:
                continue
            if phase in (JobPhase.RESTARTING, JobPhase.PENDING):
                restarts.append((at, stop))
            else:  # Running, and the Job's way out (Completing, Terminating, Aborting)
                running.append((at, stop))
    # Each restart (Restarting then Pending, until Running again) is a preemption's if one was recorded
    # shortly before it began, or during it.
    for start, stop in _merged(restarts):
        preempted = any(start - PREEMPTED_BEFORE_RESTART_SECONDS <= at <= stop for at in timeline.preempted)
        seconds["preempted" if preempted else "restarting"] += stop - start
    # A lost node (until its pods were deleted), then a stall, take their time from running.
    for bucket, spans in (("restarting", _merged(timeline.lost)), ("stalled", _merged(timeline.stalls))):
        taken = _overlap(running, spans)
        seconds[bucket] += taken
        running = _without(running, spans)
    seconds["running"] = sum(stop - start for start, stop in running)
    if progress is not None and progress.executed > 0 and progress.redone > 0:
        seconds["redone"] = seconds["running"] * min(1.0, progress.redone / progress.executed)
        seconds["running"] -= seconds["redone"]
    return Goodput(seconds, end - created, accelerators(job), preemptions=len(timeline.preempted))


def _merged(spans: Iterable[Span]) -> list[Span]:
    """Spans that overlap (two nodes lost at once) as one."""
    merged: list[Span] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _overlap(spans: Iterable[Span], others: Iterable[Span]) -> float:
    others = list(others)
    return sum(max(0.0, min(stop, b) - max(start, a)) for start, stop in spans for a, b in others)


def _without(spans: list[Span], others: Iterable[Span]) -> list[Span]:
    """`spans` with the parts inside any of `others` cut out."""
    for cut_start, cut_end in others:
        kept: list[Span] = []
        for start, stop in spans:
            if cut_end <= start or cut_start >= stop:
                kept.append((start, stop))
                continue
            if start < cut_start:
                kept.append((start, cut_start))
            if cut_end < stop:
                kept.append((cut_end, stop))
        spans = kept
    return spans
