"""Why a Job waits: its queue, its place in it, the short resource (pure, no cluster)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from airflow_volcano.status import unschedulable_message
from airflow_volcano.waiting.events import Verdict
from airflow_volcano.waiting.queueing import (
    Priorities,
    QueueSnapshot,
    amount,
    beyond_capability,
    gang_needs,
    job_needs,
    podgroup_view,
    waiting_report,
)
from airflow_volcano.waiting.wait_engine import (
    QUEUE_REFRESH_SECONDS,
    WAITING_REPEAT_SECONDS,
    CheckPods,
    Done,
    ReadQueue,
    WaitLimits,
    Watch,
)

from .test_status import job
from .test_wait_engine import engine


def podgroup(job_name: str, phase: str, *, created: str, needs: dict, priority: str | None = None,
             queue: str = "research", namespace: str = "ml") -> dict:
    spec: dict = {"queue": queue, "minMember": 2, "minResources": {"count/pods": "2", "pods": "2", **needs}}
    if priority:
        spec["priorityClassName"] = priority
    return {"metadata": {"name": f"{job_name}-uid", "namespace": namespace, "uid": f"uid-{job_name}",
                         "creationTimestamp": created, "ownerReferences": [{"name": job_name, "uid": "x"}]},
            "spec": spec, "status": {"phase": phase}}


def queue(state: str = "Open", capability: dict | None = None, allocated: dict | None = None) -> dict:
    body: dict = {"metadata": {"name": "research"}, "spec": {"capability": capability or {}},
                  "status": {"state": state}}
    if allocated is not None:
        body["status"]["allocated"] = allocated
    return body


PRIORITIES = Priorities({"high": 1000, "low": 10})
GPU = "nvidia.com/gpu"


def snapshot(*podgroups: dict, **queue_fields) -> QueueSnapshot:
    return QueueSnapshot("research", queue(**queue_fields), podgroups, PRIORITIES)


def test_quantities_are_read_as_volcano_counts_them_and_shown_as_a_person_reads_them():
    needs = gang_needs({"cpu": "2500m", "memory": "24Gi", GPU: "16", "count/pods": "3", "pods": "3",
                        "limits.cpu": "3"})
    assert needs == {"cpu": Decimal("2.5"), "memory": Decimal(24 * 1024 ** 3), GPU: Decimal(16)}
    assert [amount(name, value) for name, value in needs.items()] == ["2500m cpu", "24Gi memory", "16 nvidia.com/gpu"]


def test_position_follows_priority_then_creation_and_admitted_jobs_come_first():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={GPU: "4"}, priority="high")
    report = waiting_report(mine, snapshot(
        podgroup("older-low", "Pending", created="2026-01-01T10:00:00Z", needs={GPU: "4"}, priority="low"),
        podgroup("older-high", "Pending", created="2026-01-01T10:01:00Z", needs={GPU: "4"}, priority="high"),
        podgroup("newer-high", "Pending", created="2026-01-01T10:09:00Z", needs={GPU: "4"}, priority="high"),
        podgroup("admitted", "Inqueue", created="2026-01-01T10:08:00Z", needs={GPU: "4"}),
        podgroup("running", "Running", created="2026-01-01T09:00:00Z", needs={GPU: "4"}),
        podgroup("elsewhere", "Pending", created="2026-01-01T09:00:00Z", needs={GPU: "4"}, queue="other"),
        capability={GPU: "8"}, allocated={GPU: "4"}))
    assert (report.position, report.waiting) == (3, 5)
    assert report.ahead == ("ml/admitted", "ml/older-high")
    text = report.describe("ml/mine")
    assert "queue `research` (Open): position 3 of 5 among its waiting Jobs" in text
    assert "in the scheduler's order as far as it can be known" in text
    assert ("needs 4 nvidia.com/gpu; queue `research` has 4 of its 8 nvidia.com/gpu allocated, 4 nvidia.com/gpu "
            "more set aside for Jobs admitted before it; the Jobs ahead of it need 8 nvidia.com/gpu") in text


def test_a_finished_job_whose_podgroup_volcano_set_back_to_pending_is_not_waiting():
    """What Volcano v1.14 does (seen in the local cluster): the master succeeds, CompleteJob removes the
    worker, and the Completed Job's PodGroup is Pending with `succeeded: 1` until the Job is deleted."""
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={GPU: "2"})
    completed = podgroup("completed", "Pending", created="2026-01-01T09:00:00Z", needs={GPU: "2"})
    completed["status"].update(succeeded=1)
    aborted = podgroup("aborted", "Pending", created="2026-01-01T09:01:00Z", needs={GPU: "2"})
    aborted["status"].update(failed=1, succeeded=0)
    rival = podgroup("rival", "Pending", created="2026-01-01T10:00:00Z", needs={GPU: "2"})
    for podgroups in ((completed, aborted, rival), tuple(map(podgroup_view, (completed, aborted, rival)))):
        report = waiting_report(mine, snapshot(*podgroups, capability={GPU: "4"}, allocated={GPU: "0"}))
        assert (report.position, report.waiting, report.ahead) == (2, 2, ("ml/rival",))


def test_a_job_that_fits_the_queue_names_no_shortage_and_an_admitted_job_blames_no_queue():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "2"})
    report = waiting_report(mine, snapshot(capability={"cpu": "4"}, allocated={"cpu": "1"}))
    assert report.short == () and report.position == 1
    admitted = podgroup("mine", "Inqueue", created="2026-01-01T10:05:00Z", needs={"cpu": "2"})
    assert waiting_report(admitted, snapshot(capability={"cpu": "4"}, allocated={"cpu": "4"})).short == (), (
        "an admitted Job passed the queue's test: what holds it is the nodes")


def test_a_request_over_the_capability_can_never_fit():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "8"})
    report = waiting_report(mine, snapshot(capability={"cpu": "4"}, allocated={"cpu": "3"}))
    assert report.never_fits is not None
    assert report.never_fits.describe("research") == (
        "needs 8 cpu; queue `research` can never give it: its capability is 4 cpu")


def test_a_closed_a_missing_and_an_unreadable_queue_are_named():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "1"})
    closed = waiting_report(mine, snapshot(state="Closed")).describe("ml/mine")
    assert "waits in queue `research` (Closed: Volcano admits no Job from it until it is Open again)" in closed
    missing = waiting_report(mine, QueueSnapshot("research")).describe("ml/mine")
    assert missing == "Volcano Job ml/mine waits for queue `research`, which does not exist"
    refused = waiting_report(mine, QueueSnapshot("research", unreadable="get Queue research failed: HTTP 403"))
    assert "cannot be read (get Queue research failed: HTTP 403): deploy/queue-reader.yaml grants it" in \
        refused.describe("ml/mine")


def test_an_older_volcano_without_the_queues_allocation_is_not_guessed():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "2"})
    assert waiting_report(mine, snapshot(capability={"cpu": "4"})).short == (), (
        "without status.allocated only what can never fit is certain")


def test_the_namespace_only_position_says_so():
    mine = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "1"})
    scoped = QueueSnapshot("research", queue(), (), PRIORITIES, scope="ml")
    assert "position 1 of 1 among waiting Jobs of namespace ml" in waiting_report(mine, scoped).describe("ml/mine")


def test_what_a_job_needs_before_it_is_submitted_is_its_gangs_requests():
    template = {"spec": {"containers": [{"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "4", GPU: "1"}}},
                                        {"resources": {"limits": {"memory": "1Gi"}}}],
                         "initContainers": [{"resources": {"requests": {"cpu": "8"}}}]}}
    body = {"spec": {"tasks": [{"name": "master", "replicas": 1, "template": template},
                               {"name": "worker", "replicas": 3, "minAvailable": 2, "template": template}]}}
    assert job_needs(body) == {"cpu": Decimal(24), GPU: Decimal(3), "memory": Decimal(3 * 1024 ** 3)}
    assert beyond_capability(job_needs(body), queue(capability={GPU: "2"})).resource == GPU
    assert beyond_capability(job_needs(body), queue(capability={GPU: "4", "cpu": "100"})) is None


def test_the_slim_view_keeps_what_the_report_reads():
    full = podgroup("mine", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "1"}, priority="high")
    full["status"]["conditions"] = [
        {"type": "Unschedulable", "status": "True", "message": "queue resource quota insufficient",
         "lastTransitionTime": "2026-01-01T10:06:00Z", "transitionID": "x" * 36},
        {"type": "Scheduled", "status": "False", "message": "x" * 500}]
    full["metadata"]["labels"] = {"a": "b" * 60}
    view = podgroup_view(full)
    assert waiting_report(view, snapshot(view)) == waiting_report(full, snapshot(full))
    assert unschedulable_message(view) == unschedulable_message(full) == "queue resource quota insufficient", (
        "the scheduler's words, for a triggerer that reads the PodGroup from its cache")
    assert view["status"]["conditions"] == [
        {"type": "Unschedulable", "status": "True", "message": "queue resource quota insufficient"},
        {"type": "Scheduled", "status": "False"}], "and when its gang was placed (who preempted: its time alone)"
    assert "labels" not in view["metadata"]


def waiting_engine(now: float = 1006):
    """An engine whose Pending Job has waited past poll_interval: its next pod check asks for the scheduler."""
    wait, reported = engine(WaitLimits(poll_interval=5))
    wait.job_read(job("Pending", pending=2), now=1001)
    wait.pods_seen([], None, [], now=1001)
    assert wait.watch_ended(now=now) == CheckPods(scheduling=True)
    return wait, reported


def test_the_engine_reads_the_queue_at_most_every_few_seconds_and_says_why_a_job_waits_on_each_change():
    wait, reported = waiting_engine()
    mine = podgroup("train", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "2"})
    rival = podgroup("rival", "Pending", created="2026-01-01T10:00:00Z", needs={"cpu": "2"})
    assert wait.pods_seen([], mine, [], now=1006) == ReadQueue(queue="research")
    full = snapshot(rival, capability={"cpu": "4"}, allocated={"cpu": "3"})  # (without the Job's own PodGroup)
    assert isinstance(wait.queue_seen(full, now=1006), Watch)
    assert "position 2 of 2" in reported[-1] and "needs 2 cpu" in reported[-1]
    said = len(reported)
    assert isinstance(wait.pods_seen([], None, [], now=1010), Watch), "read 4 s ago: not again yet"
    assert wait.pods_seen([], None, [], now=1006 + QUEUE_REFRESH_SECONDS) == ReadQueue(queue="research")
    wait.queue_seen(full, now=1006 + QUEUE_REFRESH_SECONDS)
    assert len(reported) == said, "nothing changed: not said again within WAITING_REPEAT_SECONDS"
    wait.queue_seen(snapshot(capability={"cpu": "4"}, allocated={"cpu": "3"}), now=1040)
    assert "position 1 of 1" in reported[-1], "the Job ahead started: the position goes down, said at once"
    wait.queue_seen(snapshot(capability={"cpu": "4"}, allocated={"cpu": "3"}), now=1040 + WAITING_REPEAT_SECONDS)
    assert reported[-1] == reported[-2], "unchanged for WAITING_REPEAT_SECONDS: said again"


def test_the_engine_fails_a_job_that_can_never_fit_its_queue_at_once():
    wait, _ = waiting_engine()
    mine = podgroup("train", "Pending", created="2026-01-01T10:05:00Z", needs={"cpu": "8"})
    assert wait.pods_seen([], mine, [], now=1006) == ReadQueue(queue="research")
    done = wait.queue_seen(snapshot(capability={"cpu": "4"}, allocated={"cpu": "0"}), now=1006)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert done.outcome.message == ("Volcano Job ml/train can never start: it needs 8 cpu; queue `research` can "
                                    "never give it: its capability is 4 cpu")
    assert done.outcome.timeline.ended_at == 1006, "the run ends when the wait ends it"


def test_the_scheduler_view_is_read_again_only_after_a_minute_but_the_queue_sooner():
    """The PodGroup and events (the Job's own reads) at most once a minute; the queue every
    QUEUE_REFRESH_SECONDS, the Job's own PodGroup found among the snapshot's by its owner's uid."""
    wait, reported = waiting_engine()
    wait.ref = dataclasses.replace(wait.ref, uid="uid-train")  # (REF is shared: not changed in place)
    assert wait.pods_seen([], None, [], now=1006) == ReadQueue(queue="default")
    mine = podgroup("train", "Inqueue", created="2026-01-01T10:05:00Z", needs={"cpu": "2"})
    mine["metadata"]["ownerReferences"][0]["uid"] = "uid-train"
    rival = podgroup("rival", "Pending", created="2026-01-01T10:00:00Z", needs={"cpu": "2"})
    wait.queue_seen(snapshot(rival, mine, capability={"cpu": "4"}, allocated={"cpu": "3"}), now=1006)
    assert "position 1 of 2" in reported[-1], "admitted (Inqueue): ahead of the Pending one, as its snapshot says"
    assert wait.watch_ended(now=1030) == CheckPods(scheduling=False), "the scheduler's view was read 24 s ago"
    assert wait.pods_seen([], None, [], now=1030) == ReadQueue(queue="default")
    wait.queue_seen(snapshot(mine, capability={"cpu": "4"}, allocated={"cpu": "3"}), now=1030)
    assert wait.watch_ended(now=1070) == CheckPods(scheduling=True), "a minute after the last"


def test_a_thousand_waiting_jobs_name_three_ahead_and_count_the_rest():
    gangs = [podgroup(f"job-{index}", "Pending", created=f"2026-01-01T09:{index // 60:02d}:{index % 60:02d}Z",
                      needs={"cpu": "1"}) for index in range(1000)]
    mine = podgroup("mine", "Pending", created="2026-01-01T10:00:00Z", needs={"cpu": "1"})
    report = waiting_report(mine, snapshot(*gangs, mine, capability={"cpu": "1"}, allocated={"cpu": "1"}))
    assert (report.position, report.waiting, report.ahead_count) == (1001, 1001, 1000)
    assert report.ahead == ("ml/job-0", "ml/job-1", "ml/job-2"), "the first three, in order"
    assert "ahead: ml/job-0, ml/job-1, ml/job-2 and 997 more; needs 1 cpu" in report.describe("ml/mine")
