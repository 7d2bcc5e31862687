"""Preemption (issue 45): the evidence (the scheduler's Evict events), the preemptor (the queue's PodGroups),
and the wait: said once, kept on the Job for a waiter that takes over, never decided on. Pure."""

from __future__ import annotations

import datetime
from unittest.mock import ANY

from airflow_volcano.constants import PREEMPTIONS_ANNOTATION, RETRIES_ANNOTATION
from airflow_volcano.manifest.retry_budget import RetryBudget, apply_retry_budget
from airflow_volcano.status import describe_progress, failure_message, job_state
from airflow_volcano.timestamps import parse_time
from airflow_volcano.waiting.events import Verdict, WaitOutcome
from airflow_volcano.waiting.preemption import (
    Eviction,
    Preemption,
    evictions,
    name_preemptor,
    preemptions_of,
    record,
    recorded,
)
from airflow_volcano.waiting.queueing import Priorities, QueueSnapshot
from airflow_volcano.waiting.wait_engine import (
    CheckPods,
    Done,
    ReadQueue,
    RecordPreemptions,
    WaitLimits,
    Watch,
)

from .test_wait_engine import OWNED, engine, started

T0 = "2026-11-28T10:00:00Z"
AT = parse_time(T0)
assert AT is not None


def stamp(offset: float) -> str:
    return datetime.datetime.fromtimestamp(AT + offset, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def evict(pod: str, action: str = "gangpreempt", offset: float = 0.0, kind: str = "Pod") -> dict:
    message = f"Pod is evicted, because of {action}" if kind == "Pod" else action
    return {"reason": "Evict", "message": message, "lastTimestamp": stamp(offset),
            "involvedObject": {"kind": kind, "name": pod, "uid": f"{pod}-uid-{offset}"}}


def podgroup(job: str, *, queue: str = "default", priority_class: str = "", scheduled: float | None = None,
             namespace: str = "ml", phase: str = "Running") -> dict:
    conditions = [] if scheduled is None else [
        {"type": "Scheduled", "status": "True", "lastTransitionTime": stamp(scheduled)}]
    return {"metadata": {"name": f"{job}-pg", "namespace": namespace, "uid": f"{job}-pg-uid", "resourceVersion": "1",
                         "ownerReferences": [{"kind": "Job", "name": job}], "creationTimestamp": stamp(-600)},
            "spec": {"queue": queue, "priorityClassName": priority_class},
            "status": {"phase": phase, "conditions": conditions}}


def job_of(name: str, priority_class: str, namespace: str = "ml") -> dict:
    """The preempted Volcano Job (its priority is its spec's: its PodGroup may be gone mid-restart)."""
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"priorityClassName": priority_class}}


PRIORITIES = Priorities({"low": 10, "high": 1000, "mid": 100})
TRAIN = job_of("train", "low")


def test_only_the_schedulers_evictions_to_preempt_or_reclaim_count():
    events = [evict("train-master-0"), evict("train-worker-0", "preempt", 1), evict("train-worker-1", "reclaim", 2),
              evict("train-pg", "gangpreempt", 2, kind="PodGroup"),
              evict("train-worker-2", "shuffle", 3),  # rescheduling, not a preemption
              {**evict("train-master-0"), "reason": "Killing"},
              evict("train-master-0", "gangpreempt", -120)]  # before `since`
    found = evictions(events, since=AT - 60)
    assert [(item.pod, item.action) for item in found] == [
        ("train-master-0", "gangpreempt"), ("train-worker-0", "preempt"), ("train-worker-1", "reclaim"),
        (None, "gangpreempt")]


def test_evictions_close_together_are_one_preemption_and_a_gap_starts_another():
    found = [Eviction(AT, "gangpreempt", "a-0"), Eviction(AT + 1, "gangpreempt", "a-1"),
             Eviction(AT + 2, "gangpreempt", None), Eviction(AT + 300, "preempt", "a-1")]
    first, second = preemptions_of(found)
    assert (first.at, first.action, first.pods) == (AT, "gangpreempt", ("a-0", "a-1"))
    assert (second.at, second.action, second.pods) == (AT + 300, "preempt", ("a-1",))


def test_the_preemptor_is_the_higher_priority_gang_of_the_queue_placed_from_the_eviction_on():
    own = podgroup("train", priority_class="low", phase="Pending")
    snapshot = QueueSnapshot("default", {"metadata": {"name": "default"}}, podgroups=(
        own,
        podgroup("before", priority_class="high", scheduled=-100),  # placed long before: not it
        podgroup("lower", priority_class="", scheduled=1),  # priority 0 < 10: cannot preempt it
        podgroup("elsewhere", queue="other", priority_class="high", scheduled=1),  # another queue: preempt stays in it
        podgroup("taker", priority_class="mid", scheduled=2, namespace="team-b"),
        podgroup("later", priority_class="high", scheduled=30)), priorities=PRIORITIES)
    named = name_preemptor(Preemption(at=AT, action="gangpreempt", pods=("train-master-0",)), TRAIN, snapshot)
    assert (named.preemptor, named.preemptor_priority, named.queue) == (
        "team-b/taker", "PriorityClass mid, priority 100", "default")


def test_a_preemptor_that_cannot_be_seen_is_said_so_with_the_reason():
    own = podgroup("train", priority_class="low")
    unseen = name_preemptor(Preemption(at=AT, action="gangpreempt", pods=()), TRAIN,
                            QueueSnapshot("default", {}, podgroups=(own,), priorities=PRIORITIES, scope="ml"))
    assert unseen.preemptor is None and unseen.unknown_why == "none placed since then is visible in namespace ml"
    refused = name_preemptor(Preemption(at=AT, action="gangpreempt", pods=()), TRAIN,
                             QueueSnapshot("default", unreadable="403 Forbidden"))
    assert refused.unknown_why == "its queue could not be read: 403 Forbidden"
    assert "by a higher-priority Job (its queue could not be read: 403 Forbidden)" in refused.describe("ml/train", 1)
    no_priorities = name_preemptor(Preemption(at=AT, action="gangpreempt", pods=()), TRAIN, QueueSnapshot(
        "default", {}, podgroups=(own, podgroup("urgent", priority_class="high", scheduled=1))))
    assert no_priorities.preemptor is None and no_priorities.unknown_why == "the PriorityClasses could not be read"


def test_the_record_on_the_job_reads_back_and_a_damaged_one_is_empty():
    kept = [Preemption(at=AT, action="gangpreempt", pods=("a-0",), queue="default", preemptor="ml/b",
                       preemptor_priority="priority 5")]
    assert recorded(record(kept)) == kept
    assert recorded("not json") == [] and recorded(None) == [] and recorded('{"a": 1}') == []


# -- the wait ----------------------------------------------------------------------------------------------

BUDGET = RetryBudget(max_retry=3, max_preemptions=3)


def budgeted(phase: str, *, retries: int = 0, kept: list[Preemption] | None = None, kept_retries: int | None = None,
             **status: int) -> dict:
    """A Job the operator built (max_retry 3, max_preemptions 3: maxRetry 7), with the preemptions and
    retries a waiter kept on it."""
    body = started(phase, retries=retries, **status)
    apply_retry_budget(body, BUDGET.max_preemptions)
    assert body["spec"]["maxRetry"] == 7
    if kept:
        body["metadata"]["annotations"][PREEMPTIONS_ANNOTATION] = record(kept)
    if kept_retries is not None:
        body["metadata"]["annotations"][RETRIES_ANNOTATION] = str(kept_retries)
    return body


def now_of(offset: float) -> float:
    return AT + offset  # the engine's `now` on the apiserver's clock (server_offset 0)


def preempted_once(wait, reported, retries: int = 1):
    """Running, then restarted by a gang preemption at AT + 1000 * retries; the preemptor found in the queue."""
    base = 1000.0 * retries
    assert wait.job_changed(budgeted("Restarting", retries=retries, pending=3), now=now_of(base + 2)) == \
        CheckPods(scheduling=True, restart=True), "a restart: its cause is read at once"
    events = [evict("train-master-0", offset=base), evict("train-worker-0", offset=base + 0.5)]
    assert wait.pods_seen([], podgroup("train", priority_class="low", phase="Pending"), events,
                          now=now_of(base + 2)) == ReadQueue(queue="default")
    snapshot = QueueSnapshot("default", {"metadata": {"name": "default"}}, priorities=PRIORITIES, podgroups=(
        podgroup("train", priority_class="low", phase="Pending"),
        podgroup("urgent", priority_class="high", scheduled=base + 1)))
    return wait.queue_seen(snapshot, now=now_of(base + 3))


def test_a_preempted_gang_is_said_once_with_its_preemptor_and_kept_on_the_job():
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    assert isinstance(wait.job_read(budgeted("Running", running=3), now=now_of(0)), Watch)
    action = preempted_once(wait, reported)
    said = [line for line in reported if "preempted" in line]
    assert said == [
        "Volcano Job ml/train was preempted at 10:16:40 UTC by ml/urgent (PriorityClass high, priority 1000) in queue "
        "`default`: Volcano's scheduler (gangpreempt) evicted train-master-0, train-worker-0. It waits for room again "
        "and restarts from the start of its script (a script that saves checkpoints resumes from its last one). "
        "Preemptions so far: 1 of max_preemptions 3 (they do not spend max_retry)"], reported
    assert isinstance(action, RecordPreemptions)
    (kept,) = recorded(action.annotations[PREEMPTIONS_ANNOTATION])
    assert kept.preemptor == "ml/urgent" and kept.at == AT + 1000 and kept.queue == "default"
    assert wait.timeline.preempted == [AT + 1000], "goodput counts its restart as preempted time"
    assert not isinstance(wait.preemptions_recorded(None, now=now_of(1004)), Done)
    assert not isinstance(wait.job_changed(budgeted("Running", retries=1, running=3), now=now_of(1100)), Done)
    done = wait.job_changed(budgeted("Completed", retries=1, succeeded=3), now=now_of(1200))
    assert isinstance(done, Done) and done.outcome.succeeded


def test_a_record_refused_is_said_and_the_wait_goes_on():
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    assert isinstance(preempted_once(wait, reported), RecordPreemptions)
    action = wait.preemptions_recorded("403 Forbidden", now=now_of(1004))
    assert not isinstance(action, Done | RecordPreemptions)
    assert reported[-1] == ("Could not keep the preemptions and retries counted on Volcano Job ml/train (403 "
                            "Forbidden): a waiter that takes over looks for their causes again")


def test_a_restart_without_eviction_is_no_preemption_once_its_two_reads_found_none():
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    assert wait.job_changed(budgeted("Restarting", retries=1, pending=3), now=now_of(10)) == \
        CheckPods(scheduling=True, restart=True)
    assert isinstance(wait.pods_seen([], None, [], now=now_of(10)), Watch), "no eviction yet: read again"
    assert wait.watch_ended(now=now_of(15)) == CheckPods(scheduling=True, restart=True)
    assert not isinstance(wait.pods_seen([], None, [], now=now_of(15)), CheckPods | ReadQueue)
    assert wait.preemptions == [] and not any("preempted" in line for line in reported)


def restarted_without_eviction(wait, retries: int, at: float):
    """The Job restarted at `at` with no eviction to preempt in either read of the events: what follows."""
    assert wait.job_changed(budgeted("Restarting", retries=retries, pending=3), now=now_of(at)) == \
        CheckPods(scheduling=True, restart=True)
    assert isinstance(wait.pods_seen([], None, [], now=now_of(at)), Watch)
    assert wait.watch_ended(now=now_of(at + 5)) == CheckPods(scheduling=True, restart=True)
    return wait.pods_seen([], None, [], now=now_of(at + 5))


def test_preemptions_do_not_spend_max_retry_and_the_one_beyond_max_preemptions_ends_the_job():
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    for count in (1, 2, 3):
        action = preempted_once(wait, reported, retries=count)
        assert isinstance(action, RecordPreemptions)
        assert action.annotations[RETRIES_ANNOTATION] == "0", "a preemption spends nothing of max_retry"
        assert not isinstance(wait.preemptions_recorded(None, now=now_of(1000 * count + 4)), Done)
        assert not isinstance(wait.job_changed(budgeted("Running", retries=count, running=3),
                                               now=now_of(1000 * count + 100)), Done), (
            f"{count} preemption(s) of 3 allowed, 0 of max_retry 3 spent although Volcano counted {count} restarts")
    assert [line for line in reported if "preempted" in line][-1].endswith(
        "Preemptions so far: 3 of max_preemptions 3 (they do not spend max_retry)")
    action = preempted_once(wait, reported, retries=4)
    assert isinstance(action, RecordPreemptions), "said, then kept"
    done = wait.preemptions_recorded(None, now=now_of(4004))
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.BUDGET_SPENT and done.outcome.ends_the_job
    assert done.outcome.message == (
        "Volcano Job ml/train was preempted 4 times, more than max_preemptions (3); the last at 11:06:40 UTC by "
        "ml/urgent (PriorityClass high, priority 1000) in queue `default`: Volcano's scheduler (gangpreempt) evicted "
        "train-master-0, train-worker-0")
    assert len(done.outcome.preemptions) == 4


def test_restarts_after_failures_spend_max_retry_and_the_one_that_finds_it_spent_ends_the_job():
    """Volcano's maxRetry is 6 (room for the preemptions); the waiter holds the other restarts to max_retry 3,
    counting the restart that finds it spent as Volcano does."""
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    assert preempted_once(wait, reported, retries=1) is not None  # a preemption between them spends nothing
    wait.preemptions_recorded(None, now=now_of(1004))
    wait.job_changed(budgeted("Running", retries=1, running=3), now=now_of(1100))
    for retries, at in ((2, 2000.0), (3, 3000.0)):
        action = restarted_without_eviction(wait, retries, at)
        assert action == RecordPreemptions(annotations={PREEMPTIONS_ANNOTATION: ANY,
                                                        RETRIES_ANNOTATION: str(retries - 1)})
        assert not isinstance(wait.preemptions_recorded(None, now=now_of(at + 6)), Done)
        assert not isinstance(wait.job_changed(budgeted("Running", retries=retries, running=3), now=now_of(at + 100)),
                              Done)
    assert isinstance(restarted_without_eviction(wait, 4, 4000.0), RecordPreemptions)
    done = wait.preemptions_recorded(None, now=now_of(4006))
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.BUDGET_SPENT
    assert done.outcome.message == (
        "Volcano Job ml/train was restarted 3 time(s) after a failure, an eviction, a lost node or a stall: the retry "
        "budget is exhausted (max_retry 3: Volcano counts the restart that finds it spent); its 1 preemption(s) did "
        "not spend it")


def test_a_crash_loop_faster_than_the_events_are_read_again_spends_max_retry_restart_by_restart():
    """A failure every 2 s: each restart is counted once a read 5 s after it found no eviction, although
    newer restarts keep coming; the third ends the Job (max_retry 3), long before Volcano's maxRetry 7."""
    wait, _ = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    ended = None
    for retries in range(1, 8):
        at = 1000.0 + 2 * (retries - 1)
        action = wait.job_changed(budgeted("Restarting", retries=retries, pending=3), now=now_of(at))
        while isinstance(action, CheckPods | RecordPreemptions):
            action = (wait.pods_seen([], None, [], now=now_of(at)) if isinstance(action, CheckPods)
                      else wait.preemptions_recorded(None, now=now_of(at)))
        if isinstance(action, Done):
            ended = (retries, action.outcome)
            break
        wait.job_changed(budgeted("Running", retries=retries, running=3), now=now_of(at + 1))
    assert ended is not None and ended[0] == 6, ended  # restarts seen at 1000, 1002, 1004 settled by 1010
    assert ended[1].verdict is Verdict.BUDGET_SPENT and "was restarted 3 time(s)" in (ended[1].message or "")


def test_a_waiter_taking_over_counts_on_from_the_retries_kept_and_never_counts_a_restart_it_cannot_explain():
    wait, _ = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    assert isinstance(wait.job_read(budgeted("Running", retries=2, running=3, kept_retries=2), now=now_of(900)), Watch)
    assert wait.retries == 2
    assert isinstance(restarted_without_eviction(wait, 3, 1000.0), RecordPreemptions)
    assert isinstance(wait.preemptions_recorded(None, now=now_of(1006)), Done)
    # A restart no waiter explained, whose events hold no eviction (they may have expired): neither budget's.
    wait, _ = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    assert wait.job_read(budgeted("Running", retries=2, running=3, kept_retries=1), now=now_of(900)) == \
        CheckPods(scheduling=True, restart=True)
    assert isinstance(wait.pods_seen([], None, [], now=now_of(900)), Watch)
    assert wait.watch_ended(now=now_of(905)) == CheckPods(scheduling=True, restart=True)
    assert isinstance(wait.pods_seen([], None, [], now=now_of(905)), Watch)
    assert (wait.retries, wait.preemptions) == (1, [])


def test_a_waiter_that_does_not_own_the_job_never_ends_it_for_its_budgets():
    wait, _ = engine(WaitLimits(startup_timeout=None), ref=OWNED)  # a sensor's
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    for retries in (1, 2, 3, 4):
        action = restarted_without_eviction(wait, retries, 1000.0 * retries)
        assert not isinstance(action, Done | RecordPreemptions)
        wait.job_changed(budgeted("Running", retries=retries, running=3), now=now_of(1000.0 * retries + 100))
    assert wait.retries == 4


def test_the_progress_line_and_volcanos_own_exhaustion_name_both_budgets():
    state = job_state(budgeted("Failed", retries=7))
    assert describe_progress(budgeted("Restarting", retries=2)) == (
        "Volcano Job ml/train is Restarting (2 restart(s) so far; maxRetry 7 for max_retry 3, max_preemptions 3)")
    assert failure_message(state, pods=[], events=[]).splitlines()[0] == (
        "Volcano Job ml/train ended in phase Failed after 7 restart(s): the retry budget is exhausted (maxRetry 7 for "
        "max_retry 3, max_preemptions 3)")


def test_a_waiter_taking_over_counts_on_from_the_preemptions_kept_on_the_job():
    kept = [Preemption(at=AT + 100, action="gangpreempt", pods=("train-master-0",)),
            Preemption(at=AT + 500, action="gangpreempt", pods=("train-master-0",))]
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    action = wait.job_read(budgeted("Running", retries=2, running=3, kept=kept), now=now_of(900))
    assert isinstance(action, Watch), "both restarts were preemptions: nothing to look into, nothing spent"
    assert len(wait.preemptions) == 2 and reported == [reported[0]]


def test_restarts_before_a_waiter_took_over_are_looked_into_since_the_last_kept():
    kept = [Preemption(at=AT + 100, action="gangpreempt", pods=("train-master-0",))]
    wait, _ = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    body = budgeted("Running", retries=2, running=3, kept=kept)
    assert wait.job_read(body, now=now_of(900)) == CheckPods(scheduling=True, restart=True)
    events = [evict("train-master-0", offset=100), evict("train-master-0", offset=700)]  # the first is kept already
    assert wait.pods_seen([], None, events, now=now_of(900)) == ReadQueue(queue="default")
    assert [preemption.at for preemption in wait.preemptions] == [AT + 100, AT + 700]


def test_a_waiter_that_does_not_own_the_job_says_a_preemption_and_neither_records_nor_ends_anything():
    wait, reported = engine(WaitLimits(startup_timeout=None), ref=OWNED)  # a sensor's
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    action = preempted_once(wait, reported)
    assert not isinstance(action, RecordPreemptions | Done)
    assert any("was preempted at" in line for line in reported)


def test_the_only_higher_priority_gang_running_is_named_when_no_placement_is_recorded_in_time():
    own = podgroup("train", priority_class="low", phase="Pending")
    running = podgroup("urgent", priority_class="high", phase="Running")  # no Scheduled condition (yet)
    snapshot = QueueSnapshot("default", {}, podgroups=(own, running), priorities=PRIORITIES)
    named = name_preemptor(Preemption(at=AT, action="gangpreempt", pods=()), TRAIN, snapshot)
    assert named.preemptor == "ml/urgent"
    assert named.preemptor_priority == "PriorityClass high, priority 1000, the only higher-priority Job running in " \
                                       "the queue"
    two = QueueSnapshot("default", {}, podgroups=(own, running, podgroup("other", priority_class="mid")),
                        priorities=PRIORITIES)
    assert name_preemptor(Preemption(at=AT, action="gangpreempt", pods=()), TRAIN, two).preemptor is None, (
        "two it could be: neither is named")


def test_a_wait_that_ends_before_the_preemptor_is_named_says_why_it_could_not_be():
    """The queue read again every few seconds while the preemptor is looked for; a training that ends
    meanwhile says its preemption with the last read's reason, not a bare "a higher-priority Job"."""
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    wait.job_read(budgeted("Running", running=3), now=now_of(0))
    wait.job_changed(budgeted("Restarting", retries=1, pending=3), now=now_of(1002))
    own = podgroup("train", priority_class="low", phase="Pending")
    assert wait.pods_seen([], own, [evict("train-master-0", offset=1000)], now=now_of(1002)) == \
        ReadQueue(queue="default")
    waiting = podgroup("queued", priority_class="high", phase="Inqueue")  # higher, not placed: not the one
    snapshot = QueueSnapshot("default", {"metadata": {"name": "default"}}, podgroups=(own, waiting),
                             priorities=PRIORITIES, scope="ml")
    action = wait.queue_seen(snapshot, now=now_of(1003))
    assert not any("was preempted" in line for line in reported), "not named yet: looked for again"
    assert isinstance(action, Watch) and action.seconds <= 5
    assert wait.watch_ended(now=now_of(1003 + action.seconds)) in (ReadQueue(queue="default"),
                                                                   CheckPods(scheduling=False))
    done = wait.job_changed(budgeted("Completed", retries=1, succeeded=3), now=now_of(1010))
    assert isinstance(done, Done)
    said = [line for line in reported if "was preempted" in line]
    assert len(said) == 1 and "by a higher-priority Job (none placed since then is visible in namespace ml)" \
        in said[0], reported
    # Said at the end, too late to be kept on the Job: the outcome carries it to the panel's record.
    (preemption,) = done.outcome.preemptions
    assert preemption.unknown_why == "none placed since then is visible in namespace ml"
    assert preemption.summary() in said[0]
    assert WaitOutcome.from_event(done.outcome.to_event(OWNED))[0].preemptions == (preemption,)


def test_the_preemptor_is_named_while_volcano_replaces_the_preempted_jobs_podgroup():
    """Volcano deletes and recreates a restarted gang's PodGroup: just after a preemption the Job may have
    none (the cause read finds none, the queue's list lacks it). Its priority is its spec's: the preemptor
    is still the higher one. (Before: the priority of "no PodGroup" was the default, 0, and a preemptor of
    negative priority was never named; CI, the local cluster's PriorityClasses -20 and -10.)"""
    priorities = Priorities({"low": -20, "high": -10})
    wait, reported = engine(WaitLimits(poll_interval=5, owns_job=True), ref=OWNED)
    body = budgeted("Running", running=3)
    body["spec"]["priorityClassName"] = "low"
    wait.job_read(body, now=now_of(0))
    restarting = budgeted("Restarting", retries=1, pending=3)
    restarting["spec"]["priorityClassName"] = "low"
    assert wait.job_changed(restarting, now=now_of(1002)) == CheckPods(scheduling=True, restart=True)
    assert wait.pods_seen([], None, [evict("train-master-0", offset=1000)], now=now_of(1002)) == \
        ReadQueue(queue="default")
    snapshot = QueueSnapshot("default", {"metadata": {"name": "default"}}, priorities=priorities,
                             podgroups=(podgroup("urgent-neg", priority_class="high", scheduled=1000),))
    wait.queue_seen(snapshot, now=now_of(1003))
    said = [line for line in reported if "was preempted" in line]
    assert len(said) == 1 and " by ml/urgent-neg (PriorityClass high, priority -10) " in said[0], reported
