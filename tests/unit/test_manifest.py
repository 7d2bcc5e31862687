"""Manifest building and validation: pure, no cluster."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from unittest.mock import ANY

import pytest
import yaml

from airflow_volcano.constants import MANAGED_BY_LABEL, RETRY_BUDGET_ANNOTATION, SCRIPT_MOUNT_PATH
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import ARGV_SHIM, LAUNCH_SCRIPT, SESSION_SCRIPT, SSHD_SCRIPT, HostfileLaunch
from airflow_volcano.manifest import (
    JobKind,
    JobRequest,
    TrainingScript,
    build_manifests,
    default_job_name,
    identity_labels,
    load_job_template,
    max_job_name_length,
    retryable_exit_codes,
    run_labels,
    sanitize_dns_label,
    sanitize_label_value,
    script_configmap_name,
    task_pods,
    tensorboard_endpoint,
    validate_job,
)
from airflow_volcano.manifest.pod_runtime import FORWARDER_SHOWN, SHM_VOLUME, without_signal_forwarding
from airflow_volcano.manifest.retry_budget import RetryBudget

REPO = Path(__file__).resolve().parents[2]
SEED_YAML = REPO / "tests" / "fixtures" / "seed000-job.yaml"
SEED_SCRIPT = REPO / "dags" / "scripts" / "pytorch_demo.py"
LABELS = run_labels(dag_id="retrain", task_id="train", run_id="manual__2026-11-22T00:00:00+00:00",
                    try_number=1, map_index=-1)
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def seed() -> dict:
    return yaml.safe_load(SEED_YAML.read_text())


def request(**kwargs) -> JobRequest:
    """The request an operator builds; `hostfile_launch=HostfileLaunch(...)` stands for the DeepSpeed
    operator's launch arguments."""
    launch = kwargs.pop("hostfile_launch", None)
    if launch is not None:
        kwargs.update(kind=JobKind.HOSTFILE, launcher=launch.launcher, slots_per_worker=launch.slots_per_worker,
                      port=launch.port, ssh_wait_timeout=launch.ssh_wait_timeout, launcher_options=launch.options)
    return JobRequest(**kwargs)


def build(**kwargs):
    kwargs.setdefault("image", "img:1")
    return build_manifests(request(**kwargs), run_labels=LABELS, default_name="retrain-train-abc123")


def build_template(template: dict, **kwargs):
    return build_manifests(request(job_template=template, **kwargs), run_labels=LABELS,
                           default_name="retrain-train-abc123")


def task(job: dict, name: str) -> dict:
    return next(t for t in job["spec"]["tasks"] if t["name"] == name)


RUNTIME_ENV = {"VOLCANO_RESTART_COUNT", "AIRFLOW_TRY_NUMBER", "CHECKPOINT_DIR", "AIRFLOW_VOLCANO_HOLD_EXIT"}


def without_pod_runtime(job: dict) -> dict:
    """A copy of the Job without what every training pod gets around its command (pod_runtime: the
    signal-forwarding shell and the log tail in a failed container's status, /dev/shm, the restart
    counters, the exit hold), which has tests of its own."""
    job = copy.deepcopy(job)
    for each in job["spec"]["tasks"]:
        pod = each["template"]["spec"]
        for item in pod.get("containers") or []:
            if "command" in item:
                item["command"] = without_signal_forwarding(item["command"])
                if item.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                    del item["terminationMessagePolicy"]
            for key, kept in (("env", lambda var: var["name"] not in RUNTIME_ENV),
                              ("volumeMounts", lambda mount: mount["name"] != SHM_VOLUME)):
                if key in item:
                    item[key] = [value for value in item[key] if kept(value)] or item.pop(key)
        if "volumes" in pod:
            pod["volumes"] = [volume for volume in pod["volumes"] if volume["name"] != SHM_VOLUME] or pod.pop("volumes")
    return job


def container(job: dict, name: str) -> dict:
    """The task's first container as the arguments made it, without_pod_runtime."""
    return task(without_pod_runtime(job), name)["template"]["spec"]["containers"][0]


def error_of(**kwargs) -> str:
    with pytest.raises(JobSpecError) as error:
        build(**kwargs)
    return str(error.value)


def template_error(template: dict, **kwargs) -> str:
    with pytest.raises(JobSpecError) as error:
        build_template(template, **kwargs)
    return str(error.value)


# -- seed 000 -----------------------------------------------------------------------------------------


def test_seed_000_from_operator_arguments_matches_the_seed_yaml_field_by_field():
    expected = seed()
    manifests = build(
        name="pytorch-job-with-configmap", image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        image_pull_policy="IfNotPresent", worker_replicas=2, container_resources={"cpu": "1", "memory": "2Gi"},
        env={"PYTHONUNBUFFERED": "1"},
        # Our default is Never (+ PodFailed/PodEvicted -> RestartJob) so Volcano sees a failed rank;
        # the seed's OnFailure is one argument away.
        restart_policy="OnFailure",
        training_script=TrainingScript("pytorch-demo.py", SEED_SCRIPT.read_text()),
    )
    job = without_pod_runtime(manifests.job)  # also intended; tested on its own
    assert (job["apiVersion"], job["kind"]) == (expected["apiVersion"], expected["kind"])
    assert job["metadata"]["name"] == expected["metadata"]["name"]
    assert job["spec"]["minAvailable"] == expected["spec"]["minAvailable"] == 3
    assert job["spec"]["schedulerName"] == expected["spec"]["schedulerName"] == "volcano"
    assert job["spec"]["plugins"]["pytorch"] == expected["spec"]["plugins"]["pytorch"]
    # Intended differences from the seed: svc listed explicitly (MASTER_ADDR must not depend on the
    # webhook adding it), queue and maxRetry explicit, job policies restarting the gang, our labels,
    # and the script mounted read-only from our ConfigMap `<job>-script` at our path.
    assert job["spec"]["plugins"]["svc"] == []
    assert (job["spec"]["queue"], job["spec"]["maxRetry"]) == ("default", 3 + 10 + 1)  # room for 10 preemptions
    assert job["metadata"]["labels"] == LABELS
    for ours, theirs in zip(job["spec"]["tasks"], expected["spec"]["tasks"], strict=True):
        assert (ours["name"], ours["replicas"]) == (theirs["name"], theirs["replicas"])
        assert ours.get("policies") == theirs.get("policies")
        mine, seeds = ours["template"]["spec"], theirs["template"]["spec"]
        assert mine["restartPolicy"] == seeds["restartPolicy"] == "OnFailure"
        c, s = mine["containers"][0], seeds["containers"][0]
        for key in ("name", "image", "imagePullPolicy", "resources", "env"):
            assert c[key] == s[key], key
        assert c["command"] == ["python", f"{SCRIPT_MOUNT_PATH}/pytorch-demo.py"]
        assert c["volumeMounts"] == [{"name": "training-script", "mountPath": SCRIPT_MOUNT_PATH, "readOnly": True}]
        assert mine["volumes"] == [{"name": "training-script",
                                    "configMap": {"name": "pytorch-job-with-configmap-script"}}]
        assert ours["template"]["metadata"]["labels"] == LABELS
    assert task(expected, "master")["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    configmap = manifests.configmap
    assert configmap["metadata"]["name"] == script_configmap_name("pytorch-job-with-configmap")
    assert configmap["metadata"]["labels"] == LABELS
    assert configmap["data"] == {"pytorch-demo.py": SEED_SCRIPT.read_text()}


def test_seed_yaml_as_template_submits_unchanged_apart_from_labels_and_namespace():
    for namespace in (None, "ml"):
        job = build_manifests(
            JobRequest(job_template=load_job_template(SEED_YAML.read_text(), source=str(SEED_YAML)),
                              namespace=namespace),
            run_labels=LABELS, default_name="unused").job
        assert job["metadata"].pop("labels") == LABELS
        assert job["metadata"].pop("namespace", None) == namespace
        for task_spec in job["spec"]["tasks"]:
            assert task_spec["template"].pop("metadata") == {"labels": LABELS}
        # Room for preemptions beside the seed's retry budget (Volcano's default 3), kept as asked.
        assert job["metadata"].pop("annotations") == {RETRY_BUDGET_ANNOTATION: '{"max_retry":3,"max_preemptions":10}'}
        assert job["spec"].pop("maxRetry") == 3 + 10 + 1
        assert without_pod_runtime(job) == seed()


def test_seed_script_is_the_seed_documents_script():
    text = SEED_SCRIPT.read_text()
    assert 'dist.init_process_group(backend="gloo")' in text and text.rstrip().endswith("train()")


# -- precedence ----------------------------------------------------------------------------------------


def test_explicit_argument_beats_template_which_beats_default():
    template = seed()
    template["spec"]["queue"] = "q1"
    kept = build_template(template).job
    assert kept["spec"]["queue"] == "q1"
    assert "svc" not in kept["spec"]["plugins"], "no defaults injected"
    assert kept["spec"]["maxRetry"] == 3 + 10 + 1  # Volcano's default budget, and room for preemptions beside it
    overridden = build_template(template, volcano_queue="q2", worker_replicas=5, image="new:2", max_retry=2).job
    assert overridden["spec"]["queue"] == "q2" and overridden["spec"]["maxRetry"] == 2 + 10 + 1
    assert task(overridden, "worker")["replicas"] == 5
    assert container(overridden, "master")["image"] == container(overridden, "worker")["image"] == "new:2"
    assert template["spec"]["queue"] == "q1" and template["spec"]["tasks"][1]["replicas"] == 2, "not mutated"


def test_template_keeps_gang_scheduling_when_worker_replicas_change():
    assert build_template(seed(), worker_replicas=5).job["spec"]["minAvailable"] == 6
    job = build_template(seed(), worker_replicas=0).job
    assert [t["name"] for t in job["spec"]["tasks"]] == ["master"] and job["spec"]["minAvailable"] == 1


def test_template_pod_arguments_reach_master_and_worker():
    job = build_template(seed(), node_selector={"pool": "gpu"}, image_pull_secrets=["regcred"],
                         container_resources={"gpu": 1}, env={"A": "1"}, service_account_name="trainer").job
    for name in ("master", "worker"):
        pod = task(without_pod_runtime(job), name)["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "gpu"} and pod["imagePullSecrets"] == [{"name": "regcred"}]
        assert pod["serviceAccountName"] == "trainer"
        assert pod["containers"][0]["env"] == [{"name": "A", "value": "1"}]
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert pod["volumes"][0]["configMap"]["name"] == "pytorch-demo-script", "template volumes kept"


def test_port_and_task_names_rewrite_the_plugin_and_keep_other_flags():
    template = seed()
    template["spec"]["plugins"]["pytorch"].append("--wait-master-enabled=true")
    template["spec"]["tasks"][1]["name"] = "trainer"
    template["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["name"] = "trainer"
    job = build_template(template, worker_task_name="trainer", port="29500").job
    assert job["spec"]["plugins"]["pytorch"] == ["--master=master", "--worker=trainer", "--port=29500",
                                                 "--wait-master-enabled=true"]


def test_full_job_spec_is_used_as_is_apart_from_name_namespace_labels():
    spec = seed()
    del spec["metadata"]["name"]
    job = build_manifests(JobRequest(full_job_spec=spec, namespace="ml", annotations={"team": "a"}),
                          run_labels=LABELS, default_name="retrain-train-abc123").job
    assert job["metadata"] == {"name": "retrain-train-abc123", "namespace": "ml", "labels": LABELS,
                               "annotations": {"team": "a"}}
    assert job["spec"]["plugins"] == seed()["spec"]["plugins"]
    assert "maxRetry" not in job["spec"] and "queue" not in job["spec"]


def test_full_job_spec_refuses_other_arguments_and_templates():
    assert "worker_replicas cannot be combined with it" in error_of(full_job_spec=seed(), image=None,
                                                                      worker_replicas=3)
    assert "training_script cannot be combined" in error_of(full_job_spec=seed(), image=None,
                                                            training_script=TrainingScript("t.py", ""))
    assert "job_template and full_job_spec cannot be combined" in error_of(full_job_spec=seed(), job_template=seed())


# -- built-in defaults ---------------------------------------------------------------------------------


def _nulls_or_empties(value: object, path: str = "") -> list[str]:
    """Paths of null/empty values, except plugin argument lists (`svc: []` means "no arguments")."""
    if isinstance(value, dict):
        return [f"{path}.{key}" for key, v in value.items() if v is None or (v in ([], {}) and key != "svc")] + [
            bad for key, v in value.items() for bad in _nulls_or_empties(v, f"{path}.{key}")]
    if isinstance(value, list):
        return [bad for i, v in enumerate(value) for bad in _nulls_or_empties(v, f"{path}[{i}]")]
    return []


def test_defaults_gang_schedule_and_restart_the_whole_job_on_retryable_failures():
    job = build(worker_replicas=3, tolerations=[], volumes=None).job
    assert job["spec"]["minAvailable"] == 4
    assert job["spec"]["plugins"] == {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": []}
    # T9k's retryable exit codes restart the gang; any other failure ends the Job at once.
    assert job["spec"]["policies"] == [{"exitCode": 130, "action": "RestartJob"},
                                       {"exitCode": 137, "action": "RestartJob"},
                                       {"exitCode": 138, "action": "RestartJob"},
                                       {"exitCode": 143, "action": "RestartJob"},
                                       {"event": "PodEvicted", "action": "RestartJob"},
                                       {"event": "PodFailed", "action": "TerminateJob"}]
    assert task(job, "master")["replicas"] == 1
    assert task(job, "master")["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert task(job, "master")["template"]["spec"]["restartPolicy"] == "Never"
    assert _nulls_or_empties(job) == [], "unset keys are left out"


def test_zero_workers_leaves_only_the_master():
    job = build(worker_replicas=0).job
    assert [t["name"] for t in job["spec"]["tasks"]] == ["master"]
    assert job["spec"]["minAvailable"] == 1


def test_gpu_shorthand_and_per_role_resources():
    job = build(container_resources={"cpu": "2", "gpu": 1}, worker_resources={"memory": "8Gi"},
                master_resources={"requests": {"cpu": "500m"}}).job
    assert container(job, "worker")["resources"] == {
        "requests": {"cpu": "2", "nvidia.com/gpu": "1", "memory": "8Gi"},
        "limits": {"cpu": "2", "nvidia.com/gpu": "1", "memory": "8Gi"}}
    assert container(job, "master")["resources"] == {"requests": {"cpu": "500m", "nvidia.com/gpu": "1"},
                                                     "limits": {"cpu": "2", "nvidia.com/gpu": "1"}}


def test_env_dict_and_list_with_value_from():
    secret = {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    assert container(build(env={"EPOCHS": 5}).job, "master")["env"] == [{"name": "EPOCHS", "value": "5"}]
    assert container(build(env=[secret]).job, "worker")["env"] == [secret]


def test_script_sets_pythonunbuffered_unless_given_and_keeps_an_explicit_command():
    script = TrainingScript("t.py", "print(1)\n")
    job = build(training_script=script, env={"PYTHONUNBUFFERED": "0"}, command=["torchrun"],
                args=[f"{SCRIPT_MOUNT_PATH}/t.py"]).job
    master = container(job, "master")
    assert master["env"] == [{"name": "PYTHONUNBUFFERED", "value": "0"}]
    assert (master["command"], master["args"]) == (["torchrun"], [f"{SCRIPT_MOUNT_PATH}/t.py"])
    assert container(build(training_script=script).job, "worker")["env"] == [
        {"name": "PYTHONUNBUFFERED", "value": "1"}]


def test_labels_annotations_and_optional_pod_fields():
    job = build(labels={"team": "vision"}, annotations={"owner": "me"}, priority_class_name="high",
                ttl_seconds_after_finished="600", namespace="ml").job
    assert job["metadata"]["labels"] == {"team": "vision", **LABELS}
    assert job["metadata"]["annotations"] == {"owner": "me", RETRY_BUDGET_ANNOTATION: ANY}
    assert job["metadata"]["namespace"] == "ml"
    assert job["spec"]["ttlSecondsAfterFinished"] == 600 and job["spec"]["priorityClassName"] == "high"
    template = task(job, "worker")["template"]
    assert template["metadata"] == {"labels": {"team": "vision", **LABELS}, "annotations": {"owner": "me"}}
    assert template["spec"]["priorityClassName"] == "high"


def test_preemptions_get_room_beside_max_retry_and_the_budgets_are_kept_on_the_job():
    job = build(max_retry=4, max_preemptions=2).job
    assert job["spec"]["maxRetry"] == 4 + 2 + 1  # Volcano's one budget has room for both
    assert RetryBudget.of(job) == RetryBudget(max_retry=4, max_preemptions=2)
    assert build().job["spec"]["maxRetry"] == 3 + 10 + 1  # the defaults: Volcano's 3, and 10 preemptions
    pod = {"spec": {"containers": [{"name": "w", "image": "busybox"}]}}
    tasks = [{"name": "worker", "replicas": 1, "template": pod}]
    template = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"maxRetry": 0, "tasks": tasks}}
    job = build_manifests(JobRequest(kind=JobKind.GENERIC, job_template=template, max_preemptions=0),
                          run_labels=LABELS, default_name="t").job
    assert job["spec"]["maxRetry"] == 4 and RetryBudget.of(job) == RetryBudget(3, 0)  # 0 is Volcano's "unset": 3
    spec = {**template, "metadata": {"name": "as-is"}, "spec": {"maxRetry": 5, "tasks": tasks}}
    job = build_manifests(JobRequest(kind=JobKind.GENERIC, full_job_spec=spec), run_labels=LABELS,
                          default_name="t").job
    assert job["spec"]["maxRetry"] == 5 and RetryBudget.of(job) is None  # submitted as is
    with pytest.raises(JobSpecError, match="max_preemptions cannot be combined"):
        build_manifests(JobRequest(kind=JobKind.GENERIC, full_job_spec=spec, max_preemptions=1),
                        run_labels=LABELS, default_name="t")


def test_templated_numbers_as_strings_are_accepted():
    job = build(worker_replicas="2", port="29500", min_available="2").job
    assert task(job, "worker")["replicas"] == 2 and job["spec"]["minAvailable"] == 2
    assert "--port=29500" in job["spec"]["plugins"]["pytorch"]


# -- validation: every error names the parameter and the bad value ----------------------------------


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"worker_replicas": -1}, "worker_replicas must be an integer >= 0, got -1"),
    ({"worker_replicas": "two"}, "worker_replicas must be an integer >= 0, got 'two'"),
    ({"worker_replicas": 1.5}, "worker_replicas must be an integer >= 0, got 1.5"),
    ({"worker_replicas": True}, "worker_replicas must be an integer >= 0, got True"),
    ({"port": 70000}, "port must be an integer between 1 and 65535, got 70000"),
    ({"port": 0}, "port must be an integer between 1 and 65535, got 0"),
    ({"min_available": 9, "worker_replicas": 2}, "min_available (9) is larger than the total replicas (3)"),
    ({"min_available": 0}, "min_available must be an integer >= 1, got 0"),
    ({"max_retry": -1}, "max_retry must be an integer >= 1, got -1"),
    ({"max_retry": 0}, "max_retry must be an integer >= 1, got 0"),
    ({"max_preemptions": -1}, "max_preemptions must be an integer >= 0, got -1"),
    ({"max_preemptions": "many"}, "max_preemptions must be an integer >= 0, got 'many'"),
    ({"ttl_seconds_after_finished": "soon"}, "ttl_seconds_after_finished must be an integer >= 0, got 'soon'"),
    ({"name": "Bad_Name"}, "name 'Bad_Name' is not a DNS label"),
    ({"name": "9lives"}, "name '9lives' is not a DNS label"),
    ({"name": "x" * 60}, f"name '{'x' * 60}' is 60 characters; at most 54 keep every pod name"),
    ({"namespace": "ML"}, "namespace 'ML' is not a DNS label"),
    ({"master_task_name": "trainer", "worker_task_name": "trainer"}, "duplicate task name 'trainer'"),
    ({"master_task_name": "Boss"}, "master_task_name 'Boss' is not a DNS label"),
    ({"image": None}, "image: task 'master' container 'master' has no image, got None"),
    ({"image": ""}, "image must be a non-empty string, got ''"),
    ({"image_pull_policy": "Sometimes"}, "image_pull_policy must be one of Always, IfNotPresent, Never; got "
                                         "'Sometimes'"),
    ({"restart_policy": "Maybe"}, "restart_policy must be one of Always, Never, OnFailure; got 'Maybe'"),
    ({"volcano_queue": ""}, "queue must be a non-empty string, got ''"),
    ({"scheduler_name": 7}, "scheduler_name must be a non-empty string, got 7"),
    ({"env": [{"name": "1 bad", "value": "x"}]}, "env: invalid environment variable {'name': '1 bad'"),
    ({"env": [{"name": "N", "value": 3}]}, "env: the value of 'N' must be a string, got 3"),
    ({"env": "A=1"}, "env must be a dict or a list of EnvVar dicts, got 'A=1'"),
    ({"command": "python train.py"}, "command must be a list, got 'python train.py'"),
    ({"tolerations": [["key"]]}, "tolerations must be a list of dict, got [['key']]"),
    ({"labels": {"team": "a b"}}, "labels: invalid label value 'a b' for key 'team'"),
    ({"labels": {"bad key": "x"}}, "labels: invalid key 'bad key'"),
    ({"node_selector": {"bad key": "x"}}, "node_selector: invalid key 'bad key'"),
    ({"extra_plugins": {"horovod": []}}, "extra_plugins: unknown Volcano plugin 'horovod'"),
    ({"extra_plugins": {"ssh": "yes"}}, "extra_plugins['ssh'] must be a list, got 'yes'"),
    ({"container_resources": {"gpus": 1}}, "resources: unknown resource 'gpus'"),
    ({"worker_resources": {"memory": "lots"}}, "worker_resources: 'memory' must be a quantity >= 0 such as 2, 500m "
                                               "or 4Gi, got 'lots'"),
    ({"container_resources": {"cpu": "-1"}}, "resources: 'cpu' must be a quantity >= 0"),
    ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "env: each variable once; given more "
                                                                         "than once: 'A'"),
    ({"container_resources": {"cpu": 1, "limits": {"cpu": 2}}}, "resources: give either the shorthand"),
    ({"training_script": TrainingScript("my script.py", "")}, "training_script: file name 'my script.py'"),
    ({"training_script": TrainingScript("big.py", "#" * (1024 * 1024))}, "training_script 'big.py' is 1048582 "
                                                                         "bytes; a ConfigMap holds at most 1048576"),
])
def test_bad_argument_names_the_parameter_and_value(kwargs, expected):
    assert expected in error_of(**kwargs)


@pytest.mark.parametrize(("policies", "expected"), [
    ([{"event": "PodExploded", "action": "RestartJob"}], "unknown event 'PodExploded'"),
    ([{"events": ["PodFailed", "Oops"], "action": "RestartJob"}], "unknown event 'Oops'"),
    ([{"event": "PodFailed", "action": "Panic"}], "unknown action 'Panic'"),
    ([{"event": "PodFailed", "exitCode": 3, "action": "AbortJob"}], "has both an event and exitCode"),
    ([{"events": ["PodFailed"], "exitCode": 3, "action": "AbortJob"}], "has both an event and exitCode"),
    ([{"action": "AbortJob"}], "needs an event, events or an exitCode"),
    ([{"exitCode": 0, "action": "AbortJob"}], "exitCode must be a non-zero integer, got 0"),
    ([{"exitCode": 3, "action": "AbortJob"}, {"exitCode": 3, "action": "RestartJob"}], "duplicate exitCode 3"),
    ([{"event": "PodFailed", "action": "AbortJob"}, {"events": ["PodFailed"], "action": "RestartJob"}],
     "duplicate event 'PodFailed'"),
    ([{"event": "*", "action": "AbortJob"}, {"event": "PodFailed", "action": "RestartJob"}],
     "event '*' must be the only event"),
    ({"event": "PodFailed"}, "must be a list, got {'event': 'PodFailed'}"),
])
@pytest.mark.parametrize("parameter", ["policies", "master_policies"])
def test_bad_policies_name_the_parameter_and_value(parameter, policies, expected):
    message = error_of(**{parameter: policies})
    assert message.startswith(parameter) and expected in message


def test_good_policies_pass():
    job = build(policies=[{"events": ["PodFailed", "PodEvicted"], "action": "RestartJob"},
                          {"exitCode": 137, "action": "AbortJob"}]).job
    assert job["spec"]["policies"][1] == {"exitCode": 137, "action": "AbortJob"}


def _template_with(change) -> dict:
    template = seed()
    change(template)
    return template


@pytest.mark.parametrize(("change", "expected"), [
    (lambda t: t["spec"].update(tasks=[]), "job_template: spec.tasks must list at least one task, got []"),
    (lambda t: t["spec"]["tasks"][1].update(replicas=True),
     "job_template: spec.tasks[1].replicas must be an integer >= 0, got True"),
    (lambda t: t["spec"]["tasks"][1].update(replicas="2"),
     "job_template: spec.tasks[1].replicas must be an integer >= 0, got '2'"),
    (lambda t: t["spec"]["tasks"][0].update(replicas=2), "master task 'master' must have exactly 1 replica, got 2"),
    (lambda t: t["spec"]["tasks"][0].update(replicas=0), "master task 'master' must have exactly 1 replica, got 0"),
    (lambda t: t["spec"]["tasks"][1].update(name="master"),
     "duplicate task name 'master' (spec.tasks[0] and spec.tasks[1])"),
    (lambda t: t["spec"]["tasks"][1].update(name="Worker_1"), "job_template: spec.tasks[1].name 'Worker_1' is not"),
    (lambda t: t["spec"]["tasks"][1].update(name="trainer"), "worker_task_name 'worker': the job has no such task"),
    (lambda t: t["spec"]["tasks"][1].update(minAvailable=3),
     "job_template: spec.tasks[1].minAvailable (3) is larger than its replicas (2)"),
    (lambda t: t["spec"].update(minAvailable=4), "min_available (4) is larger than the total replicas (3)"),
    (lambda t: t["spec"].update(minAvailable=-1), "min_available must be an integer >= 0, got -1"),
    (lambda t: t["spec"].update(maxRetry=-2), "max_retry must be an integer >= 0, got -2"),
    (lambda t: t["spec"]["plugins"].update(pytorch=["--port=99999"]),
     "port must be an integer between 1 and 65535, got '99999'"),
    (lambda t: t["spec"]["plugins"].update(horovod=[]), "extra_plugins: unknown Volcano plugin 'horovod'"),
    (lambda t: t["spec"]["tasks"][1]["template"]["spec"].update(restartPolicy="Sometimes"),
     "restart_policy must be one of Always, Never, OnFailure; got 'Sometimes' "
     "(spec.tasks[1].template.spec.restartPolicy)"),
    (lambda t: t["spec"]["tasks"][1]["template"]["spec"]["containers"][0].pop("image"),
     "image: task 'worker' container 'worker' has no image, got None (spec.tasks[1].template.spec.containers[0]"),
    (lambda t: t["spec"]["tasks"][0].update(policies=[{"event": "TaskCompleted", "action": "Win"}]),
     "job_template: spec.tasks[0].policies: unknown action 'Win'"),
    (lambda t: t["spec"].update(queue=""), "queue must be a non-empty string, got ''"),
    (lambda t: t["metadata"].update(labels={"a": "-x"}), "labels: invalid label value '-x' for key 'a'"),
    (lambda t: t["metadata"].update(name="x" * 60), "at most 54 keep every pod name"),
])
def test_bad_template_names_the_field_and_value(change, expected):
    assert expected in template_error(_template_with(change))


def test_master_task_name_must_exist_in_the_template():
    assert "master_task_name 'boss': the job has no such task" in template_error(seed(), master_task_name="boss")


def test_worker_replicas_without_a_worker_task_is_refused():
    template = _template_with(lambda t: (t["spec"]["tasks"].pop(1), t["spec"].update(minAvailable=1)))
    assert build_template(template).job["spec"]["tasks"][0]["name"] == "master", "master alone is fine"
    assert "worker_replicas=2: the job has no task named 'worker'" in template_error(template, worker_replicas=2)


def test_validate_job_checks_kind_and_api_version():
    with pytest.raises(JobSpecError, match=r"job: must be apiVersion batch.volcano.sh/v1alpha1, kind Job; "
                                           r"got \('batch/v1', 'Job'\)"):
        validate_job({"apiVersion": "batch/v1", "kind": "Job"})
    validate_job(build().job)


def test_malformed_template_says_where():
    with pytest.raises(JobSpecError, match=r"job_template jobs/train.yaml is not valid YAML/JSON at line 4, column 1"):
        load_job_template("apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nspec: [unclosed\n",
                          source="jobs/train.yaml")
    with pytest.raises(JobSpecError, match=r"job_template <string> is not valid JSON at line 2, column 25"):
        load_job_template('{"kind": "Job",\n "spec": {"tasks": [1, 2}\n}', source="<string>")
    with pytest.raises(JobSpecError, match="must be apiVersion batch.volcano.sh/v1alpha1, kind Job; got "
                                           "apiVersion 'v1', kind 'Pod'"):
        load_job_template("apiVersion: v1\nkind: Pod\n", source="<string>")
    with pytest.raises(JobSpecError, match="job_template t.yaml must be a mapping"):
        load_job_template("- a\n- b\n", source="t.yaml")


def test_json_template_is_accepted():
    text = '{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"tasks": []}}'
    assert load_job_template(text, source="<string>")["kind"] == "Job"


# -- names and labels ----------------------------------------------------------------------------------


def test_default_name_keeps_every_pod_name_a_short_dns_label():
    longest = max_job_name_length(["master", "worker"], max_index=99)
    assert longest == 63 - len("-worker-99")
    name = default_job_name("Nightly_Retraining.Pipeline" * 3, "train_model", suffix="a1b2c3", max_len=longest)
    assert len(f"{name}-worker-99") <= 63 and DNS_LABEL.match(name) and name.endswith("-a1b2c3")
    assert default_job_name("9dag", "t", suffix="ff", max_len=longest) == "j-9dag-t-ff"
    assert default_job_name("dag", "Ünïcode task!", suffix="ff", max_len=longest) == "dag-ncode-task-ff"
    other = default_job_name("Nightly_Retraining.Pipeline" * 3, "train_model", suffix="d4e5f6", max_len=longest)
    assert other != name, "the suffix survives truncation, so reruns get distinct names"


def test_default_name_is_shortened_for_a_templates_longer_task_names():
    template = seed()
    del template["metadata"]["name"]
    template["spec"]["tasks"][1]["name"] = "w" * 40
    template["spec"]["plugins"]["pytorch"][1] = "--worker=" + "w" * 40
    default = default_job_name("retraining-pipeline", "train", suffix="abc123", max_len=54)
    job = build_manifests(JobRequest(job_template=template), run_labels=LABELS, default_name=default).job
    name = job["metadata"]["name"]
    assert name.endswith("-abc123") and len(f"{name}-{'w' * 40}-1") <= 63


def test_sanitize_dns_label():
    assert sanitize_dns_label("My_DAG.v2--x", 63) == "my-dag-v2-x"
    assert sanitize_dns_label("123", 63) == "j-123"
    assert sanitize_dns_label("abc-def", 4) == "abc"


def test_label_values_are_sanitised_and_stay_distinct():
    run_id = "scheduled__2026-11-22T00:00:00+00:00"
    label = sanitize_label_value(run_id)
    assert label != run_id and len(label) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", label)
    assert sanitize_label_value("manual") == "manual"
    a, b = sanitize_label_value("x" * 80 + "a"), sanitize_label_value("x" * 80 + "b")
    assert a != b and len(a) <= 63 and len(b) <= 63
    assert sanitize_label_value("a:b") != sanitize_label_value("a;b")


def test_run_and_identity_labels():
    labels = run_labels(dag_id="d", task_id="group.t", run_id="scheduled__2026-11-22T00:00:00+00:00",
                        try_number=3, map_index=4)
    assert labels[MANAGED_BY_LABEL] == "airflow-volcano" and labels["airflow-volcano.io/try-number"] == "3"
    assert labels["airflow-volcano.io/map-index"] == "4" and LABELS["airflow-volcano.io/map-index"] == "none"
    identity = identity_labels({**labels, "airflow-volcano.io/checked": "true", "team": "x"})
    assert identity == {key: value for key, value in labels.items() if key != "airflow-volcano.io/try-number"}
    retry = run_labels(dag_id="d", task_id="group.t", run_id="scheduled__2026-11-22T00:00:00+00:00",
                       try_number=4, map_index=4)
    assert identity_labels(retry) == identity


def test_pod_names_stay_within_63_characters_for_every_index():
    job = build(name="a" * (63 - len("-worker-10")), worker_replicas=11).job
    assert len(f"{job['metadata']['name']}-worker-10") == 63
    assert "at most 53" in error_of(name="a" * 54, worker_replicas=11)


# -- output --------------------------------------------------------------------------------------------


def test_shown_yaml_round_trips_both_documents_configmap_first():
    from airflow_volcano.observability.masking import shown_yaml

    manifests = build(training_script=TrainingScript("t.py", "print('你好')\n"), namespace="ml")
    configmap, job = yaml.safe_load_all(shown_yaml(*manifests.documents()))
    # What is shown is what is submitted, but for the signal-forwarding shell's text, named instead, and the
    # restart budgets' annotation (maxRetry is shown).
    expected = copy.deepcopy(manifests.job)
    for each in expected["spec"]["tasks"]:
        each["template"]["spec"]["containers"][0]["command"][2] = FORWARDER_SHOWN
    del expected["metadata"]["annotations"]
    assert (configmap, job) == (manifests.configmap, expected)
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["namespace"] == "ml"
    plain = build().job
    del plain["metadata"]["annotations"]
    assert list(yaml.safe_load_all(shown_yaml(*build().documents()))) == [plain], "no command, nothing named"


def test_build_does_not_mutate_its_inputs():
    template, env = seed(), [{"name": "A", "value": "1"}]
    snapshot = copy.deepcopy(template)
    build_template(template, env=env, training_script=TrainingScript("t.py", ""))
    assert template == snapshot and env == [{"name": "A", "value": "1"}]


# -- TensorBoard (seed 004) ------------------------------------------------------------------------------

SHARED_LOGS = {"volumes": [{"name": "logs", "persistentVolumeClaim": {"claimName": "train-logs"}}],
               "volume_mounts": [{"name": "logs", "mountPath": "/logs"}]}


def test_tensorboard_adds_a_task_outside_the_gang_reading_the_masters_volume():
    job = build(worker_replicas=2, node_selector={"pool": "gpu"}, tensorboard={"logdir": "/logs/tb/"},
                **SHARED_LOGS).job

    board = task(job, "tensorboard")
    pod = board["template"]["spec"]
    assert board["replicas"] == 1 and board["minAvailable"] == 0
    assert job["spec"]["minAvailable"] == 3, "the gang is master + workers; training never waits for TensorBoard"
    assert pod["restartPolicy"] == "OnFailure" and pod["nodeSelector"] == {"pool": "gpu"}
    assert board["policies"] == [{"events": ["PodEvicted", "PodFailed"], "action": "RestartTask"}]
    assert pod["volumes"] == [{"name": "logs", "persistentVolumeClaim": {"claimName": "train-logs"}}]
    (tb,) = pod["containers"]
    assert tb["image"] == "img:1" and tb["ports"] == [{"name": "tensorboard", "containerPort": 6006}]
    assert tb["command"] == ["python", "-m", "tensorboard.main", "--logdir=/logs/tb", "--bind_all", "--port=6006"]
    assert tb["volumeMounts"] == [{"name": "logs", "mountPath": "/logs", "readOnly": True}]
    assert board["template"]["metadata"]["labels"][MANAGED_BY_LABEL] == "airflow-volcano"
    assert job["spec"]["plugins"]["pytorch"][:2] == ["--master=master", "--worker=worker"], "not a rank"
    validate_job(job)


def test_tensorboard_options_image_port_resources_and_zero_workers():
    job = build(worker_replicas=0, tensorboard={"logdir": "/logs", "image": "tb:2", "port": "7007",
                                                "resources": {"cpu": "1"}}, **SHARED_LOGS).job
    tb = container(job, "tensorboard")
    assert [t["name"] for t in job["spec"]["tasks"]] == ["master", "tensorboard"]
    assert (tb["image"], tb["ports"][0]["containerPort"], tb["command"][-1]) == ("tb:2", 7007, "--port=7007")
    assert tb["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}}


def test_tensorboard_makes_the_masters_completion_end_the_job():
    template = seed()
    master = task(template, "master")
    master["policies"] = [{"event": "TaskFailed", "action": "AbortJob"}]
    master["template"]["spec"]["volumes"] = SHARED_LOGS["volumes"]
    master["template"]["spec"]["containers"][0]["volumeMounts"] = SHARED_LOGS["volume_mounts"]
    job = build_template(template, tensorboard={"logdir": "/logs"}).job
    assert task(job, "master")["policies"] == [{"event": "TaskFailed", "action": "AbortJob"},
                                               {"event": "TaskCompleted", "action": "CompleteJob"}]


@pytest.mark.parametrize(("options", "extra", "expected"), [
    ({"logdir": "logs"}, SHARED_LOGS, "tensorboard: logdir must be an absolute path"),
    ({"logdir": "/logs", "colour": "red"}, SHARED_LOGS, "tensorboard: unknown key(s) 'colour'"),
    ({"logdir": "/logs", "port": 0}, SHARED_LOGS, "tensorboard: port"),
    ({"logdir": "/logs", "image": " "}, SHARED_LOGS, "tensorboard: image must be a non-empty string"),
    ({"logdir": "/logs", "resources": {"cpu": "-1"}}, SHARED_LOGS, "tensorboard: resources"),
    ({"logdir": "/elsewhere"}, SHARED_LOGS, "logdir '/elsewhere' is not inside a volume mounted in the master"),
    ({"logdir": "/logsx"}, SHARED_LOGS, "logdir '/logsx' is not inside a volume mounted in the master"),
    ({"logdir": "/logs"}, {"volumes": [{"name": "logs", "emptyDir": {}}],
                           "volume_mounts": [{"name": "logs", "mountPath": "/logs"}]}, "an emptyDir"),
    ("/logs", SHARED_LOGS, "tensorboard must be a dict"),
])
def test_bad_tensorboard_options_are_refused_naming_the_parameter(options, extra, expected):
    assert expected in error_of(tensorboard=options, **extra)


def test_tensorboard_refuses_a_template_that_already_has_a_tensorboard_task():
    template = seed()
    template["spec"]["tasks"].append(copy.deepcopy(task(template, "worker")) | {"name": "tensorboard"})
    assert "already has a task named 'tensorboard'" in template_error(template, tensorboard={"logdir": "/x"})


def test_task_pods_names_every_pod_of_the_named_tasks_and_refuses_unknown_ones():
    job = build(worker_replicas=3, tensorboard={"logdir": "/logs"}, **SHARED_LOGS).job
    name = job["metadata"]["name"]
    assert task_pods(job, ["worker"], "log_tasks") == [(f"{name}-worker-{i}", "worker") for i in range(3)]
    assert tensorboard_endpoint(job) == (f"{name}-tensorboard-0", 6006)
    assert tensorboard_endpoint(build().job) is None
    with pytest.raises(JobSpecError, match=r"log_tasks: the job has no task 'workers' \(tasks: master, worker, "):
        task_pods(job, ["workers"], "log_tasks")


# -- launcher="torchrun" -----------------------------------------------------------------------------------

SCRIPT = TrainingScript("train.py", "print('hi')\n")


def test_torchrun_runs_one_agent_per_pod_with_volcanos_rank_as_node_rank():
    job = build(worker_replicas=2, training_script=SCRIPT, launcher="torchrun", nproc_per_node="2",
                max_restarts=1, torchrun_options=["--log_dir=/tmp/tr"], args=["--epochs", "3"]).job
    expected = ["torchrun", "--nproc_per_node=2", "--nnodes=3", "--node_rank=$(RANK)",
                "--master_addr=$(MASTER_ADDR)", "--master_port=$(MASTER_PORT)", "--max_restarts=1",
                "--log_dir=/tmp/tr", f"{SCRIPT_MOUNT_PATH}/train.py"]
    for role in ("master", "worker"):
        assert container(job, role)["command"] == expected
        assert container(job, role)["args"] == ["--epochs", "3"]


def test_torchrun_is_elastic_when_min_available_is_below_the_pods():
    job = build(worker_replicas=2, training_script=SCRIPT, launcher="torchrun", nproc_per_node="gpu",
                min_available=2).job
    name = job["metadata"]["name"]
    # The master hosts the c10d store (is_host): an agent left to decide by resolving the endpoint's
    # name may start before the master's DNS record exists and wait for a store nobody serves.
    for role, is_host in (("master", 1), ("worker", 0)):
        assert container(job, role)["command"] == [
            "torchrun", "--nproc_per_node=gpu", "--nnodes=2:3", "--rdzv_backend=c10d",
            "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)", f"--rdzv_id={name}", f"--rdzv_conf=is_host={is_host}",
            f"{SCRIPT_MOUNT_PATH}/train.py"]
    own = build(worker_replicas=2, training_script=SCRIPT, launcher="torchrun", min_available=2,
                torchrun_options=["--rdzv_conf=last_call_timeout=5", "--log_dir=/x"]).job
    assert container(own, "worker")["command"][-3:] == ["--log_dir=/x", "--rdzv_conf=last_call_timeout=5,is_host=0",
                                                        f"{SCRIPT_MOUNT_PATH}/train.py"]
    theirs = build(worker_replicas=2, training_script=SCRIPT, launcher="torchrun", min_available=2,
                   torchrun_options=["--rdzv_conf=is_host=0"]).job
    assert container(theirs, "master")["command"][-2] == "--rdzv_conf=is_host=0", "the user's is_host wins"


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"launcher": "mpirun", "training_script": SCRIPT}, "launcher must be one of python, torchrun; got 'mpirun'"),
    ({"nproc_per_node": 2, "training_script": SCRIPT}, "nproc_per_node: only used with launcher='torchrun'"),
    ({"launcher": "torchrun"}, "launcher='torchrun' runs training_script under torchrun"),
    ({"launcher": "torchrun", "training_script": SCRIPT, "command": ["x"]}, "give args= for the script, not command="),
    ({"launcher": "torchrun", "training_script": SCRIPT, "nproc_per_node": 0}, "nproc_per_node"),
    ({"launcher": "torchrun", "training_script": SCRIPT, "nproc_per_node": "many"}, "nproc_per_node"),
    ({"launcher": "torchrun", "training_script": SCRIPT, "max_restarts": -1}, "max_restarts"),
    ({"launcher": "torchrun", "training_script": SCRIPT, "torchrun_options": ["--nnodes=9"]},
     "torchrun_options: '--nnodes=9' is set by the operator"),
    ({"launcher": "torchrun", "training_script": SCRIPT, "torchrun_options": "--log_dir=/x"},
     "torchrun_options must be a list"),
])
def test_bad_launcher_arguments_are_refused_naming_the_parameter(kwargs, expected):
    assert expected in error_of(**kwargs)


# -- hostfile launch: DeepSpeed / mpirun over ssh (VolcanoDeepSpeedJobOperator) ------------------------------


def deepspeed(**kwargs) -> HostfileLaunch:
    return HostfileLaunch(**kwargs)


def launch_env(job: dict, role: str = "master") -> dict[str, str]:
    """The settings a hostfile launch's scripts read from their container's environment."""
    return {item["name"]: item["value"] for item in container(job, role).get("env") or []
            if item["name"].startswith("AIRFLOW_VOLCANO_")}


def test_deepspeed_job_has_ssh_svc_env_plugins_sshd_workers_and_a_launching_master():
    """The scripts themselves run in tests/unit/test_hostfile_launch.py; here, what the Job gives them."""
    manifests = build(worker_replicas=2, training_script=SCRIPT, args=["--steps", "5"],
                      hostfile_launch=deepspeed(slots_per_worker=2, options=["--bind_cores_to_rank"]))
    job, data = manifests.job, manifests.configmap["data"]
    assert job["spec"]["plugins"] == {"ssh": [], "svc": [], "env": []}
    assert container(job, "master")["command"] == [
        "/bin/sh", f"{SCRIPT_MOUNT_PATH}/{LAUNCH_SCRIPT}", "--launcher-options", "1", "--bind_cores_to_rank",
        f"{SCRIPT_MOUNT_PATH}/train.py"]
    assert "args" not in container(job, "master"), "no launcher carries the script's arguments"
    assert container(job, "worker")["command"] == ["/bin/sh", f"{SCRIPT_MOUNT_PATH}/{SSHD_SCRIPT}"]
    assert container(job, "worker")["args"] == ["--steps", "5"], "the ranks read them from their worker"
    assert set(data) == {"train.py", LAUNCH_SCRIPT, SSHD_SCRIPT, SESSION_SCRIPT, ARGV_SHIM}
    assert launch_env(job).items() >= {
        "AIRFLOW_VOLCANO_LAUNCHER": "deepspeed", "AIRFLOW_VOLCANO_WORKER_HOSTS_FILE": "/etc/volcano/worker.host",
        "AIRFLOW_VOLCANO_SLOTS_PER_WORKER": "2", "AIRFLOW_VOLCANO_PORT": "29500",
        "AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT": "300"}.items()
    assert launch_env(job, "worker")["AIRFLOW_VOLCANO_SSH_SESSION_SCRIPT"] == f"{SCRIPT_MOUNT_PATH}/{SESSION_SCRIPT}"
    assert manifests.main_task == "master"
    assert job["spec"]["minAvailable"] == 3 and task(job, "master")["policies"] == [
        {"event": "TaskCompleted", "action": "CompleteJob"}]


def test_mpirun_launch_runs_python_on_every_slot_with_the_rendezvous_address():
    job = build(worker_replicas=3, training_script=SCRIPT, hostfile_launch=deepspeed(
        launcher="mpirun", port="29600", ssh_wait_timeout="60", options=["--mca", "btl", "tcp,self"])).job
    assert container(job, "master")["command"][2:] == [
        "--launcher-options", "3", "--mca", "btl", "tcp,self", f"{SCRIPT_MOUNT_PATH}/train.py"]
    assert launch_env(job).items() >= {
        "AIRFLOW_VOLCANO_LAUNCHER": "mpirun", "AIRFLOW_VOLCANO_PORT": "29600",
        "AIRFLOW_VOLCANO_SSH_WAIT_TIMEOUT": "60", "AIRFLOW_VOLCANO_SLOTS_PER_WORKER": "1"}.items()


def test_a_template_gets_the_plugins_the_launch_needs_and_keeps_its_own():
    template = seed()
    template["spec"]["plugins"] = {"env": [], "svc": ["--publish-not-ready-addresses"]}
    job = build_template(template, training_script=SCRIPT, hostfile_launch=deepspeed()).job
    assert job["spec"]["plugins"] == {"env": [], "svc": ["--publish-not-ready-addresses"], "ssh": []}


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"hostfile_launch": HostfileLaunch(launcher="torchrun")}, "launcher must be one of deepspeed, mpirun; got"),
    ({"hostfile_launch": HostfileLaunch(slots_per_worker=0)}, "slots_per_worker"),
    ({"hostfile_launch": HostfileLaunch(slots_per_worker="two")}, "slots_per_worker"),
    ({"hostfile_launch": HostfileLaunch(port=70000)}, "port"),
    ({"hostfile_launch": HostfileLaunch(ssh_wait_timeout=0)}, "ssh_wait_timeout"),
    ({"hostfile_launch": HostfileLaunch(options=["--hostfile=/etc/hosts"])},
     "launcher_options: '--hostfile=/etc/hosts' is set by the operator"),
    ({"hostfile_launch": HostfileLaunch(launcher="mpirun", options=["-np", "8"])},
     "launcher_options: '-np' is set by the operator"),
    ({"hostfile_launch": HostfileLaunch(options="--bind_cores_to_rank")}, "launcher_options must be a list"),
    ({"hostfile_launch": HostfileLaunch(), "training_script": None}, "runs training_script on every worker"),
    ({"hostfile_launch": HostfileLaunch(), "command": ["deepspeed"]}, "give args= for the script, not command="),
    ({"hostfile_launch": HostfileLaunch(), "worker_replicas": 0}, "a task 'worker' with worker_replicas >= 1"),
    ({"hostfile_launch": HostfileLaunch(), "training_script": TrainingScript(LAUNCH_SCRIPT, "x")},
     "training_script: the file name 'airflow-volcano-launch.sh' is one of the operator's own"),
    ({"hostfile_launch": HostfileLaunch(), "training_script": TrainingScript(ARGV_SHIM, "x")},
     "training_script: the file name 'airflow-volcano-argv.py' is one of the operator's own"),
    ({"hostfile_launch": HostfileLaunch(options=["--module"])}, "launcher_options: '--module' cannot be used"),
    ({"hostfile_launch": HostfileLaunch(options=["--venv_script", "/v/$(id)"])},
     "DeepSpeed's runner writes this value unquoted"),
])
def test_bad_hostfile_launch_arguments_are_refused_naming_the_parameter(kwargs, expected):
    kwargs.setdefault("training_script", SCRIPT)
    assert expected in error_of(**kwargs)


# -- retryable_exit_codes ---------------------------------------------------------------------------------


def test_retryable_exit_codes_restart_the_chosen_scope_and_end_the_job_on_others():
    job = build(retryable_exit_codes=[137], restart_scope="task").job
    assert job["spec"]["policies"] == [{"exitCode": 137, "action": "RestartTask"},
                                       {"event": "PodEvicted", "action": "RestartTask"},
                                       {"event": "PodFailed", "action": "TerminateJob"}]
    assert retryable_exit_codes(job) == [137]
    assert build(retryable_exit_codes=[]).job["spec"]["policies"] == [
        {"event": "PodEvicted", "action": "RestartJob"}, {"event": "PodFailed", "action": "TerminateJob"}]
    template = seed()
    template["spec"]["policies"] = [{"event": "PodFailed", "action": "RestartJob"}]
    assert retryable_exit_codes(build_template(template).job) is None, "a template's own policies stay"
    assert retryable_exit_codes(build_template(template, retryable_exit_codes=[143]).job) == [143]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"retryable_exit_codes": [0]}, "retryable_exit_codes"),
    ({"retryable_exit_codes": [256]}, "retryable_exit_codes"),
    ({"retryable_exit_codes": [137, 137]}, "retryable_exit_codes: duplicate exit code"),
    ({"retryable_exit_codes": "137"}, "retryable_exit_codes must be a list"),
    ({"retryable_exit_codes": [True]}, "retryable_exit_codes must be a list of int"),
    ({"restart_scope": "pod"}, "restart_scope must be one of job, task; got 'pod'"),
    ({"retryable_exit_codes": [137], "policies": [{"event": "PodFailed", "action": "AbortJob"}]},
     "policies cannot be combined with retryable_exit_codes"),
])
def test_bad_retry_arguments_are_refused_naming_the_parameter(kwargs, expected):
    assert expected in error_of(**kwargs)


# -- debug mode ------------------------------------------------------------------------------------------


def test_debug_mode_keeps_the_pods_and_replaces_only_their_command():
    import json

    from airflow_volcano.constants import DEBUG_ANNOTATION
    from airflow_volcano.manifest import debug_command

    normal = build(worker_replicas=2, training_script=SCRIPT, args=["--lr", "0.1"]).job
    job = build(worker_replicas=2, training_script=SCRIPT, args=["--lr", "0.1"], debug=True, debug_timeout=600).job
    for role in ("master", "worker"):
        mine, theirs = container(job, role), container(normal, role)
        assert mine["command"] == debug_command(660) and "args" not in mine, "debug_timeout and a minute at most"
        assert {k: v for k, v in mine.items() if k not in ("command", "args")} == \
            {k: v for k, v in theirs.items() if k not in ("command", "args")}, "same image, env, mounts, resources"
        annotation = task(job, role)["template"]["metadata"]["annotations"][DEBUG_ANNOTATION]
        assert json.loads(annotation) == ["python", f"{SCRIPT_MOUNT_PATH}/train.py", "--lr", "0.1"]
    assert job["spec"]["minAvailable"] == normal["spec"]["minAvailable"]


def test_debug_mode_of_a_hostfile_launch_keeps_the_workers_sshd_for_the_launcher():
    from airflow_volcano.constants import DEBUG_ANNOTATION
    from airflow_volcano.manifest import debug_command

    job = build(worker_replicas=2, training_script=SCRIPT, hostfile_launch=deepspeed(), debug=True,
                debug_timeout=30).job
    assert container(job, "master")["command"] == debug_command(90)
    assert container(job, "worker")["command"] == ["/bin/sh", f"{SCRIPT_MOUNT_PATH}/{SSHD_SCRIPT}"]
    assert DEBUG_ANNOTATION not in (task(job, "worker")["template"]["metadata"].get("annotations") or {})


def test_wait_for_master_uses_volcanos_own_plugin_option():
    job = build(wait_for_master="localhost/img:dev", port=29500).job
    assert job["spec"]["plugins"]["pytorch"] == ["--master=master", "--worker=worker", "--port=29500",
                                                 "--wait-master-enabled", "--wait-master-timeout=300",
                                                 "--wait-master-image=localhost/img:dev"]
    assert build(wait_for_master=True).job["spec"]["plugins"]["pytorch"][3:] == [
        "--wait-master-enabled", "--wait-master-timeout=300"]
    assert "--wait-master-enabled" not in build().job["spec"]["plugins"]["pytorch"]
    assert "wait_for_master must be True/False or the image" in error_of(wait_for_master=" ")


# -- any Volcano Job (VolcanoJobOperator) --------------------------------------------------------------

def mpi_like_template() -> dict:
    def task(name: str, replicas: int) -> dict:
        return {"name": name, "replicas": replicas,
                "template": {"spec": {"containers": [{"name": name, "image": "old:1"}], "restartPolicy": "Never"}}}
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {},
            "spec": {"minAvailable": 3, "plugins": {"ssh": [], "svc": []},
                     "tasks": [task("launcher", 1), task("runner", 2)]}}


def test_any_job_gets_the_pod_arguments_in_every_task_and_keeps_its_own_shape():
    manifests = build_template(mpi_like_template(), kind=JobKind.GENERIC, image="new:2", env={"A": "1"},
                               node_selector={"pool": "cpu"}, training_script=SCRIPT)
    job = manifests.job
    assert manifests.main_task == "launcher", "no pytorch plugin: the first task"
    assert job["spec"]["plugins"] == {"ssh": [], "svc": []} and job["spec"]["minAvailable"] == 3
    for name in ("launcher", "runner"):
        pod = task(job, name)["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "cpu"}
        assert container(job, name)["image"] == "new:2"
        assert container(job, name)["command"] == ["python", f"{SCRIPT_MOUNT_PATH}/train.py"]
        assert {"name": "A", "value": "1"} in container(job, name)["env"]
    assert build_template(mpi_like_template(), kind=JobKind.GENERIC, main_task="runner").main_task == "runner"
    assert build_template(seed(), kind=JobKind.GENERIC).main_task == "master", "the pytorch plugin's master"


def test_any_job_needs_a_template_and_an_existing_main_task():
    with pytest.raises(JobSpecError, match="job_template or full_job_spec is required"):
        build_manifests(JobRequest(kind=JobKind.GENERIC, image="x"), run_labels=LABELS, default_name="a-b-c")
    assert "main_task 'chief': the job has no such task (tasks: launcher, runner)" in template_error(
        mpi_like_template(), kind=JobKind.GENERIC, main_task="chief")


def test_a_trailing_newline_does_not_pass_for_a_valid_name_or_label():
    """Python's `$` also matches before a final newline; the apiserver's patterns do not (found by
    the property test: a label value "\\n" passed our check and the apiserver refused it)."""
    assert "invalid label value '\\n'" in error_of(labels={"team": "\n"})
    assert "is not a DNS label" in error_of(name="train\n")
    assert "invalid environment variable" in error_of(env={"A\n": "1"})


@pytest.mark.parametrize("launcher", ["deepspeed", "mpirun"])
def test_the_launch_scripts_are_valid_shell_with_hostile_options(launcher):
    """The scripts are fixed files whatever the options; test_hostfile_launch.py runs them and checks
    that the launcher gets exactly these words."""
    import subprocess

    from airflow_volcano.kubelet import process_string

    options = ["--tag", "it's a \"quoted\" $(value)", "--x=`id`"] if launcher == "mpirun" else ["--comment=it's $(id)"]
    manifests = build(worker_replicas=2, training_script=SCRIPT, worker_task_name="gpu-workers",
                      hostfile_launch=deepspeed(launcher=launcher, options=options))
    data = manifests.configmap["data"]
    for name in (LAUNCH_SCRIPT, SSHD_SCRIPT, SESSION_SCRIPT):
        checked = subprocess.run(["sh", "-n"], input=data[name], text=True, capture_output=True)
        assert checked.returncode == 0, (name, checked.stderr)
    assert launch_env(manifests.job)["AIRFLOW_VOLCANO_WORKER_HOSTS_FILE"] == "/etc/volcano/gpu-workers.host"
    # The options reach the launch script as the words given: counted, never expanded by the kubelet or a shell.
    command = [process_string(word) for word in container(manifests.job, "master")["command"]]
    assert command[2:-1] == ["--launcher-options", str(len(options)), *options]


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"container_resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "100m"}}},
     "container_resources: the request of cpu (1) is more than its limit (100m)"),
    ({"container_resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1000Mi"}}},
     "container_resources: the request of memory (1Gi) is more than its limit (1000Mi)"),
    ({"container_resources": {"requests": {"cpu": "2"}}, "worker_resources": {"limits": {"cpu": "1500m"}}},
     "container_resources with worker_resources: the request of cpu (2) is more than its limit (1500m)"),
])
def test_a_request_above_its_limit_is_refused_before_submitting(kwargs, expected):
    """Found by the property test on Volcano v1.14.1 with Kubernetes v1.31: Volcano's webhook refuses it."""
    with pytest.raises(JobSpecError) as error:
        build(worker_replicas=1, training_script=SCRIPT, **kwargs)
    assert str(error.value).startswith(expected)
    assert build(worker_replicas=1, training_script=SCRIPT, container_resources={
        "requests": {"cpu": "1500m", "memory": "1e3"}, "limits": {"cpu": "1.5", "memory": "1k"}}).job
