"""Manifest building and validation: pure, no cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_volcano.manifest import (
    SCRIPT_MOUNT_PATH,
    JobSpecError,
    PyTorchJobRequest,
    TrainingScript,
    build_manifests,
    default_job_name,
    identity_labels,
    load_job_template,
    max_job_name_length,
    run_labels,
    sanitize_label_value,
)

REPO = Path(__file__).resolve().parents[2]
SEED_YAML = REPO / "tests" / "fixtures" / "seed000-job.yaml"
SEED_SCRIPT = REPO / "dags" / "scripts" / "pytorch_demo.py"
LABELS = run_labels(dag_id="retrain", task_id="train", run_id="manual__2026-11-22T00:00:00+00:00",
                    try_number=1, map_index=-1)


def build(**kwargs):
    kwargs.setdefault("image", "img:1")
    return build_manifests(PyTorchJobRequest(**kwargs), run_labels=LABELS, default_name="retrain-train-abc123")


def task(job: dict, name: str) -> dict:
    return next(t for t in job["spec"]["tasks"] if t["name"] == name)


def test_seed_000_from_operator_arguments_matches_the_seed_yaml_field_by_field():
    seed = yaml.safe_load(SEED_YAML.read_text())
    manifests = build(
        name="pytorch-job-with-configmap", image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        image_pull_policy="IfNotPresent", worker_replicas=2, resources={"cpu": "1", "memory": "2Gi"},
        env={"PYTHONUNBUFFERED": "1"}, restart_policy="OnFailure",
        training_script=TrainingScript("pytorch-demo.py", SEED_SCRIPT.read_text()),
    )
    job = manifests.job
    assert job["apiVersion"] == seed["apiVersion"] and job["kind"] == seed["kind"]
    assert job["metadata"]["name"] == seed["metadata"]["name"]
    for key in ("minAvailable", "schedulerName"):
        assert job["spec"][key] == seed["spec"][key]
    assert job["spec"]["plugins"]["pytorch"] == seed["spec"]["plugins"]["pytorch"]
    # Intended differences: svc listed explicitly (no reliance on the webhook), queue and maxRetry
    # explicit, our labels, and the script mounted from our ConfigMap at our path.
    assert job["spec"]["plugins"]["svc"] == [] and job["spec"]["queue"] == "default"
    for ours, theirs in zip(job["spec"]["tasks"], seed["spec"]["tasks"], strict=True):
        assert (ours["name"], ours["replicas"]) == (theirs["name"], theirs["replicas"])
        assert ours.get("policies") == theirs.get("policies")
        mine, seeds = ours["template"]["spec"], theirs["template"]["spec"]
        assert mine["restartPolicy"] == seeds["restartPolicy"]
        c, s = mine["containers"][0], seeds["containers"][0]
        for key in ("name", "image", "imagePullPolicy", "resources", "env"):
            assert c[key] == s[key], key
        assert c["command"] == ["python", f"{SCRIPT_MOUNT_PATH}/pytorch-demo.py"]
        script_volume = {"name": "training-script", "configMap": {"name": "pytorch-job-with-configmap-script"}}
        assert mine["volumes"] == [script_volume]
        assert ours["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "airflow-volcano"
    assert manifests.configmap["metadata"]["name"] == "pytorch-job-with-configmap-script"
    assert manifests.configmap["data"]["pytorch-demo.py"] == SEED_SCRIPT.read_text()


def test_seed_yaml_as_template_submits_unchanged_apart_from_labels():
    seed = yaml.safe_load(SEED_YAML.read_text())
    job = build_manifests(PyTorchJobRequest(job_template=load_job_template(SEED_YAML.read_text(), source="seed")),
                          run_labels=LABELS, default_name="x").job
    assert job["metadata"].pop("labels") == LABELS
    for task_spec in job["spec"]["tasks"]:
        assert task_spec["template"].pop("metadata") == {"labels": LABELS}
    assert job == seed


def test_explicit_argument_beats_template_which_beats_default():
    template = yaml.safe_load(SEED_YAML.read_text())
    template["spec"]["queue"] = "q1"
    kept = build_manifests(PyTorchJobRequest(job_template=template), run_labels=LABELS, default_name="x").job
    assert kept["spec"]["queue"] == "q1"
    assert "maxRetry" not in kept["spec"], "defaults are not injected into a template"
    overridden = build_manifests(PyTorchJobRequest(job_template=template, queue="q2", worker_replicas=5,
                                                   image="new:2"), run_labels=LABELS, default_name="x").job
    assert overridden["spec"]["queue"] == "q2"
    assert task(overridden, "worker")["replicas"] == 5
    assert task(overridden, "master")["template"]["spec"]["containers"][0]["image"] == "new:2"


def test_defaults_gang_schedule_and_restart_the_whole_job_on_pod_failure():
    job = build(worker_replicas=3).job
    assert job["spec"]["minAvailable"] == 4
    assert {"event": "PodFailed", "action": "RestartJob"} in job["spec"]["policies"]
    assert {"event": "PodEvicted", "action": "RestartJob"} in job["spec"]["policies"]
    assert task(job, "master")["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert task(job, "master")["template"]["spec"]["restartPolicy"] == "Never"


def test_zero_workers_leaves_only_the_master():
    job = build(worker_replicas=0).job
    assert [t["name"] for t in job["spec"]["tasks"]] == ["master"]
    assert job["spec"]["minAvailable"] == 1


def test_gpu_shorthand_and_per_role_resources():
    job = build(resources={"cpu": "2", "gpu": 1}, worker_resources={"memory": "8Gi"}).job
    master = task(job, "master")["template"]["spec"]["containers"][0]["resources"]
    worker = task(job, "worker")["template"]["spec"]["containers"][0]["resources"]
    assert master["limits"] == {"cpu": "2", "nvidia.com/gpu": "1"}
    assert worker["requests"] == {"cpu": "2", "nvidia.com/gpu": "1", "memory": "8Gi"}


def test_templated_numbers_as_strings_are_accepted():
    assert task(build(worker_replicas="2").job, "worker")["replicas"] == 2


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"worker_replicas": -1}, "worker_replicas must be an integer >= 0, got -1"),
    ({"worker_replicas": "two"}, "worker_replicas must be an integer >= 0, got 'two'"),
    ({"worker_replicas": True}, "worker_replicas must be an integer >= 0, got True"),
    ({"port": 70000}, "port must be an integer between 1 and 65535, got 70000"),
    ({"name": "Bad_Name"}, "name 'Bad_Name' is not a DNS label"),
    ({"name": "x" * 60}, "keep every pod name"),
    ({"min_available": 9, "worker_replicas": 2}, "min_available (9) is larger than the total replicas (3)"),
    ({"policies": [{"event": "PodExploded", "action": "RestartJob"}]}, "unknown event 'PodExploded'"),
    ({"policies": [{"event": "PodFailed", "action": "Panic"}]}, "unknown action 'Panic'"),
    ({"policies": [{"event": "PodFailed", "exitCode": 3, "action": "AbortJob"}]}, "both an event and exitCode"),
    ({"policies": [{"exitCode": 0, "action": "AbortJob"}]}, "exitCode must be a non-zero integer, got 0"),
    ({"master_task_name": "trainer", "worker_task_name": "trainer"}, "duplicate task name 'trainer'"),
    ({"image": None}, "image: task 'master' container 'master' has no image"),
    ({"max_retry": 0}, "max_retry must be an integer >= 1, got 0"),
    ({"image_pull_policy": "Sometimes"}, "image_pull_policy must be one of"),
    ({"env": [{"name": "1 bad"}]}, "env: invalid environment variable"),
    ({"labels": {"team": "a b"}}, "labels: invalid label value 'a b'"),
    ({"extra_plugins": {"horovod": []}}, "extra_plugins: unknown Volcano plugin 'horovod'"),
])
def test_bad_input_names_the_parameter_and_value(kwargs, expected):
    with pytest.raises(JobSpecError) as error:
        build(**kwargs)
    assert expected in str(error.value)


def test_master_must_have_exactly_one_replica():
    template = yaml.safe_load(SEED_YAML.read_text())
    template["spec"]["tasks"][0]["replicas"] = 2
    with pytest.raises(JobSpecError, match="exactly 1 replica, got 2"):
        build_manifests(PyTorchJobRequest(job_template=template), run_labels=LABELS, default_name="x")


def test_malformed_template_says_where():
    with pytest.raises(JobSpecError, match=r"job_template jobs/train.yaml is not valid YAML/JSON at line 4"):
        load_job_template("apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nspec: [unclosed\n",
                          source="jobs/train.yaml")
    with pytest.raises(JobSpecError, match="must be apiVersion batch.volcano.sh/v1alpha1, kind Job"):
        load_job_template("apiVersion: v1\nkind: Pod\n", source="<string>")


def test_full_job_spec_refuses_other_arguments():
    with pytest.raises(JobSpecError, match="worker_replicas cannot be combined"):
        build(full_job_spec=yaml.safe_load(SEED_YAML.read_text()), image=None, worker_replicas=3)


def test_default_name_keeps_every_pod_name_a_short_dns_label():
    longest = max_job_name_length(["master", "worker"], max_index=99)
    name = default_job_name("Nightly_Retraining.Pipeline" * 3, "train_model", suffix="a1b2c3", max_len=longest)
    assert len(f"{name}-worker-99") <= 63 and name.endswith("-a1b2c3") and name[0].isalpha()
    assert default_job_name("9dag", "t", suffix="ff", max_len=longest).startswith("j-9dag")


def test_label_values_are_sanitised_and_stay_distinct():
    run_id = "scheduled__2026-11-22T00:00:00+00:00"
    assert sanitize_label_value(run_id) != run_id and len(sanitize_label_value(run_id)) <= 63
    a, b = sanitize_label_value("x" * 80 + "a"), sanitize_label_value("x" * 80 + "b")
    assert a != b and len(a) <= 63
    assert "airflow-volcano.io/try-number" not in identity_labels(LABELS)
    assert LABELS["airflow-volcano.io/map-index"] == "none"


def test_to_yaml_round_trips_both_documents():
    manifests = build(training_script=TrainingScript("t.py", "print('hi')\n"))
    configmap, job = yaml.safe_load_all(manifests.to_yaml())
    assert (configmap, job) == (manifests.configmap, manifests.job)


def test_oversized_script_is_refused():
    with pytest.raises(JobSpecError, match="training_script 'big.py'"):
        build(training_script=TrainingScript("big.py", "#" * (1024 * 1024 + 1)))
