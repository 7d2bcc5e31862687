"""VolcanoJobOperator: one DAG task runs any Volcano Job, from a template or a whole spec.

VolcanoPyTorchJobOperator and VolcanoDeepSpeedJobOperator (through operators/master_worker.py) are
this operator with arguments that build a master/worker Job.

The operator reads: build the manifests from its arguments (`airflow_volcano.manifest`, pure), submit
or reattach (`airflow_volcano.submission`), wait (`airflow_volcano.job_runner`, or the trigger when
deferrable), finalize (logs, result, cleanup, the failure's explanation; `job_runner`, shared with
the sensor and the deferred path). What a kill or a failure does to the Job is decided here, from
what Airflow says of the task instance. Every cluster call goes through `VolcanoHook`; the
kubernetes client is imported lazily so that parsing a DAG stays cheap.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import inspect
import os
import secrets
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import yaml
from airflow.sdk import BaseOperator

from airflow_volcano.compat import AirflowFailException, TaskDeferred, conf
from airflow_volcano.constants import (
    DEFAULT_NODE_LOST_TIMEOUT,
    IfJobExists,
    OnFinishAction,
    OnKillAction,
    StallAction,
)
from airflow_volcano.exceptions import JobSpecError, VolcanoJobError
from airflow_volcano.job_ref import JobRef
from airflow_volcano.links import LINKS, link_urls
from airflow_volcano.manifest import (
    DEFAULT_DEBUG_TIMEOUT,
    DEFAULT_SHM_SIZE,
    JobKind,
    JobManifests,
    JobRequest,
    TrainingScript,
    arguments,
    build_manifests,
    checkpoint_subdir,
    default_job_name,
    load_job_template,
    max_job_name_length,
    run_labels,
    seconds,
    task_pods,
    tensorboard_endpoint,
)
from airflow_volcano.masking import register_secrets, shown_yaml

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_runner import PodLogCopy
    from airflow_volcano.logs import LogCursor
    from airflow_volcano.wait_engine import WaitLimits

TEMPLATE_EXTENSIONS = (".yaml", ".yml", ".json")


class VolcanoJobOperator(BaseOperator):
    """Submit any Volcano Job (tasks, plugins and policies of your own choosing), wait for it,
    stream its main pod's log, explain its failure, clean up; reattach instead of duplicating.

    The Job comes from `job_template` (a file or text, Jinja-rendered) or `full_job_spec`; the
    arguments below override the template's fields in every task's pods. `main_task` names the
    task whose pod 0 is followed (log, result, TensorBoard's volume): default the pytorch plugin's
    master if the Job has one, else its first task. The manifest that will be submitted is shown
    as the rendered templates `job_manifest` and `script_manifest` and by `dry_run()`.

    :param main_task: the task whose pod 0 is the Job's main pod (see above).
    :param image: container image of the pods (required unless the template has one).
    :param command: container command; `python <script>` when `training_script` is given.
    :param args: container args. Strings ending in .yaml/.json here are values, not files.
    :param env: environment: a dict, or a list of EnvVar dicts (`valueFrom` allowed).
    :param name: Job name; default `<dag_id>-<task_id>-<6 hex>`, shortened to keep pod names <= 63.
    :param namespace: default: the connection's namespace, else `default`.
    :param container_resources: `{"cpu": "4", "memory": "16Gi", "gpu": 1}` (requests = limits) or
        `{"requests": {...}, "limits": {...}}`.
    :param node_selector: pod nodeSelector.
    :param tolerations: pod tolerations.
    :param volumes: pod volumes.
    :param volume_mounts: volumeMounts of each pod's first container.
    :param service_account_name: pod service account.
    :param image_pull_policy: `Always`, `IfNotPresent` or `Never`.
    :param image_pull_secrets: names of pull secrets.
    :param labels: added to the Job and every pod.
    :param annotations: added to the Job and every pod.
    :param priority_class_name: pod and Job priority class.
    :param volcano_queue: Volcano queue (default `default`).
    :param scheduler_name: default `volcano`.
    :param min_available: gang size; default the template's (all replicas for PyTorch).
    :param max_retry: Volcano's retry budget (default 3, at least 1).
    :param ttl_seconds_after_finished: Volcano garbage-collects the Job this long after it ends.
    :param policies: Job lifecycle policies, replacing those `retryable_exit_codes` builds.
    :param retryable_exit_codes: exit codes that restart (default 130, 137, 138, 143: a signal, the
        OOM killer or a preemption, as T9k, a Kubernetes ML platform, restarts its training jobs);
        any other failure ends the Job at once, naming the pod and its code.
    :param restart_scope: what a retryable exit or an eviction restarts: `job` (the gang, default)
        or `task`.
    :param restart_policy: pod restartPolicy (default `Never`).
    :param extra_plugins: more Volcano plugins, e.g. `{"env": [], "ssh": []}`.
    :param tensorboard: `{"logdir": "/logs/tb"}` (and optionally `image`, `port` (6006), `resources`)
        adds a one-pod `tensorboard` task serving the event files the training writes under
        `logdir`, which must be on a volume the master mounts and shares (PVC, NFS, hostPath). It is
        not a rank (WORLD_SIZE counts master and workers only) and not part of the gang.
    :param training_script: a local file, relative to the DAG file's folder or the DAG's
        template_searchpath (or absolute, inside one of them or of `allowed_file_dirs`), shipped in
        a ConfigMap owned by the Job and run with python in every pod.
    :param job_template: a Job YAML/JSON file path (found like `training_script`, Jinja-rendered)
        or text: the escape hatch.
    :param allowed_file_dirs: more absolute folders `training_script` and `job_template` may be read
        from (not templated: a rendered path can never leave the folders the DAG author chose).
    :param full_job_spec: a whole Job dict, used as is apart from name, namespace and labels.
    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param get_logs: stream the master's log into the task log.
    :param log_tasks: names of more Volcano tasks (e.g. `["worker"]`) whose every pod's log is
        copied into the task log, each line prefixed with its pod: followed live while the task
        waits in a worker, read whole at the end when it was deferred.
    :param startup_timeout: seconds pods may stay unscheduled before the task fails with the
        scheduler's reason; image pull errors fail at once.
    :param job_timeout: client-side deadline in seconds; the Job is then deleted.
    :param on_finish_action: `delete_job`, `delete_succeeded_job` (default) or `keep_job`.
    :param on_kill_action: `delete_job` (default) or `keep_job`.
    :param if_job_exists: an earlier try's Job of this task instance: `reattach` (default),
        `fail` or `replace`.
    :param debug: debug mode (as in T9k, a Kubernetes ML platform): the pods come up as configured
        but sleep instead of running their command; the task log says how to open a shell in each
        (`kubectl exec`); the Job is deleted after `debug_timeout` or when the task is marked
        success/failed. Waits in the worker.
    :param debug_timeout: seconds the debug pods stay up (default 3600).
    :param shm_size: size of the memory-backed `emptyDir` mounted at `/dev/shm` in every training pod
        (default `2Gi`; a container's own is 64 MiB, too small for a DataLoader with workers). Its
        pages count against the container's memory limit as they are written. `None` turns it off; a
        `/dev/shm` volume of the template or of `volume_mounts` wins over the default.
    :param termination_grace_period: seconds a deleted pod's processes have between SIGTERM and
        SIGKILL (Kubernetes' default 30): for a script that saves a checkpoint on SIGTERM. Every
        training command runs under a small `sh` that passes SIGTERM on to the training processes, so
        a script without a handler ends at once.
    :param checkpoint_dir: an absolute path on a volume every training pod mounts and shares (a PVC,
        NFS, hostPath): every rank gets `CHECKPOINT_DIR`, its subdirectory `<dag_id>/<task_id>/<run_id>`,
        the same across Volcano's restarts and Airflow's retries of the task instance. Every rank also
        gets `VOLCANO_RESTART_COUNT` and `AIRFLOW_TRY_NUMBER`. A main-pod log line
        `[airflow-volcano] resumed from <checkpoint>` is reported as the result's `resumed_from`.
    :param node_lost_timeout: seconds (or a timedelta) the pods of a node that stopped answering
        (the cluster marks them not ready) may stay lost before they are deleted and handled like an
        eviction: the Job restarts under its retry budget, or the task fails naming the node.
        Default 180; `None` turns the check off.
    :param stall_timeout: minutes (or a timedelta, at least a minute) a Running Job may go without a
        new log line from the followed pods (the main pod, and `log_tasks`' pods) and without a
        change before it counts as stalled; off by default. On a stall the task log gets the Python
        stack of every thread of every Python process in each training pod (a `faulthandler`
        installed through a `sitecustomize` the operator ships), then `stall_action` applies. A
        script that is quiet on purpose touches `$HEARTBEAT_FILE` instead of printing. Needs
        `get_logs=True`.
    :param stall_action: `fail` (default: the Job is deleted, the task fails with "stalled: no output
        for N minutes" and where each process was) or `restart` (a gang restart, Volcano's RestartJob,
        under the Job's `max_retry` budget).
    :param deferrable: wait in the triggerer (default `[operators] default_deferrable`).
    :param poll_interval: seconds between pod checks while the Job has not started.
    """

    # The two manifests first, so the UI shows the Job before anything else; they are filled in
    # once the other fields are rendered (see _do_render_template_fields).
    template_fields: Sequence[str] = (
        "job_manifest", "script_manifest",
        "image", "command", "args", "env", "name", "namespace", "container_resources", "node_selector",
        "tolerations", "volumes", "volume_mounts", "service_account_name", "labels", "annotations", "volcano_queue",
        "priority_class_name", "min_available", "training_script", "job_template", "full_job_spec",
        "kubernetes_conn_id", "tensorboard", "log_tasks", "main_task", "checkpoint_dir",
    )
    # Empty: Airflow would read *every* templated string ending in .yaml/.json as a template file
    # (so `args=["--config", "train.yaml"]` failed with TemplateNotFound). Only job_template is a
    # file, and _job_template_text reads it.
    template_ext: Sequence[str] = ()
    template_fields_renderers = {
        "job_template": "yaml", "full_job_spec": "json", "env": "json", "container_resources": "json",
        "job_manifest": "yaml", "script_manifest": "yaml", "tensorboard": "json",
    }
    ui_color = "#f37021"
    operator_extra_links = LINKS
    job_kind: ClassVar[JobKind] = JobKind.GENERIC  # which Job the arguments build (see manifest.JobKind)

    def __init__(
        self,
        *,
        image: str | None = None,
        command: list[str] | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | list[dict] | None = None,
        name: str | None = None,
        namespace: str | None = None,
        main_task: str | None = None,
        container_resources: dict | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict] | None = None,
        volumes: list[dict] | None = None,
        volume_mounts: list[dict] | None = None,
        service_account_name: str | None = None,
        image_pull_policy: str | None = None,
        image_pull_secrets: list[str] | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class_name: str | None = None,
        volcano_queue: str | None = None,
        scheduler_name: str | None = None,
        min_available: int | None = None,
        max_retry: int | None = None,
        ttl_seconds_after_finished: int | None = None,
        policies: list[dict] | None = None,
        retryable_exit_codes: list[int] | None = None,
        restart_scope: str | None = None,
        restart_policy: str | None = None,
        extra_plugins: dict[str, list[str]] | None = None,
        tensorboard: dict[str, Any] | None = None,
        debug: bool = False,
        debug_timeout: float = DEFAULT_DEBUG_TIMEOUT,
        shm_size: str | None = DEFAULT_SHM_SIZE,
        termination_grace_period: int | None = None,
        checkpoint_dir: str | None = None,
        node_lost_timeout: float | None = DEFAULT_NODE_LOST_TIMEOUT,
        stall_timeout: float | datetime.timedelta | None = None,
        stall_action: str = StallAction.FAIL,
        training_script: str | None = None,
        job_template: str | dict | None = None,
        allowed_file_dirs: Sequence[str] | None = None,
        full_job_spec: dict | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        get_logs: bool = True,
        log_tasks: list[str] | None = None,
        startup_timeout: float | None = 900,
        job_timeout: float | None = None,
        on_finish_action: str = OnFinishAction.DELETE_SUCCEEDED_JOB,
        on_kill_action: str = OnKillAction.DELETE_JOB,
        if_job_exists: str = IfJobExists.REATTACH,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.image, self.command, self.args, self.env = image, command, args, env
        self.name, self.namespace, self.main_task = name, namespace, main_task
        # Not `resources`: BaseOperator owns that name (Airflow's executor resources), as in KubernetesPodOperator.
        self.container_resources = container_resources
        self.node_selector, self.tolerations = node_selector, tolerations
        self.volumes, self.volume_mounts = volumes, volume_mounts
        self.service_account_name, self.image_pull_policy = service_account_name, image_pull_policy
        self.image_pull_secrets = image_pull_secrets
        self.labels, self.annotations = labels, annotations
        # Not `queue`: BaseOperator owns that name (the executor queue the task runs on).
        self.priority_class_name, self.volcano_queue, self.scheduler_name = (
            priority_class_name, volcano_queue, scheduler_name
        )
        self.min_available, self.max_retry = min_available, max_retry
        self.ttl_seconds_after_finished = ttl_seconds_after_finished
        self.policies, self.restart_policy = policies, restart_policy
        self.retryable_exit_codes, self.restart_scope = retryable_exit_codes, restart_scope
        self.extra_plugins = extra_plugins
        self.tensorboard = tensorboard
        self.debug, self.debug_timeout = debug, debug_timeout
        self.shm_size, self.termination_grace_period = shm_size, termination_grace_period
        self.checkpoint_dir, self.node_lost_timeout = checkpoint_dir, node_lost_timeout
        self.stall_timeout, self.stall_action = stall_timeout, stall_action
        self.training_script = training_script
        self.job_template = job_template
        self.allowed_file_dirs = _folders("allowed_file_dirs", allowed_file_dirs)
        self.full_job_spec = full_job_spec
        self.kubernetes_conn_id = kubernetes_conn_id
        self.get_logs = get_logs
        self.log_tasks = log_tasks
        self.startup_timeout, self.job_timeout = startup_timeout, job_timeout
        self.on_finish_action = _choice("on_finish_action", on_finish_action, OnFinishAction)
        self.on_kill_action = _choice("on_kill_action", on_kill_action, OnKillAction)
        self.if_job_exists = _choice("if_job_exists", if_job_exists, IfJobExists)
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        # Filled when templates are rendered: what the UI shows is what is submitted. The Job and
        # the script's ConfigMap are separate fields, so a long script cannot push the Job past
        # Airflow's rendered-field size limit.
        self.job_manifest = ""
        self.script_manifest = ""
        self._manifests: JobManifests | None = None
        self._job_ref: JobRef | None = None
        self._ti: Any = None

    # -- building (pure apart from reading the local script/template files) --------------------------

    def _do_render_template_fields(self, parent: Any, template_fields: Any, context: Context, jinja_env: Any,
                                   seen_oids: set[int]) -> None:
        # Overridden here rather than render_template_fields: a mapped task's unmapped copy is
        # rendered through this method only, and must show its manifests too.
        super()._do_render_template_fields(parent, template_fields, context, jinja_env, seen_oids)
        if parent is self:
            self._manifests = self.build_manifests(context)
            # YAML text, which Airflow's masking of rendered fields cannot see into: shown masked.
            self.job_manifest = shown_yaml(self._manifests.job)
            configmap = self._manifests.configmap
            self.script_manifest = shown_yaml(configmap) if configmap else ""

    def build_manifests(self, context: Context | None = None) -> JobManifests:
        """The ConfigMap and Job this task submits; raises JobSpecError before any API call."""
        ti = context.get("ti") if context else None
        dag_id = self.dag_id if self.has_dag() else "no-dag"
        run_id = str(context.get("run_id")) if context and context.get("run_id") else "manual"
        map_index = int(getattr(ti, "map_index", -1) if getattr(ti, "map_index", None) is not None else -1)
        labels = run_labels(dag_id=dag_id, task_id=self.task_id, run_id=run_id,
                            try_number=int(getattr(ti, "try_number", 1) or 1), map_index=map_index)
        # Sized for the common task names; a template's longer ones shorten it (manifest._fit_default_name).
        default_name = default_job_name(dag_id, self.task_id, suffix=secrets.token_hex(3),
                                        max_len=self._default_name_limit())
        self._wait_limits()  # bad timeouts fail here, before submitting
        if self.debug:
            seconds("debug_timeout", self.debug_timeout)
        request = self._job_request(context)
        manifests = build_manifests(request, run_labels=labels, default_name=default_name,
                                    checkpoint_subdir=checkpoint_subdir(dag_id=dag_id, task_id=self.task_id,
                                                                        run_id=run_id, map_index=map_index))
        self._log_pods(manifests.job, manifests.main_task)  # an unknown task name fails here, before submitting
        register_secrets(manifests.job)  # the task log hides them from now on
        return manifests

    def _wait_limits(self) -> WaitLimits:
        from airflow_volcano.wait_engine import WaitLimits  # not at DAG parse

        if self.stall_timeout is not None and not self.get_logs:
            raise JobSpecError(f"stall_timeout={self.stall_timeout!r} needs get_logs=True: a stall is a main pod "
                               "that writes no new log line")
        return WaitLimits.checked(startup_timeout=self.startup_timeout, job_timeout=self.job_timeout,
                                  poll_interval=self.poll_interval, node_lost_timeout=self.node_lost_timeout,
                                  stall_timeout=self.stall_timeout, stall_action=self.stall_action)

    def _default_name_limit(self) -> int:
        return max_job_name_length(["master", "worker"], max_index=9)

    def _job_request(self, context: Context | None) -> JobRequest:
        """The arguments as the one request the manifest builder takes: every argument of this
        operator's signature that is a JobRequest field, by name; the files are read here."""
        values = {name: getattr(self, name) for name in _request_arguments(type(self))}
        values.update(debug=bool(self.debug) or None, training_script=self._read_training_script(),
                      job_template=self._parsed_job_template(context))
        return JobRequest(kind=self.job_kind, **values)

    def _log_pods(self, job: dict, main: str) -> list[tuple[str, str | None]]:
        """The pods (and containers) `log_tasks` copies into the task log; the main pod is get_logs'."""
        if self.log_tasks is None:
            return []
        if not isinstance(self.log_tasks, list | tuple) or not all(isinstance(n, str) for n in self.log_tasks):
            raise JobSpecError(f"log_tasks must be a list of Volcano task names, got {self.log_tasks!r}")
        main_pod = f"{job['metadata']['name']}-{main}-0"
        return [pod for pod in task_pods(job, list(self.log_tasks), "log_tasks") if pod[0] != main_pod]

    def _file_folders(self) -> list[Path]:
        """Where `training_script` and `job_template` may be read from: the DAG file's folder and its
        template_searchpath (as Airflow's own template files), and `allowed_file_dirs`; without a DAG,
        the working directory."""
        folders = [Path(folder) for folder in self.allowed_file_dirs or []]
        if self.has_dag():
            if self.dag.fileloc:
                folders.insert(0, Path(self.dag.fileloc).parent)
            searchpath = self.dag.template_searchpath or []
            folders += [Path(folder) for folder in ([searchpath] if isinstance(searchpath, str) else searchpath)]
        else:
            folders.append(Path.cwd())
        return [Path(os.path.normpath(folder.absolute())) for folder in folders]

    def _local_path(self, parameter: str, value: str) -> Path:
        """A local file named in a (rendered) argument: relative to one of `_file_folders`, or absolute
        inside one. A rendered value comes from whoever triggers the DAG run, so `../` may not leave them."""
        folders = self._file_folders()
        path = Path(value)
        candidates = [path] if path.is_absolute() else [folder / path for folder in folders]
        inside = [Path(os.path.normpath(candidate)) for candidate in candidates]
        inside = [candidate for candidate in inside if any(candidate.is_relative_to(folder) for folder in folders)]
        if not inside:
            raise JobSpecError(
                f"{parameter}: {value!r} is outside the folders files are read from "
                f"({', '.join(map(str, folders))}: the DAG file's folder and the DAG's template_searchpath); "
                "name a file there, or add its folder to allowed_file_dirs")
        return next((candidate for candidate in inside if candidate.exists()), inside[0])

    def _read_training_script(self) -> TrainingScript | None:
        if not self.training_script:
            return None
        path = self._local_path("training_script", self.training_script)
        try:
            return TrainingScript(filename=path.name, content=path.read_text())
        except OSError as error:
            raise JobSpecError(f"training_script: cannot read {str(path)!r}: {error.strerror or error}") from error

    def _job_template_text(self, context: Context | None) -> tuple[str, str]:
        """The template's text and where it came from: a file (rendered with Jinja, as Airflow
        renders template files) when job_template names one, else the string itself."""
        value = str(self.job_template)
        if not value.strip().endswith(TEMPLATE_EXTENSIONS) or "\n" in value.strip():
            return value, "<string>"
        path = self._local_path("job_template", value.strip())
        try:
            text = path.read_text()
        except OSError as error:
            raise JobSpecError(f"job_template: cannot read {str(path)!r}: {error.strerror or error}") from error
        if context is not None:
            text = self.render_template(text, context)
        return text, str(path)

    def _parsed_job_template(self, context: Context | None = None) -> dict | None:
        if self.job_template is None or isinstance(self.job_template, dict):
            return self.job_template
        text, source = self._job_template_text(context)
        return load_job_template(text, source=source)

    def dry_run(self) -> dict[str, Any]:  # type: ignore[override]
        """Print the manifests (ConfigMap and Job) as YAML and return them, secret env values masked;
        touches no cluster."""
        manifests = self._manifests or self.build_manifests()
        text = shown_yaml(*manifests.documents())
        print(text)
        *configmap, job = yaml.safe_load_all(text)
        return {"configmap": configmap[0] if configmap else None, "job": job}

    # -- running ------------------------------------------------------------------------------------

    @property
    def hook(self) -> VolcanoHook:
        from airflow_volcano.hooks.volcano import VolcanoHook

        return VolcanoHook(kubernetes_conn_id=self.kubernetes_conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_volcano import job_runner
        from airflow_volcano.manifest.compatibility import fit_to_volcano
        from airflow_volcano.submission import submit_or_reattach

        manifests = self._manifests or self.build_manifests(context)
        hook = self.hook
        # What this cluster's Volcano release cannot run is refused here, before submitting.
        for adapted in fit_to_volcano(manifests.job, hook.volcano_features()):
            self.log.info(adapted)
        namespace = manifests.job["metadata"].get("namespace") or hook.get_namespace() or "default"
        ti = context["ti"]
        self._ti = ti
        try:
            ref = submit_or_reattach(hook, manifests, namespace, if_job_exists=IfJobExists(self.if_job_exists),
                                     state_store=context.get("task_state_store"), on_created=self._watching)
            self._watching(ref)
            # "master_pod": the XCom's public name for the main pod (the master's, for PyTorch and DeepSpeed).
            for key, value in (("job_name", ref.name), ("namespace", ref.namespace), ("master_pod", ref.main_pod)):
                ti.xcom_push(key=key, value=value)
            self._push_links(hook, ref, manifests.job, ti)
            if self.debug:
                limits = dataclasses.replace(self._wait_limits(), job_timeout=None)
                return job_runner.debug_session(hook, ref, manifests.job, limits,
                                                seconds("debug_timeout", self.debug_timeout))
            if self.deferrable:
                self._defer(ref, context, manifests.job)
            result = job_runner.wait_for_job(hook, ref, self._wait_limits(),
                                             logs=self._log_copies(ref, manifests.job), report=self.log.info)
            return self._finalize(hook, ref, result, context)
        except TaskDeferred:
            raise
        except BaseException as error:  # AirflowTaskTimeout (execution_timeout) is a BaseException too
            self._settle_after_failure(error)
            raise

    def _watching(self, ref: JobRef) -> None:
        """This try's Job: from now on a failure or a kill settles what becomes of it."""
        self._job_ref = ref

    def _settle_after_failure(self, error: BaseException) -> None:
        """The task is failing with its Job submitted: keep the Job when a later try of this task will
        reattach to it; otherwise delete it if it still runs."""
        from airflow_volcano import job_runner

        ref, self._job_ref = self._job_ref, None  # on_kill, called next on a timeout, has nothing left to do
        if ref is None or self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        if self._later_try_will_reattach(error):
            self.log.info("Keeping Volcano Job %s/%s for the next try of this task to reattach", ref.namespace,
                          ref.name)
            return
        job_runner.delete_if_still_running(self.hook, ref)

    def _later_try_will_reattach(self, error: BaseException | None) -> bool:
        """Whether Airflow will run another try of this task instance (which reattaches to the Job):
        the server's own answer (`should_retry`), else the try count against max_tries."""
        if isinstance(error, AirflowFailException):
            return False
        ti = self._ti
        if ti is None:
            return False
        context = getattr(ti, "_ti_context_from_server", None)
        if context is not None and getattr(context, "should_retry", None) is not None:
            return bool(context.should_retry)
        return int(getattr(ti, "try_number", 1) or 1) <= int(getattr(ti, "max_tries", 0) or 0)

    def _log_copies(self, ref: JobRef, job: dict, master_cursor: LogCursor | None = None) -> list[PodLogCopy]:
        """The master's log (get_logs) first, then every pod of log_tasks, each prefixed with its pod."""
        from airflow_volcano.job_runner import PodLogCopy, main_log_copy

        copies = [main_log_copy(ref, self._emit_master_log, master_cursor)] if self.get_logs else []
        for pod, container in self._log_pods(job, ref.main_task):
            copies.append(PodLogCopy(pod, container, lambda line, pod=pod: self.log.info("[%s] %s", pod, line)))
        return copies

    def _push_links(self, hook: VolcanoHook, ref: JobRef, job: dict, ti: Any) -> None:
        """Store the UI links' URLs (see airflow_volcano.links) for this Job."""
        templates = {link.template_option: hook.connection_extra(link.template_option)
                     or conf.get("volcano", link.template_option, fallback="") for link in LINKS}
        values = {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid or "", "pod": ref.main_pod,
                  "container": ref.main_pod_container}
        if (endpoint := tensorboard_endpoint(job)) is not None:
            values["tensorboard_pod"], values["tensorboard_port"] = endpoint
            self.log.info("TensorBoard of this Job: kubectl port-forward -n %s pod/%s %d, then http://localhost:%d",
                          ref.namespace, endpoint[0], endpoint[1], endpoint[1])
        for key, url in link_urls(templates, values).items():
            ti.xcom_push(key=key, value=url)

    def _finalize(self, hook: VolcanoHook, ref: JobRef, result: Any, context: Context) -> dict[str, Any]:
        from airflow_volcano import job_runner

        ti = context["ti"]
        return job_runner.finalize(
            hook, ref, result,
            on_finish_action=OnFinishAction(self.on_finish_action),
            push_xcom=lambda key, value: ti.xcom_push(key=key, value=value),
        )

    def _defer(self, ref: JobRef, context: Context, job: dict) -> None:
        from airflow_volcano.triggers.job import VolcanoJobTrigger

        deadline = None
        if self.execution_timeout is not None and context.get("ti") is not None:
            start = getattr(context["ti"], "start_date", None)
            if start is not None:
                deadline = (start + self.execution_timeout).timestamp()
        trigger = VolcanoJobTrigger(
            ref.to_dict(), self.kubernetes_conn_id, limits=self._wait_limits().to_dict(), deadline=deadline,
            get_logs=self.get_logs, on_kill_action=self.on_kill_action,
            log_pods=[[pod, container] for pod, container in self._log_pods(job, ref.main_task)],
        )
        self.log.info("Deferring: the triggerer waits for Volcano Job %s/%s; this worker slot is free",
                      ref.namespace, ref.name)
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired: the same finalize as the synchronous path."""
        from airflow_volcano import job_runner
        from airflow_volcano.events import JobEvent, WaitOutcome
        from airflow_volcano.logs import LogCursor
        from airflow_volcano.status import job_state

        ended = JobEvent.from_dict(event)
        ref = JobRef.from_dict(ended.job)
        self._job_ref, self._ti = ref, context["ti"]
        self.log.info("Resumed: the trigger reports Volcano Job %s/%s %s", ref.namespace, ref.name, ended.describe())
        hook = self.hook
        cursor = LogCursor.from_dict(ended.log_cursor)
        try:
            if ended.status is WaitOutcome.ERROR:
                raise VolcanoJobError(f"Waiting for Volcano Job {ref.namespace}/{ref.name} failed: {ended.message}")
            job = hook.get_job(ref.name, ref.namespace)
            # The trigger copied the master's log; the other tasks' logs are read whole now.
            for copy in self._log_copies(ref, job or {"metadata": {"name": ref.name}}, cursor):
                job_runner.read_remaining_log(hook, ref.namespace, copy)
            if job is None:
                raise VolcanoJobError(f"Volcano Job {ref.namespace}/{ref.name} no longer exists")
            result = job_runner.WaitResult(
                state=job_state(job), job=job, log_cursor=cursor,
                timed_out=ended.message if ended.status is WaitOutcome.TIMEOUT else None,
                problem=ended.message if ended.status is WaitOutcome.PROBLEM else None,
                stalled=ended.message if ended.status is WaitOutcome.STALLED else None,
                lost_nodes=tuple(ended.lost_nodes), stalls=ended.stalls,
                failed_pods={pod["metadata"]["name"]: pod for pod in ended.failed_pods},
            )
            return self._finalize(hook, ref, result, context)
        except BaseException as error:
            self._settle_after_failure(error)
            raise

    def _emit_master_log(self, line: str) -> None:
        self.log.info("[%s] %s", self._job_ref.main_pod if self._job_ref else "master", line)

    def on_kill(self) -> None:
        """Delete the Job when a user kills the task, or when no later try will reattach to it.

        Airflow calls this when a user marks the task failed/success or clears it, when the worker
        shuts down (apache/airflow#39791) and when execution_timeout passes. In the last two the task
        instance is still `running` on the server: if the task has a try left, that try reattaches
        to the Job, so deleting it would throw the training away; with no try left, nobody would
        ever watch it again."""
        from airflow_volcano.job_runner import delete_job_and_script

        ref = self._job_ref
        if ref is None or self.on_kill_action == OnKillAction.KEEP_JOB:
            return
        if self._still_running_on_server() and self._later_try_will_reattach(None):
            self.log.info("Worker stopping while the task instance is still running: keeping Volcano Job %s/%s "
                          "for the next try to reattach", ref.namespace, ref.name)
            return
        self._job_ref = None
        self.log.info("Task killed: deleting Volcano Job %s/%s", ref.namespace, ref.name)
        delete_job_and_script(self.hook, ref)

    def _still_running_on_server(self) -> bool:
        ti = self._ti
        if ti is None:
            return False
        try:
            states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id],
                                        map_index=ti.map_index)
        except Exception as error:  # noqa: BLE001 - cannot tell: treat as a kill, so no Job is orphaned
            self.log.warning("Could not read the task instance's state (%s); treating this as a kill", error)
            return False
        from airflow_volcano.job_runner import task_state_key

        state = (states.get(ti.run_id) or {}).get(task_state_key(ti.task_id, ti.map_index))
        return str(getattr(state, "value", state)) == "running"


@functools.cache
def _request_arguments(operator: type) -> tuple[str, ...]:
    """The JobRequest fields an operator class takes as arguments (its and its bases' signatures)."""
    fields = set(arguments()) - {"debug", "training_script", "job_template"}  # (converted by _job_request)
    names = {name for cls in operator.__mro__ if "__init__" in vars(cls)
             for name in inspect.signature(cls.__init__).parameters}
    return tuple(sorted(fields & names))


def _folders(parameter: str, value: Sequence[str] | None) -> list[str] | None:
    """Absolute folders, checked at DAG parse (the argument is not templated, by design)."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(item, str) and os.path.isabs(item) for item in value):
        raise JobSpecError(f"{parameter} must be a list of absolute folder paths, got {value!r}")
    return list(value)


def _choice(parameter: str, value: str, allowed: type[StrEnum]) -> str:
    if value not in set(allowed):
        raise JobSpecError(f"{parameter} must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)
