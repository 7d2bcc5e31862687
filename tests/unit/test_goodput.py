"""Where a run's time went: the buckets split the wall time, from the Job's conditions and what the wait saw."""

from __future__ import annotations

import pytest

from airflow_volcano.observability.goodput import BUCKETS, RunTimeline, accelerators, goodput, phase_changes
from airflow_volcano.waiting.progress import Progress

T0 = 1_767_261_600.0  # 2026-01-01T10:00:00Z


def at(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(*phases: tuple[str, float], gpus: int = 1, replicas: int = 2) -> dict:
    """A Job whose conditions went through `phases` (each with its second after creation), as Volcano
    appends them (repeats included)."""
    conditions = [{"status": phase, "lastTransitionTime": at(second)} for phase, second in phases]
    template = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus), "cpu": "4"}}}]}}
    return {"metadata": {"creationTimestamp": at(0)},
            "spec": {"tasks": [{"name": "master", "replicas": 1, "template": template},
                               {"name": "worker", "replicas": replicas - 1, "template": template}]},
            "status": {"conditions": conditions,
                       "state": {"phase": phases[-1][0], "lastTransitionTime": at(phases[-1][1])}}}


def test_a_clean_run_is_queued_starting_and_running():
    run = job(("Pending", 0), ("Pending", 0), ("Running", 40), ("Running", 41), ("Completing", 640),
              ("Completed", 642))
    spent = goodput(run, RunTimeline(placed={"0": T0 + 30}))
    assert spent is not None and spent.wall == 642
    assert dict(spent.seconds) == {"queued": 30, "starting": 10, "running": 602, "restarting": 0, "preempted": 0,
                                   "stalled": 0, "redone": 0}
    assert spent.accelerators == {"nvidia.com/gpu": 2.0}
    assert spent.accelerator_hours == pytest.approx(2 * 612 / 3600)
    assert spent.useful_share == pytest.approx(602 / 612)
    table = "\n".join(spent.table("ml/train"))
    assert "Where the time went (Volcano Job ml/train, 10m42s from submit to end):" in table
    assert "  queued          30s   4.7%" in table
    assert "2 nvidia.com/gpu held 10m12s: 0.34 accelerator-hours, 98.4% of it useful (goodput)" in table


def test_restarts_stalls_lost_nodes_and_redone_work_take_their_share_and_every_second_is_counted_once():
    run = job(("Pending", 0), ("Running", 20), ("Restarting", 200), ("Pending", 205), ("Running", 260),
              ("Completed", 900))
    timeline = RunTimeline(placed={"0": T0 + 15, "1": T0 + 250},
                           stalls=[(T0 + 400, T0 + 500)],  # no output from 400 s, restarted at 500 s
                           lost=[(T0 + 100, T0 + 150), (T0 + 120, T0 + 180)])  # two nodes, overlapping
    progress = Progress(executed=1200, redone=200)
    spent = goodput(run, timeline, progress)
    assert spent is not None
    seconds = dict(spent.seconds)
    assert seconds["queued"] == 15 and seconds["starting"] == 5
    assert seconds["restarting"] == (260 - 200) + (180 - 100), "the Job restarting, and the lost nodes"
    assert seconds["stalled"] == 100
    running_before_redone = (200 - 20) - 80 + (900 - 260) - 100
    assert seconds["redone"] == pytest.approx(running_before_redone * 200 / 1200)
    assert seconds["running"] == pytest.approx(running_before_redone - seconds["redone"])
    assert sum(seconds.values()) == pytest.approx(spent.wall) == 900


def test_a_run_the_wait_ended_ends_then_and_one_that_never_started_was_all_queued():
    never = job(("Pending", 0), ("Pending", 5))
    spent = goodput(never, RunTimeline(ended_at=T0 + 120))  # cannot start: deleted after 2 minutes
    assert spent is not None and spent.seconds["queued"] == 120 and spent.wall == 120
    assert spent.useful_share is None and spent.result()["goodput"] is None
    timed_out = job(("Pending", 0), ("Running", 10))
    spent = goodput(timed_out, RunTimeline(placed={"0": T0 + 8}, ended_at=T0 + 70))  # job_timeout
    assert spent is not None and dict(spent.seconds)["running"] == 60 and spent.wall == 70


def deduplicated(run: dict) -> dict:
    """The Job as Volcano v1.15 keeps its conditions: one per phase, the latest (appendJobCondition)."""
    latest: dict[str, dict] = {}
    for condition in run["status"]["conditions"]:
        latest.pop(condition["status"], None)
        latest[condition["status"]] = condition
    return {**run, "status": {**run["status"], "conditions": list(latest.values())}}


def test_on_volcano_1_15_the_phases_the_waiter_saw_restore_what_the_kept_conditions_forgot():
    phases = (("Pending", 0), ("Running", 20), ("Restarting", 200), ("Pending", 205), ("Running", 260),
              ("Completed", 900))
    full, kept = job(*phases), deduplicated(job(*phases))
    assert [condition["status"] for condition in kept["status"]["conditions"]] == [
        "Restarting", "Pending", "Running", "Completed"], "v1.15 forgets the first Pending and Running"
    placed = {"0": T0 + 15, "1": T0 + 250}
    forgetful = goodput(kept, RunTimeline(placed=dict(placed)))
    assert forgetful is not None and forgetful.seconds["restarting"] == 0, "without the waiter, the restart is lost"
    watched = RunTimeline(placed=dict(placed))
    for phase, second in phases:  # what a read or watch saw of the Job (its state, with the controller's time)
        watched.job_seen({"status": {"state": {"phase": phase, "lastTransitionTime": at(second)}}})
        watched.job_seen({"status": {"state": {"phase": phase, "lastTransitionTime": at(second)}}})
    assert len(watched.phases) == len(phases), "a phase seen twice is noted once"
    assert RunTimeline.from_dict(watched.to_dict()) == watched
    restored, expected = goodput(kept, watched), goodput(full, RunTimeline(placed=dict(placed)))
    assert restored is not None and expected is not None
    assert dict(restored.seconds) == dict(expected.seconds)
    assert restored.seconds["restarting"] == 60
    assert phase_changes(kept, watched) == phase_changes(full)


def test_without_its_first_placement_the_start_is_all_queued_and_nothing_is_lost():
    spent = goodput(job(("Pending", 0), ("Running", 40), ("Completed", 100)), RunTimeline())
    assert spent is not None and (spent.seconds["queued"], spent.seconds["starting"]) == (40, 0)
    assert sum(spent.seconds.values()) == spent.wall == 100


def test_the_timeline_notes_when_each_generation_was_placed_and_travels_as_a_dict():
    timeline = RunTimeline()
    for version, second in (("0", 10), ("0", 12), ("1", 300)):
        timeline.pod_seen({"metadata": {"annotations": {"volcano.sh/job-version": version}},
                           "status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                                      "lastTransitionTime": at(second)}]}})
    timeline.pod_seen({"metadata": {}, "status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}})
    assert timeline.placed == {"0": T0 + 12, "1": T0 + 300}
    assert RunTimeline.from_dict(timeline.to_dict()) == timeline


def test_phase_changes_merge_volcanos_repeated_conditions_and_accelerators_count_every_pod():
    run = job(("Pending", 0), ("Pending", 0), ("Running", 5), ("Running", 6))
    assert phase_changes(run) == [("Pending", T0), ("Running", T0 + 5)]
    assert accelerators(job(("Pending", 0), gpus=4, replicas=3)) == {"nvidia.com/gpu": 12.0}
    assert BUCKETS == ("queued", "starting", "running", "restarting", "preempted", "stalled", "redone")


def test_a_restart_after_a_preemption_is_preempted_time_and_another_restart_stays_restarting():
    run = job(("Pending", 0), ("Running", 20), ("Restarting", 200), ("Pending", 202), ("Running", 500),
              ("Restarting", 600), ("Pending", 601), ("Running", 640), ("Completed", 900))
    # Evicted at 199 s (recorded a second before the controller restarted the gang); the restart at 600 s
    # was a failure.
    timeline = RunTimeline(placed={"0": T0 + 15}, preempted=[T0 + 199])
    spent = goodput(run, timeline)
    assert spent is not None
    assert spent.seconds["preempted"] == 500 - 200 and spent.seconds["restarting"] == 640 - 600
    assert sum(spent.seconds.values()) == spent.wall == 900
    assert spent.preemptions == 1 and spent.result()["preemptions"] == 1
    assert spent.result()["preempted_seconds"] == 300
    assert "  preempted     5m00s  33.3% (1 preemption(s))" in spent.table("ml/train")
    assert RunTimeline.from_dict(timeline.to_dict()) == timeline
    old = goodput(run, RunTimeline(placed={"0": T0 + 15}, preempted=[T0 + 50]))
    assert old is not None and old.seconds["preempted"] == 0, "a preemption long before a restart is not its cause"


def test_a_preemption_before_the_first_run_the_wait_saw_counts_from_its_eviction():
    """The gang ran and was preempted before the wait began (a deferred task's trigger starting): Volcano
    v1.15 keeps only the latest Running, so the first run is unknown; from the eviction on it is preempted."""
    run = job(("Pending", 0), ("Running", 60), ("Completed", 90))
    spent = goodput(run, RunTimeline(placed={"1": T0 + 58}, preempted=[T0 + 5]))
    assert spent is not None
    assert spent.seconds["preempted"] == 55 and spent.seconds["queued"] == 5 and spent.seconds["running"] == 30
    assert sum(spent.seconds.values()) == spent.wall == 90


def test_a_gang_running_again_within_the_second_it_was_pending_is_running_until_its_next_restart():
    """As seen in make test (four preemptions, kwok; seconds after creation): after its third preemption the
    gang was Pending, its status changed (which refreshes the phase's time) and it turned Running, all
    within second 94. Volcano keeps only the latest condition of each phase, in whole seconds: the Job
    ended with Running at 94, Restarting and Pending at 105; the waiter saw Pending at 94, then Running at
    94. The span from 94 to the next restart is running time, not a restart's."""
    run = job(("Running", 94), ("Restarting", 105), ("Pending", 105))
    waiter_saw = [(phase, T0 + second) for phase, second in (
        ("Pending", 0), ("Running", 0), ("Restarting", 11), ("Pending", 11), ("Running", 32), ("Restarting", 42),
        ("Pending", 43), ("Running", 63), ("Restarting", 74), ("Pending", 74), ("Pending", 94), ("Running", 94),
        ("Restarting", 105), ("Pending", 105))]
    timeline = RunTimeline(phases=waiter_saw, preempted=[T0 + 11, T0 + 42, T0 + 73, T0 + 105], ended_at=T0 + 110)
    spent = goodput(run, timeline)
    assert spent is not None and spent.wall == 110
    assert spent.seconds["running"] == 11 + 10 + 11 + 11, spent.seconds
    assert spent.seconds["preempted"] == 21 + 21 + 20 + 5, spent.seconds


def test_a_deferred_wait_that_first_looked_once_the_job_ran_counts_no_restart():
    """The trigger's first read found the Job Running since the second its Pending condition has; Volcano
    v1.15 then moved its Running condition to the Job's last update in that phase (5 s later). Seen in the
    task log of a deferred training (Airflow in the cluster): "restarting 5s 83.3%" for a Job that never
    restarted."""
    run = job(("Pending", 1), ("Running", 6), ("Completing", 6), ("Completed", 6))
    watched = RunTimeline(placed={"0": T0 + 1})
    for phase, second in (("Running", 1), ("Completing", 6), ("Completed", 6)):
        watched.job_seen({"status": {"state": {"phase": phase, "lastTransitionTime": at(second)}}})
    assert phase_changes(run, watched) == [("Pending", T0 + 1), ("Running", T0 + 1), ("Completing", T0 + 6),
                                           ("Completed", T0 + 6)]
    spent = goodput(run, watched)
    assert spent is not None and dict(spent.seconds) == {
        "queued": 1, "starting": 0, "running": 5, "restarting": 0, "preempted": 0, "stalled": 0, "redone": 0}


def test_a_restart_the_waiter_did_not_see_still_counts_from_the_conditions_kept():
    """The waiter saw the Job Running, then nothing until it had Completed (a deferral's gap): the Running
    condition after the kept Restarting and Pending is a new run, not an update of the one it saw."""
    run = deduplicated(job(("Pending", 0), ("Running", 20), ("Restarting", 200), ("Pending", 205),
                           ("Running", 260), ("Completed", 900)))
    watched = RunTimeline(placed={"0": T0 + 15, "1": T0 + 250})
    for phase, second in (("Running", 20), ("Completed", 900)):
        watched.job_seen({"status": {"state": {"phase": phase, "lastTransitionTime": at(second)}}})
    spent = goodput(run, watched)
    assert spent is not None and spent.seconds["restarting"] == 60 and spent.seconds["running"] == 180 + 640
