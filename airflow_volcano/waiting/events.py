"""The wait's verdict: one typed value from the wait engine to whoever acts on it.

The engine decides a `WaitOutcome`; the worker's driver hands it to finalize; the trigger sends it
to the worker as its event (`to_event`), and the operator's and the sensor's `execute_complete`
read it back (`from_event`). A new kind of end is one `Verdict` member, and its handling in the
modules that act on it (finalize, the sensor).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_volcano.constants import SUCCEEDED_PHASES
from airflow_volcano.job_ref import JobRef
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.logs import LogCursor
from airflow_volcano.waiting.preemption import Preemption


class Verdict(StrEnum):
    """How a wait for a Job ended."""

    FINISHED = "finished"  # the Job reached a final phase (`phase` says which)
    JOB_TIMEOUT = "job_timeout"  # job_timeout passed (`message`): the Job must not run on
    DEADLINE = "deadline"  # the task's execution_timeout passed while it was deferred
    CANNOT_START = "cannot_start"  # an image that cannot be pulled, or pods unscheduled after startup_timeout
    STALLED = "stalled"  # no output for stall_timeout, and stall_action (or a refused restart) ends it
    BUDGET_SPENT = "budget_spent"  # more restarts after failures than max_retry, or preemptions than max_preemptions
    DELETED = "deleted"  # the Job disappeared while it was waited for
    WAIT_FAILED = "wait_failed"  # the wait itself failed (an API error that stayed, a trigger error)


# The Job must not keep running (and holding GPUs) once the wait ends this way, whatever
# on_finish_action and on_kill_action say: it is what job_timeout, a stall with stall_action="fail",
# pods that cannot start and a spent restart budget are there for.
ENDS_THE_JOB = frozenset({Verdict.JOB_TIMEOUT, Verdict.CANNOT_START, Verdict.STALLED, Verdict.BUDGET_SPENT})

# Events written by releases before the verdict had a type (a trigger fired before an upgrade of
# the provider, resumed after it): their `status` and what it meant.
_OLDER_STATUSES = {"finished": Verdict.FINISHED, "timeout": Verdict.JOB_TIMEOUT, "problem": Verdict.CANNOT_START,
                   "stalled": Verdict.STALLED, "error": Verdict.WAIT_FAILED}


@dataclass(frozen=True)
class WaitOutcome:
    """The end of one wait.

    :param verdict: how it ended.
    :param message: what a person reads about it (not for FINISHED: the failure report says why).
    :param phase: the Job's phase when it ended.
    :param job: the Job as last seen (not carried in the event: the worker reads it again).
    :param lost_nodes: nodes whose pods were deleted after node_lost_timeout.
    :param stalls: stalls seen (each restarted the gang with stall_action="restart", but a STALLED one).
    :param failed_pods: pods seen failed during the wait, by name (`status.pod_view`): Volcano may
        remove them before the end, and the failure report still names them.
    :param log_cursor: how far the main pod's log was shown.
    :param log_cursors: how far each other followed pod's log (log_tasks') was shown, by pod.
    :param timeline: what the wait saw of the run that the Job does not keep (`goodput.RunTimeline`).
    :param stacks: the last stall's report, as the task log showed it (its first STACKS_KEPT_BYTES).
    :param preemptions: the Job's preemptions as the wait last said them (earlier waiters' included), for
        the panel: one said as the wait ended is not kept on the Job.
    """

    verdict: Verdict
    message: str | None = None
    phase: str | None = None
    job: dict | None = field(default=None, compare=False)
    lost_nodes: tuple[str, ...] = ()
    stalls: int = 0
    failed_pods: dict[str, dict] = field(default_factory=dict)
    log_cursor: LogCursor = field(default_factory=LogCursor)
    log_cursors: dict[str, LogCursor] = field(default_factory=dict)
    timeline: RunTimeline = field(default_factory=RunTimeline)
    stacks: tuple[str, ...] = ()
    preemptions: tuple[Preemption, ...] = ()

    @property
    def succeeded(self) -> bool:
        return self.verdict is Verdict.FINISHED and self.phase in SUCCEEDED_PHASES

    @property
    def ends_the_job(self) -> bool:
        """Whether the Job is deleted whatever on_finish_action and on_kill_action say."""
        return self.verdict in ENDS_THE_JOB

    def describe(self) -> str:
        return self.phase if self.verdict is Verdict.FINISHED and self.phase else self.message or self.verdict.value

    def masked(self, redact: Callable[[Any], Any]) -> WaitOutcome:
        """A copy whose texts (the message, the failed pods' statuses: a termination message may be a
        failed container's last log lines) went through `redact`, for what leaves the waiter."""
        return dataclasses.replace(self, message=redact(self.message) if self.message else self.message,
                                   failed_pods={name: redact(view) for name, view in self.failed_pods.items()},
                                   stacks=tuple(redact(line) for line in self.stacks))

    def to_event(self, ref: JobRef) -> dict[str, Any]:
        """The trigger's event payload: this outcome and the Job it is about (JSON-serialisable)."""
        return {"verdict": self.verdict.value, "message": self.message, "phase": self.phase, "job": ref.to_dict(),
                "lost_nodes": list(self.lost_nodes), "stalls": self.stalls,
                "failed_pods": list(self.failed_pods.values()), "log_cursor": self.log_cursor.to_dict(),
                "log_cursors": {pod: cursor.to_dict() for pod, cursor in self.log_cursors.items()},
                "timeline": self.timeline.to_dict(), "stacks": list(self.stacks),
                "preemptions": [preemption.to_dict() for preemption in self.preemptions]}

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> tuple[WaitOutcome, JobRef]:
        """The outcome and the Job of a trigger's event, this release's or an older one's."""
        if "verdict" in event:
            verdict = Verdict(event["verdict"])
        else:
            verdict = _OLDER_STATUSES[event["status"]]
            message = str(event.get("message") or "")
            if verdict is Verdict.JOB_TIMEOUT and "execution_timeout" in message:
                verdict = Verdict.DEADLINE
            elif verdict is Verdict.WAIT_FAILED and message.endswith("was deleted"):
                verdict = Verdict.DELETED
        failed = [pod for pod in event.get("failed_pods") or [] if isinstance(pod, dict)]
        outcome = cls(verdict=verdict, message=event.get("message"), phase=event.get("phase"),
                      lost_nodes=tuple(event.get("lost_nodes") or ()), stalls=int(event.get("stalls") or 0),
                      failed_pods={(pod.get("metadata") or {}).get("name", ""): pod for pod in failed},
                      log_cursor=LogCursor.from_dict(event.get("log_cursor")),
                      log_cursors={str(pod): LogCursor.from_dict(cursor)
                                   for pod, cursor in (event.get("log_cursors") or {}).items()},
                      timeline=RunTimeline.from_dict(event.get("timeline")),
                      stacks=tuple(str(line) for line in event.get("stacks") or ()),
                      preemptions=tuple(Preemption.from_dict(item) for item in event.get("preemptions") or ()
                                        if isinstance(item, dict)))
        return outcome, JobRef.from_dict(event.get("job") or {})
