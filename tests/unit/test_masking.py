"""The masking helpers (masking.py): the worker writes where the values its Airflow masker knows sit in the
Job, never the values; any other process (a triggerer, the panel's API server, a resumed worker) reads them
back from the Job and masks them; values only (no name-based redaction of results), at any depth."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk._shared.secrets_masker import SecretsMasker

from airflow_volcano.constants import OnFinishAction
from airflow_volcano.exceptions import VolcanoJobError
from airflow_volcano.observability import masking
from airflow_volcano.observability.masking import (
    MASKED_ANNOTATION,
    JobSecrets,
    mark_masked_places,
    masked_values,
    secret_values,
)
from airflow_volcano.ownership.finalize import finalize
from airflow_volcano.waiting.events import Verdict, WaitOutcome

from .test_finalize import REF, Hook

VARIABLE = "hf_v4r_unit_5e6f7a8b9c"  # a Variable the worker rendered into the Job
PASSWORD = "pa$w0rd_unit_1234"  # a connection password, with a `$` (written `$$` in a container string)


def use_masker(monkeypatch: pytest.MonkeyPatch, *secrets: str) -> SecretsMasker:
    """This process's Airflow masker, knowing `secrets` (a process of its own: the worker, or another)."""
    masker = SecretsMasker()
    for secret in secrets:
        masker.add_mask(secret)
    monkeypatch.setattr(masking, "_masker_getter", lambda: lambda: masker)
    return masker


def a_job() -> dict[str, Any]:
    container = {"name": "master", "image": "train:1", "args": ["--token", VARIABLE, "--pw=pa$$w0rd_unit_1234"],
                 "env": [{"name": "PLAIN", "value": f"x-{VARIABLE}"}, {"name": "RANK", "value": "0"}]}
    return {"metadata": {"name": "train", "namespace": "ml", "annotations": {"example.com/a~b": "no secret"}},
            "spec": {"tasks": [{"name": "master", "replicas": 1, "template": {"spec": {"containers": [container]}}}]}}


def test_the_worker_marks_where_its_maskers_values_sit_and_another_process_masks_them_from_the_job_alone(
        monkeypatch):
    use_masker(monkeypatch, VARIABLE, PASSWORD, "hf_not_in_the_job_000")
    job = a_job()
    assert mark_masked_places(job) == 2, "one place per value in the Job; a value not in it has none"
    annotation = job["metadata"]["annotations"][MASKED_ANNOTATION]
    assert VARIABLE not in annotation and "w0rd_unit" not in annotation, "places, never values"
    assert json.loads(annotation) == [["/spec/tasks/0/template/spec/containers/0/args/1", 0, len(VARIABLE)],
                                      ["/spec/tasks/0/template/spec/containers/0/args/2", 5, 5 + len(PASSWORD)]]

    use_masker(monkeypatch)  # a triggerer, the API server: their masker never read the Variable
    read_back = json.loads(json.dumps(job))  # as the apiserver returns it
    assert dict(secret_values(read_back)) == {"/spec/tasks/0/template/spec/containers/0/args/1": VARIABLE,
                                              "/spec/tasks/0/template/spec/containers/0/args/2": PASSWORD}
    line = f"using {VARIABLE} and {PASSWORD}, again {VARIABLE}"
    assert JobSecrets.of(read_back).redact(line) == "using *** and ***, again ***"
    del read_back["metadata"]["annotations"][MASKED_ANNOTATION]
    assert JobSecrets.of(read_back).redact(line) == line, "the Job's annotation is what carries them"


def test_a_place_that_is_not_there_or_an_annotation_that_is_not_the_providers_masks_nothing(monkeypatch):
    use_masker(monkeypatch)
    job = a_job()
    for forged in ("not json", '{"a": 1}', '[["/spec/tasks/0/template/spec/containers/0/args/1", 0, 999]]',
                   '[["/spec/tasks/7/name", 0, 3], ["/metadata/name", 3, 1], ["metadata/name", 0, 2], [1, 2, 3]]',
                   '[["/spec/tasks/0/replicas", 0, 1], ["/spec/tasks/0/template/spec/containers/0/args/x", 0, 1]]'):
        job["metadata"]["annotations"][MASKED_ANNOTATION] = forged
        assert masked_values(job) == (), forged
    job["metadata"]["annotations"][MASKED_ANNOTATION] = json.dumps(
        [["/metadata/annotations/example.com~1a~0b", 3, 9]] * (masking.MAX_MASKED_PLACES + 10))
    assert masked_values(job)[0] == ("/metadata/annotations/example.com~1a~0b", "secret"), "RFC 6901 escapes"
    assert len(masked_values(job)) == masking.MAX_MASKED_PLACES, "bounded work, whatever the annotation"


def test_without_airflows_masker_nothing_is_marked_and_the_caller_says_so(monkeypatch):
    monkeypatch.setattr(masking, "_masker_getter", lambda: None)
    job = a_job()
    job["metadata"]["annotations"][MASKED_ANNOTATION] = "[]"  # an earlier build's: not kept
    assert mark_masked_places(job) is None
    assert MASKED_ANNOTATION not in job["metadata"]["annotations"]
    assert JobSecrets().redact(f"a {VARIABLE}") == f"a {VARIABLE}"


def test_values_are_masked_at_any_depth_and_only_values_never_by_a_keys_name(monkeypatch):
    use_masker(monkeypatch, VARIABLE)
    result = {"tokens_per_second": 812.5, "password_len": 12, "api_key_id": "k-1",
              "runs": [{"config": {"argv": ["--token", VARIABLE], "deep": [[[f"uri?token={VARIABLE}"]]]}}]}
    assert JobSecrets().redact(result) == {
        "tokens_per_second": 812.5, "password_len": 12, "api_key_id": "k-1",
        "runs": [{"config": {"argv": ["--token", "***"], "deep": [[["uri?token=***"]]]}}]}


def test_the_result_the_panel_and_the_error_a_resumed_worker_reports_are_masked_with_the_jobs_secrets(monkeypatch):
    """A resumed worker (or one whose masker lost the Variable) learns it from the Job it reads back."""
    use_masker(monkeypatch, VARIABLE)
    job = a_job()
    mark_masked_places(job)
    use_masker(monkeypatch)
    job["status"] = {"state": {"phase": "Completed"}}
    hook = Hook()
    hook.master["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(
        {"model_uri": f"hf://m?token={VARIABLE}", "eval_loss": 0.25})
    pushed: dict[str, Any] = {}
    done = finalize(hook, REF, WaitOutcome(Verdict.FINISHED, phase="Completed", job=job),
                    on_finish_action=OnFinishAction.KEEP_JOB, push_xcom=pushed.__setitem__)
    assert done["result"] == {"model_uri": "hf://m?token=***", "eval_loss": 0.25}

    job["status"] = {"state": {"phase": "Failed"}}
    hook = Hook(pod_log=f"2026-11-24T10:00:00Z connecting with {VARIABLE}\n".encode())
    with pytest.raises(VolcanoJobError) as raised:
        finalize(hook, REF, WaitOutcome(Verdict.FINISHED, phase="Failed", job=job),
                 on_finish_action=OnFinishAction.KEEP_JOB, push_xcom=pushed.__setitem__)
    assert "connecting with ***" in str(raised.value) and VARIABLE not in str(raised.value)
    assert "connecting with ***" in pushed["volcano_panel"]["failure"]
    assert VARIABLE not in json.dumps(pushed, default=str)
    with pytest.raises(VolcanoJobError) as raised:
        finalize(hook, REF, WaitOutcome(Verdict.WAIT_FAILED, message=f"KeyError: {VARIABLE}", job=job),
                 on_finish_action=OnFinishAction.KEEP_JOB)
    assert str(raised.value).endswith("failed: KeyError: ***")


@pytest.mark.openlineage
def test_the_operator_marks_the_job_it_builds_and_masks_its_lineage_facets(monkeypatch, tmp_path):
    from .test_lineage import serialized, training

    use_masker(monkeypatch, VARIABLE)
    task = training(tmp_path, args=["--token", VARIABLE])
    task.render_template_fields({"params": {}, "run_id": "manual"})
    places = json.loads(task._manifests.job["metadata"]["annotations"][MASKED_ANNOTATION])
    assert [pointer for pointer, _start, _end in places] == ["/spec/tasks/0/template/spec/containers/0/args/1"]

    task._lineage_run = {"uid": "u-1", "namespace": "ml", "name": "x", "phase": "Failed", "restarts": 0,
                         "failure": f"Volcano Job ml/x failed: refused {VARIABLE}"}
    failed = task.get_openlineage_facets_on_failure(None)
    assert failed.run_facets["volcanoRun"].failure == "Volcano Job ml/x failed: refused ***"
    assert VARIABLE not in serialized(failed)


def test_the_uis_view_of_a_job_leaves_out_the_restart_budgets_annotation_and_dry_run_keeps_it():
    from airflow_volcano.constants import RETRY_BUDGET_ANNOTATION
    from airflow_volcano.manifest.retry_budget import apply_retry_budget
    from airflow_volcano.observability.masking import shown

    job = {"metadata": {"name": "t", "annotations": {"team": "a"}}, "spec": {"maxRetry": 3, "tasks": []}}
    apply_retry_budget(job, 10)
    assert shown(job)["metadata"]["annotations"] == {"team": "a"} and shown(job)["spec"]["maxRetry"] == 14
    assert RETRY_BUDGET_ANNOTATION in shown(job, whole=True)["metadata"]["annotations"], "what is applied, whole"
    del job["metadata"]["annotations"]["team"]
    assert "annotations" not in shown(job)["metadata"]
    assert RETRY_BUDGET_ANNOTATION in job["metadata"]["annotations"], "the Job itself is left as it is"
