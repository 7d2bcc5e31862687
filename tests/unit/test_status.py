"""Status interpretation: what a user reads when a Job ends."""

from __future__ import annotations

import pytest

from airflow_volcano.job_ref import JobRef
from airflow_volcano.status import (
    JobProgress,
    Outcome,
    PodLogTail,
    failure_message,
    job_state,
    unschedulable_message,
)
from airflow_volcano.waiting.wait_engine import WaitLimits, startup_problem


def job(phase: str | None, **status: int) -> dict:
    body = {"metadata": {"name": "train", "namespace": "ml", "resourceVersion": "7"}, "status": dict(status)}
    if phase:
        body["status"]["state"] = {"phase": phase}
    return body


# What the kubelet says of an image the registry does not have (containerd's words).
NOT_FOUND = ('rpc error: code = NotFound desc = failed to pull and unpack image "repo/img:1": failed to resolve '
             'reference "repo/img:1": repo/img:1: not found')
# ... and of a registry that answers 503: it may pass.
UNAVAILABLE = ('rpc error: code = Unknown desc = failed to pull and unpack image "repo/img:1": failed to resolve '
               'reference "repo/img:1": unexpected status from HEAD request to https://repo/v2/img/manifests/1: '
               '503 Service Unavailable')


def pod(name: str, task: str, phase: str, *, exit_code: int | None = None, reason: str | None = None,
        waiting: str | None = None, finished: str | None = None, message: str = NOT_FOUND,
        uid: str | None = None) -> dict:
    state: dict = {"running": {}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": finished}}
    if waiting:
        state = {"waiting": {"reason": waiting, "message": message}}
    return {
        "metadata": {"name": name, "labels": {"volcano.sh/task-spec": task}, **({"uid": uid} if uid else {})},
        "status": {"phase": phase, "containerStatuses": [{"name": task, "image": "repo/img:1", "state": state}]},
    }


def test_phases_map_to_outcomes():
    assert job_state(job("Completed")).outcome is Outcome.SUCCEEDED
    for phase in ("Failed", "Terminated", "Aborted"):
        assert job_state(job(phase)).outcome is Outcome.FAILED
    assert job_state(job("Running")).outcome is Outcome.RUNNING
    assert job_state(job("Completing")).finished is False
    assert job_state(job(None)).phase == "Pending"


def test_success_is_decided_by_phase_not_by_counters():
    # Volcano can report succeeded=0 after it deletes pods of a finished Job.
    assert job_state(job("Completed", succeeded=0, failed=0)).outcome is Outcome.SUCCEEDED


def test_failure_message_names_pod_exit_code_reason_log_and_warnings():
    pods = [pod("train-master-0", "master", "Running"),
            pod("train-worker-1", "worker", "Failed", exit_code=137, reason="OOMKilled")]
    events = [{"type": "Warning", "reason": "PodFailed", "message": "worker died",
               "involvedObject": {"kind": "Job", "name": "train"}},
              {"type": "Normal", "reason": "Scheduled", "message": "fine", "involvedObject": {"kind": "Pod"}}]
    logs = {"train-worker-1": PodLogTail(lines=("Traceback", "MemoryError"), last_ns=None)}
    text = failure_message(job_state(job("Failed", retryCount=2)), pods=pods, events=events, main_task="master",
                           logs=logs)
    assert "ml/train ended in phase Failed after 2 restart(s): pod train-worker-1 failed (exit code 137)" in text
    assert "Last 2 log lines of train-worker-1:" in text
    assert "train-worker-1 (task worker) Failed, container worker, exit code 137, reason OOMKilled" in text
    assert "| MemoryError" in text
    assert "Job/train: PodFailed: worker died" in text
    assert "fine" not in text


def test_unschedulable_message_comes_from_the_podgroup_condition():
    podgroup = {"status": {"conditions": [{"type": "Unschedulable", "status": "True",
                                           "message": "0/2 nodes are unavailable: 2 Insufficient nvidia.com/gpu."}]}}
    assert "Insufficient nvidia.com/gpu" in unschedulable_message(podgroup)
    assert unschedulable_message({"status": {}}) is None


def test_an_image_that_cannot_exist_is_a_startup_problem_at_once_and_a_passing_registry_error_is_not():
    ref = JobRef("train", "ml")
    problem = startup_problem(ref, [pod("train-master-0", "master", "Pending", waiting="ErrImagePull")],
                              None, WaitLimits(startup_timeout=600), waited=1)
    assert "cannot start" in problem and "repo/img:1" in problem and "not found" in problem
    passing = [pod("train-master-0", "master", "Pending", waiting="ErrImagePull", message=UNAVAILABLE)]
    limits = WaitLimits(startup_timeout=600, image_pull_timeout=120)
    assert startup_problem(ref, passing, None, limits, waited=119) is None
    assert "503 Service Unavailable" in startup_problem(ref, passing, None, limits, waited=120)


@pytest.mark.parametrize(("reason", "message", "final"), [
    ("ErrImagePull", NOT_FOUND, True),
    ("ErrImagePull", "failed to resolve reference: pull access denied, repository does not exist or may require "
                     "authorization: server message: insufficient_scope: authorization failed", True),
    ("ErrImagePull", "failed to fetch anonymous token: unexpected status: 401 Unauthorized", True),
    ("ErrImagePull", "manifest unknown: manifest unknown", True),
    ("InvalidImageName", 'Failed to apply default image tag "Repo/IMG": invalid reference format', True),
    ("ErrImageNeverPull", 'Container image "repo/img:1" is not present with pull policy of Never', True),
    ("ErrImagePull", UNAVAILABLE, False),
    ("ErrImagePull", "unexpected status: 429 Too Many Requests", False),
    ("ErrImagePull", 'dial tcp 10.0.0.9:443: connect: connection refused', False),
    ("ImagePullBackOff", 'Back-off pulling image "repo/img:1"', False),
])
def test_which_pull_errors_are_final(reason, message, final):
    from airflow_volcano.status import pod_problem, pull_is_final

    problem = pod_problem(pod("train-master-0", "master", "Pending", waiting=reason, message=message))
    assert problem is not None and pull_is_final(problem) is final


def test_startup_timeout_reports_pending_pods_with_the_scheduler_reason():
    ref = JobRef("train", "ml")
    pods = [pod("train-master-0", "master", "Pending")]
    podgroup = {"status": {"conditions": [{"type": "Unschedulable", "status": "True", "message": "no GPUs"}]}}
    assert startup_problem(ref, pods, podgroup, WaitLimits(startup_timeout=60), waited=30) is None
    text = startup_problem(ref, pods, podgroup, WaitLimits(startup_timeout=60), waited=61)
    assert "did not start within startup_timeout (60s): no GPUs (pending pods: train-master-0)" in text


def test_a_gang_is_blocked_only_by_pods_it_needs():
    from airflow_volcano.status import gang_cannot_form

    pytorch = {"spec": {"minAvailable": 3, "tasks": [{"name": "master", "replicas": 1, "minAvailable": 1},
                                                     {"name": "worker", "replicas": 2, "minAvailable": 2},
                                                     {"name": "tensorboard", "replicas": 1, "minAvailable": 0}]}}
    assert gang_cannot_form(pytorch, [pod("train-worker-1", "worker", "Pending")])
    assert not gang_cannot_form(pytorch, [pod("train-tensorboard-0", "tensorboard", "Pending")])
    elastic = {"spec": {"minAvailable": 2, "tasks": [{"name": "master", "replicas": 1, "minAvailable": 1},
                                                     {"name": "worker", "replicas": 3, "minAvailable": 1}]}}
    assert not gang_cannot_form(elastic, [pod("train-worker-2", "worker", "Pending")]), "a worker above minAvailable"
    assert gang_cannot_form(elastic, [pod(f"train-worker-{i}", "worker", "Pending") for i in range(3)])
    assert gang_cannot_form({"spec": {}}, [pod("x-0", "x", "Pending")]), "unknown gang: every pod is needed"


def _job(phase: str, running: int = 0, retries: int = 0) -> dict:
    return {"metadata": {"name": "train", "namespace": "ml"},
            "spec": {"maxRetry": 3, "tasks": [{"name": "master", "replicas": 1}, {"name": "worker", "replicas": 2}]},
            "status": {"state": {"phase": phase}, "running": running, "retryCount": retries}}


def test_progress_says_each_phase_change_once():
    progress = JobProgress()
    seen = [progress.observe(job) for job in (
        _job("Pending"), _job("Pending", running=1), _job("Running", running=3), _job("Running", running=3),
        _job("Restarting", retries=1), _job("Pending", retries=1), _job("Running", 3, retries=1),
        _job("Completing", 3, retries=1), _job("Completed", retries=1),
    )]
    assert seen == [
        "Volcano Job ml/train is Pending: 0/3 pods running",
        None,
        "Volcano Job ml/train is Running: 3/3 pods running",
        None,
        "Volcano Job ml/train is Restarting (1 restart(s) so far; max_retry 3)",
        "Volcano Job ml/train is Pending: 0/3 pods running (1 restart(s) so far; max_retry 3)",
        "Volcano Job ml/train is Running: 3/3 pods running (1 restart(s) so far; max_retry 3)",
        "Volcano Job ml/train is Completing (1 restart(s) so far; max_retry 3)",
        "Volcano Job ml/train is Completed (1 restart(s) so far; max_retry 3)",
    ]


def test_progress_gives_the_schedulers_reason_while_pending_once_per_reason():
    progress = JobProgress()
    pending = _job("Pending")
    progress.observe(pending)
    assert progress.scheduler_reason(pending, None) is None
    assert progress.scheduler_reason(pending, "3/3 tasks in gang unschedulable: Insufficient cpu") == (
        "Volcano Job ml/train is Pending, the scheduler says: 3/3 tasks in gang unschedulable: Insufficient cpu")
    assert progress.scheduler_reason(pending, "3/3 tasks in gang unschedulable: Insufficient cpu") is None
    assert progress.scheduler_reason(_job("Running", 3), "stale reason") is None


def test_api_errors_read_as_sentences_without_headers():
    import json
    from types import SimpleNamespace

    from airflow_volcano.exceptions import VolcanoApiError

    forbidden = SimpleNamespace(status=403, reason="Forbidden", headers={"Audit-Id": "x"}, body=(
        '{"kind":"Status","message":"jobs.batch.volcano.sh is forbidden: User \\"u\\" cannot list resource '
        '\\"jobs\\" in API group \\"batch.volcano.sh\\" in the namespace \\"ml\\"","code":403}'))
    text = str(VolcanoApiError.from_api_exception("list Jobs in ml", forbidden))
    assert text.startswith('list Jobs in ml failed: HTTP 403 Forbidden: jobs.batch.volcano.sh is forbidden: User "u"')
    assert "deploy/rbac.yaml" in text and "Audit-Id" not in text
    # An admission policy's refusal: RBAC allowed it, so no permission is missing; its message says why.
    refused = SimpleNamespace(status=403, reason="Forbidden", body=json.dumps({"message": (
        "pods \"theirs\" is forbidden: ValidatingAdmissionPolicy 'airflow-volcano-own-objects' with binding "
        "'airflow-volcano-own-objects' denied request: system:serviceaccount:ml:airflow-volcano may delete only "
        "its own pods, Volcano Jobs and ConfigMaps (labelled app.kubernetes.io/managed-by=airflow-volcano): "
        "Pod ml/theirs is not labelled so")}))
    text = str(VolcanoApiError.from_api_exception("delete pod ml/theirs", refused))
    assert text.startswith("delete pod ml/theirs failed: HTTP 403 Forbidden: pods \"theirs\" is forbidden: "
                           "ValidatingAdmissionPolicy") and text.endswith("Pod ml/theirs is not labelled so")
    unreadable = SimpleNamespace(status=500, reason="Internal Server Error", body=b"<html>oops</html>")
    assert str(VolcanoApiError.from_api_exception("get Job ml/x", unreadable)) == (
        "get Job ml/x failed: HTTP 500 Internal Server Error")


def test_termination_message_is_the_result_json_if_it_parses():
    from airflow_volcano.status import termination_result

    def pod(message: str | None, container: str = "master") -> dict:
        terminated = {"exitCode": 0} | ({"message": message} if message is not None else {})
        return {"status": {"containerStatuses": [{"name": container, "state": {"terminated": terminated}}]}}

    assert termination_result(pod('{"loss": 0.12, "model_uri": "s3://m/1"}'), "master") == {
        "loss": 0.12, "model_uri": "s3://m/1"}
    assert termination_result(pod("model at s3://m/1\n"), "master") == "model at s3://m/1"
    assert termination_result(pod(None), "master") is None
    assert termination_result(pod('{"loss": 1}', container="pytorch"), "master") is None
    assert termination_result(None, "master") is None


def test_a_gang_being_bound_is_not_a_reason_to_wait():
    binding = {"status": {"conditions": [{"type": "Unschedulable", "status": "True",
                                          "message": "0/3 tasks in gang unschedulable: pod group is ready, 3 Binding, "
                                                     "3 minAvailable"}]}}
    assert unschedulable_message(binding) is None


def test_failure_message_says_an_exit_code_was_not_retryable_and_when_the_budget_is_exhausted():
    from airflow_volcano.manifest import exit_code_policies

    terminated = job("Terminated")
    terminated["spec"] = {"maxRetry": 3, "policies": exit_code_policies([137, 143], "job")}
    text = failure_message(job_state(terminated), pods=[pod("train-worker-0", "worker", "Failed", exit_code=1,
                                                            reason="Error")], main_task="master")
    assert "ml/train ended in phase Terminated: pod train-worker-0 failed (exit code 1)\n" in text
    assert ("Exit code 1 of pod train-worker-0 is not one of retryable_exit_codes (137, 143): the Job was ended "
            "without a restart.") in text

    exhausted = job("Failed", retryCount=3)
    exhausted["spec"] = {"maxRetry": 3, "policies": exit_code_policies([137], "job")}
    text = failure_message(job_state(exhausted), pods=[pod("train-worker-0", "worker", "Failed", exit_code=137,
                                                           reason="Error")], main_task="master")
    assert "ended in phase Failed after 3 restart(s): the retry budget is exhausted (max_retry 3)" in text
    assert "not one of retryable_exit_codes" not in text



def test_the_trigger_event_survives_its_dict_form_and_reads_an_older_one():
    from airflow_volcano.observability.logs import LogCursor
    from airflow_volcano.waiting.events import Verdict, WaitOutcome

    ref = JobRef(name="train", namespace="ml")
    event = WaitOutcome(Verdict.JOB_TIMEOUT, message="job_timeout of 60s passed", log_cursor=LogCursor(lines_shown=3))
    payload = event.to_event(ref)
    assert payload["verdict"] == "job_timeout" and WaitOutcome.from_event(payload) == (event, ref)
    older, older_ref = WaitOutcome.from_event({"status": "finished", "phase": "Completed", "job": ref.to_dict()})
    assert (older.verdict, older.describe(), older.log_cursor) == (Verdict.FINISHED, "Completed", LogCursor())
    assert older_ref == ref
    # An older release's other statuses read as the verdicts they meant.
    assert [WaitOutcome.from_event({"status": status, "message": message, "job": ref.to_dict()})[0].verdict
            for status, message in (("timeout", "the task's execution_timeout passed"), ("problem", "x"),
                                    ("error", "Volcano Job ml/train was deleted"), ("error", "HTTP 403"),
                                    ("stalled", "x"))] == [
        Verdict.DEADLINE, Verdict.CANNOT_START, Verdict.DELETED, Verdict.WAIT_FAILED, Verdict.STALLED]


def log_tail(*lines: tuple[str, str]) -> PodLogTail:
    """A log tail from (time, message) pairs, as read with timestamps."""
    return PodLogTail.from_raw(f"2026-11-24T10:02:{at}Z {message}" for at, message in lines)


def test_the_pod_that_failed_first_heads_the_report_and_its_peers_follow_as_consequences():
    # Rank 1 raises; within the same second ranks 0 and 2 die of the closed connection. The API lists
    # the master first; the kubelet's seconds cannot tell them apart; the logs can.
    pods = [pod("t-master-0", "master", "Failed", exit_code=1, reason="Error", finished="2026-11-24T10:02:03Z"),
            pod("t-worker-0", "worker", "Failed", exit_code=1, reason="Error", finished="2026-11-24T10:02:03Z"),
            pod("t-worker-1", "worker", "Failed", exit_code=1, reason="Error", finished="2026-11-24T10:02:03Z")]
    gloo = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.88.0.9]:41"
    logs = {"t-master-0": log_tail(("02.100", "epoch 3"), ("03.400120", "Traceback"), ("03.400130", gloo)),
            "t-worker-0": log_tail(("03.400110", "Traceback"), ("03.400111", gloo)),
            "t-worker-1": log_tail(("02.900", "Traceback (most recent call last):"),
                                   ("02.900001", "ValueError: bad batch"))}
    text = failure_message(job_state(job("Terminated")), pods=pods, main_task="master", logs=logs)
    lines = text.splitlines()
    assert lines[0] == ("Volcano Job ml/train ended in phase Terminated: pod t-worker-1 failed first "
                        "(exit code 1 at 10:02:03 UTC); 2 pod(s) failed after it")
    assert text.index("ValueError: bad batch") < text.index("Failed pods, in the order they ended:")
    assert "Last 2 log lines of t-worker-1:" in text
    consequences = lines[lines.index("Failed pods, in the order they ended:") + 1:]
    assert consequences[0].startswith("  - pod t-worker-1 ") and consequences[0].endswith("(first: the likely cause)")
    assert consequences[1].startswith("  - pod t-worker-0 ") and consequences[1].endswith(f"its last line: {gloo}")
    assert consequences[2].startswith("  - pod t-master-0 ")


def test_a_rank_that_lost_its_peer_comes_after_the_one_that_failed_even_if_its_container_ended_sooner():
    # Seen on the real node: the peers' containers ended before the failed rank's own process had exited.
    pods = [pod("t-master-0", "master", "Failed", exit_code=1, finished="2026-11-24T10:02:04Z"),
            pod("t-worker-0", "worker", "Failed", exit_code=1, finished="2026-11-24T10:02:06Z")]
    logs = {"t-master-0": log_tail(("03", "RuntimeError: [gloo] Connection closed by peer")),
            "t-worker-0": log_tail(("02", "ValueError: x"))}
    text = failure_message(job_state(job("Terminated")), pods=pods, main_task="master", logs=logs)
    assert "pod t-worker-0 failed first (exit code 1 at 10:02:06 UTC); 1 pod(s) failed after it" in text


def test_without_a_lost_peer_the_pod_that_ended_first_comes_first():
    pods = [pod("t-master-0", "master", "Failed", exit_code=1, finished="2026-11-24T10:02:05Z"),
            pod("t-worker-0", "worker", "Failed", exit_code=2, finished="2026-11-24T10:02:04Z")]
    text = failure_message(job_state(job("Terminated")), pods=pods, main_task="master")
    assert "pod t-worker-0 failed first (exit code 2 at 10:02:04 UTC); 1 pod(s) failed after it" in text


def test_a_pod_volcano_removed_is_reported_from_its_last_state_with_its_log_tail_from_the_termination_message():
    from airflow_volcano.status import pod_problem, pod_view

    removed = pod("t-worker-0", "worker", "Failed", exit_code=1, reason="Error", finished="2026-11-24T10:02:03Z")
    terminated = removed["status"]["containerStatuses"][0]["state"]["terminated"]
    terminated["message"] = "Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: shard 1\n"
    problem = pod_problem(pod_view(removed))
    assert problem.log_tail == ("Traceback (most recent call last):", '  File "train.py", line 9',
                                "ValueError: shard 1")
    assert problem.message is None, "a log tail is shown as the log, not squeezed into the pod's line"
    one_line = pod("t-worker-1", "worker", "Failed", exit_code=1)
    one_line["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = "{\"loss\": 0.1}"
    assert pod_problem(one_line).message == "{\"loss\": 0.1}" and pod_problem(one_line).log_tail == ()


def test_a_retryable_exit_that_spent_the_budget_is_named_as_such():
    from airflow_volcano.manifest import exit_code_policies

    exhausted = job("Failed", retryCount=3)
    exhausted["spec"] = {"maxRetry": 3, "policies": exit_code_policies([137, 143], "job")}
    pods = [pod("t-worker-1", "worker", "Failed", exit_code=137, reason="OOMKilled", finished="2026-11-24T10:02:03Z")]
    text = failure_message(job_state(exhausted), pods=pods, main_task="master")
    assert text.splitlines()[0] == (
        "Volcano Job ml/train ended in phase Failed after 3 restart(s): the retry budget is exhausted (max_retry 3): "
        "pod t-worker-1 failed (exit code 137 at 10:02:03 UTC, retryable)")

    evicted = {"metadata": {"name": "t-master-0", "labels": {"volcano.sh/task-spec": "master"}},
               "status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
                          "conditions": [{"type": "Ready", "status": "False",
                                          "lastTransitionTime": "2026-11-24T10:01:00Z"}]}}
    text = failure_message(job_state(exhausted), pods=[*pods, evicted], main_task="master")
    assert ("pod t-master-0 was evicted first (reason Evicted at 10:01:00 UTC, retryable); 1 pod(s) failed "
            "after it") in text


def test_a_failed_pod_replaced_by_a_later_attempts_pod_of_its_name_is_still_the_one_reported():
    from airflow_volcano.status import failures_not_listed

    failed = {"t-worker-0": pod("t-worker-0", "worker", "Failed", exit_code=1, reason="Error", uid="first"),
              "t-worker-1": pod("t-worker-1", "worker", "Failed", exit_code=1, reason="Error", uid="w1"),
              "t-master-0": pod("t-master-0", "master", "Failed", exit_code=143, reason="Error", uid="m-first")}
    listed = [pod("t-worker-0", "worker", "Running", uid="second"),  # the restart's: the failure is the first's
              pod("t-worker-1", "worker", "Failed", exit_code=1, reason="Error", uid="w1"),  # the same pod: as listed
              pod("t-master-0", "master", "Failed", exit_code=1, reason="Error", uid="m-second")]  # failed again
    assert failures_not_listed(listed, failed) == {"t-worker-0": failed["t-worker-0"]}
    assert failures_not_listed([], failed) == failed, "removed since: each as last seen"
