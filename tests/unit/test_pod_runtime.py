"""What every training pod gets around its command (manifest.pod_runtime): the signal-forwarding
shell, /dev/shm, the grace period, the checkpoint directory and the restart counters; and the
conventions the training reports back through (resumed_from, the shared-memory hint)."""

from __future__ import annotations

import pytest

from airflow_volcano.hostfile_launch import HostfileLaunch
from airflow_volcano.job_ref import JobRef
from airflow_volcano.kubelet import process_string
from airflow_volcano.manifest import checkpoint_subdir
from airflow_volcano.manifest.pod_runtime import SIGNAL_FORWARDER, without_signal_forwarding
from airflow_volcano.observability.logs import LogCursor, emit_new_lines
from airflow_volcano.shell import read
from airflow_volcano.status import lost_pods, pod_view, shared_memory_hint
from airflow_volcano.waiting.events import Verdict, WaitOutcome
from airflow_volcano.waiting.wait_engine import WaitLimits

from .test_manifest import SCRIPT, build, build_template, error_of, seed, task

SHARED = {"volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
          "volume_mounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}


def pod_spec(job: dict, name: str) -> dict:
    return task(job, name)["template"]["spec"]


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env") or []}


@pytest.mark.parametrize("kwargs", [
    {"training_script": SCRIPT},
    {"training_script": SCRIPT, "launcher": "torchrun", "nproc_per_node": 2},
    {"command": ["bash", "-c", "echo $HOME"]},
    {"training_script": SCRIPT, "hostfile_launch": HostfileLaunch(launcher="deepspeed")},
    {"training_script": SCRIPT, "hostfile_launch": HostfileLaunch(launcher="mpirun")},
])
def test_every_training_command_runs_under_the_signal_forwarding_shell(kwargs):
    if "hostfile_launch" in kwargs:
        kwargs["extra_plugins"] = {"ssh": [], "svc": []}
    job = build(**kwargs).job
    for name in ("master", "worker"):
        command = pod_spec(job, name)["containers"][0]["command"]
        assert command[:2] == ["/bin/sh", "-c"] and command[3] == SIGNAL_FORWARDER
        assert process_string(command[2]) == read("forward-signals.sh"), "the kubelet hands sh the file exactly"
        assert without_signal_forwarding(command) == command[4:] and command[4:], "then the command itself"
        assert pod_spec(job, name)["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError", (
            "a failed container's log tail survives its pod")


def test_a_debug_pod_keeps_its_sleep_and_a_container_without_command_its_entrypoint():
    debug = build(training_script=SCRIPT, debug=True).job
    assert "airflow-volcano-debug" in pod_spec(debug, "master")["containers"][0]["command"]
    assert SIGNAL_FORWARDER not in pod_spec(debug, "master")["containers"][0]["command"]
    entrypoint = build(args=["--epochs", "3"]).job
    assert "command" not in pod_spec(entrypoint, "master")["containers"][0]


def test_shm_is_a_memory_emptydir_by_default_sized_by_shm_size_and_none_turns_it_off():
    for shm_size, expected in ((None, None), ("8Gi", "8Gi")):
        kwargs = {} if shm_size is None else {"shm_size": shm_size}
        job = build(training_script=SCRIPT, **kwargs).job
        volumes = {volume["name"]: volume for volume in pod_spec(job, "worker")["volumes"]}
        assert volumes["airflow-volcano-shm"] == {"name": "airflow-volcano-shm", "emptyDir": {
            "medium": "Memory", "sizeLimit": expected or "2Gi"}}
        assert {"name": "airflow-volcano-shm", "mountPath": "/dev/shm"} in \
            pod_spec(job, "worker")["containers"][0]["volumeMounts"]
    off = pod_spec(build(training_script=SCRIPT, shm_size=None).job, "worker")
    assert "airflow-volcano-shm" not in str(off["volumes"]) + str(off["containers"][0]["volumeMounts"])


def test_the_users_own_dev_shm_wins_over_the_default_and_conflicts_with_an_explicit_size():
    mine = {"volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
            "volume_mounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}
    job = build(training_script=SCRIPT, **mine).job
    assert [volume["name"] for volume in pod_spec(job, "master")["volumes"]] == ["dshm", "training-script"]
    template = seed()
    template["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "dshm", "mountPath": "/dev/shm/"})
    template["spec"]["tasks"][0]["template"]["spec"]["volumes"].append({"name": "dshm", "emptyDir": {}})
    assert "airflow-volcano-shm" not in str(pod_spec(build_template(template).job, "master"))
    assert "shm_size='4Gi': the container already mounts volume 'dshm' at /dev/shm" in error_of(
        training_script=SCRIPT, shm_size="4Gi", **mine)


def test_termination_grace_period_goes_to_every_training_pod():
    job = build(training_script=SCRIPT, termination_grace_period="90").job
    assert [pod_spec(job, name)["terminationGracePeriodSeconds"] for name in ("master", "worker")] == [90, 90]
    assert "terminationGracePeriodSeconds" not in pod_spec(build(training_script=SCRIPT).job, "master")


def test_every_rank_gets_the_restart_counters_and_the_task_instances_checkpoint_dir():
    job = build(training_script=SCRIPT, checkpoint_dir="/ckpt/runs/", **SHARED).job
    for name in ("master", "worker"):
        env = env_of(pod_spec(job, name)["containers"][0])
        assert env["CHECKPOINT_DIR"]["value"] == "/ckpt/runs/manual"
        assert env["VOLCANO_RESTART_COUNT"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['volcano.sh/job-retry-count']"
        assert env["AIRFLOW_TRY_NUMBER"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['airflow-volcano.io/try-number']"
    assert "CHECKPOINT_DIR" not in env_of(pod_spec(build(training_script=SCRIPT).job, "master")["containers"][0])


def test_the_checkpoint_subdirectory_is_the_task_instance_the_same_for_every_try():
    first = checkpoint_subdir(dag_id="retrain", task_id="train", run_id="scheduled__2026-11-24T00:00:00+00:00",
                              map_index=-1)
    assert first.startswith("retrain/train/scheduled__2026-11-24T00_00_00_00_00-")
    assert first == checkpoint_subdir(dag_id="retrain", task_id="train",
                                      run_id="scheduled__2026-11-24T00:00:00+00:00", map_index=-1)
    assert checkpoint_subdir(dag_id="d", task_id="t", run_id="a/b", map_index=-1) != \
        checkpoint_subdir(dag_id="d", task_id="t", run_id="a_b", map_index=-1)
    assert checkpoint_subdir(dag_id="d", task_id="t", run_id="r", map_index=2) == "d/t-2/r"
    assert ".." not in checkpoint_subdir(dag_id="..", task_id="..", run_id="..", map_index=-1).split("/")


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"shm_size": "lots"}, "shm_size must be a positive Kubernetes quantity such as '2Gi'"),
    ({"shm_size": 0}, "shm_size must be a positive Kubernetes quantity"),
    ({"shm_size": "-1Gi"}, "shm_size must be a positive Kubernetes quantity"),
    ({"termination_grace_period": -1}, "termination_grace_period"),
    ({"termination_grace_period": "soon"}, "termination_grace_period"),
    ({"checkpoint_dir": "ckpt"}, "checkpoint_dir must be an absolute path"),
    ({"checkpoint_dir": "/ckpt/../etc"}, "checkpoint_dir must be an absolute path without '.' or '..'"),
    ({"checkpoint_dir": "/elsewhere", **SHARED}, "checkpoint_dir '/elsewhere' is not inside a volume mounted in "
                                                 "task 'master'"),
    ({"checkpoint_dir": "/ckpt", "volumes": [{"name": "ckpt", "emptyDir": {}}],
      "volume_mounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}, "which is an emptyDir, private to each pod"),
    # Found by the property test with the new arguments: a mount without its volume (the webhook refuses it).
    ({"volume_mounts": [{"name": "x", "mountPath": "/x"}]}, "volume_mounts: mount 'x' at '/x' in task 'master' names "
                                                            "no volume of its pod"),
])
def test_bad_values_of_the_new_arguments_are_refused_naming_the_parameter(kwargs, expected):
    assert expected in error_of(training_script=SCRIPT, **kwargs)


def test_node_lost_timeout_is_checked_like_the_other_timeouts():
    assert WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5,
                              node_lost_timeout=90).node_lost_timeout == 90
    with pytest.raises(Exception, match="node_lost_timeout"):
        WaitLimits.checked(startup_timeout=None, job_timeout=None, poll_interval=5, node_lost_timeout=-3)
    assert WaitLimits.from_dict({"startup_timeout": 1, "job_timeout": None, "poll_interval": 5}).node_lost_timeout \
        is None, "a trigger serialized by an older version looks for no lost node"


def test_a_resumed_from_line_is_remembered_and_travels_with_the_cursor():
    cursor, shown = LogCursor(), []
    emit_new_lines(["2026-11-24T10:00:00.1Z epoch 1", "2026-11-24T10:00:00.2Z INFO:train:[airflow-volcano] "
                    "resumed from /ckpt/run/epoch-3.pt", "2026-11-24T10:00:00.3Z epoch 4"], cursor,
                   lambda line, at: shown.append(line))
    assert cursor.resumed_from == "/ckpt/run/epoch-3.pt" and len(shown) == 3
    assert LogCursor.from_dict(cursor.to_dict()).resumed_from == "/ckpt/run/epoch-3.pt"
    assert "resumed_from" not in LogCursor().to_dict(), "an old trigger's cursor dict stays as it was"


def test_lost_nodes_travel_in_the_trigger_event():
    ref = JobRef("train", "ml")
    event = WaitOutcome(Verdict.FINISHED, phase="Failed", lost_nodes=("gpu-7",))
    assert WaitOutcome.from_event(event.to_event(ref)) == (event, ref)
    assert WaitOutcome.from_event({"status": "finished", "phase": "Failed", "job": ref.to_dict()})[0].lost_nodes == ()


@pytest.mark.parametrize(("lines", "hinted"), [
    (["RuntimeError: DataLoader worker (pid 77) is killed by signal: Bus error."], True),
    (["ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory "
      "(shm)."], True),
    (["RuntimeError: unable to write to file </torch_75_1697_0>: No space left on device (28)"], True),
    (["ValueError: bad learning rate"], False),
    (["OSError: [Errno 28] No space left on device: '/data/out'"], False),
])
def test_a_shared_memory_failure_is_explained_in_one_sentence(lines, hinted):
    hint = shared_memory_hint(lines)
    assert (hint is not None) == hinted
    if hinted:
        assert "shared memory (/dev/shm)" in hint and "shm_size" in hint


def test_the_triggerers_pod_view_keeps_what_lost_pods_read():
    body = {"metadata": {"name": "p", "resourceVersion": "9", "labels": {"volcano.sh/task-spec": "worker", "x": "y"},
                         "annotations": {"big": "x" * 10_000}},
            "spec": {"nodeName": "gpu-7", "containers": [{"name": "c", "image": "img"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-24T17:21:06Z"},
                {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "c", "ready": True, "state": {"running": {}}, "imageID": "sha"}]}}
    view = pod_view(body)
    assert lost_pods([view]) == lost_pods([body]) and lost_pods([view])[0].node == "gpu-7"
    assert len(str(view)) < 500


def test_stall_timeout_mounts_the_pods_annotations_and_ships_the_sitecustomize_and_the_output_relay():
    from airflow_volcano.manifest.pod_runtime import (
        OUTPUT_RELAY_ENV,
        OUTPUT_RELAY_SHOWN,
        PODINFO_PATH,
        SITECUSTOMIZE_ENV,
        SITECUSTOMIZE_SHOWN,
    )
    from airflow_volcano.observability.masking import shown, shown_yaml

    job = build(training_script=SCRIPT, stall_timeout=120).job
    for name in ("master", "worker"):
        spec = pod_spec(job, name)
        container = spec["containers"][0]
        volume = next(volume for volume in spec["volumes"] if volume["name"] == "airflow-volcano-podinfo")
        assert volume["downwardAPI"]["items"] == [{"path": "annotations",
                                                  "fieldRef": {"fieldPath": "metadata.annotations"}}]
        assert {"name": "airflow-volcano-podinfo", "mountPath": PODINFO_PATH, "readOnly": True} in \
            container["volumeMounts"]
        env = env_of(container)
        assert env["AIRFLOW_VOLCANO_PODINFO"]["value"] == PODINFO_PATH
        assert process_string(env[SITECUSTOMIZE_ENV]["value"]) == read("stack_dumps.py")
        assert process_string(env[OUTPUT_RELAY_ENV]["value"]) == read("output_relay.py")
    shown_env = env_of(task(shown(job), "master")["template"]["spec"]["containers"][0])
    assert shown_env[SITECUSTOMIZE_ENV]["value"] == SITECUSTOMIZE_SHOWN, "the UI names the file, not its 2 KiB"
    assert shown_env[OUTPUT_RELAY_ENV]["value"] == OUTPUT_RELAY_SHOWN == "<airflow_volcano/shell/output_relay.py>"
    assert "import select" not in shown_yaml(job), "the rendered Job stays small"
    plain = pod_spec(build(training_script=SCRIPT).job, "master")
    assert "airflow-volcano-podinfo" not in str(plain), "off by default: nothing added"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"stall_timeout": 0}, "stall_timeout must be a number of seconds >= 30 or a timedelta of at least 30 seconds, "
                           "got 0 (it takes seconds, not minutes"),
    ({"stall_timeout": "soon"}, "stall_timeout must be a number of seconds >= 30"),
])
def test_bad_stall_arguments_fail_before_anything_is_built(kwargs, message):
    assert message in error_of(training_script=SCRIPT, **kwargs)


def test_the_operators_defaults_still_build_a_full_job_spec_and_stall_action_is_checked_by_the_operator():
    from airflow_volcano.exceptions import JobSpecError
    from airflow_volcano.operators.job import VolcanoJobOperator

    spec = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "given"},
            "spec": {"tasks": [{"name": "master", "replicas": 1, "template": {"spec": {"containers": [
                {"name": "master", "image": "img:1", "command": ["python", "train.py"]}]}}}]}}
    built = VolcanoJobOperator(task_id="train", full_job_spec=spec, main_task="master").build_manifests()
    assert built.job["metadata"]["name"] == "given", "stall_action's default is no pod argument"
    with pytest.raises(JobSpecError, match="stall_action must be one of .*'reboot'"):
        VolcanoJobOperator(task_id="train", full_job_spec=spec, main_task="master",
                           stall_action="reboot").build_manifests()


def test_stall_timeout_without_get_logs_is_refused_by_the_operator():
    from airflow_volcano.exceptions import JobSpecError
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    operator = VolcanoPyTorchJobOperator(task_id="train", image="img:1", command=["python", "-c", "pass"],
                                         stall_timeout=300, get_logs=False)
    with pytest.raises(JobSpecError, match=r"stall_timeout=300 needs get_logs=True"):
        operator.build_manifests()


def test_the_sitecustomize_registers_every_python_process_and_leaves_the_images_own_in_place(tmp_path):
    """Run for real: a Python process with the shipped sitecustomize first on its path writes its
    stacks on the signal, and the sitecustomize it shadows still runs."""
    import os
    import signal
    import subprocess
    import sys
    import time

    ours, images = tmp_path / "ours", tmp_path / "image"
    ours.mkdir(), images.mkdir()
    (ours / "sitecustomize.py").write_text(read("stack_dumps.py"))
    (images / "sitecustomize.py").write_text("import builtins\nbuiltins.IMAGE_SITE = True\n")
    env = {**os.environ, "PYTHONPATH": f"{ours}:{images}", "AIRFLOW_VOLCANO_STACKS_DIR": str(tmp_path), "RANK": "3"}
    script = tmp_path / "train.py"
    script.write_text("import builtins, time\nprint(getattr(builtins, 'IMAGE_SITE', False), flush=True)\n"
                      "time.sleep(30)\n")
    process = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "True", "the image's sitecustomize ran too"
        sleeping = f'File "{script}", line 3 in <module>'
        deadline = time.monotonic() + 10
        stacks = ""
        while sleeping not in stacks and time.monotonic() < deadline:  # (a loaded machine: not yet at line 3)
            os.kill(process.pid, 42)
            time.sleep(0.5)
            assert process.poll() is None, "the signal does not end a registered process"
            stacks = (tmp_path / f"stacks-{process.pid}").read_text()
        assert sleeping in stacks
        assert (tmp_path / f"about-{process.pid}").read_text().startswith("RANK=3: ")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def hold_of(job: dict, name: str) -> str | None:
    item = env_of(pod_spec(job, name)["containers"][0]).get("AIRFLOW_VOLCANO_HOLD_EXIT")
    return item and item["value"]


@pytest.mark.parametrize(("kwargs", "master", "worker"), [
    ({}, "10 130 137 138 143", "10 130 137 138 143"),
    ({"retryable_exit_codes": [137], "restart_scope": "task"}, "10 137", "10 137"),
    ({"retryable_exit_codes": []}, "10", "10"),  # an eviction still restarts: every failure waits for it
    ({"policies": [{"event": "PodFailed", "action": "TerminateJob"}]}, None, None),  # nothing restarts
    ({"policies": [{"event": "*", "action": "RestartJob"}]}, None, None),  # everything restarts
    ({"policies": [{"event": "PodFailed", "action": "TerminateJob"}, {"exitCode": 137, "action": "RestartJob"}]},
     None, None),  # PodFailed matches first: 137 never restarts
    # Task policies come first (Volcano reads them before the Job's): the master's own decide for it.
    ({"master_policies": [{"event": "PodFailed", "action": "RestartJob"}]}, None, "10 130 137 138 143"),
    ({"master_policies": [{"exitCode": 1, "action": "RestartTask"}, {"exitCode": 137, "action": "TerminateJob"}]},
     "10 1 130 138 143", "10 130 137 138 143"),
])
def test_a_non_retryable_failure_is_held_back_when_the_policies_restart_on_something_and_end_the_job_on_the_rest(
        kwargs, master, worker):
    job = build(training_script=SCRIPT, **kwargs).job
    assert (hold_of(job, "master"), hold_of(job, "worker")) == (master, worker)


def test_no_hold_for_a_container_the_shell_does_not_run():
    assert hold_of(build(training_script=SCRIPT, debug=True).job, "master") is None, "a debug pod sleeps"
    assert hold_of(build(args=["--epochs", "3"]).job, "master") is None, "the image's entrypoint runs unwrapped"
    mine = build(training_script=SCRIPT, env={"AIRFLOW_VOLCANO_HOLD_EXIT": "99 1"}).job
    assert hold_of(mine, "worker") == "10 130 137 138 143", "ours wins over a variable of the same name"
    assert [item["name"] for item in pod_spec(mine, "worker")["containers"][0]["env"]].count(
        "AIRFLOW_VOLCANO_HOLD_EXIT") == 1


def test_stall_action_restart_needs_policies_that_restart_an_evicted_pod():
    """It restarts the gang by deleting the stalled pods: a Job whose policies would not restart them is
    refused before submitting, naming stall_action."""
    from airflow_volcano.exceptions import JobSpecError
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    common = dict(task_id="train", image="img:1", command=["python", "-c", "pass"], stall_timeout=60,
                  stall_action="restart")
    assert VolcanoPyTorchJobOperator(**common).build_manifests(), "the default policies restart on PodEvicted"
    with pytest.raises(JobSpecError, match=r"stall_action='restart' restarts a stalled gang by deleting its pods"):
        VolcanoPyTorchJobOperator(**common, policies=[{"event": "PodFailed", "action": "AbortJob"}]).build_manifests()
