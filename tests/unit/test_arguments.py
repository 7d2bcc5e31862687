"""Operator arguments checked before anything is submitted, and user strings kept literal on the way
to the process (pure: no cluster)."""

from __future__ import annotations

import datetime

import pytest

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import HostfileLaunch
from airflow_volcano.kubelet import ExpandVars, container_string, process_string
from airflow_volcano.manifest import TrainingScript, managed_flag
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
from airflow_volcano.waiting.wait_engine import WaitLimits

from .test_manifest import build, build_template, container, error_of, seed, template_error

SCRIPT = TrainingScript("train.py", "print('hi')\n")


# -- durations ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("argument", "value"), [
    ("job_timeout", "60"), ("job_timeout", 0), ("job_timeout", -5), ("job_timeout", True),
    ("startup_timeout", float("nan")), ("startup_timeout", "15m"), ("poll_interval", None), ("poll_interval", 0),
    ("poll_interval", datetime.timedelta(0)),
])
def test_a_bad_duration_fails_before_submitting_naming_the_parameter(argument, value):
    operator = VolcanoPyTorchJobOperator(task_id="train", image="img:1", **{argument: value})
    with pytest.raises(JobSpecError) as error:
        operator.build_manifests()
    assert str(error.value).startswith(f"{argument} must be a number of seconds > 0 or a timedelta, got {value!r}")


def test_durations_may_be_timedeltas_and_limits_may_be_off():
    limits = WaitLimits.checked(startup_timeout=None, job_timeout=datetime.timedelta(hours=2), poll_interval=1)
    assert limits == WaitLimits(startup_timeout=None, job_timeout=7200.0, poll_interval=1.0)
    assert WaitLimits.from_dict(limits.to_dict()) == limits


def test_a_bad_debug_timeout_fails_before_submitting():
    operator = VolcanoPyTorchJobOperator(task_id="train", image="img:1", debug=True, debug_timeout="1h")
    with pytest.raises(JobSpecError, match="debug_timeout must be a number of seconds > 0"):
        operator.build_manifests()


# -- reserved keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["labels", "annotations"])
@pytest.mark.parametrize("key", ["airflow-volcano.io/checked", "airflow-volcano.io/try-number",
                                 "app.kubernetes.io/managed-by", "airflow-volcano.io/debug-command"])
def test_the_providers_own_label_and_annotation_keys_are_refused(argument, key):
    assert f"{argument}: '{key}' is reserved for airflow-volcano's own bookkeeping" in error_of(
        **{argument: {key: "true"}})


def test_a_template_with_the_providers_keys_is_refused_naming_where():
    template = seed()
    template["metadata"]["labels"] = {"airflow-volcano.io/checked": "true"}
    assert "job_template metadata.labels: 'airflow-volcano.io/checked' is reserved" in template_error(template)
    template = seed()
    template["spec"]["tasks"][1]["template"]["metadata"] = {"annotations": {"airflow-volcano.io/debug-command": "[]"}}
    assert ("job_template spec.tasks[1].template.metadata.annotations: 'airflow-volcano.io/debug-command' is "
            "reserved") in template_error(template)
    full = seed() | {"metadata": {"name": "x", "labels": {"app.kubernetes.io/managed-by": "helm"}}}
    with pytest.raises(JobSpecError, match="full_job_spec metadata.labels: 'app.kubernetes.io/managed-by' is reserved"):
        build(full_job_spec=full, image=None)


def test_other_keys_of_our_domain_family_are_the_users():
    job = build(labels={"team.airflow-volcano.io/owner": "ml"}, annotations={"airflow-volcano.io": "x"}).job
    assert job["metadata"]["labels"]["team.airflow-volcano.io/owner"] == "ml"


# -- launcher flags under any spelling ----------------------------------------------------------------


@pytest.mark.parametrize("option", ["--nnodes=4", "--nnode=4", "--nn=4", "--node-rank=1", "--node_ra=1",
                                    "--master-addr=x", "--master_p=1", "--rdzv-endpoint=x:1", "--nproc-per-node=8",
                                    "--max-restarts", "--standalone", "--stand"])
def test_torchrun_flags_the_operator_sets_are_refused_under_any_abbreviation(option):
    assert f"torchrun_options: {option!r} is set by the operator" in error_of(
        launcher="torchrun", training_script=SCRIPT, torchrun_options=[option])


@pytest.mark.parametrize("option", ["--rdzv_conf=last_call_timeout=5", "--log_dir=/logs", "--tee=3", "--redirects=3",
                                    "--monitor-interval=1", "-m"])
def test_torchrun_flags_of_the_users_pass(option):
    job = build(launcher="torchrun", training_script=SCRIPT, torchrun_options=[option]).job
    assert option in container(job, "master")["command"]


@pytest.mark.parametrize(("launcher", "option", "managed"), [
    ("deepspeed", "--hostf=/h", True), ("deepspeed", "--master_ad=x", True), ("deepspeed", "-Hhosts", True),
    ("deepspeed", "--num-gpus=2", True), ("deepspeed", "--force", True), ("deepspeed", "--bind_cores_to_rank", False),
    ("mpirun", "-np", True), ("mpirun", "--host=a,b", True), ("mpirun", "-npernode", False), ("mpirun", "--mca", False),
])
def test_hostfile_launcher_flags_the_operator_sets_are_refused_as_the_launcher_would_read_them(launcher, option,
                                                                                               managed):
    from airflow_volcano.hostfile_launch import MANAGED_OPTIONS

    assert bool(managed_flag(option, MANAGED_OPTIONS[launcher], abbreviations=launcher == "deepspeed")) is managed


def test_an_option_value_is_not_a_flag():
    assert managed_flag("nnodes", {"--nnodes"}, abbreviations=True) is None
    assert managed_flag("--", {"--nnodes"}, abbreviations=True) is None


# -- DeepSpeed: environment names a shell can carry ---------------------------------------------------


@pytest.mark.parametrize("name", ["MY-VAR", "my.var", "a.b-c"])
def test_a_hostfile_launch_refuses_env_names_its_ranks_would_lose(name):
    assert f"env: {name!r} cannot reach the ranks of a DeepSpeed/mpirun launch" in error_of(
        worker_replicas=1, training_script=SCRIPT, hostfile_launch=HostfileLaunch(), env={name: "1"})


def test_env_names_with_dots_stay_allowed_where_no_shell_carries_them():
    job = build(env={"my.var": "1"}).job
    assert {"name": "my.var", "value": "1"} in container(job, "master")["env"]


# -- user strings reach the process exactly -------------------------------------------------------------


HOSTILE = ["$(HF_TOKEN)", "$(id)", "`id`", "cost $5", "pa$$word", "$", "it's \"quoted\"", "a\nb", ""]


@pytest.mark.parametrize("value", HOSTILE)
def test_the_kubelet_gives_the_process_each_string_as_given(value):
    assert process_string(container_string(value)) == value


def test_command_args_env_and_torchrun_options_are_written_so_the_kubelet_expands_nothing():
    job = build(command=["python", "-c", "print('$(HF_TOKEN)')"], args=["--token=$(HF_TOKEN)", 5],
                env={"GREETING": "$(HOSTNAME) says hi", "PASSWORD": "pa$$word"}).job
    master = container(job, "master")
    assert master["command"] == ["python", "-c", "print('$$(HF_TOKEN)')"]
    assert master["args"] == ["--token=$$(HF_TOKEN)", "5"]
    assert {"name": "GREETING", "value": "$$(HOSTNAME) says hi"} in master["env"]
    assert {"name": "PASSWORD", "value": "pa$$$$word"} in master["env"]
    torchrun = container(build(launcher="torchrun", training_script=SCRIPT,
                               torchrun_options=["--log_dir=/logs/$(RANK)"]).job, "master")["command"]
    assert "--log_dir=/logs/$$(RANK)" in torchrun
    assert "--node_rank=$(RANK)" in torchrun, "the operator's own references are still expanded"


def test_expand_vars_opts_a_value_in_to_the_kubelets_expansion():
    job = build(args=[ExpandVars("/ckpt/$(POD_NAME)"), "$(POD_NAME)"],
                env=[{"name": "OUT", "value": ExpandVars("/data/$(RANK)")}, {"name": "RAW", "value": "$(RANK)"}]).job
    master = container(job, "master")
    assert master["args"] == ["/ckpt/$(POD_NAME)", "$$(POD_NAME)"]
    assert {"name": "OUT", "value": "/data/$(RANK)"} in master["env"]
    assert {"name": "RAW", "value": "$$(RANK)"} in master["env"]


def test_expand_vars_is_rendered_by_jinja_like_any_templated_string():
    from airflow.sdk import DAG

    with DAG("expand", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)):
        operator = VolcanoPyTorchJobOperator(task_id="train", image="img:1", worker_replicas=0,
                                             args=[ExpandVars("{{ params.out }}/$(RANK)"), "{{ params.out }}"],
                                             params={"out": "/ckpt"})
    operator.render_template_fields({"params": {"out": "/ckpt"}, "run_id": "manual"})
    assert container(operator._manifests.job, "master")["args"] == ["/ckpt/$(RANK)", "/ckpt"]


def test_a_template_keeps_kubernetes_own_semantics():
    template = seed()
    template["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["args"] = ["$(MASTER_ADDR)"]
    job = build_template(template).job
    assert container(job, "master")["args"] == ["$(MASTER_ADDR)"], "a template is written as the user wrote it"


def test_debug_mode_prints_the_command_as_the_process_would_get_it():
    import json

    from airflow_volcano.constants import DEBUG_ANNOTATION

    job = build(command=["python", "train.py", "$(id)"], debug=True).job
    annotation = job["spec"]["tasks"][0]["template"]["metadata"]["annotations"][DEBUG_ANNOTATION]
    assert json.loads(annotation) == ["python", "train.py", "$(id)"]


def test_deepspeed_operator_refuses_a_bad_duration_too():
    operator = VolcanoDeepSpeedJobOperator(task_id="train", image="img:1", training_script="/x.py",
                                           job_timeout="1h")
    with pytest.raises(JobSpecError, match="job_timeout must be a number of seconds"):
        operator.build_manifests()


# -- files are read only from the DAG author's folders ------------------------------------------------


def dag_with(tmp_path, **operator_kwargs):
    """An operator in a DAG whose file is in tmp_path/dags, with tmp_path/shared on its template_searchpath."""
    from airflow.sdk import DAG

    (tmp_path / "dags" / "scripts").mkdir(parents=True)
    (tmp_path / "dags" / "scripts" / "train.py").write_text("print('train')\n")
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "job.yaml").write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nspec:\n  tasks:\n  - name: main\n    replicas: 1\n"
        "    template: {spec: {containers: [{name: main, image: img}]}}\n")
    (tmp_path / "secret.txt").write_text("token\n")
    with DAG("files", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
             template_searchpath=[str(tmp_path / "shared")]) as dag:
        dag.fileloc = str(tmp_path / "dags" / "files.py")
        operator = VolcanoPyTorchJobOperator(task_id="train", image="img:1", worker_replicas=0, **operator_kwargs)
    return operator


def render(operator, **params):
    operator.render_template_fields({"params": params, "run_id": "manual"})
    return operator._manifests


@pytest.mark.parametrize("value", ["../secret.txt", "scripts/../../secret.txt", "{path}/secret.txt", "/etc/passwd"])
def test_a_rendered_script_path_cannot_leave_the_dags_folders(tmp_path, value):
    operator = dag_with(tmp_path, training_script="{{ params.s }}")
    with pytest.raises(JobSpecError) as error:
        render(operator, s=value.format(path=tmp_path))
    assert str(error.value).startswith(f"training_script: {value.format(path=tmp_path)!r} is outside the folders")
    assert "token" not in str(error.value)


def test_job_template_cannot_leave_them_either(tmp_path):
    from airflow_volcano.operators.job import VolcanoJobOperator

    operator = dag_with(tmp_path)
    generic = VolcanoJobOperator(task_id="generic", image="img:1", job_template="{{ params.t }}", dag=operator.dag)
    with pytest.raises(JobSpecError, match="job_template: '../secret.yaml' is outside the folders"):
        render(generic, t="../secret.yaml")


def test_files_in_the_dags_folder_its_searchpath_and_allowed_dirs_are_read(tmp_path):
    assert render(dag_with(tmp_path, training_script="scripts/{{ params.s }}"), s="train.py").configmap["data"] == {
        "train.py": "print('train')\n"}
    from airflow_volcano.operators.job import VolcanoJobOperator

    operator = dag_with(tmp_path / "b", training_script=str(tmp_path / "b" / "secret.txt"),
                        allowed_file_dirs=[str(tmp_path / "b")])
    assert "secret.txt" in render(operator).configmap["data"], "an explicit, untemplated folder"
    generic = VolcanoJobOperator(task_id="generic", job_template="job.yaml", dag=operator.dag)
    assert render(generic).job["spec"]["tasks"][0]["name"] == "main", "found on the template_searchpath"


@pytest.mark.parametrize("value", ["relative/dir", "/abs", ["relative"]])
def test_allowed_file_dirs_must_be_absolute_folders(value):
    with pytest.raises(JobSpecError, match="allowed_file_dirs must be a list of absolute folder paths"):
        VolcanoPyTorchJobOperator(task_id="train", allowed_file_dirs=value)


# -- secrets are not shown ----------------------------------------------------------------------------


def test_secret_looking_env_values_are_masked_in_rendered_manifests_dry_run_and_the_log(capsys):
    from airflow.sdk import DAG
    from airflow.sdk._shared.secrets_masker import redact
    from airflow.sdk.log import mask_secret

    mask_secret("value-of-a-secret-variable", "api_key")  # what Airflow does for a Variable named like a secret
    with DAG("masked", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)):
        operator = VolcanoPyTorchJobOperator(
            task_id="train", image="img:1", worker_replicas=1,
            env={"HF_TOKEN": "hf_abcdef123456", "DB_PASSWORD": "pa$$w0rd-xyz", "STEPS": "5",
                 "FROM_VARIABLE": "{{ params.v }}"},
            params={"v": "value-of-a-secret-variable"})
    operator.render_template_fields({"params": {"v": "value-of-a-secret-variable"}, "run_id": "manual"})
    printed = operator.dry_run()
    out = capsys.readouterr().out
    for text in (operator.job_manifest, out, str(printed)):
        assert "hf_abcdef123456" not in text and "pa$$" not in text and "value-of-a-secret-variable" not in text
    import yaml

    for job in (yaml.safe_load(operator.job_manifest), printed["job"]):
        assert {"name": "HF_TOKEN", "value": "***"} in container(job, "master")["env"]
        assert {"name": "STEPS", "value": "5"} in container(job, "master")["env"], "the rest is shown"
    # The values the process gets are now known to the masker: the task log hides them.
    assert redact("loaded hf_abcdef123456 and pa$$w0rd-xyz") == "loaded *** and ***"
    # What is submitted is untouched.
    env = container(operator._manifests.job, "master")["env"]
    assert {"name": "HF_TOKEN", "value": "hf_abcdef123456"} in env


# -- a try reattaches only to a Job built from its own request --------------------------------------------


def built(try_number: int = 1, default_name: str = "retrain-train-abc123", **kwargs):
    from airflow_volcano.manifest import build_manifests, run_labels

    from .test_manifest import request

    labels = run_labels(dag_id="retrain", task_id="train", run_id="manual", try_number=try_number, map_index=-1)
    kwargs.setdefault("image", "img:1")
    kwargs.setdefault("training_script", SCRIPT)
    return build_manifests(request(**kwargs), run_labels=labels, default_name=default_name)


def test_the_request_hash_is_the_same_for_every_try_of_the_same_arguments():
    first = built(try_number=1, default_name="retrain-train-aaaaaa", launcher="torchrun", min_available=1)
    second = built(try_number=2, default_name="retrain-train-bbbbbb", launcher="torchrun", min_available=1)
    assert first.job["metadata"]["name"] != second.job["metadata"]["name"]
    assert first.request_hash == second.request_hash


def test_the_request_hash_is_what_the_user_asked_for_not_what_the_provider_builds_around_it(monkeypatch):
    """An upgraded provider (another signal-forwarding shell, another default) or the cluster's Volcano
    release (fit_to_volcano's environment) must not make a retry refuse the Job an earlier try submitted."""
    from airflow_volcano import shell
    from airflow_volcano.manifest.compatibility import VolcanoFeatures, fit_to_volcano

    before = built(args=["--lr", "0.1"], tensorboard={"logdir": "/logs/tb"},
                   volumes=[{"name": "logs", "hostPath": {"path": "/tmp"}}],
                   volume_mounts=[{"name": "logs", "mountPath": "/logs"}])
    original = shell.read
    monkeypatch.setattr(shell, "read", lambda name: original(name) + "\n# a comment of a later release\n")
    after = built(args=["--lr", "0.1"], tensorboard={"logdir": "/logs/tb"},
                  volumes=[{"name": "logs", "hostPath": {"path": "/tmp"}}],
                  volume_mounts=[{"name": "logs", "mountPath": "/logs"}])
    fit_to_volcano(after.job, VolcanoFeatures.from_version("1.10", "test"))
    assert before.job != after.job, "the built Jobs differ (the shell, WORLD_SIZE for Volcano 1.10)"
    assert before.request_hash == after.request_hash


@pytest.mark.parametrize("change", [{"debug": True}, {"args": ["--lr", "0.2"]},
                                    {"training_script": TrainingScript("train.py", "print('other')\n")},
                                    {"worker_replicas": 3}])
def test_the_request_hash_changes_with_the_arguments_the_script_and_debug_mode(change):
    from airflow_volcano.manifest import is_debug_job

    base = built(args=["--lr", "0.1"])
    other = built(**{"args": ["--lr", "0.1"], **change})
    assert base.request_hash != other.request_hash
    assert is_debug_job(other.job) is bool(change.get("debug")) and not is_debug_job(base.job)


def test_a_debug_pods_command_ends_by_itself_after_its_time_and_at_once_on_sigterm():
    """The real command, run by sh: the pod ends even if the worker that would delete the Job is gone."""
    import signal
    import subprocess
    import time

    from airflow_volcano.manifest import debug_command

    start = time.monotonic()
    done = subprocess.run(debug_command(2), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and 2 <= time.monotonic() - start < 6, done
    assert "for at most 2s" in done.stdout and "2s are over" in done.stdout
    sleeping = subprocess.Popen(debug_command(3600), stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    start = time.monotonic()
    sleeping.send_signal(signal.SIGTERM)
    assert sleeping.wait(timeout=5) == 0 and time.monotonic() - start < 3


def test_the_deployments_allowed_folders_serve_every_task_and_a_param_still_cannot_leave_them(tmp_path,
                                                                                             monkeypatch):
    """`[volcano] allowed_file_dirs` (or the connection's extra): a deployment that keeps scripts in an
    include/ folder says so once, not on every task; a DAG run's params still cannot leave the folders."""
    include = tmp_path / "include"

    def operator() -> VolcanoPyTorchJobOperator:  # rendering replaces the template: one operator a render
        task = dag_with(tmp_path / str(len(list(tmp_path.iterdir()))), training_script=str(include / "{{ params.s }}"))
        (tmp_path / "secret.txt").write_text("token\n")
        return task

    include.mkdir()
    (include / "train.py").write_text("print('from include')\n")
    with pytest.raises(JobSpecError, match="is outside the folders"):
        render(operator(), s="train.py")
    monkeypatch.setenv("AIRFLOW__VOLCANO__ALLOWED_FILE_DIRS", f"{tmp_path / 'elsewhere'}, {include}")
    assert render(operator(), s="train.py").configmap["data"] == {"train.py": "print('from include')\n"}
    with pytest.raises(JobSpecError, match=r"training_script: '.*/include/../secret.txt' is outside the folders"):
        render(operator(), s="../secret.txt")
    monkeypatch.setenv("AIRFLOW__VOLCANO__ALLOWED_FILE_DIRS", "include")
    with pytest.raises(JobSpecError, match=r"\[volcano\] allowed_file_dirs: 'include' is not an absolute folder path"):
        render(operator(), s="train.py")
