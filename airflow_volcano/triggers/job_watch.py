"""One watch of Volcano Jobs per connection and namespace, shared by every trigger in the triggerer.

A deferred VolcanoJobTrigger used to hold its own client and its own watch request: about 1 MiB,
one TLS session and one apiserver watch per waiting Job. Here all triggers of one connection and
namespace subscribe to one `SharedJobWatch`: one client, one watch request of the namespace's Jobs
(resumed from the last resourceVersion when it drops, once for everyone), and each trigger gets
only its own Job's changes on a queue. The watch stops when the last subscriber leaves.

On 410 Gone (the apiserver compacted the resourceVersion away) it lists the namespace's Jobs page
by page and hands each subscriber its Job as now: one paged list instead of a GET per trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_volcano.exceptions import WatchExpired
from airflow_volcano.wait_engine import backoff_after_drops

log = logging.getLogger(__name__)

WATCH_SECONDS = 300  # one watch request lasts this long at most, then is reopened from where it was
LIST_PAGE = 500
# What a subscriber's queue receives besides Job objects: the Job is gone (or an exception: the
# shared watch failed for good, and so does every wait on it).
DELETED = "DELETED"


class SharedJobWatch:
    """The Jobs of one namespace, watched once for all subscribers (one event loop)."""

    def __init__(self, connection: dict[str, Any], namespace: str) -> None:
        self.connection, self.namespace = connection, namespace
        self.subscribers: dict[str, set[asyncio.Queue]] = {}
        self.watch_requests = 0  # how many watch requests were opened (for tests and benchmarks)
        self.relists = 0
        self._resource_version: str | None = None
        self._task: asyncio.Task | None = None
        self._hook: Any = None
        self._ready = asyncio.Event()  # set once the watch has a resourceVersion (or has failed)

    @contextlib.asynccontextmanager
    async def subscribe(self, name: str) -> AsyncIterator[asyncio.Queue]:
        """A queue of the named Job's changes (each a Job dict, or DELETED) while the block runs."""
        queue: asyncio.Queue = asyncio.Queue()
        self.subscribers.setdefault(name, set()).add(queue)
        if self._task is None or self._task.done():
            self._ready.clear()
            self._task = asyncio.create_task(self._run(), name=f"airflow-volcano watch of Jobs in {self.namespace}")
        try:
            await self._started()
            yield queue
        finally:
            queues = self.subscribers.get(name, set())
            queues.discard(queue)
            if not queues:
                self.subscribers.pop(name, None)
            if not self.subscribers:
                await self.close()

    @property
    def hook(self) -> Any:
        """The connection's AsyncVolcanoHook, whose calls share the watch's client while it runs."""
        if self._hook is None:
            from airflow_volcano.hooks.volcano import AsyncVolcanoHook  # loaded by the trigger already

            self._hook = AsyncVolcanoHook(self.connection)
        return self._hook

    async def close(self) -> None:
        task, self._task = self._task, None
        _registry().pop((_connection_key(self.connection), self.namespace), None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _started(self) -> None:
        """Return once the watch has a resourceVersion: changes after that reach the queue."""
        await self._ready.wait()
        task = self._task
        if task is not None and task.done() and not task.cancelled() and (error := task.exception()) is not None:
            raise error

    async def _run(self) -> None:
        try:
            await self._watch()
        except Exception as error:  # noqa: BLE001 - e.g. a permission taken away: every subscriber fails with it
            _registry().pop((_connection_key(self.connection), self.namespace), None)  # the next trigger starts anew
            self._ready.set()
            for queues in self.subscribers.values():
                for queue in queues:
                    queue.put_nowait(error)
            raise

    async def _watch(self) -> None:
        async with self.hook.shared_client():
            await self._watch_with(self.hook)

    async def _watch_with(self, hook: Any) -> None:
        self._resource_version = None
        drops = 0
        while True:
            if self._resource_version is None:
                await self._relist()
            opened = time.monotonic()
            self.watch_requests += 1
            try:
                changes = hook.watch_jobs(self.namespace, resource_version=self._resource_version,
                                          timeout_seconds=WATCH_SECONDS)
                async for kind, job in changes:
                    metadata = job.get("metadata") or {}
                    self._resource_version = metadata.get("resourceVersion") or self._resource_version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._dispatch(metadata.get("name", ""), DELETED if kind == "DELETED" else job)
            except WatchExpired:
                self._resource_version = None
                continue
            if time.monotonic() - opened < WATCH_SECONDS - 1:
                # Dropped or refused: resume from the last resourceVersion after a jittered back-off.
                drops += 1
                await asyncio.sleep(backoff_after_drops(drops, random.random()))
            else:
                drops = 0

    async def _relist(self) -> None:
        """Every subscriber's Job as it is now, from a paged list; its resourceVersion to watch from."""
        self.relists += 1
        seen: set[str] = set()
        token: str | None = None
        while True:
            jobs, version, token = await self.hook.list_jobs_page(self.namespace, limit=LIST_PAGE,
                                                                    continue_token=token)
            for job in jobs:
                name = job["metadata"]["name"]
                seen.add(name)
                self._dispatch(name, job)
            if token is None:
                break
        for name in set(self.subscribers) - seen:
            self._dispatch(name, DELETED)
        self._resource_version = version
        self._ready.set()

    def _dispatch(self, name: str, item: dict | str) -> None:
        for queue in self.subscribers.get(name, ()):
            queue.put_nowait(item)


def _connection_key(connection: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(connection, sort_keys=True, default=str).encode()).hexdigest()


_WATCHES: dict[int, dict[tuple[str, str], SharedJobWatch]] = {}


def _registry() -> dict[tuple[str, str], SharedJobWatch]:
    """This event loop's shared watches (a triggerer runs one loop; tests may run several in turn)."""
    loop = asyncio.get_running_loop()
    for stale in [key for key in _WATCHES if key != id(loop) and not _WATCHES[key]]:
        del _WATCHES[stale]
    return _WATCHES.setdefault(id(loop), {})


def shared_job_watch(connection: dict[str, Any], namespace: str) -> SharedJobWatch:
    """The shared watch of this connection and namespace, created on first use."""
    registry = _registry()
    key = (_connection_key(connection), namespace)
    if key not in registry:
        registry[key] = SharedJobWatch(connection, namespace)
    return registry[key]
