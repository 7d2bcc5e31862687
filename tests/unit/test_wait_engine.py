"""The waiting engine, driven by hand: what a wait does next for each observation (pure, no cluster)."""

from __future__ import annotations

import pytest

from airflow_volcano.job_ref import JobRef
from airflow_volcano.waiting.events import Verdict
from airflow_volcano.waiting.wait_engine import (
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

REF = JobRef(name="train", namespace="ml", created_at=1000.0)


def engine(limits: WaitLimits | None = None, **kwargs) -> tuple[WaitEngine, list[str]]:
    reported: list[str] = []
    kwargs.setdefault("jitter", lambda: 0.5)
    kwargs.setdefault("server_offset", 0.0)  # the apiserver's clock reads as the waiter's here
    return WaitEngine(kwargs.pop("ref", REF), limits or WaitLimits(), report=reported.append, **kwargs), reported


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


# What the DefaultTolerationSeconds admission plugin gives every pod.
UNREACHABLE_300 = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                   "tolerationSeconds": 300}


def lost(name: str, node: str = "gpu-7", *, ready: str = "False", since: str = "2026-11-24T17:21:06Z",
         containers_ready: bool = True, evicting: bool = False, tolerations: list | None = None) -> dict:
    """A Running pod as the node controller leaves it when the node's kubelet goes silent: Ready False
    while every container still reads as ready (or, with ready="True", a healthy pod); `evicting`: the
    taint manager has deleted it (its toleration ran out), which its silent kubelet cannot finish."""
    body = pod(name, "worker", "Running")
    body["spec"] = {"nodeName": node, "tolerations": [UNREACHABLE_300] if tolerations is None else tolerations}
    if evicting:
        body["metadata"]["deletionTimestamp"] = "2026-11-24T17:26:06Z"
    body["status"]["conditions"] = [{"type": "Ready", "status": ready, "lastTransitionTime": since}]
    body["status"]["containerStatuses"][0]["ready"] = containers_ready
    return body


SINCE = 1795540866.0  # 2026-11-24T17:21:06Z


def test_a_lost_nodes_pods_are_deleted_only_once_the_cluster_evicts_them_and_node_lost_timeout_passed():
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
        "at 17:21:06 UTC; unless it is back first, the cluster evicts them after their toleration of its "
        "unreachable taint (300s), and once that has begun and node_lost_timeout (120s) has passed they are "
        "deleted and handled like an eviction"], "said once, naming the node, the pods and since when"
    assert isinstance(wait.pods_seen(pods, None, [], now=SINCE + 50), Watch) and len(reported) == 2
    assert isinstance(wait.pods_seen(pods, None, [], now=SINCE + 200), Watch), (
        "node_lost_timeout passed, but the cluster has not evicted them yet: a node cut off only from the "
        "apiserver still runs them, and nothing acts before Kubernetes would")
    evicting = [lost("train-master-0", "node-a", ready="True"), lost("train-worker-0", evicting=True)]
    assert wait.pods_seen(evicting, None, [], now=SINCE + 320) == DeletePods(pods=(PodRef("train-worker-0", ""),))
    assert ("has not come back within node_lost_timeout (120s) and the cluster is evicting its pod(s) "
            "train-worker-0") in reported[-1]
    assert wait.pods_seen(evicting, None, [], now=SINCE + 330) == DeletePods(pods=(PodRef("train-worker-0", ""),)), (
        "a delete that failed is retried at the next check")
    assert len([line for line in reported if "deleting" in line]) == 1, "and said once"
    done = wait.pods_deleted(now=SINCE + 332)
    assert isinstance(done, Watch)
    ended = wait.job_changed(job("Failed", failed=2), now=SINCE + 340)
    assert isinstance(ended, Done) and ended.outcome.lost_nodes == ("gpu-7",)


def test_node_lost_timeout_is_counted_from_the_waiters_first_sight_even_once_the_cluster_evicts():
    wait, _ = engine(WaitLimits(node_lost_timeout=120))
    wait.job_read(job("Running", running=1), now=SINCE)
    assert isinstance(wait.pods_seen([lost("train-worker-0", evicting=True)], None, [], now=SINCE + 10), Watch)
    assert isinstance(wait.pods_seen([lost("train-worker-0", evicting=True)], None, [], now=SINCE + 129), Watch), (
        "the apiserver's clock may be skewed: counted from when this wait first saw them lost (SINCE + 10)")
    assert isinstance(wait.pods_seen([lost("train-worker-0", evicting=True)], None, [], now=SINCE + 130), DeletePods)


def test_pods_the_cluster_never_evicts_are_never_deleted_and_the_log_says_the_task_waits_for_the_node():
    forever = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]
    wait, reported = engine(WaitLimits(node_lost_timeout=10))
    wait.job_read(job("Running", running=1), now=SINCE)
    assert isinstance(wait.pods_seen([lost("train-worker-0", tolerations=forever)], None, [], now=SINCE + 1), Watch)
    assert isinstance(wait.pods_seen([lost("train-worker-0", tolerations=forever)], None, [], now=SINCE + 3600), Watch)
    assert "the cluster never evicts them: the task waits for the node to come back" in reported[-1]


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
    from airflow_volcano.waiting.wait_engine import CollectStacks

    output = OutputClock()
    wait, reported = engine(WaitLimits(stall_timeout=60), output=output)
    assert wait.job_read(running("7"), now=1000) == Watch(resource_version="7", seconds=60), (
        "the watch ends when a stall would begin")
    output.seen(1030.0)  # a log line
    assert wait.watch_ended(now=1060) == Watch(resource_version="7", seconds=30), "output moved the stall on"
    assert wait.job_changed(running("8", succeeded=0), now=1080) is None, "a change of the Job is progress too"
    assert wait.watch_ended(now=1110) == Watch(resource_version="8", seconds=30)
    assert wait.watch_ended(now=1140) == CollectStacks(silent_for=60.0, requested_at=1140)
    done = wait.stacks_collected("where each process was: train-worker-0 (pid 7, RANK=1) in sleep", now=1175)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.STALLED
    assert done.outcome.message == ("stalled: no output for 1 minute; where each process was: train-worker-0 "
                                    "(pid 7, RANK=1) in sleep")
    assert done.outcome.stalls == 1


def test_stall_action_restart_asks_for_a_gang_restart_and_starts_the_clock_again():
    from airflow_volcano.waiting.wait_engine import CollectStacks, RestartJob

    wait, reported = engine(WaitLimits(stall_timeout=120, stall_action="restart"))
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1120) == CollectStacks(silent_for=120.0, requested_at=1120)
    running_pods = (PodRef("train-master-0", "u1"), PodRef("train-worker-0", "u2"))
    assert wait.stacks_collected("", now=1130, running=running_pods) == RestartJob(pods=running_pods)
    assert "stalled: no output for 2 minutes; restarting the gang (stall_action='restart')" in reported[-1]
    assert wait.restart_requested(now=1131) == Watch(resource_version="7", seconds=120)
    restarting = job("Restarting", retryCount=1)
    restarting["metadata"]["resourceVersion"] = "8"
    wait.job_changed(restarting, now=1132)
    assert wait.job_read(restarting, now=1400) != CollectStacks(silent_for=268.0, requested_at=1400), (
        "not Running: no stall")
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
    from airflow_volcano.waiting.wait_engine import CollectStacks

    output = OutputClock()
    wait, _ = engine(WaitLimits(stall_timeout=60), output=output)
    assert wait.job_read(running("7"), now=1000) == Watch(resource_version="7", seconds=60)
    output.blind("log:train-master-0", 1040)  # 40 s of silence, then the reads fail
    assert wait.watch_ended(now=1060) == Watch(resource_version="7", seconds=10), "blind: look again soon"
    assert wait.watch_ended(now=1300) == Watch(resource_version="7", seconds=10), "still blind: never a stall"
    output.sighted("log:train-master-0", 1400)  # 360 s blind: not counted
    assert wait.watch_ended(now=1400) == Watch(resource_version="7", seconds=20), "40 s were silent, 20 s are left"
    assert wait.watch_ended(now=1420) == CollectStacks(silent_for=60.0, requested_at=1420)


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
    from airflow_volcano.observability.logs import LogCursor
    from airflow_volcano.waiting.wait_engine import BLIND, CollectStacks, FollowedLog, ProbeOutput

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
    assert wait.output_probed({"train-master-0": 1_000_000_000_000}, now=1133) == CollectStacks(
        silent_for=61.0, requested_at=1133)


def test_pods_whose_output_counts_without_being_copied_are_probed_on_the_waiters_clock():
    """A DeepSpeed rank's heartbeat shows only in its worker pod's log: its newest line is read every
    quarter of stall_timeout; a newer one (the node's timestamps, compared with that pod's own) is
    output at the time the waiter saw it."""
    from airflow_volcano.waiting.wait_engine import CollectStacks, FollowedLog, ProbeOutput

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
    assert wait.output_probed({"train-worker-0": 9}, now=1075) == CollectStacks(silent_for=60.0, requested_at=1075)


def test_a_refused_restart_fails_the_stall_once_saying_why():
    from airflow_volcano.waiting.wait_engine import CollectStacks, RestartJob

    wait, _ = engine(WaitLimits(stall_timeout=60, stall_action="restart"))
    wait.job_read(running("7"), now=1000)
    assert wait.watch_ended(now=1060) == CollectStacks(silent_for=60.0, requested_at=1060)
    pods = (PodRef("train-master-0", "u1"),)
    assert wait.stacks_collected("", now=1070, running=pods) == RestartJob(pods=pods)
    done = wait.restart_requested(now=1071, refused="delete pod ml/train-master-0 failed: HTTP 403 Forbidden")
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.STALLED
    assert done.outcome.message == ("stalled: no output for 1 minute; stall_action='restart' could not restart it "
                                    "(delete pod ml/train-master-0 failed: HTTP 403 Forbidden)")


def test_repeated_stalls_are_capped():
    from airflow_volcano.constants import MAX_STALL_RESTARTS
    from airflow_volcano.waiting.wait_engine import CollectStacks, RestartJob

    wait, _ = engine(WaitLimits(stall_timeout=60, stall_action="restart"))
    now, pods = 1000.0, (PodRef("train-master-0", "u1"),)
    wait.job_read(running("7"), now=now)
    for _ in range(MAX_STALL_RESTARTS):
        now += 60
        assert wait.watch_ended(now=now) == CollectStacks(silent_for=60.0, requested_at=now)
        assert wait.stacks_collected("", now=now, running=pods) == RestartJob(pods=pods)
        wait.restart_requested(now=now)
    done = wait.watch_ended(now=now + 60)
    assert done == CollectStacks(silent_for=60.0, requested_at=now + 60)
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
    ours = lost("train-worker-0", evicting=True)
    ours["metadata"].update(uid="pod-uid-1", ownerReferences=[{"uid": "job-uid"}])
    other = lost("train-worker-1", evicting=True)
    other["metadata"].update(uid="pod-uid-2", ownerReferences=[{"uid": "someone-else"}])
    wait.pods_seen([ours, other], None, [], now=SINCE)
    assert wait.pods_seen([ours, other], None, [], now=SINCE + 11) == DeletePods(
        pods=(PodRef("train-worker-0", "pod-uid-1"),))


def test_a_node_is_said_to_answer_again_only_for_pods_that_are_still_there():
    wait, reported = engine(WaitLimits(node_lost_timeout=10))
    wait.job_read(job("Running", running=1), now=SINCE)
    wait.pods_seen([lost("train-worker-0", evicting=True)], None, [], now=SINCE)
    assert isinstance(wait.pods_seen([lost("train-worker-0", evicting=True)], None, [], now=SINCE + 11), DeletePods)
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


# -- proof before an end: restarts, clocks, pulls, identities ----------------------------------------------


def started(phase: str, *, retries: int = 0, created: str = "1970-01-01T00:16:40Z", uid: str = "job-uid",
            **status: int) -> dict:
    """A Job (master + 2 workers, gang of 3, a TensorBoard outside it) created at epoch 1000."""
    body = job(phase, retryCount=retries, **status)
    body["metadata"].update(uid=uid, creationTimestamp=created)
    body["spec"] = {"minAvailable": 3, "tasks": [{"name": "master", "replicas": 1, "minAvailable": 1},
                                                 {"name": "worker", "replicas": 2, "minAvailable": 2},
                                                 {"name": "tensorboard", "replicas": 1, "minAvailable": 0}]}
    return body


OWNED = JobRef(name="train", namespace="ml", uid="job-uid", created_at=1000.0)


def owned(body: dict) -> dict:
    body["metadata"]["ownerReferences"] = [{"uid": "job-uid"}]
    body["metadata"].setdefault("uid", body["metadata"]["name"] + "-uid")
    return body


def test_a_gang_restarted_long_after_startup_timeout_gets_the_bound_again_from_the_restart():
    """Issue 41: a Job older than startup_timeout whose gang restarts had its new pods' first check end it
    as "did not start". Now the restart's pods get startup_timeout from when the wait saw the restart."""
    wait, reported = engine(WaitLimits(startup_timeout=30, poll_interval=5), ref=OWNED)
    assert isinstance(wait.job_read(started("Running", running=3), now=1060), Watch)
    assert wait.job_changed(started("Restarting", retries=1, pending=3), now=1070) == CheckPods(
        scheduling=True, restart=True), "its pods, and the events that say why it restarted (a preemption?)"
    fresh = [owned(pod(f"train-{task}-0", task, "Pending")) for task in ("master", "worker")]
    assert isinstance(wait.pods_seen(fresh, None, [], now=1070), Watch), "70 s after creation, 0 s after the restart"
    assert wait.watch_ended(now=1075) == CheckPods(scheduling=True, restart=True), "its cause read again: not found"
    assert isinstance(wait.pods_seen(fresh, None, [], now=1075), Watch)
    assert isinstance(wait.pods_seen(fresh, None, [], now=1099), Watch)
    done = wait.pods_seen(fresh, None, [], now=1101)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert done.outcome.message.startswith(
        "Volcano Job ml/train was restarted (restarts so far: 1) and its pods did not start again within "
        "startup_timeout (30s) of the restart"), done.outcome.message


def test_a_restart_that_runs_again_clears_the_restart_bound():
    wait, _ = engine(WaitLimits(startup_timeout=30, poll_interval=5), ref=OWNED)
    wait.job_read(started("Running", running=3), now=1060)
    wait.job_changed(started("Restarting", retries=1, pending=3), now=1070)
    wait.job_changed(started("Running", retries=1, running=3), now=1080)
    wait.job_changed(started("Restarting", retries=2, pending=3), now=2000)
    fresh = [owned(pod("train-master-0", "master", "Pending"))]
    assert isinstance(wait.pods_seen(fresh, None, [], now=2029), Watch), "the second restart counts from 2000"


def test_pods_outside_a_running_gang_never_end_it_and_are_reported_once():
    wait, reported = engine(WaitLimits(startup_timeout=30, poll_interval=5), ref=OWNED)
    running_gang = started("Running", running=3, pending=1)
    assert wait.job_read(running_gang, now=5000) == CheckPods(scheduling=False)
    board = owned(pod("train-tensorboard-0", "tensorboard", "Pending"))
    board["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                      "message": "0/3 nodes are available: 3 Insufficient cpu."}]
    board["status"]["containerStatuses"] = []
    gang = [owned(pod(f"train-{name}", name.split("-")[0], "Running")) for name in ("master-0", "worker-0", "worker-1")]
    for now in (5000, 5100, 9000):
        assert isinstance(wait.pods_seen([*gang, board], None, [], now=now), Watch)
    said = [line for line in reported if "outside its gang" in line]
    assert said == ["Volcano Job ml/train runs; pod(s) outside its gang (not needed to run it) still wait: "
                    "train-tensorboard-0 (0/3 nodes are available: 3 Insufficient cpu.)"]
    missing_image = owned(pod("train-tensorboard-0", "tensorboard", "Pending", waiting="ErrImagePull"))
    assert isinstance(wait.pods_seen([*gang, missing_image], None, [], now=9100), Watch), (
        "even an image that cannot exist, outside the gang, is only reported")


def test_an_image_that_cannot_exist_ends_the_start_at_once_only_when_the_gang_needs_it():
    wait, _ = engine(WaitLimits(poll_interval=5), ref=OWNED)
    wait.job_read(started("Pending", pending=4), now=1001)
    board = owned(pod("train-tensorboard-0", "tensorboard", "Pending", waiting="ErrImagePull"))
    assert isinstance(wait.pods_seen([board], None, [], now=1001), Watch), "TensorBoard is outside the gang"
    worker = owned(pod("train-worker-1", "worker", "Pending", waiting="ErrImagePull"))
    done = wait.pods_seen([board, worker], None, [], now=1006)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert "train-worker-1" in done.outcome.message and "not found" in done.outcome.message


def test_a_passing_registry_error_is_waited_out_for_image_pull_timeout_said_meanwhile():
    from .test_status import UNAVAILABLE

    wait, reported = engine(WaitLimits(poll_interval=5, image_pull_timeout=120), ref=OWNED)
    wait.job_read(started("Pending", pending=3), now=1001)
    backing_off = [owned(pod("train-master-0", "master", "Pending", waiting="ErrImagePull", message=UNAVAILABLE,
                             uid="m0"))]
    assert isinstance(wait.pods_seen(backing_off, None, [], now=1001), Watch)
    assert any("503 Service Unavailable" in line and "image_pull_timeout (120s)" in line for line in reported)
    backoff = [owned(pod("train-master-0", "master", "Pending", waiting="ImagePullBackOff",
                         message='Back-off pulling image "repo/img:1"', uid="m0"))]
    assert not isinstance(wait.pods_seen(backoff, None, [], now=1100), Done)
    pulled = [owned(pod("train-master-0", "master", "Pending", uid="m0"))]
    assert not isinstance(wait.pods_seen(pulled, None, [], now=1110), Done), "it pulled: the back-off starts anew"
    assert not isinstance(wait.pods_seen(backing_off, None, [], now=1200), Done), "new back-off since 1200"
    done = wait.pods_seen(backing_off, None, [], now=1320)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert "image_pull_timeout, 120s" in done.outcome.message


def test_a_final_cause_seen_once_stays_final_through_the_kubelets_back_off_message():
    wait, _ = engine(WaitLimits(poll_interval=5), ref=OWNED)
    wait.job_read(started("Pending", pending=3), now=1001)
    final = [owned(pod("train-master-0", "master", "Pending", waiting="ErrImagePull", uid="m0"))]
    backoff = [owned(pod("train-master-0", "master", "Pending", waiting="ImagePullBackOff",
                         message='Back-off pulling image "repo/img:1"', uid="m0"))]
    assert isinstance(wait.pods_seen(backoff, None, [], now=1001), Watch), "the back-off alone says no cause"
    done = wait.pods_seen(final, None, [], now=1006)
    assert isinstance(done, Done)


@pytest.mark.parametrize("skew", [-1200.0, 1200.0], ids=["waiter-behind", "waiter-ahead"])
def test_job_age_is_counted_on_the_apiservers_clock_whatever_the_waiters_says(skew):
    """The waiter's `now` is its own clock; the apiserver's time is `now + offset`. A waiter 20 minutes
    ahead (or behind) of the apiserver neither ends a Job early nor waits late."""
    # The apiserver's time is 1060 when the waiter's clock reads 1060 + skew.
    wait, _ = engine(WaitLimits(job_timeout=120, startup_timeout=900), server_offset=-skew, ref=OWNED)
    assert isinstance(wait.job_read(started("Running", running=3), now=1060 + skew), Watch)
    assert isinstance(wait.watch_ended(now=1119 + skew), Watch)
    done = wait.watch_ended(now=1121 + skew)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.JOB_TIMEOUT


def test_without_the_apiservers_clock_no_age_decides_anything_and_the_clock_is_read_again():
    from airflow_volcano.waiting.wait_engine import ReadClock

    wait, reported = engine(WaitLimits(job_timeout=60, startup_timeout=30), server_offset=None, ref=OWNED)
    assert wait.job_read(started("Running", running=3), now=99999) == ReadClock()
    action = wait.clock_read(None, now=99999)
    assert isinstance(action, Watch) and action.seconds <= 10, "asked again soon"
    assert "Cannot read the apiserver's clock" in reported[-1]
    assert wait.watch_ended(now=100010) == ReadClock()
    done = wait.clock_read(1100.0, now=100010)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.JOB_TIMEOUT, "100 s old on its clock"


def test_the_execution_timeout_deadline_is_compared_with_the_apiservers_clock():
    wait, _ = engine(deadline=2000.0, server_offset=-5000.0, ref=OWNED)  # the waiter reads 5000 s ahead
    assert isinstance(wait.job_read(started("Running", running=3), now=6500.0), Watch)
    done = wait.watch_ended(now=7001.0)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.DEADLINE


def test_another_job_of_the_same_name_is_never_taken_for_this_one():
    wait, _ = engine(ref=OWNED)
    assert isinstance(wait.job_read(started("Running", running=3), now=1010), Watch)
    assert wait.job_deleted("older-uid", now=1011) is None, "a stale deletion of an older Job of that name"
    assert wait.job_changed(started("Running", running=3, uid="newer-uid"), now=1012) == Reread(after=0.0), (
        "a change of another Job says nothing sure of this one: read it again")
    done = wait.job_read(started("Running", running=3, uid="newer-uid"), now=1013)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.DELETED
    assert done.outcome.message == ("Volcano Job ml/train (uid job-uid) was deleted: a Job of that name with another "
                                    "uid (newer-uid) exists now")
    again, _ = engine(ref=OWNED)
    again.job_read(started("Running", running=3), now=1010)
    gone = again.job_deleted("job-uid", now=1011)
    assert isinstance(gone, Done) and gone.outcome.verdict is Verdict.DELETED


def test_a_job_that_cannot_be_seen_is_waited_for_said_once():
    wait, reported = engine(ref=OWNED)
    wait.job_read(started("Running", running=3), now=1010)
    first = wait.job_unseen("get Job ml/train failed: HTTP 404 Not Found", now=1020)
    second = wait.job_unseen("get Job ml/train failed: HTTP 404 Not Found", now=1030)
    assert isinstance(first, Reread) and isinstance(second, Reread) and second.after >= first.after
    assert len([line for line in reported if line.startswith("Cannot see Volcano Job ml/train")]) == 1
    assert isinstance(wait.job_read(started("Running", running=3), now=1050), Watch), "seen again: the wait goes on"


def gated(body: dict, *gates: str) -> dict:
    body.setdefault("spec", {})["schedulingGates"] = [{"name": gate} for gate in gates]
    body["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                                     "message": "Scheduling is blocked due to non-empty scheduling gates"}]
    return body


def test_pods_held_by_scheduling_gates_are_named_with_whose_gate_it_is_and_in_the_startup_timeout_end():
    """Issue 45: a pod held by a scheduling gate (Volcano v1.15's queue gate, or anyone's) is never
    scheduled until the gate goes; the log says which gate holds which pod, and who removes it."""
    from airflow_volcano.status import VOLCANO_QUEUE_GATE, pod_view, pod_waiting_reason

    wait, reported = engine(WaitLimits(startup_timeout=30, poll_interval=5), ref=OWNED)
    assert wait.job_read(started("Pending", pending=3), now=1001) == CheckPods(scheduling=False)
    held = [owned(gated(pod("train-master-0", "master", "Pending"), VOLCANO_QUEUE_GATE)),
            owned(gated(pod("train-worker-0", "worker", "Pending"), "example.com/hold", VOLCANO_QUEUE_GATE)),
            owned(pod("train-worker-1", "worker", "Pending"))]
    assert isinstance(wait.pods_seen(held, None, [], now=1001), Watch)
    said = [line for line in reported if "scheduling gate" in line]
    assert said == [
        "Volcano Job ml/train: train-master-0 held by scheduling gate scheduling.volcano.sh/queue-allocation-gate "
        "(Volcano's: removed once the pod's queue has room for it); train-worker-0 held by scheduling gate "
        "example.com/hold (not Volcano's: removed by whoever added it), scheduling.volcano.sh/queue-allocation-gate "
        "(Volcano's: removed once the pod's queue has room for it); Kubernetes schedules a pod only once its gates "
        "are removed"], reported
    wait.pods_seen(held, None, [], now=1006)
    assert len([line for line in reported if "scheduling gate" in line]) == 1, "said once while it holds"
    assert pod_waiting_reason(pod_view(held[1])) == (
        "held by scheduling gate example.com/hold (not Volcano's: removed by whoever added it), "
        "scheduling.volcano.sh/queue-allocation-gate (Volcano's: removed once the pod's queue has room for it)"), (
        "the triggerer's slim copy of a pod keeps its gates")
    done = wait.pods_seen(held, None, [], now=1031)
    assert isinstance(done, Done) and done.outcome.verdict is Verdict.CANNOT_START
    assert "held by scheduling gates: train-master-0: scheduling.volcano.sh/queue-allocation-gate" in (
        done.outcome.message), done.outcome.message
