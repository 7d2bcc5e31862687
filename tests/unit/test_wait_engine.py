"""The waiting engine, driven by hand: what a wait does next for each observation (pure, no cluster)."""

from __future__ import annotations

import pytest

from airflow_volcano.events import Verdict
from airflow_volcano.job_ref import JobRef
from airflow_volcano.wait_engine import (
    CheckPods,
    DeletePods,
    Done,
    OutputClock,
    PodRef,
    Reread,
    WaitEngine,
    WaitLimits,
    Watch,
)

from .test_status import job, pod

REF = JobRef(name="train", namespace="ml")


def engine(limits: WaitLimits | None = None, **kwargs) -> tuple[WaitEngine, list[str]]:
    reported: list[str] = []
    kwargs.setdefault("jitter", lambda: 0.5)
    return WaitEngine(REF, limits or WaitLimits(), started_at=1000.0, report=reported.append, **kwargs), reported


def test_a_running_job_is_watched_for_five_minutes_from_its_resource_version():
    wait, reported = engine()
    assert wait.job_read(job("Running", running=3), now=1010) == Watch(resource_version="7", seconds=300)
    assert wait.job_changed(job("Running", running=3), now=1020) is None, "nothing to do: keep watching"
    done = wait.job_changed(job("Completed", succeeded=3), now=1030)
    assert isinstance(done, Done) and done.outcome.phase == "Completed"
    assert len(reported) == 2 and "Running" in reported[0] and "Completed" in reported[1]


def test_a_pending_job_has_its_pods_and_scheduler_checked_and_an_image_pull_error_ends_the_wait():
    wait, _ = engine(WaitLimits(poll_interval=5))
    assert wait.job_read(job("Pending", pending=3), now=1001) == CheckPods(scheduling=False), (
        "pods at once (an image pull error shows early); the scheduler once it has been Pending a while")
    watching = wait.pods_seen([pod("train-master-0", "master", "Pending")], None, [], now=1001)
    assert watching == Watch(resource_version="7", seconds=5), "the next pod check in poll_interval"
    assert wait.job_changed(job("Pending", pending=3), now=1003) is None
    assert wait.watch_ended(now=1006) == CheckPods(scheduling=True), "a full-length watch: the next check is due"
    done = wait.pods_seen([pod("train-master-0", "master", "Pending", waiting="ImagePullBackOff")], None, [],
                          now=1006)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert "cannot start" in done.outcome.message and "repo/img:1" in done.outcome.message


def test_a_dropped_watch_backs_off_with_jitter_growing_per_drop_and_resets_after_a_full_watch():
    wait, _ = engine(jitter=lambda: 1.0)
    wait.job_read(job("Running", running=1), now=1000)
    backoffs = []
    for _ in range(8):
        action = wait.watch_ended(now=1000.5)  # a 300 s watch that ended after half a second
        assert isinstance(action, Reread)
        backoffs.append(action.after)
        wait.job_read(job("Running", running=1), now=1000)
    assert backoffs == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert isinstance(wait.watch_ended(now=1300), Watch), "a watch that ran its time is not a drop"
    wait.job_read(job("Running", running=1), now=1300)
    assert wait.watch_ended(now=1300.5) == Reread(after=1.0), "the back-off starts again"
    low, _ = engine(jitter=lambda: 0.0)
    low.job_read(job("Running", running=1), now=1000)
    assert low.watch_ended(now=1000) == Reread(after=0.5), "full jitter: between half and all of the ceiling"


@pytest.mark.parametrize(("limits", "deadline", "expected"), [
    (WaitLimits(job_timeout=60), None, "job_timeout of 60s passed (phase Running)"),
    (WaitLimits(), 1070.0, "the task's execution_timeout passed"),
])
def test_deadlines_end_the_wait_and_shorten_the_watch(limits, deadline, expected):
    wait, _ = engine(limits, deadline=deadline)
    assert wait.job_read(job("Running", running=1), now=1020) == Watch(resource_version="7", seconds=40 if
                                                                         limits.job_timeout else 50)
    assert wait.job_changed(job("Running", running=1), now=1030) is None
    done = wait.job_read(job("Running", running=1), now=1075)
    assert isinstance(done, Done) and done.outcome.message == expected


def test_a_deleted_job_ends_the_wait_saying_so():
    wait, _ = engine()
    done = wait.job_read(None, now=1000)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.DELETED
    assert done.outcome.message == "Volcano Job ml/train was deleted"


def test_the_scheduler_reason_is_reported_once_while_pending():
    wait, reported = engine(WaitLimits(poll_interval=5))
    wait.job_read(job("Pending", pending=2), now=1001)
    podgroup = {"metadata": {"name": "train-pg"}, "status": {"conditions": [
        {"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
         "message": "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 2 minAvailable"}]}}
    wait.pods_seen([], podgroup, [], now=1001)
    wait.watch_ended(now=1007)
    wait.pods_seen([], podgroup, [], now=1007)
    assert sum("the scheduler says" in line for line in reported) == 1, reported


def lost(name: str, node: str = "gpu-7", *, ready: str = "False", since: str = "2026-11-24T17:21:06Z",
         containers_ready: bool = True) -> dict:
    """A Running pod as the node controller leaves it when the node's kubelet goes silent: Ready False
    while every container still reads as ready (or, with ready="True", a healthy pod)."""
    body = pod(name, "worker", "Running")
    body["spec"] = {"nodeName": node}
    body["status"]["conditions"] = [{"type": "Ready", "status": ready, "lastTransitionTime": since}]
    body["status"]["containerStatuses"][0]["ready"] = containers_ready
    return body


SINCE = 1795540866.0  # 2026-11-24T17:21:06Z


def test_pods_of_a_node_that_stopped_answering_are_reported_then_deleted_after_node_lost_timeout():
    wait, reported = engine(WaitLimits(node_lost_timeout=120))
    assert wait.job_read(job("Running", running=2), now=SINCE - 100) == CheckPods(scheduling=False)
    healthy = [lost("train-master-0", "node-a", ready="True"), lost("train-worker-0", ready="True")]
    assert wait.pods_seen(healthy, None, [], now=SINCE - 100) == Watch(resource_version="7", seconds=40), (
        "a running Job's pods are looked at every node_lost_timeout / 3")
    assert wait.watch_ended(now=SINCE - 60) == CheckPods(scheduling=False)
    assert wait.pods_seen(healthy, None, [], now=SINCE - 60) == Watch(resource_version="7", seconds=40)
    pods = [lost("train-master-0", "node-a", ready="True"), lost("train-worker-0")]
    assert isinstance(wait.pods_seen(pods, None, [], now=SINCE + 10), Watch)
    assert [line for line in reported if "gpu-7" in line] == [
        "Node gpu-7 stopped answering: its pod(s) train-worker-0 of Volcano Job ml/train were marked not ready "
        "at 17:21:06 UTC; unless it is back within node_lost_timeout (120s), they are deleted and handled like "
        "an eviction"], "said once, naming the node, the pods and since when"
    assert isinstance(wait.pods_seen(pods, None, [], now=SINCE + 50), Watch) and len(reported) == 2
    assert isinstance(wait.pods_seen(pods, None, [], now=SINCE + 121), Watch), (
        "counted from when the wait first saw them lost (SINCE + 10): the apiserver's clock may be skewed")
    assert wait.pods_seen(pods, None, [], now=SINCE + 130) == DeletePods(pods=(PodRef("train-worker-0", ""),))
    assert "has not come back within node_lost_timeout (120s): deleting its pod(s) train-worker-0" in reported[-1]
    assert wait.pods_seen(pods, None, [], now=SINCE + 140) == DeletePods(pods=(PodRef("train-worker-0", ""),)), (
        "a delete that failed is retried at the next check")
    assert len([line for line in reported if "deleting" in line]) == 1, "and said once"
    done = wait.pods_deleted(now=SINCE + 142)
    assert isinstance(done, Watch)
    ended = wait.job_changed(job("Failed", failed=2), now=SINCE + 130)
    assert isinstance(ended, Done) and ended.outcome.lost_nodes == ("gpu-7",)


def test_a_node_back_before_the_timeout_is_said_and_nothing_is_deleted():
    wait, reported = engine(WaitLimits(node_lost_timeout=120))
    wait.job_read(job("Running", running=1), now=SINCE)
    wait.watch_ended(now=SINCE + 40)
    assert isinstance(wait.pods_seen([lost("train-worker-0")], None, [], now=SINCE + 40), Watch)
    assert isinstance(wait.pods_seen([lost("train-worker-0", ready="True")], None, [], now=SINCE + 80), Watch)
    assert reported[-1] == "Node gpu-7 answers again: pod(s) train-worker-0 are ready"
    assert isinstance(wait.pods_seen([lost("train-worker-0", ready="True")], None, [], now=SINCE + 200), Watch)


def test_a_pod_the_kubelet_itself_marks_not_ready_is_not_lost():
    wait, reported = engine(WaitLimits(node_lost_timeout=10))
    wait.job_read(job("Running", running=1), now=SINCE)
    failing_probe = lost("train-worker-0", containers_ready=False)
    assert isinstance(wait.pods_seen([failing_probe], None, [], now=SINCE + 600), Watch)
    assert not any("answering" in line for line in reported)


def test_without_node_lost_timeout_a_running_job_is_not_polled():
    wait, _ = engine(WaitLimits(node_lost_timeout=None))
    assert wait.job_read(job("Running", running=1), now=SINCE) == Watch(resource_version="7", seconds=300)


def running(version: str, **status: int) -> dict:
    body = job("Running", running=3, **status)
    body["metadata"]["resourceVersion"] = version
    return body


def test_a_running_job_without_output_for_stall_timeout_has_its_stacks_collected_then_fails():
    from airflow_volcano.wait_engine import CollectStacks

    output = OutputClock()
    wait, reported = engine(WaitLimits(stall_timeout=60), output=output)
    assert wait.job_read(running("7"), now=1000) == Watch(resource_version="7", seconds=60), (
        "the watch ends when a stall would begin")
    output.seen(1030.0)  # a log line
    assert wait.watch_ended(now=1060) == Watch(resource_version="7", seconds=30), "output moved the stall on"
    assert wait.job_changed(running("8", succeeded=0), now=1080) is None, "a change of the Job is progress too"
    assert wait.watch_ended(now=1110) == Watch(resource_version="8", seconds=30)
    assert wait.watch_ended(now=1140) == CollectStacks(silent_for=60.0)
    done = wait.stacks_collected("where each process was: train-worker-0 (pid 7, RANK=1) in sleep", now=1175)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.STALLED
    assert done.outcome.message == ("stalled: no output for 1 minute; where each process was: train-worker-0 "
                                    "(pid 7, RANK=1) in sleep")
    assert done.outcome.stalls == 1


def test_stall_action_restart_asks_for_a_gang_restart_and_starts_the_clock_again():
    from airflow_volcano.wait_engine import CollectStacks, RestartJob

    wait, reported = engine(WaitLimits(stall_timeout=120, stall_action="restart"))
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1120) == CollectStacks(silent_for=120.0)
    running_pods = (PodRef("train-master-0", "u1"), PodRef("train-worker-0", "u2"))
    assert wait.stacks_collected("", now=1130, running=running_pods) == RestartJob(pods=running_pods)
    assert "stalled: no output for 2 minutes; restarting the gang (stall_action='restart')" in reported[-1]
    assert wait.restart_requested(now=1131) == Watch(resource_version="7", seconds=120)
    restarting = job("Restarting", retryCount=1)
    restarting["metadata"]["resourceVersion"] = "8"
    wait.job_changed(restarting, now=1132)
    assert wait.job_read(restarting, now=1400) != CollectStacks(silent_for=268.0), "not Running: no stall"
    assert wait.job_changed(running("9", retryCount=1), now=1500) is None
    assert wait.watch_ended(now=1560) == Watch(resource_version="9", seconds=60), "Running again: a new clock"
    done = wait.job_changed(job("Completed", succeeded=3), now=1500)
    assert isinstance(done, Done) and done.outcome.stalls == 1 and done.outcome.verdict is Verdict.FINISHED


def test_without_stall_timeout_a_quiet_job_is_never_a_stall():
    wait, _ = engine()
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=100000) == Watch(resource_version="7", seconds=300)


@pytest.mark.parametrize("value", [0, 0.5, -1, "5", True, float("nan"), 10, 29.9])
def test_a_bad_stall_timeout_fails_naming_it(value):
    """Seconds now: a value written for minutes (10) is refused, naming the unit, not waited 10 s."""
    from airflow_volcano.exceptions import JobSpecError

    with pytest.raises(JobSpecError, match=r"stall_timeout must be a number of seconds >= 30 .*seconds, not minutes"):
        WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5, stall_timeout=value)


def test_stall_timeout_is_seconds_or_a_timedelta_and_stall_action_one_of_two():
    import datetime

    from airflow_volcano.exceptions import JobSpecError

    limits = WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5, stall_timeout=120)
    assert limits.stall_timeout == 120 and limits.stall_action == "fail"
    limits = WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5,
                                stall_timeout=datetime.timedelta(minutes=90), stall_action="restart")
    assert (limits.stall_timeout, limits.stall_action) == (5400, "restart")
    assert WaitLimits.from_dict(limits.to_dict()) == limits
    with pytest.raises(JobSpecError, match="stall_action must be one of .*'reboot'"):
        WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5, stall_timeout=60,
                           stall_action="reboot")


# -- stalls only on certainty -------------------------------------------------------------------------


def test_time_the_waiter_cannot_see_a_log_is_not_silence():
    """A log read failing (the apiserver cannot reach the kubelet) for longer than stall_timeout: no stall
    meanwhile, and once it can read again the clock goes on from where it stopped, not from zero."""
    from airflow_volcano.wait_engine import CollectStacks

    output = OutputClock()
    wait, _ = engine(WaitLimits(stall_timeout=60), output=output)
    assert wait.job_read(running("7"), now=1000) == Watch(resource_version="7", seconds=60)
    output.blind("log:train-master-0", 1040)  # 40 s of silence, then the reads fail
    assert wait.watch_ended(now=1060) == Watch(resource_version="7", seconds=10), "blind: look again soon"
    assert wait.watch_ended(now=1300) == Watch(resource_version="7", seconds=10), "still blind: never a stall"
    output.sighted("log:train-master-0", 1400)  # 360 s blind: not counted
    assert wait.watch_ended(now=1400) == Watch(resource_version="7", seconds=20), "40 s were silent, 20 s are left"
    assert wait.watch_ended(now=1420) == CollectStacks(silent_for=60.0)


def test_a_waiter_that_just_started_counts_no_silence_before_its_first_read():
    """After a reattach or a triggerer's restart, the log is expected but not read yet: blind, not silent."""
    output = OutputClock()
    output.expected("log:train-master-0", 1000)
    wait, _ = engine(WaitLimits(stall_timeout=60), output=output)
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1500) == Watch(resource_version="7", seconds=10)
    output.sighted("log:train-master-0", 1500)
    assert wait.watch_ended(now=1510) == Watch(resource_version="7", seconds=50), "the clock starts at the first read"


def test_a_stall_is_confirmed_by_a_fresh_read_of_every_followed_log_before_it_is_acted_on():
    """A followed stream may hang without failing, a copy may lag: before collecting stacks the engine
    asks for each followed pod's newest line; output the copy had not reached yet is output."""
    from airflow_volcano.logs import LogCursor
    from airflow_volcano.wait_engine import BLIND, CollectStacks, FollowedLog, ProbeOutput

    cursor = LogCursor(last_ns=1_000_000_000_000)
    followed = (FollowedLog("train-master-0", "master", cursor),)
    wait, _ = engine(WaitLimits(stall_timeout=60), output=OutputClock(), followed=followed)
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1060) == ProbeOutput(pods=(("train-master-0", "master"),))
    newer = wait.output_probed({"train-master-0": 1_000_000_000_001}, now=1061)
    assert newer == Watch(resource_version="7", seconds=60), "a line the copy had not shown yet: output, now"
    assert wait.watch_ended(now=1121) == ProbeOutput(pods=(("train-master-0", "master"),))
    assert isinstance(wait.output_probed({"train-master-0": BLIND}, now=1122), Watch), "a failed read: no stall"
    assert wait.watch_ended(now=1132) == ProbeOutput(pods=(("train-master-0", "master"),)), "read again soon"
    # Silent since 1061, the 11 s the read failed not counted.
    assert wait.output_probed({"train-master-0": 1_000_000_000_000}, now=1133) == CollectStacks(silent_for=61.0)


def test_pods_whose_output_counts_without_being_copied_are_probed_on_the_waiters_clock():
    """A DeepSpeed rank's heartbeat shows only in its worker pod's log: its newest line is read every
    quarter of stall_timeout; a newer one (the node's timestamps, compared with that pod's own) is
    output at the time the waiter saw it."""
    from airflow_volcano.wait_engine import CollectStacks, FollowedLog, ProbeOutput

    worker = FollowedLog("train-worker-0", "worker")
    wait, _ = engine(WaitLimits(stall_timeout=60), output=OutputClock(), followed=(worker,))
    assert wait.job_read(running("7"), now=1000) == ProbeOutput(pods=(("train-worker-0", "worker"),))
    assert wait.output_probed({"train-worker-0": 5}, now=1000) == Watch(resource_version="7", seconds=15)
    assert wait.watch_ended(now=1015) == ProbeOutput(pods=(("train-worker-0", "worker"),))
    assert wait.output_probed({"train-worker-0": 9}, now=1015) == Watch(resource_version="7", seconds=15)
    for now in (1030, 1045, 1060):
        assert wait.watch_ended(now=now) == ProbeOutput(pods=(("train-worker-0", "worker"),))
        wait.output_probed({"train-worker-0": 9}, now=now)
    assert wait.watch_ended(now=1075) == ProbeOutput(pods=(("train-worker-0", "worker"),))
    assert wait.output_probed({"train-worker-0": 9}, now=1075) == CollectStacks(silent_for=60.0)


def test_a_refused_restart_fails_the_stall_once_saying_why():
    from airflow_volcano.wait_engine import CollectStacks, RestartJob

    wait, _ = engine(WaitLimits(stall_timeout=60, stall_action="restart"))
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1060) == CollectStacks(silent_for=60.0)
    pods = (PodRef("train-master-0", "u1"),)
    assert wait.stacks_collected("", now=1070, running=pods) == RestartJob(pods=pods)
    done = wait.restart_requested(now=1071, refused="delete pod ml/train-master-0 failed: HTTP 403 Forbidden")
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.STALLED
    assert done.outcome.message == ("stalled: no output for 1 minute; stall_action='restart' could not restart it "
                                    "(delete pod ml/train-master-0 failed: HTTP 403 Forbidden)")


def test_repeated_stalls_are_capped():
    from airflow_volcano.constants import MAX_STALL_RESTARTS
    from airflow_volcano.wait_engine import CollectStacks, RestartJob

    wait, _ = engine(WaitLimits(stall_timeout=60, stall_action="restart"))
    now, pods = 1000.0, (PodRef("train-master-0", "u1"),)
    wait.job_read(running("7"), now=now)
    for _ in range(MAX_STALL_RESTARTS):
        now += 60
        assert wait.watch_ended(now=now) == CollectStacks(silent_for=60.0)
        assert wait.stacks_collected("", now=now, running=pods) == RestartJob(pods=pods)
        wait.restart_requested(now=now)
    done = wait.watch_ended(now=now + 60)
    assert done == CollectStacks(silent_for=60.0)
    ended = wait.stacks_collected("where each process was: x", now=now + 61, running=pods)
    assert isinstance(ended, Done) and ended.outcome.verdict is Verdict.STALLED
    assert f"it stalled again after {MAX_STALL_RESTARTS} restarts" in ended.outcome.message


# -- lost nodes: only what is certain -------------------------------------------------------------------


def test_a_pod_waiting_for_a_readiness_gate_is_never_lost():
    wait, reported = engine(WaitLimits(node_lost_timeout=10))
    wait.job_read(job("Running", running=1), now=SINCE)
    gated = lost("train-worker-0")
    gated["spec"]["readinessGates"] = [{"conditionType": "example.com/ready"}]
    gated["status"]["conditions"][0]["reason"] = "ReadinessGatesNotReady"
    assert isinstance(wait.pods_seen([gated], None, [], now=SINCE + 600), Watch)
    gated["status"]["conditions"][0].pop("reason")  # and without the kubelet's reason: the gate is unmet
    assert isinstance(wait.pods_seen([gated], None, [], now=SINCE + 1200), Watch)
    assert not any("answering" in line for line in reported)


def test_only_the_jobs_own_pods_are_lost_and_each_is_deleted_as_the_pod_it_was():
    wait, _ = engine(WaitLimits(node_lost_timeout=10))
    wait.ref = JobRef(name="train", namespace="ml", uid="job-uid")
    wait.job_read(job("Running", running=1), now=SINCE)
    ours = lost("train-worker-0")
    ours["metadata"].update(uid="pod-uid-1", ownerReferences=[{"uid": "job-uid"}])
    other = lost("train-worker-1")
    other["metadata"].update(uid="pod-uid-2", ownerReferences=[{"uid": "someone-else"}])
    wait.pods_seen([ours, other], None, [], now=SINCE)
    assert wait.pods_seen([ours, other], None, [], now=SINCE + 11) == DeletePods(
        pods=(PodRef("train-worker-0", "pod-uid-1"),))


def test_a_node_is_said_to_answer_again_only_for_pods_that_are_still_there():
    wait, reported = engine(WaitLimits(node_lost_timeout=10))
    wait.job_read(job("Running", running=1), now=SINCE)
    wait.pods_seen([lost("train-worker-0")], None, [], now=SINCE)
    wait.pods_seen([lost("train-worker-0")], None, [], now=SINCE + 11)
    wait.pods_deleted(now=SINCE + 11)
    wait.pods_seen([], None, [], now=SINCE + 30)  # deleted: gone, not back
    assert not any("answers again" in line for line in reported), reported


def admitted(phase: str = "Inqueue") -> dict:
    return {"metadata": {"name": "train-pg"}, "status": {"phase": phase}}


def test_a_job_admitted_by_the_scheduler_whose_pods_volcano_never_creates_cannot_start():
    """Found by the chaos soak: a Job submitted while the apiserver restarted stayed Pending with its
    PodGroup Inqueue and no pod, because vc-controller-manager missed the PodGroup's change; the task
    waited for startup_timeout (15 min by default) and then blamed the scheduler."""
    wait, reported = engine(WaitLimits(poll_interval=5))
    wait.job_read(job("Pending"), now=1001)
    assert wait.pods_seen([], admitted(), [], now=1061) is not None
    assert any("created no pod" in line for line in reported), reported
    assert not isinstance(wait.pods_seen([], admitted(), [], now=1121), Done), "not yet: 60s of it"
    assert not isinstance(wait.pods_seen([], None, [], now=1200), Done), "a check without the scheduler's view"
    done = wait.pods_seen([], admitted(), [], now=1181)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert "Volcano's job controller created no pod in 120s" in done.outcome.message, done.outcome.message
    assert "next try submits it again" in done.outcome.message


@pytest.mark.parametrize(("podgroup", "pods"), [
    (admitted("Pending"), []),  # waiting in its queue: the scheduler has not admitted it
    (admitted("Inqueue"), [pod("train-master-0", "master", "Pending")]),  # pods exist, waiting for nodes
], ids=["queued", "pods-pending"])
def test_a_job_waiting_in_its_queue_or_for_nodes_is_not_taken_for_one_volcano_forgot(podgroup, pods):
    wait, _ = engine(WaitLimits(poll_interval=5))
    wait.job_read(job("Pending"), now=1001)
    for now in range(1061, 1800, 60):
        assert not isinstance(wait.pods_seen(pods, podgroup, [], now=now), Done)


def test_pods_appearing_reset_the_clock_of_a_job_admitted_without_pods():
    wait, _ = engine(WaitLimits(poll_interval=5))
    wait.job_read(job("Pending"), now=1001)
    wait.pods_seen([], admitted(), [], now=1061)
    wait.pods_seen([pod("train-master-0", "master", "Pending")], admitted(), [], now=1121)
    wait.pods_seen([], admitted(), [], now=1181)
    assert not isinstance(wait.pods_seen([], admitted(), [], now=1241), Done), "120s from the second sight"
    assert isinstance(wait.pods_seen([], admitted(), [], now=1301), Done)
