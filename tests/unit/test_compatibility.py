"""Fitting a Job to the cluster's Volcano release (manifest.compatibility): what each release's Job
schema tells, what an older pytorch plugin cannot run (refused before submitting), and the WORLD_SIZE
an older plugin gets wrong (set by the operator's launch shell instead)."""

from __future__ import annotations

import copy
import os
import subprocess

import pytest

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.kubelet import process_string
from airflow_volcano.manifest.compatibility import WORLD_SIZE_ENV, VolcanoFeatures, fit_to_volcano
from airflow_volcano.manifest.pod_runtime import signal_forwarding_command

from .test_manifest import SCRIPT, build, build_template, task

# The Job kind's schema as the apiserver publishes it, reduced to what tells the releases apart
# (the CRDs of volcano.sh/volcano v1.10.0, v1.12.0 and v1.14.0, config/crd/volcano/bases).
SPEC_1_10 = {"maxRetry": {}, "minAvailable": {}, "plugins": {}, "policies": {}, "queue": {},
             "tasks": {"items": {"properties": {"name": {}, "replicas": {}, "template": {}, "topologyPolicy": {}}}}}
SPEC_1_12 = {**SPEC_1_10, "networkTopology": {}}
SPEC_1_14 = {**SPEC_1_12, "tasks": {"items": {"properties": {
    **SPEC_1_10["tasks"]["items"]["properties"], "partitionPolicy": {}}}}}


def from_schema(spec: dict) -> VolcanoFeatures:
    return VolcanoFeatures.from_job_schema({"properties": {"spec": {"properties": spec}}}, "the Job CRD's schema")


V1_10 = from_schema(SPEC_1_10)
V1_12 = from_schema(SPEC_1_12)
V1_14 = from_schema(SPEC_1_14)
UNKNOWN = VolcanoFeatures.unknown("/openapi/v3/apis/batch.volcano.sh/v1alpha1 could not be read: 403 Forbidden")


def test_the_job_schema_tells_the_releases_apart_where_the_plugin_changed():
    assert V1_10.describe() == "Volcano before 1.12 (the Job CRD's schema)"
    assert V1_12.describe() == "Volcano 1.12 to before 1.14 (the Job CRD's schema)"
    assert V1_14.describe() == "Volcano 1.14 or later (the Job CRD's schema)"
    assert (V1_10.at_least((1, 12)), V1_12.at_least((1, 12)), V1_14.at_least((1, 12))) == (False, True, True)
    assert (V1_10.at_least((1, 14)), V1_12.at_least((1, 14)), V1_14.at_least((1, 14))) == (False, False, True)
    assert UNKNOWN.at_least((1, 12)) is None
    for features in (V1_10, V1_12, V1_14, UNKNOWN):
        assert VolcanoFeatures.from_dict(features.to_dict()) == features


@pytest.mark.parametrize(("text", "describe", "has_wait_master"), [
    ("1.10", "1.10", False), ("v1.14.1", "1.14", True), ("1.12.0-rc.1", "1.12", False), (" v1.15 ", "1.15", True),
])
def test_a_configured_version_is_exact(text, describe, has_wait_master):
    features = VolcanoFeatures.from_version(text, "connection extra volcano_version")
    assert features.describe() == f"Volcano {describe} (connection extra volcano_version)"
    assert features.at_least((1, 14)) is has_wait_master


def test_a_configured_version_that_is_not_one_is_refused_naming_the_setting():
    with pytest.raises(JobSpecError, match=r"volcano_version: 'latest' is not a Volcano release"):
        VolcanoFeatures.from_version("latest", "connection extra volcano_version")


def test_wait_for_master_is_refused_before_1_14_naming_the_release():
    job = build(worker_replicas=2, training_script=SCRIPT, wait_for_master=True).job
    for features in (V1_10, V1_12, VolcanoFeatures.from_version("1.10", "connection extra volcano_version")):
        with pytest.raises(JobSpecError) as error:
            fit_to_volcano(job, features)
        assert str(error.value).startswith("wait_for_master (the pytorch plugin's '--wait-master-enabled') needs "
                                           f"Volcano >= 1.14; this cluster runs {features.describe()}")
    assert fit_to_volcano(job, V1_14) == []


def test_wait_for_master_on_a_release_that_could_not_be_learned_asks_for_the_version():
    job = build(worker_replicas=2, training_script=SCRIPT, wait_for_master=True).job
    with pytest.raises(JobSpecError, match=r"could not be learned \(.*403 Forbidden\); set the connection extra "
                                           r"volcano_version"):
        fit_to_volcano(job, UNKNOWN)


def test_a_templates_flags_an_older_plugin_lacks_are_refused_and_unknown_ones_left_to_volcano():
    job = build(worker_replicas=1, training_script=SCRIPT).job
    job["spec"]["plugins"]["pytorch"] = ["--wait-master-timeout", "60", "--port=29500"]
    with pytest.raises(JobSpecError, match=r"'--wait-master-timeout'\) needs Volcano >= 1.14"):
        fit_to_volcano(job, V1_10)
    job["spec"]["plugins"]["pytorch"] = ["--port=29500", "--some-future-flag"]
    assert fit_to_volcano(job, V1_10) == []


def ranks_world_size(job: dict) -> dict[str, str | None]:
    return {t["name"]: next((e["value"] for e in t["template"]["spec"]["containers"][0].get("env") or []
                             if e["name"] == WORLD_SIZE_ENV), None) for t in job["spec"]["tasks"]}


def test_before_1_12_the_ranks_of_a_job_with_tensorboard_get_world_size_from_the_operator():
    job = build(worker_replicas=2, training_script=SCRIPT, tensorboard={"logdir": "/logs"},
                volumes=[{"name": "logs", "hostPath": {"path": "/logs"}}],
                volume_mounts=[{"name": "logs", "mountPath": "/logs"}]).job
    built = copy.deepcopy(job)
    assert fit_to_volcano(job, V1_14) == [] and fit_to_volcano(job, V1_12) == [] and job == built

    notes = fit_to_volcano(job, V1_10)
    assert notes == ["This cluster runs Volcano before 1.12 (the Job CRD's schema), which counts task(s) tensorboard "
                     "in WORLD_SIZE (4): the ranks of tasks master and worker get WORLD_SIZE=3 from the operator "
                     "instead"]
    assert ranks_world_size(job) == {"master": "3", "worker": "3", "tensorboard": None}
    fit_to_volcano(job, V1_10)  # again (a retry of the same task instance): the same Job
    master_env = task(job, "master")["template"]["spec"]["containers"][0]["env"]
    assert sum(item["name"] == WORLD_SIZE_ENV for item in master_env) == 1
    # A release that could not be learned: the right WORLD_SIZE either way.
    unknown_job = copy.deepcopy(built)
    assert fit_to_volcano(unknown_job, UNKNOWN) and ranks_world_size(unknown_job)["worker"] == "3"


def test_before_1_12_a_templates_rank_without_a_command_of_the_operators_is_refused():
    template = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {}, "spec": {
        "tasks": [
            {"name": "lead", "replicas": 1, "template": {"spec": {"containers": [{"name": "lead", "image": "i"}]}}},
            {"name": "rest", "replicas": 3, "template": {"spec": {"containers": [{"name": "rest", "image": "i"}]}}},
            {"name": "evaluator", "replicas": 2, "template": {"spec": {"containers": [{"name": "e", "image": "i"}]}}},
        ],
        "plugins": {"pytorch": ["--master=lead", "--worker=rest"], "svc": []}}}
    job = build_template(template, master_task_name="lead", worker_task_name="rest", worker_replicas=None).job
    with pytest.raises(JobSpecError) as error:
        fit_to_volcano(job, V1_10)
    assert str(error.value).startswith(
        "task 'lead' besides task(s) evaluator: this cluster runs Volcano before 1.12 (the Job CRD's schema), "
        "whose pytorch plugin counts every task in WORLD_SIZE (6 instead of 4)")
    assert "container 'lead' has none it runs" in str(error.value)
    # With the operator's command (a training script) the plugin's role names are followed.
    job = build_template(template, master_task_name="lead", worker_task_name="rest", worker_replicas=None,
                         training_script=SCRIPT).job
    fit_to_volcano(job, V1_10)
    assert ranks_world_size(job) == {"lead": "4", "rest": "4", "evaluator": None}


def test_the_launch_shell_exports_the_operators_world_size_over_the_plugins():
    # As the kubelet passes it to the process (it turns the Job's $$ back into $).
    shown = 'echo "WORLD_SIZE=$WORLD_SIZE ${AIRFLOW_VOLCANO_WORLD_SIZE-unset}"'
    command = [process_string(part) for part in signal_forwarding_command(["sh", "-c", shown])]
    env = {"PATH": os.environ["PATH"], "WORLD_SIZE": "4"}
    plugin_only = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
    corrected = subprocess.run(command, env={**env, WORLD_SIZE_ENV: "3"}, capture_output=True, text=True, timeout=30)
    assert plugin_only.stdout.strip() == "WORLD_SIZE=4 unset"
    assert corrected.stdout.strip() == "WORLD_SIZE=3 unset"

