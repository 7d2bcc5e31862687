"""Watches shared by every trigger in the triggerer: one of Volcano Jobs per connection and
namespace, and one of their pods while some Job is starting.

A deferred VolcanoJobTrigger used to hold its own client and its own watch request: about 1 MiB,
one TLS session and one apiserver watch per waiting Job. Here all triggers of one connection and
namespace subscribe to one `SharedJobWatch`: one client, one watch request of the namespace's Jobs
(resumed from the last resourceVersion when it drops, once for everyone), and each trigger gets
only its own Job's changes. The watch stops when the last subscriber leaves.

On 410 Gone (the apiserver compacted the resourceVersion away) it lists the namespace's Jobs page
by page and hands each subscriber its Job as now: one paged list instead of a GET per trigger.

Every trigger also follows its Job's pods (an image that cannot be pulled leaves the Job Pending; a
node that stops answering, a pod that ends or is deleted, whose last log lines are copied at once).
They share a `SharedPodWatch` of the namespace's Volcano pods: each lists its Job's pods once and
then follows their changes, instead of listing them at every check; the watch delivers only changes
of the subscribed Jobs' pods, so a quiet namespace costs one open watch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from airflow_volcano.constants import JOB_NAME_LABEL
from airflow_volcano.exceptions import VolcanoApiError, WatchExpired
from airflow_volcano.hooks import calls
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.masking import secret_values
from airflow_volcano.status import pod_problem, pod_view, waited_view
from airflow_volcano.waiting.queueing import Priorities, QueueSnapshot, podgroup_view, queue_view
from airflow_volcano.waiting.wait_engine import backoff_after_drops

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # one watch request lasts this long at most, then is reopened from where it was
LIST_PAGE = 500
# How many of the subscribers' own reads (the first GET of each Job, pod checks) run at once. When
# a triggerer starts with thousands of deferred tasks they all read at the same moment; unbounded,
# the burst of pending requests is what stays in the loop's memory afterwards.
CONCURRENT_READS = 20
@dataclass(frozen=True)
class Deleted:
    """What a subscriber's queue receives when a Job of its name is deleted: which one (its uid; the
    subscriber's own, or an older Job of the same name)."""

    uid: str | None
RESYNC = "RESYNC"  # to a pod subscriber: the watch restarted, list your pods again
# The shared watch failed again (the apiserver refuses it, e.g. a permission taken away): read your
# own object after your back-off, as after a dropped watch. A single failure (an expired token read
# anew) is not told: the restarted watch's list brings every subscriber its object.
WATCH_BROKEN = "WATCH_BROKEN"
# A new subscriber starts from the objects of the watch's first list for this long after it, so a
# triggerer starting with thousands of deferred tasks does not GET each Job; after that the watch
# keeps only the Jobs someone waits on.
LIST_GRACE_SECONDS = 60.0


class Changes:
    """One subscriber's changes of its Job, in order: a queue as light as it can be, since a
    triggerer holds one per deferred task (asyncio.Queue costs four deques and an Event)."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any) -> None:
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def ready(self) -> bool:
        return bool(self._items)

    def get_nowait(self) -> Any:
        return self._items.popleft()

    def clear(self) -> None:
        self._items.clear()

    async def get(self) -> Any:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()


class SharedWatch:
    """One kind of object in one namespace, watched once for all subscribers (one event loop).
    Subclasses say which kind, whose subscribers get an object, and how a (re)start catches up."""

    resource = ""  # what AsyncVolcanoHook.list_page / watch call it
    label_selector: str | None = None

    def __init__(self, kubernetes_conn_id: str, namespace: str, hook: Any = None) -> None:
        self.kubernetes_conn_id, self.namespace = kubernetes_conn_id, namespace
        self.subscribers: dict[str, set[Changes]] = {}
        self.watch_requests = 0  # how many watch requests were opened (for tests and benchmarks)
        self.relists = 0
        self.failures = 0  # failed (re)starts in a row
        self.last_error: str | None = None  # why the last (re)start failed, until a list works again
        self._resource_version: str | None = None
        self._task: asyncio.Task | None = None
        self._hook: Any = hook
        self._ready = asyncio.Event()  # set once the watch has a resourceVersion (or has failed)

    @contextlib.asynccontextmanager
    async def subscribe(self, name: str) -> AsyncIterator[Changes]:
        """The changes of what belongs to the named Job while the block runs."""
        queue = Changes()
        self.subscribers.setdefault(name, set()).add(queue)
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.create_task(
                self._run(), name=f"airflow-volcano watch of {self.resource} in {self.namespace}")
        try:
            await self._started()
            yield queue
        finally:
            queues = self.subscribers.get(name, set())
            queues.discard(queue)
            if not queues:
                self.subscribers.pop(name, None)
                self.forget(name)
            if not self.subscribers:
                await self.close()

    @property
    def hook(self) -> Any:
        """The connection's AsyncVolcanoHook, whose calls share the watch's client while it runs."""
        if self._hook is None:
            from airflow_volcano.hooks.volcano import AsyncVolcanoHook  # loaded by the trigger already

            self._hook = AsyncVolcanoHook(self.kubernetes_conn_id)
            self._hook.note_credentials_accepted()  # they created the Jobs watched: a 401 is retried
        return self._hook

    async def close(self) -> None:
        task, self._task = self._task, None
        _registry().pop(self._key(), None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _started(self) -> None:
        """Return once the watch has a resourceVersion (changes after that reach the queue), or has
        failed to start (the subscriber then reads on its own)."""
        await self._ready.wait()

    async def _run(self) -> None:
        """Watch until the last subscriber leaves. A failure fails no subscriber: the watch reads the
        connection's credentials again (an expired token) and restarts after a back-off; meanwhile,
        from its second failure in a row, subscribers read their own objects (their reads fail or not)."""
        while True:
            try:
                await self._watch()
            except Exception as error:  # noqa: BLE001 - e.g. 401 or 403: retried, never fatal to the waits
                self.failures += 1
                self.last_error = str(error)
                self._ready.set()  # subscribers waiting for the first list read on their own
                log.warning("The shared watch of %s %s failed (%s: %s); restarting it", self.resource,
                            f"in {self.namespace}" if self.namespace else "of the cluster", type(error).__name__,
                            error)
                if self.failures > 1:
                    self._tell_broken()
                try:
                    await self.hook.reload_credentials()
                except Exception:  # noqa: BLE001 - the next start says what is wrong
                    log.debug("reloading the credentials failed", exc_info=True)
                await asyncio.sleep(backoff_after_drops(self.failures, random.random()))

    async def _watch(self) -> None:
        async with self.hook.shared_client():
            await self._watch_with(self.hook)

    async def _watch_with(self, hook: Any) -> None:
        self._resource_version = None
        drops = 0
        while True:
            if self._resource_version is None:
                await self._relist()
                self._ready.set()
            opened = time.monotonic()
            self.watch_requests += 1
            try:
                changes = hook.watch(self.resource, self.namespace, resource_version=self._resource_version,
                                     timeout_seconds=WATCH_SECONDS, label_selector=self.label_selector)
                async for kind, obj in changes:
                    self.failures = 0  # the watch works again
                    self._resource_version = (obj.get("metadata") or {}).get("resourceVersion") or \
                        self._resource_version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._changed(kind, obj)
            except WatchExpired:
                self._resource_version = None  # list again, after the back-off below if it repeats
            else:
                self.failures = 0
            if time.monotonic() - opened < WATCH_SECONDS - 1:
                # Dropped, refused or expired: resume (or list again) after a jittered back-off.
                drops += 1
                await asyncio.sleep(backoff_after_drops(drops, random.random()))
            else:
                drops = 0

    def _tell_broken(self) -> None:
        """The watch failed again: every subscriber reads its own object until it works."""
        for queues in self.subscribers.values():
            for queue in queues:
                queue.put(WATCH_BROKEN)

    def _changed(self, kind: str, obj: dict) -> None:
        """A change the watch delivered: to the subscribers of the Job it belongs to."""
        if owner := self.owner(obj):
            self._dispatch(owner, self.item(kind, obj))

    def owner(self, obj: dict) -> str | None:
        """The name of the Job whose subscribers get `obj`."""
        raise NotImplementedError

    def forget(self, name: str) -> None:
        """The last subscriber of this Job left."""

    def item(self, kind: str, obj: dict) -> Any:
        """What a subscriber receives for a change."""
        raise NotImplementedError

    async def _relist(self) -> None:
        """Catch up at a (re)start: set the resourceVersion to watch from, tell subscribers."""
        raise NotImplementedError

    def _dispatch(self, name: str, item: Any) -> None:
        for queue in self.subscribers.get(name, ()):
            queue.put(item)

    def _key(self) -> tuple[str, str, str]:
        return self.kubernetes_conn_id, self.namespace, self.resource


class SharedJobWatch(SharedWatch):
    """The Jobs of one namespace. A subscriber receives its Job at each change (the part waiting
    reads, `waited_view`), or `Deleted`. `latest` holds every Job of the namespace as last seen, so
    a new subscriber starts from it without a GET of its own, and `secrets` its secret values (env values
    by name, and those its masking annotation points at: `masking.secret_values`; the waited view drops
    them, and a trigger masks them in what it copies, see masking.JobSecrets);
    `reads` bounds the subscribers' own API reads."""

    resource = "jobs"

    def __init__(self, kubernetes_conn_id: str, namespace: str) -> None:
        super().__init__(kubernetes_conn_id, namespace)
        self.reads = asyncio.Semaphore(CONCURRENT_READS)  # held by a subscriber around each of its API reads
        self.latest: dict[str, dict] = {}
        self.secrets: dict[str, tuple[tuple[str, str], ...]] = {}  # Job -> (name, value) of its secret env
        self._keep_all_until = 0.0  # monotonic time: every Job is kept until then (LIST_GRACE_SECONDS)

    def owner(self, obj: dict) -> str | None:
        return (obj.get("metadata") or {}).get("name")

    def item(self, kind: str, obj: dict) -> dict | Deleted:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.latest.pop(name, None)
            self.secrets.pop(name, None)
            return Deleted(obj["metadata"].get("uid"))
        view = waited_view(obj)
        if name in self.subscribers or self._keeping_all():
            self.latest[name] = view
            self.secrets[name] = secret_values(obj)
        return view

    def forget(self, name: str) -> None:
        """Nobody waits on this Job any more: drop it (other people's Jobs cost no memory)."""
        if not self._keeping_all():
            self.latest.pop(name, None)
            self.secrets.pop(name, None)

    def _keeping_all(self) -> bool:
        if time.monotonic() < self._keep_all_until:
            return True
        if len(self.latest) > len(self.subscribers):  # the list's grace is over: keep the waited Jobs only
            self.latest = {name: job for name, job in self.latest.items() if name in self.subscribers}
            self.secrets = {name: values for name, values in self.secrets.items() if name in self.subscribers}
        return False

    async def _relist(self) -> None:
        """Every subscriber's Job as it is now, from a paged list; its resourceVersion to watch from."""
        self.relists += 1
        # Only these can be told their Job is gone: a Job of a later subscriber may be newer than
        # the list's snapshot (taken at its first page).
        subscribed = set(self.subscribers)
        latest: dict[str, dict] = {}
        secrets: dict[str, tuple[tuple[str, str], ...]] = {}
        token: str | None = None
        while True:
            jobs, version, token = await self.hook.list_page(self.resource, self.namespace, limit=LIST_PAGE,
                                                             continue_token=token)
            for job in jobs:  # a subscriber may start from this list's view
                latest[job["metadata"]["name"]] = waited_view(job)
                secrets[job["metadata"]["name"]] = secret_values(job)
            if token is None:
                break
        self.latest, self.secrets = latest, secrets
        self._keep_all_until = time.monotonic() + LIST_GRACE_SECONDS
        for name in list(self.subscribers):
            if name in latest:
                self._dispatch(name, latest[name])
            elif name in subscribed:
                self._dispatch(name, Deleted(None))  # none of that name: whichever it was, it is gone
        self._resource_version = version


class SharedPodWatch(SharedWatch):
    """The Volcano pods of one namespace, for triggers whose Job is starting. A subscriber receives
    (ADDED/MODIFIED/DELETED, pod) for its Job's pods, or RESYNC: list your pods again (`JobPods`).

    It borrows the Job watch's hook, so it shares that watch's client too."""

    resource = "pods"
    label_selector = JOB_NAME_LABEL  # pods of any Volcano Job

    def owner(self, obj: dict) -> str | None:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL)

    def item(self, kind: str, obj: dict) -> tuple[str, dict]:
        return kind, obj

    async def _watch(self) -> None:
        await self._watch_with(self.hook)

    async def _relist(self) -> None:
        """Only a resourceVersion (a list of one pod): each subscriber lists its own Job's pods, so
        a namespace of thousands of running pods is never listed whole."""
        self.relists += 1
        _, self._resource_version, _ = await self.hook.list_page(self.resource, self.namespace, limit=1,
                                                                 label_selector=self.label_selector)
        for queues in self.subscribers.values():
            for queue in queues:
                queue.put(RESYNC)


class SharedCache(SharedWatch):
    """Every object of one kind in the cluster, kept as slim views while some trigger subscribes (its
    Job waits to start): Volcano's Queues (cluster-scoped), every namespace's PodGroups, PriorityClasses.
    Nobody is sent changes: a trigger reads `objects` when it reports why its Job waits, so a thousand
    waiting Jobs cost one watch of each kind, not a read each. `last_error` says why the cache is not
    current (a watch refused: no deploy/queue-reader.yaml), for the report."""

    def __init__(self, kubernetes_conn_id: str, resource: str, view: Callable[[dict], dict]) -> None:
        super().__init__(kubernetes_conn_id, "")  # a hook (and client) of its own while it watches
        self.resource = resource
        self.view = view
        self.objects: dict[tuple[str, str], dict] = {}  # (namespace, name) -> view

    @staticmethod
    def key(obj: dict) -> tuple[str, str]:
        metadata = obj.get("metadata") or {}
        return metadata.get("namespace", ""), metadata.get("name", "")

    def _tell_broken(self) -> None:
        """Nobody reads a cache's queue: `last_error` tells a snapshot that the cache is not current."""

    def _changed(self, kind: str, obj: dict) -> None:
        if kind == "DELETED":
            self.objects.pop(self.key(obj), None)
        else:
            self.objects[self.key(obj)] = self.view(obj)

    async def _relist(self) -> None:
        self.relists += 1
        found: dict[tuple[str, str], dict] = {}
        token: str | None = None
        while True:
            page, version, token = await self.hook.list_page(self.resource, self.namespace, limit=LIST_PAGE,
                                                             continue_token=token)
            found.update((self.key(obj), self.view(obj)) for obj in page)
            if token is None:
                break
        self.objects, self._resource_version, self.last_error = found, version, None

    async def close(self) -> None:
        await super().close()
        self.objects = {}  # nobody waits: the cluster's objects cost no memory

    def current(self) -> list[dict] | None:
        """The objects as last seen; None if the cache is not current (its watch failed)."""
        return None if self.last_error is not None else list(self.objects.values())


def _priority_class_view(item: dict) -> dict:
    return {"metadata": {"name": (item.get("metadata") or {}).get("name")}, "value": item.get("value"),
            "globalDefault": item.get("globalDefault", False)}


def shared_cache(kubernetes_conn_id: str, resource: str) -> SharedCache:
    """The shared cache of this connection's `resource`: "queues", "podgroups" or "priorityclasses"."""
    registry = _registry()
    key = (kubernetes_conn_id, "", resource)
    if key not in registry:
        view = {"queues": queue_view, "podgroups": podgroup_view, "priorityclasses": _priority_class_view}[resource]
        registry[key] = SharedCache(kubernetes_conn_id, resource, view)
    return registry[key]  # type: ignore[return-value]


class JobQueueView:
    """One trigger's view of its Job's queue, from the shared caches: subscribed at its first waiting
    report, left once its Job no longer waits (or the wait ends)."""

    RESOURCES = ("queues", "podgroups", "priorityclasses")

    def __init__(self, kubernetes_conn_id: str, job: str) -> None:
        self.kubernetes_conn_id, self.job = kubernetes_conn_id, job
        self._stack: contextlib.AsyncExitStack | None = None

    async def _caches(self) -> list[SharedCache]:
        caches = [shared_cache(self.kubernetes_conn_id, resource) for resource in self.RESOURCES]
        if self._stack is None:
            self._stack = contextlib.AsyncExitStack()
            for cache in caches:
                await self._stack.enter_async_context(cache.subscribe(self.job))
        return caches

    async def podgroup(self, job: dict) -> dict | None:
        """The Job's PodGroup from the shared cache; None if the cache cannot tell (read it yourself)."""
        podgroups = (await self._caches())[1]
        if podgroups.current() is None:
            return None
        return podgroups.objects.get((job["metadata"]["namespace"], calls.podgroup_name(job)))

    async def snapshot(self, queue: str, namespace: str, hook: Any) -> QueueSnapshot:
        caches = await self._caches()
        queues, podgroups, classes = (cache.current() for cache in caches)
        if queues is None:
            return QueueSnapshot(queue, unreadable=caches[0].last_error)
        found = next((item for item in queues if item["metadata"].get("name") == queue), None)
        if found is None:
            return QueueSnapshot(queue)
        scope = None
        if podgroups is None:  # no cluster-wide watch allowed: the namespace's PodGroups at least
            scope = namespace
            try:
                podgroups = await hook.run(calls.list_podgroups(namespace))
            except VolcanoApiError as error:
                return QueueSnapshot(queue, unreadable=error.brief())
        return QueueSnapshot(queue, found, tuple(podgroups), Priorities.of(classes or ()), scope=scope)

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()


class JobPods:
    """A Job's pods (`status.pod_view`), kept current from the shared pod watch: listed once (and
    again after a RESYNC), then changed by each event, so checking them costs no request. Each pod
    seen tells `timeline` (if given) when its generation was placed."""

    def __init__(self, changes: Changes, list_pods: Callable[[], Awaitable[list[dict]]],
                 timeline: RunTimeline | None = None) -> None:
        self.changes, self.list_pods = changes, list_pods
        self.timeline = timeline or RunTimeline()
        self.pods: dict[str, dict] | None = None
        self.failed: dict[str, dict] = {}  # each pod's last failed state seen, even once it is gone

    async def current(self) -> list[dict]:
        while self.changes.ready():
            item = self.changes.get_nowait()
            if item in (RESYNC, WATCH_BROKEN):  # the watch restarted, or is down: list anew
                self.pods = None
                continue
            self.timeline.pod_seen(item[1])
            self._note_failure(pod_view(item[1]))
            if self.pods is not None:
                self._apply(*item)
        if self.pods is None:
            # Changes queued until now are older than this list; those arriving during it are
            # sorted out by resourceVersion in _apply.
            listed = await self.list_pods()
            for pod in listed:
                self.timeline.pod_seen(pod)
            self.pods = {pod["metadata"]["name"]: pod_view(pod) for pod in listed}
            for view in self.pods.values():
                self._note_failure(view)
        return list(self.pods.values())

    def _note_failure(self, view: dict) -> None:
        if pod_problem(view) is not None:
            self.failed[view["metadata"]["name"]] = view

    def _apply(self, kind: str, pod: dict) -> None:
        name = pod["metadata"]["name"]
        known = self.pods.get(name) if self.pods is not None else None
        if known is not None and _older(pod, known):
            return  # sent before the list that gave `known`
        if kind == "DELETED":
            self.pods.pop(name, None)  # type: ignore[union-attr]
        else:
            self.pods[name] = pod_view(pod)  # type: ignore[index]


def _older(pod: dict, than: dict) -> bool:
    """Whether `pod` is an older version than `than`. The apiserver documents resourceVersions as
    opaque; within one cluster they are etcd's growing revisions, and anything else is not compared."""
    mine, theirs = pod["metadata"].get("resourceVersion", ""), than["metadata"].get("resourceVersion", "")
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


_WATCHES: dict[int, dict[tuple[str, str, str], SharedWatch]] = {}
_CLOCKS: dict[int, dict[str, ServerClock]] = {}


def _registry() -> dict[tuple[str, str, str], SharedWatch]:
    """This event loop's shared watches (a triggerer runs one loop; tests may run several in turn)."""
    loop = asyncio.get_running_loop()
    for stale in [key for key in _WATCHES if key != id(loop) and not _WATCHES[key]]:
        del _WATCHES[stale]
    return _WATCHES.setdefault(id(loop), {})


# The apiserver's clock is read again this often (it is carried forward on the monotonic clock meanwhile).
CLOCK_REFRESH_SECONDS = 600.0
# After a read of it failed, others wait this long before trying again (thousands of triggers start at once).
CLOCK_RETRY_SECONDS = 5.0


class ServerClock:
    """The apiserver's epoch time as an offset from this process's monotonic clock: read once (its Date
    header) for every trigger of a connection, and again when older than CLOCK_REFRESH_SECONDS."""

    def __init__(self) -> None:
        self.offset: float | None = None
        self.reads = 0
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def read(self, hook: Any) -> float | None:
        """The offset (apiserver epoch minus time.monotonic()), None if it cannot be read."""
        async with self._lock:
            age = time.monotonic() - self._read_at
            if age < (CLOCK_REFRESH_SECONDS if self.offset is not None else CLOCK_RETRY_SECONDS):
                return self.offset
            self.reads += 1
            before = time.monotonic()
            try:
                date = await hook.run(calls.read_server_date())
            except Exception as error:  # noqa: BLE001 - unknown: nothing is decided on it, and it is read again
                log.warning("Could not read the apiserver's clock: %s", error)
                date = None
            after = time.monotonic()
            self._read_at = after
            if (server := calls.server_time(date)) is not None:
                self.offset = server - (before + after) / 2
            return self.offset


def shared_server_clock(kubernetes_conn_id: str) -> ServerClock:
    """This connection's apiserver clock, shared by the triggers of this event loop."""
    clocks = _CLOCKS.setdefault(id(asyncio.get_running_loop()), {})
    return clocks.setdefault(kubernetes_conn_id, ServerClock())


def shared_job_watch(kubernetes_conn_id: str, namespace: str) -> SharedJobWatch:
    """The shared watch of this connection's Jobs in `namespace`, created on first use."""
    registry = _registry()
    key = (kubernetes_conn_id, namespace, SharedJobWatch.resource)
    if key not in registry:
        registry[key] = SharedJobWatch(kubernetes_conn_id, namespace)
    return registry[key]  # type: ignore[return-value]


def shared_pod_watch(kubernetes_conn_id: str, namespace: str) -> SharedPodWatch:
    """The shared watch of this connection's Volcano pods in `namespace` (with the Job watch's hook)."""
    registry = _registry()
    key = (kubernetes_conn_id, namespace, SharedPodWatch.resource)
    if key not in registry:
        registry[key] = SharedPodWatch(kubernetes_conn_id, namespace,
                                       hook=shared_job_watch(kubernetes_conn_id, namespace).hook)
    return registry[key]  # type: ignore[return-value]
