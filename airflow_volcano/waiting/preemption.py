"""Preemption: a Job's pods evicted by Volcano's scheduler to make room for a higher-priority Job. Pure:
the events and PodGroups as the API returns them in, a `Preemption` and its words out. No I/O, no clock.

What is evidence. Volcano's scheduler evicts a pod through one path (`defaultEvictor.Evict`): it records
a Warning event `Evict` on the pod, "Pod is evicted, because of <action>", and an event `Evict` on the
PodGroup whose message is the action, then deletes the pod. The actions that preempt are `preempt` and
`gangpreempt` (a higher-priority Job of the same queue) and `reclaim` and `gangreclaim` (a queue taking
back its deserved share). Any other eviction (the `shuffle` action's rescheduling, a node drained) is
not a preemption. The Job's controller then restarts the gang (its `PodEvicted` policy).

Who preempted. The scheduler does not say. The Job that took the room is found, when the waiter can see
it, among the PodGroups of the same queue: one of higher priority whose gang was scheduled from the
eviction on (its `Scheduled` condition), else the only one of higher priority running there (said so).
When none is visible (in a namespace the waiter cannot read, say) the report says so.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_volcano.timestamps import clock_text, parse_time
from airflow_volcano.waiting.queueing import Gang, Priorities, QueueSnapshot

PREEMPTING_ACTIONS = ("gangpreempt", "preempt", "gangreclaim", "reclaim")
_POD_EVICTED = re.compile(r"^Pod is evicted, because of (\S+)$")
# The preemptor's gang is placed within this long of the eviction (the scheduler pipelines it onto the
# freed room in the same session; binding follows once the victims are gone).
PLACED_WITHIN_SECONDS = 300.0
# Event times have a resolution of one second, and the preemptor's PodGroup may be marked scheduled
# in the same second as, or just before, the eviction is recorded.
CLOCK_SLACK_SECONDS = 5.0
# The evictions of one preemption are recorded within this long of each other.
EVICTION_SPREAD_SECONDS = 10.0


@dataclass(frozen=True)
class Preemption:
    """One preemption of the Job: when (epoch seconds, the apiserver's clock), by which action, of which
    of its pods, and (once its queue is read) by which Job."""

    at: float
    action: str
    pods: tuple[str, ...]
    queue: str = ""
    preemptor: str | None = None  # namespace/name of the Job that took the room, if known
    preemptor_priority: str | None = None  # "PriorityClass high, priority 1000" or "priority 0"
    unknown_why: str = ""  # why the preemptor is not named

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "action": self.action, "pods": list(self.pods), "queue": self.queue,
                "preemptor": self.preemptor, "preemptor_priority": self.preemptor_priority,
                "unknown_why": self.unknown_why}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Preemption:
        return cls(at=float(data["at"]), action=str(data["action"]), pods=tuple(data.get("pods") or ()),
                   queue=str(data.get("queue") or ""), preemptor=data.get("preemptor"),
                   preemptor_priority=data.get("preemptor_priority"), unknown_why=str(data.get("unknown_why") or ""))

    def describe(self, job: str, count: int, limit: int | None = None) -> str:
        """The task log's line; `limit`: max_preemptions, if the Job was submitted with it."""
        line = (f"Volcano Job {job} was preempted at {self.summary()}. It waits for room again and restarts "
                f"from the start of its script (a script that saves checkpoints resumes from its last one). "
                f"Preemptions so far: {count}")
        if limit is not None:
            line += f" of max_preemptions {limit} (they do not spend max_retry)"
        return line

    def summary(self) -> str:
        """When, by whom, where and what: "12:00:01 UTC by ml/urgent (...) in queue `q`: Volcano's scheduler
        (gangpreempt) evicted a-master-0" (the panel's row, the task log's line)."""
        by = (f"by {self.preemptor} ({self.preemptor_priority})" if self.preemptor
              else f"by a higher-priority Job{f' ({self.unknown_why})' if self.unknown_why else ''}")
        where = f" in queue `{self.queue}`" if self.queue else ""
        evicted = ", ".join(self.pods) or "its pods"
        return f"{clock_text(self.at)} {by}{where}: Volcano's scheduler ({self.action}) evicted {evicted}"


@dataclass(frozen=True)
class Eviction:
    """One `Evict` event of a preempting action: on a pod (named) or on the PodGroup (pod None)."""

    at: float
    action: str
    pod: str | None


def evictions(events: Iterable[Mapping[str, Any]], *, since: float) -> list[Eviction]:
    """The evictions to preempt that `events` record after `since` (epoch seconds, the apiserver's clock),
    on the Job's pods or its PodGroup. An event repeated (a PodGroup's, counted up) is read at its last time."""
    found: list[Eviction] = []
    for event in events:
        if event.get("reason") != "Evict":
            continue
        kind = (event.get("involvedObject") or {}).get("kind")
        message = str(event.get("message") or "").strip()
        if kind == "Pod":
            match = _POD_EVICTED.match(message)
            action, pod = (match.group(1), (event.get("involvedObject") or {}).get("name")) if match else ("", None)
        elif kind == "PodGroup":
            action, pod = message, None
        else:
            continue
        at = parse_time(event.get("lastTimestamp") or event.get("eventTime")
                        or (event.get("metadata") or {}).get("creationTimestamp"))
        if action in PREEMPTING_ACTIONS and at is not None and at > since:
            found.append(Eviction(at, action, pod))
    return found


def preemptions_of(found: Iterable[Eviction]) -> list[Preemption]:
    """The preemptions the evictions make, oldest first: evictions less than EVICTION_SPREAD_SECONDS apart
    are one (a gang's pods, or those one action took); a longer gap starts another."""
    groups: list[list[Eviction]] = []
    for eviction in sorted(found, key=lambda item: item.at):
        if groups and eviction.at - groups[-1][-1].at < EVICTION_SPREAD_SECONDS:
            groups[-1].append(eviction)
        else:
            groups.append([eviction])
    return [Preemption(at=group[0].at, action="/".join(sorted({eviction.action for eviction in group})),
                       pods=tuple(sorted({eviction.pod for eviction in group if eviction.pod})))
            for group in groups]


def recorded(text: str | None) -> list[Preemption]:
    """The preemptions a Job's annotation keeps (PREEMPTIONS_ANNOTATION); none if it is absent or unreadable."""
    try:
        items = json.loads(text) if text else []
        return [Preemption.from_dict(item) for item in items] if isinstance(items, list) else []
    except (ValueError, TypeError, KeyError):
        return []


def record(preemptions: Iterable[Preemption]) -> str:
    return json.dumps([preemption.to_dict() for preemption in preemptions], separators=(",", ":"))


def scheduled_at(podgroup: Mapping[str, Any]) -> float | None:
    """When Volcano last marked the PodGroup's gang scheduled (its `Scheduled` condition)."""
    times = [parse_time(condition.get("lastTransitionTime"))
             for condition in (podgroup.get("status") or {}).get("conditions") or []
             if condition.get("type") == "Scheduled" and condition.get("status") == "True"]
    return max((time for time in times if time is not None), default=None)


def name_preemptor(preemption: Preemption, job: Mapping[str, Any], snapshot: QueueSnapshot) -> Preemption:
    """The preemption of the Volcano Job `job` with the Job that took the room, found in the queue's
    PodGroups (see the module's docstring), or why it cannot be named. The Job's own priority is its
    spec's, not its PodGroup's: Volcano replaces the PodGroup when it restarts the gang, so just after a
    preemption there may be none."""
    queue = snapshot.name
    if snapshot.unreadable:
        return dataclasses.replace(preemption, queue=queue, unknown_why=f"its queue could not be read: "
                                                                         f"{snapshot.unreadable}")
    metadata = job.get("metadata") or {}
    own_job = (metadata.get("namespace"), metadata.get("name"))
    own_priority = snapshot.priorities.value((job.get("spec") or {}).get("priorityClassName"))
    reclaim = "reclaim" in preemption.action
    candidates: list[tuple[float, Gang]] = []
    running: list[Gang] = []  # higher-priority gangs of the queue running, placed whenever
    for podgroup in snapshot.podgroups:
        gang = Gang.of(podgroup)
        if (gang.namespace, gang.job) == own_job:
            continue
        if reclaim:
            if gang.queue == queue:
                continue  # reclaim gives another queue back its share
        elif gang.queue != queue or snapshot.priorities.value(gang.priority_class) <= own_priority:
            continue  # preempt makes room for a higher priority in the same queue
        if gang.phase == "Running":
            running.append(gang)
        placed = scheduled_at(podgroup)
        if placed is None or not (preemption.at - CLOCK_SLACK_SECONDS <= placed
                                  <= preemption.at + PLACED_WITHIN_SECONDS):
            continue
        candidates.append((placed, gang))
    if not candidates and len(running) == 1:
        # Its placement not (yet) recorded as the PodGroup's Scheduled condition: the only one it can be.
        (gang,) = running
        return dataclasses.replace(preemption, queue=queue, preemptor=f"{gang.namespace}/{gang.job}",
                                   preemptor_priority=priority_text(gang.priority_class, snapshot.priorities)
                                   + ", the only higher-priority Job running in the queue")
    if not candidates and not snapshot.priorities.values:
        # Every cluster has PriorityClasses (system-node-critical): none read means their list failed.
        return dataclasses.replace(preemption, queue=queue, unknown_why="the PriorityClasses could not be read")
    if not candidates:
        where = f"namespace {snapshot.scope}" if snapshot.scope else "the cluster"
        return dataclasses.replace(preemption, queue=queue, unknown_why=f"none placed since then is visible in {where}")
    _, gang = min(candidates, key=lambda item: item[0])
    return dataclasses.replace(preemption, queue=queue, preemptor=f"{gang.namespace}/{gang.job}",
                               preemptor_priority=priority_text(gang.priority_class, snapshot.priorities))


def priority_text(priority_class: str, priorities: Priorities) -> str:
    value = priorities.value(priority_class)
    return f"PriorityClass {priority_class}, priority {value}" if priority_class else f"priority {value}"

