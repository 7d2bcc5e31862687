"""What leaves a trigger: its event, which Airflow logs and stores. A failed pod's status in it may carry
the container's last log lines (its termination message, FallbackToLogsOnError): the Job's secret env
values are masked there too, at any depth, and in the message; nothing else changes."""

from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_volcano.job_ref import JobRef
from airflow_volcano.observability.masking import JobSecrets
from airflow_volcano.status import pod_view
from airflow_volcano.waiting.events import Verdict, WaitOutcome

SECRET = "hf_event_token_0c4e9a"


def failed_pod(name: str, message: str) -> dict:
    return pod_view({"metadata": {"name": name, "labels": {"volcano.sh/task-spec": "master"}},
                     "status": {"phase": "Failed", "containerStatuses": [{"name": "master", "state": {"terminated": {
                         "exitCode": 137, "reason": "Error", "message": message}}}]}})


def test_a_failed_pods_last_words_and_the_message_are_masked_in_the_event():
    secrets = JobSecrets()
    secrets.add([("HF_TOKEN", SECRET)])
    outcome = WaitOutcome(Verdict.CANNOT_START, message=f"could not start with {SECRET}", phase="Failed",
                          failed_pods={"leak-master-0": failed_pod("leak-master-0", f"connecting with {SECRET}\n")})

    event = outcome.masked(secrets.redact).to_event(JobRef(name="leak", namespace="ml"))

    assert SECRET not in json.dumps(event)
    [pod] = event["failed_pods"]
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "connecting with ***\n"
    assert event["message"] == "could not start with ***"
    restored, _ref = WaitOutcome.from_event(event)
    assert restored.failed_pods["leak-master-0"]["status"]["phase"] == "Failed", "the rest as it was"


def test_without_secrets_the_event_is_unchanged():
    outcome = WaitOutcome(Verdict.FINISHED, phase="Failed",
                          failed_pods={"a-master-0": failed_pod("a-master-0", "plain words")})
    ref = JobRef(name="a", namespace="ml")
    assert outcome.masked(JobSecrets().redact).to_event(ref) == outcome.to_event(ref)


@pytest.mark.parametrize("value", [WaitOutcome(Verdict.FINISHED, phase="Completed"), JobRef(name="j", namespace="ml")],
                         ids=lambda value: type(value).__name__)
def test_the_values_that_cross_between_the_waiters_are_frozen(value):
    """What travels between the worker, the triggerer and submission is changed by copying it
    (dataclasses.replace), never in place."""
    for item in dataclasses.fields(value):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, item.name, None)
