"""Why a Job waits: its Volcano queue, its place among the queue's waiting Jobs, and the resource that
is short, with numbers. Pure: plain dicts as the API returns them (the Job's PodGroup, its Queue, the
queue's PodGroups) and the PriorityClasses' values in; a `WaitingReport` out. No I/O, no clock.

The order is the scheduler's as far as it can be known from outside. Volcano's default scheduler
configuration orders a queue's Jobs by the `priority` plugin (the PodGroup's PriorityClass value,
higher first; no class: the cluster's global default, else 0), then `gang` and `drf` (alike for
Jobs that hold nothing yet), then creation time. A PodGroup already admitted to the queue
(`Inqueue`: its quota was checked and set aside) comes before those still `Pending`. Another
configuration (the `sla` or `tdm` plugins) orders otherwise, and the default `traverse` dequeue
lets a Job that fits pass one ahead of it that does not.

Which numbers each Volcano release gives: `spec.capability` and `status.state` on every release;
`status.allocated` (what the queue's running Jobs hold) from v1.10 on; where it is missing, the
report says so instead of guessing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from airflow_volcano.manifest.checks import QUANTITY, quantity_value
from airflow_volcano.timestamps import parse_time

OPEN = "Open"
# PodGroup phases of a gang that has not been placed: admitted to its queue (Inqueue) or not yet (Pending).
INQUEUE, PENDING = "Inqueue", "Pending"
WAITING_PHASES = (INQUEUE, PENDING)
# What deploy/queue-reader.yaml grants; named when a read of it is refused.
QUEUE_READER = "deploy/queue-reader.yaml"


def gang_needs(resources: Mapping[str, Any] | None) -> dict[str, Decimal]:
    """A PodGroup's `minResources` (or a queue's capability) as numbers, without what no queue limits
    by (object counts `count/...`, `pods`, and the `limits.`/`requests.` quota duplicates)."""
    needs: dict[str, Decimal] = {}
    for name, value in (resources or {}).items():
        text = str(value).strip()
        if name == "pods" or name.startswith(("count/", "limits.", "requests.")) or not QUANTITY.match(text):
            continue
        needs[str(name)] = quantity_value(text)
    return needs


def ended_pods(status: Mapping[str, Any] | None) -> int:
    """How many of a PodGroup's pods have succeeded or failed (the scheduler's count of its status)."""
    status = status or {}
    return sum(count for count in (status.get("succeeded"), status.get("failed")) if isinstance(count, int))


def quantity_text(name: str, value: Decimal) -> str:
    """A quantity of a resource as a person reads it: `2` or `500m` (cpu), `24Gi` (memory), `16`."""
    if name == "memory" or name.startswith("hugepages-") or name == "ephemeral-storage":
        for suffix, size in (("Ti", 1024 ** 4), ("Gi", 1024 ** 3), ("Mi", 1024 ** 2), ("Ki", 1024)):
            if value >= size:
                return f"{_number(value / size)}{suffix}"
        return _number(value)
    if name == "cpu" and value != value.to_integral_value():
        return f"{_number(value * 1000)}m"
    return _number(value)


def amount(name: str, value: Decimal) -> str:
    """`2 cpu`, `500m cpu`, `16 nvidia.com/gpu`, `24Gi memory`."""
    return f"{quantity_text(name, value)} {name}"


def _number(value: Decimal) -> str:
    text = f"{value.quantize(Decimal('0.1')):f}" if value != value.to_integral_value() else f"{value:.0f}"
    return text.removesuffix(".0")


@dataclass(frozen=True)
class Gang:
    """One PodGroup as the queue's order sees it."""

    namespace: str
    name: str
    job: str  # the Job that owns it (its name), else the PodGroup's
    queue: str
    phase: str
    priority_class: str
    created: float
    uid: str = ""
    needs: Mapping[str, Decimal] = field(default_factory=dict)
    ended_pods: int = 0  # pods of it that have succeeded or failed

    @classmethod
    def of(cls, podgroup: Mapping[str, Any]) -> Gang:
        """The PodGroup read once per version of it (a triggerer reports on a thousand waiting Jobs from
        the same few thousand PodGroups: each is parsed once, not once per report)."""
        metadata, spec = podgroup.get("metadata") or {}, podgroup.get("spec") or {}
        key = (metadata.get("uid", ""), metadata.get("resourceVersion", ""))
        if key[0] and key[1] and (known := _GANGS.get(key)) is not None:
            return known
        owners = metadata.get("ownerReferences") or []
        gang = cls(namespace=metadata.get("namespace", ""), name=metadata.get("name", ""),
                   job=next((owner.get("name") for owner in owners if owner.get("name")), metadata.get("name", "")),
                   queue=spec.get("queue") or "default",
                   phase=(podgroup.get("status") or {}).get("phase") or PENDING,
                   priority_class=spec.get("priorityClassName") or "",
                   created=parse_time(metadata.get("creationTimestamp")) or 0.0, uid=metadata.get("uid", ""),
                   needs=gang_needs(spec.get("minResources")), ended_pods=ended_pods(podgroup.get("status")))
        if key[0] and key[1]:
            if len(_GANGS) >= MAX_REMEMBERED_GANGS:
                _GANGS.clear()
            _GANGS[key] = gang
        return gang

    @property
    def waiting(self) -> bool:
        """Not placed yet, and not a Job that has ended: Volcano's scheduler sets a finished Job's
        PodGroup back to Pending once fewer than its minMember pods are left (the master succeeded,
        CompleteJob removed the workers) and leaves it so until the Job is deleted; its ended pods tell."""
        return self.phase in WAITING_PHASES and not self.ended_pods

    def order(self, priorities: Priorities) -> tuple[int, int, float, str]:
        """The scheduler's order (see the module's docstring): smaller first."""
        return (0 if self.phase == INQUEUE else 1, -priorities.value(self.priority_class), self.created, self.uid)


# Gangs by (uid, resourceVersion): a PodGroup's version changes with every change of it.
_GANGS: dict[tuple[str, str], Gang] = {}
MAX_REMEMBERED_GANGS = 100_000
SHOWN_AHEAD = 3  # the Jobs ahead named in the task log


@dataclass(frozen=True)
class Priorities:
    """PriorityClass values by name, and the value of a PodGroup that names none (or one that does not
    exist): the cluster's global default class, else 0."""

    values: Mapping[str, int] = field(default_factory=dict)
    default: int = 0

    @classmethod
    def of(cls, priority_classes: Iterable[Mapping[str, Any]]) -> Priorities:
        values, default = {}, 0
        for item in priority_classes:
            name, value = (item.get("metadata") or {}).get("name"), item.get("value")
            if name and isinstance(value, int):
                values[name] = value
                if item.get("globalDefault"):
                    default = value
        return cls(values, default)

    def value(self, name: str | None) -> int:
        return self.values.get(name or "", self.default)

    def to_dict(self) -> dict[str, Any]:
        return {"values": dict(self.values), "default": self.default}


@dataclass(frozen=True)
class QueueSnapshot:
    """What the waiter could read of a Job's queue at one moment (the answer a driver gives the engine).

    :param name: the queue the Job's PodGroup is in.
    :param queue: the Queue (None: there is no queue of that name).
    :param podgroups: the PodGroups that may be in it (every namespace's, or only `scope`'s).
    :param priorities: PriorityClass values.
    :param scope: the only namespace whose PodGroups could be read (no cluster-wide list allowed).
    :param unreadable: why the queue could not be read (no permission, say): nothing else is known.
    """

    name: str
    queue: Mapping[str, Any] | None = None
    podgroups: tuple[Mapping[str, Any], ...] = ()
    priorities: Priorities = field(default_factory=Priorities)
    scope: str | None = None
    unreadable: str | None = None


@dataclass(frozen=True)
class Shortage:
    """A resource the queue cannot give the Job now (or ever)."""

    resource: str
    needs: Decimal
    capability: Decimal
    allocated: Decimal | None  # None: the Volcano release does not report it
    admitted: Decimal  # set aside for other Jobs admitted to the queue and not placed yet
    ahead: Decimal  # what the Jobs ahead of it in the queue need

    @property
    def never(self) -> bool:
        return self.needs > self.capability

    def describe(self, queue: str) -> str:
        text = f"needs {amount(self.resource, self.needs)}; queue `{queue}` "
        if self.never:
            return text + f"can never give it: its capability is {amount(self.resource, self.capability)}"
        if self.allocated is None:
            text += f"has a capability of {amount(self.resource, self.capability)} (its allocation is not reported)"
        else:
            text += (f"has {quantity_text(self.resource, self.allocated)} of its "
                     f"{amount(self.resource, self.capability)} allocated")
        if self.admitted:
            text += f", {amount(self.resource, self.admitted)} more set aside for Jobs admitted before it"
        if self.ahead:
            text += f"; the Jobs ahead of it need {amount(self.resource, self.ahead)}"
        return text


@dataclass(frozen=True)
class WaitingReport:
    """Why a Job waits, as the task log says it.

    :param queue: the queue's name; `state` its state (None: it does not exist).
    :param position: the Job's place among the queue's waiting Jobs (1: next), of `waiting`.
    :param ahead: the first SHOWN_AHEAD Jobs before it, as `namespace/job`; `ahead_count` how many there are.
    :param unnamed: how many of those ahead may not be named to whom the report is for (counted only).
    :param short: the resources the queue cannot give it now.
    """

    queue: str
    state: str | None
    position: int | None = None
    waiting: int = 0
    ahead: tuple[str, ...] = ()
    ahead_count: int = 0
    unnamed: int = 0
    short: tuple[Shortage, ...] = ()
    scope: str | None = None
    unreadable: str | None = None

    @property
    def never_fits(self) -> Shortage | None:
        return next((shortage for shortage in self.short if shortage.never), None)

    def describe(self, job: str) -> str:
        """One line: the queue and its state, the position, what is short."""
        if self.unreadable is not None:
            return (f"Volcano Job {job} waits in queue `{self.queue}`; its state and the Job's place in it cannot be "
                    f"read ({self.unreadable}): {QUEUE_READER} grants it")
        if self.state is None:
            return f"Volcano Job {job} waits for queue `{self.queue}`, which does not exist"
        text = f"Volcano Job {job} waits in queue `{self.queue}` ({self.state}"
        if self.state != OPEN:
            text += ": Volcano admits no Job from it until it is Open again"
        text += ")"
        if self.position is not None:
            among = f"waiting Jobs of namespace {self.scope}" if self.scope else "its waiting Jobs"
            text += (f": position {self.position} of {self.waiting} among {among}, in the scheduler's order as far "
                     "as it can be known (priority, then submission)")
            more = self.ahead_count - len(self.ahead) - self.unnamed
            if self.unnamed:
                named = [*self.ahead, *([f"{more} more"] if more > 0 else [])]
                others = f"{self.unnamed} Job{'s' if self.unnamed > 1 else ''} of other namespaces or DAGs"
                text += "; ahead: " + (", ".join(named) + " and " if named else "") + others
            elif self.ahead:
                text += f"; ahead: {', '.join(self.ahead)}" + (f" and {more} more" if more > 0 else "")
        for shortage in self.short:
            text += f"; {shortage.describe(self.queue)}"
        return text


def waiting_report(own: Mapping[str, Any] | None, snapshot: QueueSnapshot, job_uid: str | None = None,
                   nameable: Callable[[Mapping[str, Any]], bool] | None = None) -> WaitingReport:
    """Where the Job whose PodGroup is `own` stands in its queue (`own` None: not read, or not created yet).
    The snapshot's own copy of it (the PodGroup owned by `job_uid`), read with the others, is preferred.
    `nameable`: whether a PodGroup's Job may be named (the panel's viewer may not see every namespace and
    DAG); the others ahead are counted only. Linear in the snapshot's PodGroups: no sort."""
    if snapshot.unreadable is not None:
        return WaitingReport(snapshot.name, None, unreadable=snapshot.unreadable)
    queue = snapshot.queue
    if queue is None:
        return WaitingReport(snapshot.name, None)
    state = (queue.get("status") or {}).get("state") or "Unknown"
    if job_uid:
        own = next((podgroup for podgroup in snapshot.podgroups if any(
            owner.get("uid") == job_uid for owner in (podgroup.get("metadata") or {}).get("ownerReferences") or [])),
            own)
    if own is None:
        return WaitingReport(snapshot.name, state)
    mine = Gang.of(own)
    priorities = snapshot.priorities
    gangs = [gang for gang in map(Gang.of, snapshot.podgroups) if gang.queue == snapshot.name and gang.uid != mine.uid]
    admitted = [gang for gang in gangs if gang.phase == INQUEUE]
    waiting = [gang for gang in gangs if gang.waiting]
    position = None
    ahead: list[Gang] = []
    if mine.waiting:
        place = mine.order(priorities)
        ahead = [gang for gang in waiting if gang.order(priorities) < place]
        position = len(ahead) + 1
    short = shortages(mine, queue, admitted, ahead)
    hidden = set() if nameable is None else {
        (podgroup.get("metadata") or {}).get("uid", "") for podgroup in snapshot.podgroups if not nameable(podgroup)}
    shown = [gang for gang in ahead if gang.uid not in hidden]
    named = heapq.nsmallest(SHOWN_AHEAD, shown, key=lambda gang: gang.order(priorities))
    return WaitingReport(snapshot.name, state, position=position, waiting=len(waiting) + 1 if position else 0,
                         ahead=tuple(f"{gang.namespace}/{gang.job}" for gang in named), ahead_count=len(ahead),
                         unnamed=len(ahead) - len(shown), short=tuple(short), scope=snapshot.scope)


def shortages(mine: Gang, queue: Mapping[str, Any], admitted: Iterable[Gang], ahead: Iterable[Gang]) -> list[Shortage]:
    """The resources of the queue's capability that the Job cannot have now: what it needs, with what
    the queue's running Jobs hold and what Jobs admitted before it have set aside, is more than the
    capability (Volcano's own test before admitting a Job to a queue)."""
    capability = gang_needs((queue.get("spec") or {}).get("capability"))
    reported = (queue.get("status") or {}).get("allocated")
    allocated = gang_needs(reported) if reported is not None else None
    admitted, ahead = list(admitted), list(ahead)
    found = []
    for resource, needs in sorted(mine.needs.items()):
        if resource not in capability or needs <= 0:
            continue
        held = allocated.get(resource, Decimal(0)) if allocated is not None else None
        set_aside = sum((gang.needs.get(resource, Decimal(0)) for gang in admitted), Decimal(0))
        shortage = Shortage(resource, needs, capability[resource], held, set_aside,
                            sum((gang.needs.get(resource, Decimal(0)) for gang in ahead), Decimal(0)))
        # Admitted (Inqueue), the Job passed that test: what holds it now is the nodes, not the queue.
        over = mine.phase != INQUEUE and held is not None and needs + held + set_aside > capability[resource]
        if shortage.never or over:
            found.append(shortage)
    return found


def queue_of(job: Mapping[str, Any], podgroup: Mapping[str, Any] | None) -> str:
    """The queue a Job waits in: its PodGroup's (Volcano's word), else the Job's own spec's."""
    return ((podgroup or {}).get("spec") or {}).get("queue") or (job.get("spec") or {}).get("queue") or "default"


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What one pod asks of a node (as Kubernetes counts it): its containers' requests (a limit where no
    request is given) added up, or its largest init container's, whichever is more."""
    def requested(container: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return gang_needs(asked)

    total: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in requested(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod_spec.get("initContainers") or []:
        for name, value in requested(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


def job_needs(job: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a Job's gang needs to start (each task's minAvailable pods, else its replicas), as Volcano
    sums it into the PodGroup's minResources for a Job whose minAvailable covers every task's."""
    total: dict[str, Decimal] = {}
    for task in (job.get("spec") or {}).get("tasks") or []:
        count = task.get("minAvailable", task.get("replicas", 1))
        per_pod = pod_requests(((task.get("template") or {}).get("spec")) or {})
        for name, value in per_pod.items():
            total[name] = total.get(name, Decimal(0)) + value * int(count or 0)
    return total


def beyond_capability(needs_of_job: Mapping[str, Decimal], queue: Mapping[str, Any]) -> Shortage | None:
    """A resource the Job needs more of than the queue's capability allows: it can never start there."""
    capability = gang_needs((queue.get("spec") or {}).get("capability"))
    for resource, needs in sorted(needs_of_job.items()):
        if resource in capability and needs > capability[resource]:
            return Shortage(resource, needs, capability[resource], None, Decimal(0), Decimal(0))
    return None


def queue_refusal(name: str, queue: Mapping[str, Any] | None, job: Mapping[str, Any]) -> str | None:
    """Why a Job must not be submitted to queue `name` (read as `queue`, None: there is none): the
    queue is missing, not Open, or its capability is less than the Job's gang needs. None: go ahead."""
    where = f"volcano_queue {name!r}"
    if queue is None:
        return f"{where}: there is no Volcano queue of that name in this cluster"
    state = (queue.get("status") or {}).get("state") or "Unknown"
    if state != OPEN:
        return f"{where}: the Volcano queue is {state}; it admits no new Job until it is Open again"
    shortage = beyond_capability(job_needs(job), queue)
    if shortage is not None:
        return (f"{where}: the Job could never start there: it needs {amount(shortage.resource, shortage.needs)} and "
                f"the queue's capability is {amount(shortage.resource, shortage.capability)}")
    return None


# -- the slim views a triggerer keeps of every queue and PodGroup (one per object of the cluster) --------


def queue_view(queue: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a Queue a waiting report reads."""
    metadata, spec, status = queue.get("metadata") or {}, queue.get("spec") or {}, queue.get("status") or {}
    return {"metadata": {key: metadata[key] for key in ("name", "resourceVersion") if key in metadata},
            "spec": {key: spec[key] for key in ("capability",) if key in spec},
            "status": {key: status[key] for key in ("state", "allocated") if key in status}}


def podgroup_view(podgroup: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a PodGroup a waiting report reads, the scheduler's words (its Unschedulable
    condition: `status.unschedulable_message`) and when its gang was last placed (its Scheduled
    condition: who took a preempted Job's room, `preemption.name_preemptor`)."""
    metadata, spec, status = podgroup.get("metadata") or {}, podgroup.get("spec") or {}, podgroup.get("status") or {}
    return {"metadata": {**{key: metadata[key] for key in ("name", "namespace", "uid", "creationTimestamp",
                                                           "resourceVersion") if key in metadata},
                         "ownerReferences": [{"name": owner.get("name"), "uid": owner.get("uid")}
                                             for owner in (metadata.get("ownerReferences") or [])[:1]]},
            "spec": {key: spec[key] for key in ("queue", "priorityClassName", "minResources") if key in spec},
            "status": {"phase": status.get("phase"),
                       **{key: status[key] for key in ("succeeded", "failed") if key in status},
                       "conditions": [{key: condition[key] for key in VIEWED_CONDITIONS[condition["type"]]
                                       if key in condition} for condition in status.get("conditions") or []
                                      if condition.get("type") in VIEWED_CONDITIONS]}}


# Of a PodGroup's conditions, what podgroup_view keeps.
VIEWED_CONDITIONS = {"Unschedulable": ("type", "status", "reason", "message"),
                     "Scheduled": ("type", "status", "lastTransitionTime")}
