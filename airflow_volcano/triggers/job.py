"""VolcanoJobTrigger: waits for a Volcano Job in the triggerer, so no worker slot is held.

It drives the same waiting engine as the worker (`airflow_volcano.wait_engine`) and fires one
event: finished, timeout, problem (cannot start) or error. The worker then resumes in
`execute_complete`, which runs the shared finalize path. While waiting it copies new lines of the
master log into the task log every `log_interval` seconds, remembering how far it got in a
`LogCursor` that travels with the event, so nothing is shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_volcano.constants import OnKillAction
from airflow_volcano.events import JobEvent, WaitOutcome
from airflow_volcano.job_ref import JobRef
from airflow_volcano.job_runner import task_state_key
from airflow_volcano.logs import LOG_CHUNK_BYTES, LineSplitter, LogCursor, emit_unseen, iter_lines, parse_timestamp_ns
from airflow_volcano.manifest import TENSORBOARD_TASK
from airflow_volcano.masking import register_secrets_in_triggerer
from airflow_volcano.stalls import STACKS_POLL_SECONDS, STACKS_REQUEST_ANNOTATION, STACKS_WAIT_SECONDS, StackCollection
from airflow_volcano.status import Outcome, waited_view
from airflow_volcano.triggers.job_watch import (
    DELETED,
    WATCH_BROKEN,
    Changes,
    JobPods,
    shared_job_watch,
    shared_pod_watch,
)
from airflow_volcano.wait_engine import (
    Action,
    CheckPods,
    CollectStacks,
    DeletePods,
    Done,
    Reread,
    RestartJob,
    WaitEngine,
    WaitLimits,
    WaitResult,
    Watch,
    scheduling_subjects,
)

# Airflow 3.3+ calls a trigger's on_kill when a user kills its deferred task. Before that a
# user's kill and a triggerer shutdown both just cancel run(); only the task state tells them apart.
TRIGGERER_CALLS_ON_KILL = "on_kill" in vars(BaseTrigger)
ON_KILL_SECONDS = 30.0  # as long as Airflow 3.3 gives on_kill


async def _finish_despite_cancellation(work: Coroutine[Any, Any, None], limit: float) -> None:
    """Run `work` to the end even though the triggerer keeps cancelling this trigger until it is gone."""
    task = asyncio.ensure_future(asyncio.wait_for(work, limit))
    while not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)
    with contextlib.suppress(Exception, asyncio.CancelledError):
        task.result()


async def _follow(engine: WaitEngine, changes: Changes, seconds: float) -> Action:
    """The Job's changes from the shared watch, for up to `seconds`, until one needs acting on."""
    deadline = time.monotonic() + seconds
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            async with asyncio.timeout(remaining):  # no task per wait, unlike wait_for
                item = await changes.get()
        except TimeoutError:
            break
        if item == WATCH_BROKEN:  # the shared watch is down: this wait reads its Job after a back-off
            return engine.watch_ended(time.time())
        if item == DELETED:
            return engine.job_read(None, time.time())
        if (action := engine.job_changed(item, time.time())) is not None:
            return action
    return engine.watch_ended(time.time())


def _event(result: WaitResult) -> JobEvent:
    """The engine's verdict as the event the worker resumes with."""
    lost = list(result.lost_nodes)
    if result.deleted:
        return JobEvent(WaitOutcome.ERROR, message=result.deleted, lost_nodes=lost)
    if result.timed_out:
        return JobEvent(WaitOutcome.TIMEOUT, message=result.timed_out, lost_nodes=lost)
    if result.problem:
        return JobEvent(WaitOutcome.PROBLEM, message=result.problem, lost_nodes=lost)
    if result.stalled:
        return JobEvent(WaitOutcome.STALLED, message=result.stalled, lost_nodes=lost, stalls=result.stalls)
    return JobEvent(WaitOutcome.FINISHED, phase=result.state.phase, lost_nodes=lost, stalls=result.stalls,
                    failed_pods=list(result.failed_pods.values()))


class VolcanoJobTrigger(BaseTrigger):
    """Waits in the triggerer for a Volcano Job to finish, fail to start, or pass a deadline, and
    copies the master's new log lines into the task log meanwhile.

    Its arguments hold no credentials (Airflow before 3.2 returns a deferred task's trigger
    arguments through its REST API): the triggerer resolves the connection by its id.

    :param job: the Job's reference (`JobRef.to_dict()`).
    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection, resolved in the triggerer.
    :param limits: startup_timeout, job_timeout and poll_interval (`WaitLimits.to_dict()`).
    :param deadline: the task's execution_timeout, as an epoch timestamp.
    :param get_logs: copy the master's log into the task log.
    :param log_interval: seconds between two log copies.
    :param log_cursor: how far the log was shown already (`LogCursor.to_dict()`).
    :param on_kill_action: what a kill of the deferred task does to the Job: `delete_job` or `keep_job`.
    :param log_pods: `[pod, container]` of each pod of `log_tasks`: with stall_timeout, their newest
        log line counts as output too (their logs are copied by the worker, at the end).
    """

    def __init__(
        self,
        job: dict[str, Any],
        kubernetes_conn_id: str,
        *,
        limits: dict[str, Any] | None = None,
        deadline: float | None = None,
        get_logs: bool = True,
        log_interval: float = 30.0,
        log_cursor: dict[str, int] | None = None,
        on_kill_action: str = OnKillAction.DELETE_JOB,
        log_pods: list[list[str | None]] | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.kubernetes_conn_id = kubernetes_conn_id
        self.limits = WaitLimits.from_dict(limits) if limits is not None else WaitLimits()
        self.deadline = deadline  # epoch seconds: the task's execution_timeout, if any
        self.get_logs = get_logs
        self.log_interval = log_interval
        self.log_cursor = log_cursor
        self.on_kill_action = str(on_kill_action)  # a plain string among the serialized arguments
        self.log_pods = [list(pod) for pod in log_pods or []]
        self._output_at: dict[str, float] = {}  # pod of log_pods -> its newest line's time

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job, "kubernetes_conn_id": self.kubernetes_conn_id, "limits": self.limits.to_dict(),
                "deadline": self.deadline, "get_logs": self.get_logs, "log_interval": self.log_interval,
                "log_cursor": self.log_cursor, "on_kill_action": self.on_kill_action, "log_pods": self.log_pods,
            },
        )

    async def _hook(self) -> Any:
        # The first import of the Kubernetes clients takes seconds; in a thread, so the triggerer's
        # other triggers keep running meanwhile (its event loop would report itself blocked).
        hooks = await asyncio.to_thread(importlib.import_module, "airflow_volcano.hooks.volcano")
        return hooks.AsyncVolcanoHook(self.kubernetes_conn_id)

    async def _shared_hook(self, namespace: str) -> Any:
        """The hook of this connection's shared watch: its calls share one client with the watch."""
        await asyncio.to_thread(importlib.import_module, "airflow_volcano.hooks.volcano")
        return shared_job_watch(self.kubernetes_conn_id, namespace).hook

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ref = JobRef.from_dict(self.job)
        cursor = LogCursor.from_dict(self.log_cursor)
        self.log.info("Waiting for Volcano Job %s/%s", ref.namespace, ref.name)
        try:
            event = await self._wait(ref, cursor)
        except asyncio.CancelledError:
            if not TRIGGERER_CALLS_ON_KILL:
                await _finish_despite_cancellation(self._kill_if_task_left_deferral(ref), ON_KILL_SECONDS)
            raise
        except Exception as error:  # noqa: BLE001 - reported to the worker, which fails the task
            event = JobEvent(WaitOutcome.ERROR, message=f"{type(error).__name__}: {error}")
        yield TriggerEvent(dataclasses.replace(event, job=ref.to_dict(), log_cursor=cursor.to_dict()).to_dict())

    async def _wait(self, ref: JobRef, cursor: LogCursor) -> JobEvent:
        hook = await self._shared_hook(ref.namespace)
        copiers: list[asyncio.Task] = []

        def copy_logs() -> None:
            if self.get_logs and not copiers:
                copiers.append(asyncio.create_task(self._copy_logs_periodically(hook, ref, cursor)))

        def last_output() -> float | None:
            return max([cursor.last_line_at or 0.0, *self._output_at.values()]) or None

        try:
            return await self._watch_until_done(hook, ref, copy_logs, last_output)
        finally:
            for copier in copiers:
                copier.cancel()
            await asyncio.gather(*copiers, return_exceptions=True)

    async def _watch_until_done(self, hook: Any, ref: JobRef, copy_logs: Callable[[], None],
                                last_output: Callable[[], float | None]) -> JobEvent:
        """The asyncio driver of the wait engine (job_runner._watch_until_done is the blocking one).
        Changes come from the triggerer's one shared watch of the namespace's Jobs, and its pods from
        the shared pod watch (what starting, lost nodes and the failure report need: Volcano may
        remove a failed pod before the Job ends)."""
        engine = WaitEngine(ref, self.limits, started_at=ref.created_at or time.time(),
                            report=lambda line: self.log.info("%s", line), deadline=self.deadline,
                            last_output=last_output)
        watch = shared_job_watch(self.kubernetes_conn_id, ref.namespace)
        pod_watch = shared_pod_watch(self.kubernetes_conn_id, ref.namespace)
        async with watch.subscribe(ref.name) as changes, pod_watch.subscribe(ref.name) as pod_changes:
            job_pods = JobPods(pod_changes, lambda: hook.list_job_pods(ref.name, ref.namespace))
            job = watch.latest.get(ref.name)
            if job is not None:
                changes.clear()  # all older than what `latest` holds
            else:  # not seen by the shared watch yet (just created), or gone
                async with watch.reads:
                    job = await hook.get_job(ref.name, ref.namespace)
                    if job is not None:
                        await register_secrets_in_triggerer(job)  # its copied log lines are masked
                    job = waited_view(job)
            # The Job has been seen whole (its secret env values registered): its log may be copied now.
            copy_logs()
            action: Action = engine.job_read(job, time.time())
            while True:
                match action:
                    case Done(result=result):
                        if result.state.outcome is Outcome.FAILED or result.stalled:
                            # The failed pods Volcano has removed, as last seen (the report reads the rest).
                            try:
                                async with watch.reads:
                                    listed = {pod["metadata"]["name"] for pod in await job_pods.current()}
                                result.failed_pods = {name: view for name, view in job_pods.failed.items()
                                                      if name not in listed}
                            except Exception as error:  # noqa: BLE001 - the report explains with what it finds
                                self.log.warning("Could not read the pods of Volcano Job %s/%s: %s", ref.namespace,
                                                 ref.name, error)
                        return _event(result)
                    case CheckPods(scheduling=scheduling):
                        async with watch.reads:
                            pods = await job_pods.current()
                            podgroup = await hook.get_podgroup(engine.job) if scheduling and engine.job else None
                            events = (await hook.list_events(ref.namespace, scheduling_subjects(podgroup, pods))
                                      if scheduling else [])
                        action = engine.pods_seen(pods, podgroup, events, time.time())
                    case Watch(seconds=seconds):
                        action = await _follow(engine, changes, seconds)
                    case Reread(after=after):
                        await asyncio.sleep(after)
                        async with watch.reads:
                            action = engine.job_read(waited_view(await hook.get_job(ref.name, ref.namespace)),
                                                     time.time())
                    case DeletePods(pods=pods):
                        for pod in pods:
                            try:
                                await hook.delete_lost_pod(pod, ref.namespace)
                            except Exception as error:  # noqa: BLE001 - e.g. no permission: the check retries
                                self.log.warning("Could not delete pod %s/%s on a lost node: %s", ref.namespace,
                                                 pod, error)
                        action = engine.pods_deleted(time.time())
                    case CollectStacks(silent_for=silent_for):
                        where = await self._collect_stacks(hook, ref, silent_for)
                        action = engine.stacks_collected(where, time.time())
                    case RestartJob():
                        try:
                            await hook.restart_job(engine.job or {})
                        except Exception as error:  # noqa: BLE001 - reported; the stall's clock starts again
                            self.log.warning("Could not restart Volcano Job %s/%s: %s", ref.namespace, ref.name,
                                             error)
                        action = engine.restart_requested(time.time())

    async def _collect_stacks(self, hook: Any, ref: JobRef, silent_for: float) -> str:
        """As job_runner.collect_stacks (the blocking twin): ask, read, show; where each process was."""
        from airflow_volcano.job_runner import stall_notice

        self.log.info("%s", stall_notice(ref, silent_for))
        asked_at = time.time()
        collection = StackCollection.of(await hook.list_job_pods(ref.name, ref.namespace), str(int(asked_at)),
                                        skip_tasks=[TENSORBOARD_TASK])
        for pod, _container in collection.pods:
            try:
                if not await hook.annotate_pod(pod, ref.namespace, {STACKS_REQUEST_ANNOTATION: collection.request}):
                    collection.unreachable[pod] = "the pod is gone"
            except Exception as error:  # noqa: BLE001 - said in the report
                collection.unreachable[pod] = f"could not annotate it ({error})"
        deadline = time.monotonic() + STACKS_WAIT_SECONDS
        while collection.waiting_for() and time.monotonic() < deadline:
            await asyncio.sleep(STACKS_POLL_SECONDS)
            for pod, container in collection.waiting_for():
                try:
                    chunks = [chunk async for chunk in hook.pod_log_chunks(
                        pod, ref.namespace, container=container, since_seconds=int(time.time() - asked_at) + 5,
                        chunk_bytes=LOG_CHUNK_BYTES)]
                    collection.log_read(pod, [line.partition(" ")[2] for line in iter_lines(chunks)])
                except Exception:  # noqa: BLE001 - a pod that cannot be read now may be read at the next poll
                    pass
        for line in collection.report():
            self.log.info("%s", line)
        return collection.where()

    async def _copy_logs_periodically(self, hook: Any, ref: JobRef, cursor: LogCursor) -> None:
        while True:
            await self._copy_new_log_lines(hook, ref, cursor)
            if self.limits.stall_timeout is not None:
                for pod, container in self.log_pods:
                    await self._note_newest_line(hook, ref.namespace, str(pod), container)
            await asyncio.sleep(self.log_interval)

    async def _note_newest_line(self, hook: Any, namespace: str, pod: str, container: str | None) -> None:
        """The time of a log_tasks pod's newest line (one line read): output, for stall_timeout."""
        try:
            chunks = [chunk async for chunk in hook.pod_log_chunks(
                pod, namespace, container=container, since_seconds=None, chunk_bytes=LOG_CHUNK_BYTES, tail_lines=1)]
        except Exception:  # noqa: BLE001 - not started, gone: no output from it
            return
        for line in iter_lines(chunks):
            if (at := parse_timestamp_ns(line.partition(" ")[0])) is not None:
                self._output_at[pod] = at / 1e9

    async def _copy_new_log_lines(self, hook: Any, ref: JobRef, cursor: LogCursor) -> None:
        """Everything newer than the cursor, streamed: one read from the cursor's second to the
        log's current end, one chunk in memory at a time, each line shown once."""
        splitter = LineSplitter()
        cursor.start_read()

        def emit(line: str) -> None:
            self.log.info("[%s] %s", ref.main_pod, line)

        try:
            async for chunk in hook.pod_log_chunks(ref.main_pod, ref.namespace, container=ref.main_pod_container,
                                                   since_seconds=cursor.since_seconds(), chunk_bytes=LOG_CHUNK_BYTES):
                emit_unseen(splitter.feed(chunk), cursor, emit)
            emit_unseen(splitter.end(), cursor, emit)
        except Exception:  # noqa: BLE001 - master not started yet, no log, a dropped read: the next copy resumes
            return

    async def _kill_if_task_left_deferral(self, ref: JobRef) -> None:
        """Before Airflow 3.3: delete the Job only if the task is no longer deferred (a user acted).

        A triggerer shutting down or handing the trigger to another triggerer leaves the task
        deferred; then the Job must keep running. If the state cannot be read, keep it too: a
        kept Job can still be reattached or deleted later, a deleted one is lost training.
        """
        if self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        try:
            state = await self._task_state()
        except Exception as error:  # noqa: BLE001 - cancellation must go on; keeping is the safe side
            self.log.warning("Cancelled, and the task's state is unknown (%s): keeping Volcano Job %s/%s",
                             error, ref.namespace, ref.name)
            return
        if state == "deferred":
            self.log.info("Cancelled while the task is still deferred (a triggerer stopping or handing over): "
                          "keeping Volcano Job %s/%s", ref.namespace, ref.name)
        else:
            self.log.info("Cancelled while the task is %s: treating it as a kill", state)
            try:
                await self.on_kill()
            except Exception:  # noqa: BLE001 - the cancellation must still go on
                self.log.exception("Could not delete Volcano Job %s/%s after the kill", ref.namespace, ref.name)

    async def _task_state(self) -> str | None:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        ti = self.task_instance
        # The triggerer answers this through its supervisor; sync_to_async keeps the event loop free.
        states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
            dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index,
        )
        return (states.get(ti.run_id) or {}).get(task_state_key(ti.task_id, ti.map_index))

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the training."""
        if self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        ref = JobRef.from_dict(self.job)
        hook = await self._hook()
        await hook.delete_job(ref.name, ref.namespace)
        if ref.script_configmap:
            await hook.delete_configmap(ref.script_configmap, ref.namespace)
        self.log.info("Task killed: deleted Volcano Job %s/%s", ref.namespace, ref.name)


