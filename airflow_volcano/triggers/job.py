"""VolcanoJobTrigger: waits for a Volcano Job in the triggerer, so no worker slot is held.

It drives the same wait engine as the worker (`airflow_volcano.waiting.wait_engine`), carries out its actions
with the same programs (`airflow_volcano.waiting.wait_steps`), and fires one event: the engine's verdict
(`events.WaitOutcome.to_event`). The worker then resumes in `execute_complete`, which runs the shared
finalize path. While waiting it copies the followed pods' new log lines into the task log (the main
pod's, and log_tasks'), every `log_interval` seconds and at once when one of them ends or is being
deleted (its last lines would go with it), each line stamped with the time the pod printed it. How
far each copy got travels with the event, so nothing is shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import random
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_volcano.constants import ENDED_POD_PHASES, OnKillAction
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks import calls
from airflow_volcano.job_ref import JobRef
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.logs import LOG_CHUNK_BYTES, Emit, LineSplitter, LogCursor, emit_unseen
from airflow_volcano.observability.masking import JobSecrets, secret_values
from airflow_volcano.observability.pod_logs import printed_at
from airflow_volcano.ownership import cancellation_ends_job, nothing_to_stop, task_state
from airflow_volcano.status import Outcome, failed_pods, failures_not_listed, job_state, waited_view
from airflow_volcano.triggers.job_watch import (
    WATCH_BROKEN,
    Changes,
    Deleted,
    JobPods,
    JobQueueView,
    ServerClock,
    SharedJobWatch,
    shared_job_watch,
    shared_pod_watch,
    shared_server_clock,
)
from airflow_volcano.waiting import wait_steps
from airflow_volcano.waiting.events import Verdict, WaitOutcome
from airflow_volcano.waiting.wait_engine import (
    Action,
    CheckPods,
    CollectStacks,
    DeletePods,
    Done,
    FollowedLog,
    OutputClock,
    ProbeOutput,
    ReadClock,
    ReadQueue,
    RecordPreemptions,
    Reread,
    RestartJob,
    WaitEngine,
    WaitLimits,
    Watch,
    backoff_after_drops,
)

if TYPE_CHECKING:
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

# Airflow 3.3+ calls a trigger's on_kill when a user kills its deferred task. Before that a
# user's kill and a triggerer shutdown both just cancel run(); only the task state tells them apart.
TRIGGERER_CALLS_ON_KILL = "on_kill" in vars(BaseTrigger)
# The states a user's action leaves a deferred task in (Mark failed / success, Clear: no state), as
# the pre-3.3 triggerer's cancellation sees them. Not "scheduled", "queued", "running": a resumed task.
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
            return engine.watch_ended(time.monotonic())
        if isinstance(item, Deleted):
            if (action := engine.job_deleted(item.uid, time.monotonic())) is not None:
                return action
            continue
        if (action := engine.job_changed(item, time.monotonic())) is not None:
            return action
    return engine.watch_ended(time.monotonic())


async def _read_job(hook: AsyncVolcanoHook, engine: WaitEngine, ref: JobRef, reads: asyncio.Semaphore) -> Action:
    """Read the Job for the engine; a resource the apiserver does not serve is "cannot see", not "gone"."""
    try:
        async with reads:
            job = await hook.run(calls.get_job(ref.name, ref.namespace))
    except VolcanoApiError as error:
        if not error.not_served:
            raise
        return engine.job_unseen(str(error), time.monotonic())
    return engine.job_read(waited_view(job), time.monotonic())


class _AsyncSteps(wait_steps.DriverSteps[Awaitable[Action]]):
    """The trigger's steps for the engine's actions (dispatched by `wait_steps.step`), on the event loop:
    its Job's changes and pods from the triggerer's shared watches, its queue from the shared caches."""

    def __init__(self, hook: AsyncVolcanoHook, ref: JobRef, engine: WaitEngine, changes: Changes, job_pods: JobPods,
                 watch: SharedJobWatch, queue_view: JobQueueView, clock: ServerClock, say: Emit, warn: Emit) -> None:
        self.hook, self.ref, self.engine, self.changes, self.job_pods = hook, ref, engine, changes, job_pods
        self.reads, self.queue_view, self.clock, self.say, self.warn = watch.reads, queue_view, clock, say, warn

    async def read_clock(self, action: ReadClock) -> Action:
        offset = await self.clock.read(self.hook)
        now = time.monotonic()
        return self.engine.clock_read(None if offset is None else now + offset, now)

    async def check_pods(self, action: CheckPods) -> Action:
        engine = self.engine
        cached = await self.queue_view.podgroup(engine.job) if action.scheduling and engine.job else None
        async with self.reads:
            pods = await self.job_pods.current()
            podgroup, events = await self.hook.drive(wait_steps.scheduling_view(engine.job, pods, action,
                                                                                cached))
        return engine.pods_seen(pods, podgroup, events, time.monotonic())

    async def read_queue(self, action: ReadQueue) -> Action:
        return self.engine.queue_seen(await self.queue_view.snapshot(action.queue, self.ref.namespace, self.hook),
                                      time.monotonic())

    async def watch(self, action: Watch) -> Action:
        return await _follow(self.engine, self.changes, action.seconds)

    async def reread(self, action: Reread) -> Action:
        await asyncio.sleep(action.after)
        return await _read_job(self.hook, self.engine, self.ref, self.reads)

    async def delete_pods(self, action: DeletePods) -> Action:
        await self.hook.drive(wait_steps.delete_lost_pods(self.ref.namespace, action.pods, self.warn))
        return self.engine.pods_deleted(time.monotonic())

    async def probe_output(self, action: ProbeOutput) -> Action:
        async with self.reads:
            newest = await self.hook.drive(wait_steps.probe_output(self.ref.namespace, action.pods))
        return self.engine.output_probed(newest, time.monotonic())

    async def collect_stacks(self, action: CollectStacks) -> Action:
        where, running, lines = await self.hook.drive(
            wait_steps.collect_stacks(self.ref, action.silent_for, self.say, action.requested_at))
        return self.engine.stacks_collected(where, time.monotonic(), running, lines)

    async def restart_job(self, action: RestartJob) -> Action:
        refused = await self.hook.drive(wait_steps.restart_gang(self.ref.namespace, action.pods))
        return self.engine.restart_requested(time.monotonic(), refused)

    async def record_preemptions(self, action: RecordPreemptions) -> Action:
        refused = await self.hook.drive(wait_steps.record_preemptions(self.ref, action.annotations))
        return self.engine.preemptions_recorded(refused, time.monotonic())


def _leaving(pod: dict) -> bool:
    """Whether a pod ended or is being deleted: its log goes with it, so copy it now."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp")) or \
        (pod.get("status") or {}).get("phase") in ENDED_POD_PHASES


class _LogCopy:
    """One followed pod's log, copied by the trigger: where, how far, and whether it has started."""

    __slots__ = ("container", "cursor", "pod", "started")

    def __init__(self, pod: str, container: str | None, cursor: LogCursor) -> None:
        self.pod, self.container, self.cursor = pod, container, cursor
        self.started: bool | None = None  # None: not known yet (one read tells)


class VolcanoJobTrigger(BaseTrigger):
    """Waits in the triggerer for a Volcano Job to finish, fail to start, stall, or pass a deadline,
    and copies the followed pods' new log lines into the task log meanwhile.

    Its arguments hold no credentials and no secrets (Airflow stores a deferred task's trigger arguments
    unencrypted, and 3.1 and 3.2 return them through the REST API): the triggerer resolves the connection by
    its id, and the Job's secrets, Variables the worker rendered into it included, are read from the Job
    (`masking.secret_values`).

    :param job: the Job's reference (`JobRef.to_dict()`).
    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection, resolved in the triggerer.
    :param limits: the wait's limits (`WaitLimits.to_dict()`).
    :param deadline: the task's execution_timeout, as an epoch timestamp.
    :param get_logs: copy the main pod's log into the task log.
    :param log_interval: seconds between two log copies (a quarter of stall_timeout at most).
    :param log_cursor: how far the main pod's log was shown already (`LogCursor.to_dict()`).
    :param on_kill_action: what a kill of the deferred task does to the Job: `delete_job` or `keep_job`.
    :param log_pods: `[pod, container]` of each pod of `log_tasks`, whose log is copied too.
    :param log_cursors: how far each of `log_pods` was shown already, by pod.
    :param probe_pods: `[pod, container]` of pods whose output counts for stall_timeout without being
        copied (the ranks' pods of a DeepSpeed/mpirun launch).
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
        log_cursors: dict[str, dict[str, Any]] | None = None,
        probe_pods: list[list[str | None]] | None = None,
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
        self.log_cursors = dict(log_cursors or {})
        self.probe_pods = [list(pod) for pod in probe_pods or []]
        self._secrets: JobSecrets | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job, "kubernetes_conn_id": self.kubernetes_conn_id, "limits": self.limits.to_dict(),
                "deadline": self.deadline, "get_logs": self.get_logs, "log_interval": self.log_interval,
                "log_cursor": self.log_cursor, "on_kill_action": self.on_kill_action, "log_pods": self.log_pods,
                "log_cursors": self.log_cursors, "probe_pods": self.probe_pods,
            },
        )

    async def _hook(self) -> AsyncVolcanoHook:
        # The first import of the Kubernetes clients takes seconds; in a thread, so the triggerer's
        # other triggers keep running meanwhile (its event loop would report itself blocked).
        hooks = await asyncio.to_thread(importlib.import_module, "airflow_volcano.hooks.volcano")
        hook = hooks.AsyncVolcanoHook(self.kubernetes_conn_id)
        hook.note_credentials_accepted()  # they created the Job: a 401 now is an expired token, retried
        return hook

    async def _shared_hook(self, namespace: str) -> AsyncVolcanoHook:
        """The hook of this connection's shared watch: its calls share one client with the watch."""
        await asyncio.to_thread(importlib.import_module, "airflow_volcano.hooks.volcano")
        return shared_job_watch(self.kubernetes_conn_id, namespace).hook

    def _say(self, line: str) -> None:
        """A line of the trigger's own into the task log, the Job's secrets masked."""
        self.log.info("%s", self._secrets.redact(line) if self._secrets is not None else line)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ref = JobRef.from_dict(self.job)
        self._secrets = JobSecrets()
        copies = ([_LogCopy(ref.main_pod, ref.main_pod_container, LogCursor.from_dict(self.log_cursor))]
                  if self.get_logs else [])
        copies += [_LogCopy(str(pod), container, LogCursor.from_dict(self.log_cursors.get(str(pod))))
                   for pod, container in self.log_pods]
        self._say(f"Waiting for Volcano Job {ref.namespace}/{ref.name}")
        try:
            outcome = await self._wait(ref, copies)
        except asyncio.CancelledError:
            if not TRIGGERER_CALLS_ON_KILL:
                await _finish_despite_cancellation(self._kill_if_task_left_deferral(ref), ON_KILL_SECONDS)
            raise
        except Exception as error:  # noqa: BLE001 - reported to the worker, which fails the task
            # The event carries the error's one line; where it came from goes into the task log (found by the
            # chaos soak: "AssertionError: " alone said nothing).
            self._say(f"The wait for Volcano Job {ref.namespace}/{ref.name} failed:\n{traceback.format_exc()}")
            outcome = WaitOutcome(Verdict.WAIT_FAILED, message=f"{type(error).__name__}: {error}")
        outcome = dataclasses.replace(
            outcome, log_cursors={copy.pod: copy.cursor for copy in copies if copy.pod != ref.main_pod},
            log_cursor=copies[0].cursor if self.get_logs else outcome.log_cursor)
        # Airflow logs a fired event and stores it unencrypted: nothing secret leaves the trigger.
        yield TriggerEvent(outcome.masked(self._secrets.redact).to_event(ref))

    async def _wait(self, ref: JobRef, copies: list[_LogCopy]) -> WaitOutcome:
        hook = await self._shared_hook(ref.namespace)
        output = OutputClock()
        watch = shared_job_watch(self.kubernetes_conn_id, ref.namespace)
        pod_watch = shared_pod_watch(self.kubernetes_conn_id, ref.namespace)
        async with (watch.subscribe(ref.name) as changes, pod_watch.subscribe(ref.name) as pod_changes,
                    pod_watch.subscribe(ref.name) as copied_pod_changes):
            job_pods = JobPods(pod_changes, lambda: hook.run(calls.list_job_pods(ref.name, ref.namespace)),
                               RunTimeline())
            job = watch.latest.get(ref.name)
            assert self._secrets is not None
            if job is not None and (job["metadata"].get("uid") in (None, ref.uid) or not ref.uid):
                changes.clear()  # all older than what `latest` holds
                self._secrets.add(watch.secrets.get(ref.name, ()))
            else:  # not seen by the shared watch yet (just created), gone, or another Job of that name
                whole = await self._first_read(hook, ref, watch.reads)
                if whole is not None:
                    self._secrets.add(secret_values(whole))
                job = waited_view(whole)
            # The Job's secrets are known: its logs may be copied now.
            for copy in copies:
                output.expected(f"log:{copy.pod}", time.monotonic())  # blind until its first read
            copier = asyncio.create_task(self._copy_logs(hook, ref, copies, output, copied_pod_changes))
            try:
                return await self._drive(hook, ref, job, changes, job_pods, output, copies)
            finally:
                copier.cancel()
                await asyncio.gather(copier, return_exceptions=True)

    async def _first_read(self, hook: AsyncVolcanoHook, ref: JobRef, reads: asyncio.Semaphore) -> dict | None:
        """The whole Job (its secrets are masked in what is copied), read before anything is copied. While
        the apiserver does not serve Volcano Jobs (Volcano being upgraded) it cannot be seen: read again
        after a back-off, said once."""
        drops = 0
        while True:
            try:
                async with reads:
                    return await hook.run(calls.get_job(ref.name, ref.namespace))
            except VolcanoApiError as error:
                if not error.not_served:
                    raise
                if drops == 0:
                    self._say(f"Cannot see Volcano Job {ref.namespace}/{ref.name}: {error}. Nothing is "
                              "decided meanwhile; the task reads it again")
                drops += 1
                await asyncio.sleep(backoff_after_drops(drops, random.random()))

    async def _drive(self, hook: AsyncVolcanoHook, ref: JobRef, job: dict | None, changes: Changes,
                     job_pods: JobPods, output: OutputClock, copies: list[_LogCopy]) -> WaitOutcome:
        """The asyncio driver of the wait engine (wait_worker is the blocking one). Changes come from the
        triggerer's one shared watch of the namespace's Jobs, its pods from the shared pod watch (what
        starting, lost nodes and the failure report need: Volcano may remove a failed pod before the
        Job ends), and while it waits to start, its queue from the shared caches (`JobQueueView`)."""
        followed = (*(FollowedLog(copy.pod, copy.container, copy.cursor) for copy in copies),
                    *(FollowedLog(str(pod), container) for pod, container in self.probe_pods))
        clock = shared_server_clock(self.kubernetes_conn_id)
        engine = WaitEngine(ref, self.limits, report=self._say, server_offset=await clock.read(hook),
                            epoch_offset=time.time() - time.monotonic(), deadline=self.deadline, output=output,
                            followed=followed, timeline=job_pods.timeline)
        watch = shared_job_watch(self.kubernetes_conn_id, ref.namespace)
        queue_view = JobQueueView(self.kubernetes_conn_id, ref.name)
        steps = _AsyncSteps(hook, ref, engine, changes, job_pods, watch, queue_view, clock, self._say,
                            self.log.warning)
        action: Action = engine.job_read(job, time.monotonic())
        try:
            while True:
                if not engine.starting:
                    await queue_view.close()  # no longer waiting to start: its queue is not read any more
                if isinstance(action, Done):
                    outcome = action.outcome
                    break
                action = await wait_steps.step(steps, action)
            if outcome.verdict in (Verdict.STALLED, Verdict.BUDGET_SPENT) or (
                    outcome.job is not None and job_state(outcome.job).outcome is Outcome.FAILED):
                return await self._noted_failures(ref, watch, job_pods, outcome)
            return outcome
        finally:
            await queue_view.close()

    async def _noted_failures(self, ref: JobRef, watch: Any, job_pods: JobPods,
                              outcome: WaitOutcome) -> WaitOutcome:
        """The outcome with the failed pods Volcano has removed or is removing, as last seen (the failure
        report reads the rest). One being deleted is still listed as the Job ends, and gone when the task resumes.
        And the pod that failed first, said now: if the task is marked failed before a worker resumes it,
        the full report is never written, and this line is what the log tells of the cause (found by the
        chaos soak)."""
        try:
            async with watch.reads:
                pods = await job_pods.current()
        except Exception as error:  # noqa: BLE001 - the report explains with what it finds
            self.log.warning("Could not read the pods of Volcano Job %s/%s: %s", ref.namespace, ref.name, error)
            pods = []
        else:
            listed = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
            outcome = dataclasses.replace(outcome, failed_pods={
                name: view for name, view in failures_not_listed(listed, job_pods.failed).items()
                if not ref.uid or calls.owned_by(view, ref.uid)})
        pods = [pod for pod in pods if not ref.uid or calls.owned_by(pod, ref.uid)]
        gone = failures_not_listed(pods, job_pods.failed)
        problems = failed_pods([*(pod for pod in pods if pod["metadata"]["name"] not in gone), *gone.values()],
                               ref.main_task)
        if problems:
            self._say(f"Volcano Job {ref.namespace}/{ref.name} failed; first to fail: {problems[0].describe()}")
        return outcome

    # -- copying the followed pods' logs -----------------------------------------------------------

    async def _copy_logs(self, hook: AsyncVolcanoHook, ref: JobRef, copies: list[_LogCopy], output: OutputClock,
                         pod_changes: Changes) -> None:
        """Every `log_interval` (a quarter of stall_timeout at most), and at once when a followed pod ends
        or is being deleted, copy what each followed pod printed since the last copy."""
        interval = self.log_interval
        if self.limits.stall_timeout is not None:
            interval = min(interval, self.limits.stall_timeout / 4)
        by_pod = {copy.pod: copy for copy in copies}
        while True:
            for copy in copies:
                if copy.started is not False:
                    await self._copy_new_lines(hook, ref.namespace, copy, output)
            deadline = time.monotonic() + interval
            while (remaining := deadline - time.monotonic()) > 0:
                try:
                    async with asyncio.timeout(remaining):
                        item = await pod_changes.get()
                except TimeoutError:
                    break
                if not isinstance(item, tuple):  # RESYNC, WATCH_BROKEN: the periodic copy goes on
                    continue
                _kind, pod = item
                leaving = by_pod.get((pod.get("metadata") or {}).get("name", ""))
                if leaving is None:
                    continue
                phase = (pod.get("status") or {}).get("phase")
                if phase not in (None, "Pending") or _leaving(pod):
                    leaving.started = True
                if _leaving(pod):
                    await self._copy_new_lines(hook, ref.namespace, leaving, output)

    async def _copy_new_lines(self, hook: AsyncVolcanoHook, namespace: str, copy: _LogCopy,
                              output: OutputClock) -> None:
        """Everything newer than the copy's cursor, streamed: one read from the cursor's second to the
        log's current end, one chunk in memory at a time, each line shown once, with the time the pod
        printed it, the Job's secrets masked."""
        splitter = LineSplitter()
        copy.cursor.start_read()
        source = f"log:{copy.pod}"
        assert self._secrets is not None
        secrets = self._secrets

        def emit(message: str, at_ns: int | None) -> None:
            stamp = {"timestamp": at} if (at := printed_at(at_ns)) is not None else {}
            self.log.info("[%s] %s", copy.pod, secrets.redact(message), **stamp)

        def seen() -> None:
            output.seen(time.monotonic())

        try:
            async for chunk in hook.pod_log_chunks(copy.pod, namespace, container=copy.container,
                                                   since=copy.cursor.last_line_at,
                                                   chunk_bytes=LOG_CHUNK_BYTES):
                emit_unseen(splitter.feed(chunk), copy.cursor, emit, seen)
            emit_unseen(splitter.end(), copy.cursor, emit, seen)
        except VolcanoApiError as error:
            if error.status in (400, 404):  # not started, or gone: nothing to see (not blind)
                output.sighted(source, time.monotonic())
                copy.started = copy.started or False
            else:  # the apiserver cannot reach its kubelet, say: what the pod prints is not seen
                output.blind(source, time.monotonic())
            return
        except Exception:  # noqa: BLE001 - a dropped read: the next copy resumes
            output.blind(source, time.monotonic())
            return
        copy.started = True
        output.sighted(source, time.monotonic())

    # -- a kill ---------------------------------------------------------------------------------

    async def _kill_if_task_left_deferral(self, ref: JobRef) -> None:
        """Before Airflow 3.3 (no on_kill for triggers): a cancellation is a kill only when the task's state
        says a user ended it, and then only a Job still running is deleted (its uid).

        A triggerer shutting down or handing the trigger over leaves the task deferred. A second triggerer
        that briefly ran the same trigger (HA) is cancelled once the other one fired: the task is then
        scheduled, queued, running, or finished by its resumed try, which owns the Job now. A cleared task is
        scheduled again at once, and its next try reattaches. A state that cannot be read, or one that does
        not say a user ended the task, keeps the Job: a kept Job can still be reattached or swept, a deleted
        one is lost training."""
        if self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        try:
            state = await self._task_state()
        except Exception as error:  # noqa: BLE001 - cancellation must go on; keeping is the safe side
            self.log.warning("Cancelled, and the task's state is unknown (%s): keeping Volcano Job %s/%s",
                             error, ref.namespace, ref.name)
            return
        if not cancellation_ends_job(state):
            self.log.info("Cancelled while the task is %s (a triggerer stopping or handing over, or the task resumed "
                          "by another): keeping Volcano Job %s/%s", state, ref.namespace, ref.name)
            return
        try:
            hook = await self._hook()
            job = await hook.run(calls.get_job(ref.name, ref.namespace))
        except Exception as error:  # noqa: BLE001 - keeping is the safe side
            self.log.warning("Cancelled while the task is %s, and Volcano Job %s/%s cannot be read (%s): keeping it",
                             state, ref.namespace, ref.name, error)
            return
        why = nothing_to_stop(job, ref)
        if why == "gone":
            return  # a try deleted it, or its name is a later try's Job now
        if why == "ended":
            self.log.info("Cancelled while the task is %s; Volcano Job %s/%s has ended (or a try reported it): "
                          "nothing to stop", state, ref.namespace, ref.name)
            return
        self.log.info("Cancelled while the task is %s: treating it as a kill", state)
        await self._delete_job()

    async def _task_state(self) -> str:
        from asgiref.sync import sync_to_async

        ti = self.task_instance
        assert ti is not None, "a trigger the triggerer runs knows its task instance"
        # The triggerer answers this through its supervisor; sync_to_async keeps the event loop free.
        return await sync_to_async(task_state)(ti)

    async def on_kill(self) -> None:
        """A user marked the deferred task failed/success or cleared it: stop the training. The triggerer
        may cancel this trigger again while on_kill runs (found by the chaos soak: a delete retrying a
        refused token was cut off after a second, and the Job trained on), so the deletion runs to its
        end regardless, within ON_KILL_SECONDS."""
        if self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        await _finish_despite_cancellation(self._delete_job(), ON_KILL_SECONDS)

    async def _delete_job(self) -> None:
        """The Job and the script's ConfigMap, after a kill; a failure is said in the task log."""
        ref = JobRef.from_dict(self.job)
        try:
            hook = await self._hook()
            done = await hook.drive(calls.delete_owned_job(ref.name, ref.namespace, ref.uid, ref.owner_try))
            if ref.script_configmap and done != "adopted":
                await hook.drive(calls.delete_script_configmap(ref.script_configmap, ref.namespace, ref.uid))
        except Exception:  # noqa: BLE001 - said; the kill goes on
            self.log.exception("Could not delete Volcano Job %s/%s after the kill", ref.namespace, ref.name)
            return
        if done == "deleted":
            self.log.info("Task killed: deleted Volcano Job %s/%s", ref.namespace, ref.name)
        elif done == "adopted":  # cleared, and the next try reattached before this kill's delete landed
            self.log.info("Task killed: leaving Volcano Job %s/%s, which a later try of the task reattached to",
                          ref.namespace, ref.name)
        else:  # gone already, or its name is a later try's Job now, which is not this trigger's
            self.log.info("Task killed: Volcano Job %s/%s (uid %s) was gone already", ref.namespace, ref.name, ref.uid)
