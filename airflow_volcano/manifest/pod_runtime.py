"""What every training pod gets around its command, for long training on real clusters: signals passed
on to the training process (shell/forward-signals.sh as PID 1), a memory-backed /dev/shm, the
checkpoint directory of the task instance, the counters that tell a script it is resuming, and the
hold of a non-retryable failure that lets a peer's retryable one decide (AIRFLOW_VOLCANO_HOLD_EXIT)."""

from __future__ import annotations

from typing import Any

from airflow_volcano import shell
from airflow_volcano.constants import DEBUG_ANNOTATION, HOLD_NONRETRYABLE_EXIT_SECONDS, TRY_NUMBER_LABEL
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.kubelet import container_string
from airflow_volcano.manifest.policies import held_exit_codes
from airflow_volcano.manifest.request import DEFAULT_SHM_SIZE, JobRequest

SIGNAL_FORWARDER = "airflow-volcano-run"  # $0 of the forwarding shell, as `ps` shows it
SHM_VOLUME = "airflow-volcano-shm"
SHM_PATH = "/dev/shm"
# The environment every rank gets (the values come from the pod's own metadata: the downward API).
CHECKPOINT_DIR_ENV = "CHECKPOINT_DIR"
RESTART_COUNT_ENV = "VOLCANO_RESTART_COUNT"
TRY_NUMBER_ENV = "AIRFLOW_TRY_NUMBER"
# Volcano writes the Job's restart count (status.retryCount when the pod was made) on every pod.
RETRY_COUNT_ANNOTATION = "volcano.sh/job-retry-count"
# With stall_timeout: the pod's annotations as a file (the downward API; the kubelet rewrites it when
# they change), where forward-signals.sh sees the operator's request for stacks, and the
# sitecustomize (shell/stack_dumps.py) that makes every Python process able to answer it.
PODINFO_VOLUME = "airflow-volcano-podinfo"
PODINFO_PATH = "/var/run/airflow-volcano"
PODINFO_ENV = "AIRFLOW_VOLCANO_PODINFO"
SITECUSTOMIZE_ENV = "AIRFLOW_VOLCANO_SITECUSTOMIZE"
SITECUSTOMIZE_SHOWN = "<airflow_volcano/shell/stack_dumps.py>"
# With stall_timeout too: the relay forward-signals.sh runs the command's output through, which makes
# bytes without a newline (a progress bar) count as output.
OUTPUT_RELAY_ENV = "AIRFLOW_VOLCANO_OUTPUT_RELAY"
OUTPUT_RELAY_SHOWN = "<airflow_volcano/shell/output_relay.py>"
# Env values shown to a user by the file's name (the UI, dry_run), not inlined.
SHOWN_ENV_VALUES = {SITECUSTOMIZE_ENV: SITECUSTOMIZE_SHOWN, OUTPUT_RELAY_ENV: OUTPUT_RELAY_SHOWN}
# "<seconds> <code>...": forward-signals.sh holds back a non-zero exit not among the codes (see
# HOLD_NONRETRYABLE_EXIT_SECONDS), set when the Job's policies restart on something and end it on the rest.
HOLD_EXIT_ENV = "AIRFLOW_VOLCANO_HOLD_EXIT"


def signal_forwarding_command(command: list[str]) -> list[str]:
    """`command` run under the forwarding shell (inline: the pod may not mount the script's ConfigMap)."""
    return ["/bin/sh", "-c", container_string(shell.read("forward-signals.sh")), SIGNAL_FORWARDER, *command]


# What the UI and dry_run() show instead of the forwarding shell's text (2.5 KiB per container, which
# would push a Job past Airflow's rendered-field limit, max_templated_field_length).
FORWARDER_SHOWN = "<airflow_volcano/shell/forward-signals.sh>"


def forwarded(command: list[Any]) -> bool:
    """Whether a container command is one signal_forwarding_command built."""
    return len(command) >= 4 and command[:2] == ["/bin/sh", "-c"] and command[3] == SIGNAL_FORWARDER


def shown_command(command: list[Any]) -> list[Any]:
    """A container command as shown to a user: the forwarding shell's text named, not inlined."""
    return [*command[:2], FORWARDER_SHOWN, *command[3:]] if forwarded(command) else command


def without_signal_forwarding(command: list[str]) -> list[str]:
    """The command the forwarding shell runs (the command itself if it has none)."""
    return command[4:] if forwarded(command) else command


def apply_pod_runtime(job: dict, tasks: list[dict], req: JobRequest, *, checkpoint_subdir: str) -> None:
    """Give the first container of each of the Job's `tasks`' pods what long training needs (see the
    module docstring). A debug pod keeps its sleeping command; a container without a command (the
    image's entrypoint, which the Job does not show) runs it as PID 1, unwrapped."""
    checkpoint = f"{req.checkpoint_dir}/{checkpoint_subdir}" if req.checkpoint_dir else None
    for task in tasks:
        template = task.setdefault("template", {})
        pod = template.setdefault("spec", {})
        containers = pod.get("containers") or []
        if not containers:
            continue
        container = containers[0]
        debugging = DEBUG_ANNOTATION in ((template.get("metadata") or {}).get("annotations") or {})
        wrapped = bool(container.get("command")) and not debugging
        if wrapped:
            container["command"] = signal_forwarding_command(container["command"])
            # A failed container's last log lines in its status: they survive Volcano removing the
            # pod, which it does to the pods still running when it ends a Job (the first to fail, too).
            container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
        if req.termination_grace_period is not None:
            pod["terminationGracePeriodSeconds"] = req.termination_grace_period
        if req.shm_size is not None:
            _add_shm(pod, container, req)
        if req.checkpoint_dir is not None:
            shared_volume(pod, container, req.checkpoint_dir, "checkpoint_dir", f"task {task.get('name')!r}")
        _set_env(container, checkpoint)
        held = held_exit_codes(task, job) if wrapped else None
        if held is not None:
            _replace_env(container, {"name": HOLD_EXIT_ENV,
                                     "value": " ".join(map(str, [HOLD_NONRETRYABLE_EXIT_SECONDS, *held]))})
        if req.stall_timeout is not None and wrapped:
            _add_stack_dumps(pod, container)


def _add_stack_dumps(pod: dict, container: dict) -> None:
    pod.setdefault("volumes", []).append({"name": PODINFO_VOLUME, "downwardAPI": {"items": [
        {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}})
    container.setdefault("volumeMounts", []).append({"name": PODINFO_VOLUME, "mountPath": PODINFO_PATH,
                                                     "readOnly": True})
    container.setdefault("env", []).extend([
        {"name": PODINFO_ENV, "value": PODINFO_PATH},
        {"name": SITECUSTOMIZE_ENV, "value": container_string(shell.read("stack_dumps.py"))},
        {"name": OUTPUT_RELAY_ENV, "value": container_string(shell.read("output_relay.py"))},
    ])


def _add_shm(pod: dict, container: dict, req: JobRequest) -> None:
    own = [mount for mount in container.get("volumeMounts") or [] if mount.get("mountPath", "").rstrip("/") == SHM_PATH]
    if own:
        if req.shm_size != DEFAULT_SHM_SIZE:
            raise JobSpecError(f"shm_size={req.shm_size!r}: the container already mounts volume "
                               f"{own[0].get('name')!r} at {SHM_PATH}; give one or the other (shm_size=None keeps "
                               "yours)")
        return  # the user's own /dev/shm wins over the default
    pod.setdefault("volumes", []).append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                                                          "sizeLimit": req.shm_size}})
    container.setdefault("volumeMounts", []).append({"name": SHM_VOLUME, "mountPath": SHM_PATH})


def _set_env(container: dict, checkpoint: str | None) -> None:
    ours: list[dict[str, Any]] = [
        {"name": RESTART_COUNT_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{RETRY_COUNT_ANNOTATION}']"}}},
        {"name": TRY_NUMBER_ENV, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{TRY_NUMBER_LABEL}']"}}},
    ]
    if checkpoint is not None:
        ours.append({"name": CHECKPOINT_DIR_ENV, "value": container_string(checkpoint)})
    names = {item["name"] for item in ours}
    env = container.setdefault("env", [])
    env[:] = [item for item in env if item.get("name") not in names] + ours


def _replace_env(container: dict, item: dict) -> None:
    """Set an env entry of ours, in place of the container's own of that name (ours win)."""
    env = container.setdefault("env", [])
    env[:] = [entry for entry in env if entry.get("name") != item["name"]] + [item]


def shared_volume(pod: dict, container: dict, path: str, parameter: str, where: str) -> tuple[dict, dict]:
    """The mount and volume that hold `path` in `container`, which other pods can see too (not an
    emptyDir); a JobSpecError naming `parameter` otherwise."""
    mounts = [mount for mount in container.get("volumeMounts") or []
              if path == mount.get("mountPath", "").rstrip("/") or
              path.startswith(mount.get("mountPath", "").rstrip("/") + "/")]
    if not mounts:
        paths = ", ".join(repr(mount.get("mountPath")) for mount in container.get("volumeMounts") or []) or "none"
        raise JobSpecError(f"{parameter} {path!r} is not inside a volume mounted in {where} (mounts: {paths}); it "
                           "must be on a volume the pods share: add one with volumes= and volume_mounts= (a "
                           "PersistentVolumeClaim, NFS, or a hostPath on a single node)")
    mount = max(mounts, key=lambda item: len(item.get("mountPath", "")))
    volume = next((item for item in pod.get("volumes") or [] if item.get("name") == mount.get("name")), None)
    if volume is None or "emptyDir" in volume:
        kind = "an emptyDir, private to each pod" if volume else f"not among the volumes of {where}"
        raise JobSpecError(f"{parameter} {path!r} is on volume {mount.get('name')!r}, which is {kind}; it must be "
                           "on a volume the pods share (a PersistentVolumeClaim, NFS, hostPath)")
    return mount, volume
