"""What a deferred wait hands back to the task: one typed event, serialised as the trigger's payload.

The trigger builds it, the operator's and the sensor's `execute_complete` read it; the dict form
is what Airflow stores between them (and what an event written by an older version looks like).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class WaitOutcome(StrEnum):
    FINISHED = "finished"  # the Job reached a final phase (succeeded or failed: `phase` says)
    TIMEOUT = "timeout"  # job_timeout or the task's execution_timeout passed (`message` says which)
    PROBLEM = "problem"  # the Job cannot start (image pull error, startup_timeout), `message` says why
    ERROR = "error"  # the wait itself failed (Job deleted, API error), `message` says how
    STALLED = "stalled"  # no output for stall_timeout (stall_action fail): `message` says where each process was


@dataclass(frozen=True)
class JobEvent:
    status: WaitOutcome
    phase: str | None = None
    message: str | None = None
    job: dict[str, Any] = field(default_factory=dict)  # JobRef.to_dict()
    log_cursor: dict[str, Any] = field(default_factory=dict)  # LogCursor.to_dict(): how far the master log got
    lost_nodes: list[str] = field(default_factory=list)  # nodes whose pods were deleted after node_lost_timeout
    stalls: int = 0  # stalls seen (restarted with stall_action="restart", but a STALLED one)
    failed_pods: list[dict] = field(default_factory=list)  # failed pods Volcano removed, as last seen (pod_view)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "status": self.status.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobEvent:
        return cls(status=WaitOutcome(data["status"]), phase=data.get("phase"), message=data.get("message"),
                   job=data.get("job") or {}, log_cursor=data.get("log_cursor") or {},
                   lost_nodes=list(data.get("lost_nodes") or []), stalls=int(data.get("stalls") or 0),
                   failed_pods=list(data.get("failed_pods") or []))

    def describe(self) -> str:
        return self.phase or self.message or self.status.value
