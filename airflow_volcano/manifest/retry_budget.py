"""A Job's two restart budgets: `max_retry` for restarts after a failure (a retryable exit, an eviction, a
lost node, a stall) and `max_preemptions` for preemptions, which must not spend the first. Pure.

Volcano has one budget (`spec.maxRetry`, counted by its job controller on every restart, whatever the cause)
and its webhook refuses any change to it once the Job exists. So the Job is submitted with room for both,
which Volcano enforces as a backstop, and with the two budgets as asked in an annotation; the waiter that
owns the Job tells each restart's cause from the scheduler's evictions (waiting/preemption.py) and ends the
Job when either budget is spent. `max_retry=N` allows N - 1 restarts after failures (Volcano's own count:
the restart that finds the budget spent ends the Job); `max_preemptions=N` allows N preemptions. The
restart that spends either is at most restart number max_retry + max_preemptions; Volcano fails a Job at
restart number maxRetry, so maxRetry is one more: the waiter tells that restart's cause, and names the
budget spent, before Volcano would end the Job without saying which.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_volcano.constants import RETRIES_ANNOTATION, RETRY_BUDGET_ANNOTATION

# Volcano's own default, which its webhook also puts in place of 0.
VOLCANO_DEFAULT_MAX_RETRY = 3
DEFAULT_MAX_PREEMPTIONS = 10


@dataclass(frozen=True)
class RetryBudget:
    max_retry: int
    max_preemptions: int

    def annotation(self) -> str:
        return json.dumps({"max_retry": self.max_retry, "max_preemptions": self.max_preemptions},
                          separators=(",", ":"))

    @classmethod
    def of(cls, job: Mapping[str, Any] | None) -> RetryBudget | None:
        """The budgets a Job was submitted with; None for a Job without them (submitted as a full_job_spec,
        by an earlier release, or by someone else): Volcano's maxRetry alone bounds its restarts."""
        text = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(RETRY_BUDGET_ANNOTATION)
        try:
            data = json.loads(text) if text else None
            budget = cls(int(data["max_retry"]), int(data["max_preemptions"])) if isinstance(data, dict) else None
        except (ValueError, TypeError, KeyError):
            return None
        return budget if budget is not None and budget.max_retry >= 1 and budget.max_preemptions >= 0 else None

    def describe(self) -> str:
        return f"max_retry {self.max_retry}, max_preemptions {self.max_preemptions}"


def apply_retry_budget(job: dict, max_preemptions: int) -> RetryBudget:
    """Give the checked Job room for `max_preemptions` preemptions beside its max_retry: Volcano's maxRetry
    becomes their sum plus one (see above), and the annotation keeps both for the waiter."""
    spec = job.setdefault("spec", {})
    budget = RetryBudget(int(spec.get("maxRetry") or VOLCANO_DEFAULT_MAX_RETRY), max_preemptions)
    spec["maxRetry"] = budget.max_retry + budget.max_preemptions + 1
    metadata = job.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), RETRY_BUDGET_ANNOTATION: budget.annotation()}
    return budget


def kept_retries(job: Mapping[str, Any] | None) -> int:
    """The restarts that spent max_retry as the waiters kept them on the Job (0 if none were kept)."""
    text = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(RETRIES_ANNOTATION)
    try:
        return max(0, int(text or 0))
    except ValueError:
        return 0
