"""Operator arguments -> a validated Volcano Job manifest (and the training script's ConfigMap).

Pure: no Airflow, no network. Every error names the parameter and the bad value, before anything is
submitted. The modules, bottom up: `names` (the Job's and its tasks' names, the task instance's
labels), `policies` (restart rules), `checks` (value checks and the whole Job's validation),
`launchers` (what the pods run: python, torchrun, DeepSpeed/mpirun over ssh, debug mode),
`pod_runtime` (what every training pod gets around its command: signals, /dev/shm, checkpoints), `request`
(`JobRequest`, the one request every operator builds, and its checks) and `build`
(`build_manifests`).
"""

from airflow_volcano.constants import DEFAULT_DEBUG_TIMEOUT, DEFAULT_SHM_SIZE
from airflow_volcano.manifest.build import (
    JobManifests,
    build_manifests,
    is_debug_job,
    request_hash,
    task_pods,
    tensorboard_endpoint,
)
from airflow_volcano.manifest.checks import load_job_template, optional_seconds, seconds, stall_seconds, validate_job
from airflow_volcano.manifest.launchers import debug_command, managed_flag, torchrun_command
from airflow_volcano.manifest.names import (
    DEFAULT_MASTER,
    DEFAULT_WORKER,
    TENSORBOARD_TASK,
    checkpoint_subdir,
    default_job_name,
    identity_labels,
    max_job_name_length,
    run_labels,
    sanitize_dns_label,
    sanitize_label_value,
    script_configmap_name,
)
from airflow_volcano.manifest.policies import exit_code_policies, retryable_exit_codes
from airflow_volcano.manifest.request import JobKind, JobRequest, TrainingScript, arguments, templated_arguments

__all__ = [
    "DEFAULT_DEBUG_TIMEOUT", "DEFAULT_MASTER", "DEFAULT_SHM_SIZE", "DEFAULT_WORKER", "TENSORBOARD_TASK", "JobKind",
    "JobManifests", "JobRequest", "TrainingScript", "arguments", "build_manifests", "checkpoint_subdir",
    "debug_command", "default_job_name", "exit_code_policies", "identity_labels", "is_debug_job",
    "load_job_template", "managed_flag", "max_job_name_length", "optional_seconds", "request_hash",
    "retryable_exit_codes", "run_labels", "sanitize_dns_label", "sanitize_label_value", "script_configmap_name",
    "seconds", "stall_seconds", "task_pods", "templated_arguments", "tensorboard_endpoint", "torchrun_command",
    "validate_job",
]
