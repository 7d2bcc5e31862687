"""VolcanoJobOperator: one DAG task runs any Volcano Job, from a template or a whole spec.

VolcanoPyTorchJobOperator and VolcanoDeepSpeedJobOperator (through operators/master_worker.py) are
this operator with arguments that build a master/worker Job.

This module is Airflow's side only: the arguments, templating, execute, execute_complete, on_kill,
dry_run and the OpenLineage hooks. Each step is another module's: build the manifests
(`operators/building.py` over `airflow_volcano.manifest`, pure), submit or reattach
(`airflow_volcano.ownership.submission`), publish the Job's XCom and links (`airflow_volcano.links`), wait
(`airflow_volcano.waiting.wait_worker`, or the trigger when deferrable), finalize (logs, result, cleanup, the
failure's explanation; `airflow_volcano.ownership.finalize`, shared with the sensor and the deferred path). What a
kill or a failure does to the Job is `airflow_volcano.ownership`'s, shared with the trigger and the
sensor. Every cluster call goes through `VolcanoHook`; the kubernetes client is imported lazily so
that parsing a DAG stays cheap.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import yaml
from airflow.sdk import Asset, BaseOperator

from airflow_volcano.compat import TaskDeferred
from airflow_volcano.constants import (
    IfJobExists,
    OnFinishAction,
    OnKillAction,
    StallAction,
)
from airflow_volcano.exceptions import VolcanoJobError
from airflow_volcano.links import LINKS, job_link_urls, links_by_name, publish
from airflow_volcano.local_files import read_training_script
from airflow_volcano.manifest import JobKind, JobManifests, TrainingScript, max_job_name_length, seconds
from airflow_volcano.observability.lineage import as_asset, fill_model_asset_events
from airflow_volcano.observability.masking import register_secrets, shown, shown_yaml
from airflow_volcano.operators import building
from airflow_volcano.operators.arguments import (
    DEFAULT_DEFERRABLE,
    refuse_kubernetes_pod_operator_habits,
    take_arguments,
    templated_fields,
)
from airflow_volcano.ownership import TryOwnership

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.observability.logs import LogCursor
    from airflow_volcano.observability.pod_logs import PodLogCopy
    from airflow_volcano.waiting.events import WaitOutcome


class VolcanoJobOperator(BaseOperator):
    """Submit any Volcano Job (tasks, plugins and policies of your own choosing), wait for it,
    stream its main pod's log, explain its failure, clean up; reattach instead of duplicating.

    The Job comes from `job_template` (a file or text, Jinja-rendered) or `full_job_spec`; the
    arguments below override the template's fields in every task's pods. `main_task` names the
    task whose pod 0 is followed (log, result, TensorBoard's volume): default the pytorch plugin's
    master if the Job has one, else its first task. The manifest that will be submitted is shown
    as the rendered templates `job_manifest` and `script_manifest` and by `dry_run()`.

    :param name: Job name. Default `<dag_id>-<task_id>-<6 hex>`, made a DNS label (lowercase, starting with a
        letter) and shortened so that every pod name `<job>-<task>-<index>` (also the pod's hostname) is at most 63
        characters. A name given is used as it is: one that is not such a label, or too long for that, fails before
        submitting.
    :param namespace: default: the connection's namespace, else `default`.
    :param job_template: the escape hatch: a Volcano Job as a dict, as YAML/JSON text, or as the path of a `.yaml`,
        `.yml` or `.json` file, found like `training_script` and rendered with Jinja like any template file. An
        explicit argument overrides the template's field. Only this argument is ever read as a file: strings ending
        in `.yaml` or `.json` in other arguments (`args=["--config", "conf/train.yaml"]`, `env={"CFG": "x.json"}`)
        are values, only rendered. Not with `full_job_spec`.
    :param full_job_spec: a whole Job dict, used as is apart from its name, namespace, labels and annotations (the
        provider's labels are added). Any other argument the Job is built from is refused with it (`job_template` is
        the way to override fields), and its pods get nothing the provider adds around a training command (signal
        forwarding, `/dev/shm`, `CHECKPOINT_DIR`, the restart counters).
    :param main_task: the task whose pod 0 is the Job's main pod, followed for the log, the result and TensorBoard's
        volume: default the pytorch plugin's master if the Job has one, else its first task.
    :param labels: added to the Job and every pod. Keys `airflow-volcano.io/*` and `app.kubernetes.io/managed-by`
        are the provider's and refused; keys and values must be valid Kubernetes labels.
    :param annotations: added to the Job and every pod. Keys `airflow-volcano.io/*` and
        `app.kubernetes.io/managed-by` are the provider's and refused.
    :param priority_class_name: the PriorityClass of the Job and of its pods, for Volcano's scheduling.
    :param volcano_queue: the Volcano queue (default `default`; not `queue`, which is Airflow's own argument of
        every operator). A queue that does not exist, is not Open, or whose capability is less than the Job's gang
        needs is refused before submitting, naming `volcano_queue`, when the queue can be read
        (deploy/queue-reader.yaml).
    :param scheduler_name: the Job's scheduler (default `volcano`).
    :param min_available: gang size: Volcano starts the Job once this many of its pods fit. Default the template's;
        all replicas (gang scheduling) in a Job built without one. At least 1 (Volcano's webhook turns 0 into all
        replicas), at most the replica total.
    :param max_retry: the retry budget of restarts after a failure: a retryable exit, an eviction, a lost node, a
        stall (default 3, at least 1: Volcano's webhook turns 0 into 3). Volcano counts the restart that finds the
        budget spent, so `max_retry=N` allows N - 1 restarts. Preemptions do not spend it: see `max_preemptions`.
    :param max_preemptions: how many times the Job may be preempted (its pods evicted by Volcano's scheduler for a
        higher-priority Job, or by a queue reclaiming its share) and wait for room again, beside `max_retry`, which
        preemptions do not spend (default 10; 0: the first preemption fails the task). The one after the last
        allowed ends the Job, and the task fails naming `max_preemptions`. Volcano's `maxRetry` is submitted as
        `max_retry + max_preemptions + 1`, a backstop, and the task holds the restarts that were not preemptions to
        `max_retry` (docs/failures.md). Not with `full_job_spec`, which is submitted as is.
    :param ttl_seconds_after_finished: Volcano garbage-collects the Job this many seconds after it ends.
    :param policies: the Job's Volcano lifecycle policies, replacing those `retryable_exit_codes` builds (it cannot
        be combined with `retryable_exit_codes` or `restart_scope`). Unknown events and actions are refused before
        submitting.
    :param retryable_exit_codes: exit codes that restart (default 130, 137, 138, 143: a signal, the OOM killer or a
        preemption, as T9k, a Kubernetes ML platform, restarts its training jobs; `[]`: none); an evicted pod
        restarts too. Any other failure ends the Job at once, naming the pod and its code. Codes 1 to 255, each
        once.
    :param restart_scope: what a retryable exit or an eviction restarts: `job` (the gang, default) or `task` (the
        pods of the failed pod's task).
    :param extra_plugins: more Volcano plugins and their arguments, e.g. `{"env": [], "ssh": []}` (Volcano's own
        plugins only). The Job built without a template always lists `svc`.
    :param tensorboard: `{"logdir": "/logs/tb"}`, optionally with `image` (default the master's, which must have the
        `tensorboard` package), `port` (default 6006) and `resources`: adds a one-pod task `tensorboard` serving the
        event files the training writes under `logdir`. `logdir` must be on a volume the master mounts that other
        pods can read (a PVC, NFS, hostPath), which that pod mounts read-only; a `logdir` outside every mount, or on
        an `emptyDir`, fails before submitting. The pod is not a rank (`WORLD_SIZE` counts master and workers only),
        not part of the gang, restarts alone if it fails, and ends with the Job.
    :param image: container image of the pods (required unless the template has one).
    :param command: container command; `python <script>` when `training_script` is given. Each string reaches the
        process exactly as given: the kubelet does not expand `$(VAR)` in it unless it is wrapped in
        `ExpandVars(...)`. VolcanoPyTorchJobOperator with `launcher="torchrun"` builds it and refuses one.
    :param args: container args (with `training_script`, the script's arguments). Each string reaches the process
        exactly as given: the kubelet does not expand `$(VAR)` in it unless it is wrapped in `ExpandVars(...)`.
        Strings ending in `.yaml` or `.json` here are values, not files.
    :param env: environment: a dict, or a list of EnvVar dicts or `k8s.V1EnvVar` (`valueFrom` allowed), each name
        once. Values reach the process exactly, as `args` do (`ExpandVars(...)` opts in to `$(VAR)`). The values of
        names Airflow hides (token, password, secret, api_key and the like) are masked in the rendered Job,
        `dry_run()` and the task log. For a DeepSpeed or mpirun launch, names must be shell names (letters, digits,
        `_`).
    :param container_resources: `{"cpu": "4", "memory": "16Gi", "gpu": 1}` (requests = limits; `gpu` is
        `nvidia.com/gpu`) or `{"requests": {...}, "limits": {...}}` (or a `k8s.V1ResourceRequirements`), for every
        pod the pod arguments go to. Not `resources`: that is Airflow's own argument (the executor's), and pod
        resources given there fail naming this one.
    :param node_selector: the pods' nodeSelector.
    :param tolerations: the pods' tolerations (dicts or `k8s.V1Toleration`).
    :param volumes: the pods' volumes (dicts or `k8s.V1Volume`).
    :param volume_mounts: volumeMounts of each pod's first container (dicts or `k8s.V1VolumeMount`); each must name
        a volume of the pod.
    :param service_account_name: the pods' service account.
    :param image_pull_policy: the containers' imagePullPolicy: `Always`, `IfNotPresent` or `Never`.
    :param image_pull_secrets: names of the pods' pull secrets (or `k8s.V1LocalObjectReference`).
    :param restart_policy: the pods' restartPolicy (default `Never`: every failure reaches Volcano, instead of the
        kubelet restarting one pod in place while the others wait).
    :param training_script: a local file, relative to the DAG file's folder or the DAG's `template_searchpath` (an
        absolute path must lie inside one of them or of `allowed_file_dirs`; after rendering, `../` cannot leave
        them), shipped as the ConfigMap `<job>-script` owned by the Job (at most 1 MiB), mounted read-only in every
        pod and run there by `launcher`: `python <script>` unless `command` is given.
    :param debug: debug mode (as in T9k, a Kubernetes ML platform): the pods come up as configured but sleep instead
        of running their command; the task log says how to open a shell in each (`kubectl exec`); the Job is deleted
        after `debug_timeout` or when the task is marked success/failed. Waits in the worker.
    :param debug_timeout: seconds (or a timedelta) the debug pods stay up (default 3600).
    :param shm_size: size limit, a Kubernetes quantity, of the memory-backed `emptyDir` mounted at `/dev/shm` in
        every training pod (default `2Gi`; a container's own is 64 MiB, and a DataLoader with workers dies with "bus
        error"). Its pages count against the container's memory limit only as they are written. `None` turns it off.
        A `/dev/shm` volume of your own (the template's or `volume_mounts`') wins over the default; with a
        `shm_size` other than the default it is an error.
    :param termination_grace_period: seconds a deleted pod's processes have between SIGTERM and SIGKILL (Kubernetes'
        default 30) when a pod is deleted (a kill, `job_timeout`, a restart, a preemption): time for a script that
        saves a checkpoint on SIGTERM. Every training command runs under a small `sh` that passes SIGTERM on to the
        training processes, so a script without a handler ends at once.
    :param checkpoint_dir: an absolute path on a volume every training pod mounts and shares (a PVC, NFS, hostPath;
        an `emptyDir` or a path outside every mount fails before submitting). Every rank gets `CHECKPOINT_DIR`,
        `<checkpoint_dir>/<dag_id>/<task_id>[-<map_index>]/<run_id>`, created at start and the same across Volcano's
        restarts and Airflow's retries of the task instance. A main-pod log line `[airflow-volcano] resumed from
        <checkpoint>` is reported as the result's `resumed_from`.
    :param stall_timeout: seconds (at least 30; a smaller number is refused, naming the unit) or a timedelta; off by
        default. A Running Job whose followed pods (the main pod, `log_tasks`' pods, a DeepSpeed/mpirun launch's
        ranks) write nothing, not a byte (a progress bar redrawn in place is output), and which does not change, for
        this long has stalled. Time the waiter cannot read their logs does not count, and a stall is confirmed by a
        fresh read of each before anything is done. The task log then gets the Python stack of every thread of every
        Python process in each training pod (a `faulthandler` installed through a `sitecustomize` the operator
        ships), and `stall_action` applies. A script that is quiet on purpose touches `$HEARTBEAT_FILE` instead of
        printing. Needs `get_logs=True`, and `patch` on pods (deploy/rbac.yaml).
    :param allowed_file_dirs: more absolute folders `training_script` and `job_template` may be read from, besides
        the DAG file's folder, the DAG's `template_searchpath` and those every task of the deployment may read from:
        `[volcano] allowed_file_dirs` (comma-separated; docker compose: `VOLCANO_ALLOWED_FILE_DIRS`) and the
        connection's extra `allowed_file_dirs` (a list or comma-separated). Not templated on purpose: a value
        rendered from a DAG run's `params` can never name a file outside the folders the DAG author chose
        (`scripts/{{ params.s }}` with `s=../../home/airflow/.kube/config` is refused, naming the parameter).
    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param get_logs: stream the main pod's log (a PyTorch Job's master's) into the task log, each line shown at the
        time the pod printed it.
    :param log_tasks: names of more Volcano tasks (e.g. `["worker"]`) whose every pod's log is copied into the task
        log as it is written, each line prefixed `[<pod>]` like the main pod's, in both modes (deferred: copied with
        the main pod's). A pod Volcano removed before a copy reached it, such as a worker still running when the
        master's completion ended the Job, has no log left to read: the task log says so. A name the Job has no task
        for fails before submitting.
    :param startup_timeout: seconds or a timedelta (default 900; `None`: no limit) the gang may take to first run,
        counted from the Job's creation on the apiserver's clock (never the worker's or the triggerer's, which may
        be skewed); past it, the task fails with the scheduler's reason. After a restart (a retryable exit, an
        eviction, a lost node, `stall_action="restart"`) the restarted gang gets the same bound again, counted from
        when the waiter saw the restart. Pods outside the gang (a TensorBoard, replicas above `min_available`) never
        end the Job: the task log says they wait and why.
    :param image_pull_timeout: seconds or a timedelta (default 300; `None`: only `startup_timeout` bounds it) a pod
        the gang needs may stay in an image pull back-off that may pass (the registry's 429 or 5xx, a registry out
        of reach: the kubelet retries by itself), counted from when the waiter first saw it; the task log says so
        meanwhile. An image the kubelet says cannot exist or cannot be read (not found, manifest unknown,
        unauthorized, denied, an invalid name, `imagePullPolicy: Never` without the image) fails the task at once,
        naming the image.
    :param job_timeout: seconds or a timedelta: a client-side deadline (Volcano has none), counted from the Job's
        creation on the apiserver's clock; past it, the Job is deleted and the task fails.
    :param node_lost_timeout: seconds or a timedelta (default 180; `None` turns the check off) the pods of a node
        that stopped answering may stay lost, counted by the waiter from when it first saw them lost, before they
        are deleted and handled like an eviction: the Job restarts under `max_retry`, or the task fails naming the
        node. Never before the cluster's own eviction has begun: a pod is deleted only once the taint manager has
        evicted it (its toleration of `node.kubernetes.io/unreachable` ran out: 300 s unless the pod says otherwise,
        see `tolerations`); a pod that tolerates the taint without limit is never deleted (the task waits for the
        node). Only the Job's own pods, each exactly as it was seen (its uid), never a pod waiting for a readiness
        gate. Needs `delete` on pods (deploy/rbac.yaml).
    :param stall_action: what a stall (`stall_timeout`) does. `fail` (default): the Job is deleted and the task
        fails with "stalled: no output for N seconds" (or minutes) and where each process was. `restart`: a gang
        restart: the Job's Running training pods are deleted gracefully, each by its uid, and the Job's `PodEvicted`
        policy restarts the gang, counted in `max_retry` (a Job whose policies do not restart on `PodEvicted` is
        refused before submitting); the stall's clock then starts again. At most 3 times, and a restart that is
        refused (no `delete` on pods) fails the task as `fail` would, saying why. `restart` needs `delete` on pods
        (deploy/rbac.yaml).
    :param on_finish_action: `delete_job`, `delete_succeeded_job` (default: failed Jobs are kept for debugging) or
        `keep_job`. T9k's `Unfinished` (delete the pods still running, keep finished ones for their logs) is what a
        kept Job already is: Volcano's end (Completed, Terminated, Failed, Aborted) deletes the pods still running
        and keeps finished ones (tested on the real node: after success the workers are gone and the master's log is
        still readable). A Job the task ends itself (`job_timeout`, a stall, pods that cannot start, a spent restart
        budget) is deleted whatever it says.
    :param on_kill_action: what killing the task does to the Job: `delete_job` (default) or `keep_job`. A worker
        stopping, or `execution_timeout`, while the task has a try left keeps the Job for that try to reattach to.
    :param if_job_exists: what to do with a Job an earlier try of this task instance submitted and no try has
        reported (still running, or finished since): `reattach` (default: wait for it instead of submitting
        another), `fail` (fail the task, leaving the Job as it is) or `replace` (delete it and submit anew). A Job
        built from other arguments, script or debug mode than this try's fails the task unless `replace` (a sleeping
        debug Job is replaced).
    :param delete_orphaned_jobs: before submitting, sweep the namespace for Jobs no try will watch again: another
        task instance's, which Airflow reports finished (a worker killed outright, then the task marked failed or
        success), not kept on purpose (`on_finish_action`, `on_kill_action`). Each is marked at first sight and
        deleted by a submission five minutes later or more. Default True.
    :param deferrable: wait in the triggerer instead of a worker slot (default `[operators] default_deferrable`).
    :param poll_interval: seconds or a timedelta (default 5): how often the pods are looked at while the Job has not
        started (less often for a Job that waits long, at most once a minute).
    :param model_asset: an Airflow `Asset` (or its URI) the training produces, added to the task's `outlets`. Every
        successful run emits an event of each Asset in `outlets`, whose `extra` holds what a consumer needs: the
        `model_uri` and metrics the main pod's termination message reports, the Volcano Job, the image and its
        digest, the Airflow run, where the time went (`goodput`; docs "Retraining pipelines"). A failed run emits
        nothing.
    """

    # Empty: Airflow would read *every* templated string ending in .yaml/.json as a template file
    # (so `args=["--config", "train.yaml"]` failed with TemplateNotFound). Only job_template is a
    # file, and local_files.parsed_job_template reads it.
    template_ext: Sequence[str] = ()
    template_fields_renderers = {
        "job_template": "yaml", "full_job_spec": "json", "env": "json", "container_resources": "json",
        "job_manifest": "yaml", "script_manifest": "yaml", "tensorboard": "json",
    }
    ui_color = "#f37021"
    operator_extra_links = LINKS
    job_kind: ClassVar[JobKind] = JobKind.GENERIC  # which Job the arguments build (see manifest.JobKind)
    # Which declared arguments (operators/arguments.py) a class takes: those of its groups, less those it
    # refuses (a base's argument that is not the subclass's to take).
    argument_groups: ClassVar[tuple[str, ...]] = ("job",)
    refused_arguments: ClassVar[tuple[str, ...]] = ()
    extra_template_fields: ClassVar[tuple[str, ...]] = ()  # a subclass's own template fields
    # The arguments this class reads itself (take_arguments sets every one; the Job request's others are
    # read by name, building.job_request).
    training_script: str | None
    job_template: str | dict | None
    allowed_file_dirs: list[str] | None
    on_finish_action: str
    on_kill_action: str
    if_job_exists: str
    debug: bool
    debug_timeout: float | datetime.timedelta
    kubernetes_conn_id: str
    get_logs: bool
    log_tasks: list[str] | None
    startup_timeout: float | datetime.timedelta | None
    image_pull_timeout: float | datetime.timedelta | None
    job_timeout: float | datetime.timedelta | None
    node_lost_timeout: float | datetime.timedelta | None
    stall_timeout: float | datetime.timedelta | None
    stall_action: str
    delete_orphaned_jobs: bool
    deferrable: bool
    poll_interval: float | datetime.timedelta
    model_asset: Asset | None
    checkpoint_dir: str | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.template_fields = templated_fields(cls)

    def __init__(
        self,
        *,
        # Generated from the declarations: python -m airflow_volcano.operators.arguments
        name: str | None = None,
        namespace: str | None = None,
        job_template: str | dict | None = None,
        full_job_spec: dict | None = None,
        main_task: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        priority_class_name: str | None = None,
        volcano_queue: str | None = None,
        scheduler_name: str | None = None,
        min_available: int | str | None = None,
        max_retry: int | None = None,
        max_preemptions: int | None = None,
        ttl_seconds_after_finished: int | None = None,
        policies: list[dict] | None = None,
        retryable_exit_codes: list[int] | None = None,
        restart_scope: str | None = None,
        extra_plugins: dict[str, list[str]] | None = None,
        tensorboard: dict[str, Any] | None = None,
        image: str | None = None,
        command: list[Any] | None = None,
        args: list[Any] | None = None,
        env: dict[str, Any] | list[dict] | None = None,
        container_resources: dict | None = None,
        node_selector: dict[str, str] | None = None,
        tolerations: list[dict] | None = None,
        volumes: list[dict] | None = None,
        volume_mounts: list[dict] | None = None,
        service_account_name: str | None = None,
        image_pull_policy: str | None = None,
        image_pull_secrets: list[str] | None = None,
        restart_policy: str | None = None,
        training_script: str | None = None,
        debug: bool = False,
        debug_timeout: float | datetime.timedelta = 3600.0,
        shm_size: str | None = "2Gi",
        termination_grace_period: int | None = None,
        checkpoint_dir: str | None = None,
        stall_timeout: float | datetime.timedelta | None = None,
        allowed_file_dirs: Sequence[str] | None = None,
        kubernetes_conn_id: str = "kubernetes_default",
        get_logs: bool = True,
        log_tasks: list[str] | None = None,
        startup_timeout: float | datetime.timedelta | None = 900.0,
        image_pull_timeout: float | datetime.timedelta | None = 300.0,
        job_timeout: float | datetime.timedelta | None = None,
        node_lost_timeout: float | datetime.timedelta | None = 180.0,
        stall_action: str = StallAction.FAIL,
        on_finish_action: str = OnFinishAction.DELETE_SUCCEEDED_JOB,
        on_kill_action: str = OnKillAction.DELETE_JOB,
        if_job_exists: str = IfJobExists.REATTACH,
        delete_orphaned_jobs: bool = True,
        deferrable: bool = DEFAULT_DEFERRABLE,
        poll_interval: float | datetime.timedelta = 5.0,
        model_asset: Asset | str | None = None,
        **kwargs: Any,
    ) -> None:
        given = dict(locals())
        refuse_kubernetes_pod_operator_habits(type(self).__name__, kwargs)
        if model_asset is not None:
            model_asset = given["model_asset"] = as_asset(model_asset)
            kwargs["outlets"] = [*(kwargs.get("outlets") or []), model_asset]
        super().__init__(**kwargs)
        # Not `resources`: BaseOperator owns that name (Airflow's executor resources), as in
        # KubernetesPodOperator; not `queue` either (the executor queue): `container_resources`, `volcano_queue`.
        take_arguments(self, VolcanoJobOperator, given)
        # Filled when templates are rendered: what the UI shows is what is submitted. The Job and
        # the script's ConfigMap are separate fields, so a long script cannot push the Job past
        # Airflow's rendered-field size limit.
        self.job_manifest = ""
        self.script_manifest = ""
        self._manifests: JobManifests | None = None
        self._ownership = TryOwnership()  # this try's Job, task instance, and whether a kill came (ownership.py)
        self._link_urls: dict[str, str] | None = None  # known once this process knows the Job (links.py)
        self._lineage_run: dict[str, Any] | None = None  # the Job's uid, phase, restarts, failure (OpenLineage)

    def __copy__(self) -> VolcanoJobOperator:
        """A shallow copy, as Airflow makes one to run each try (`prepare_for_execution`), with its own
        `TryOwnership`: tries run in one process (dag.test, a retry in the same worker) copy one task, and
        the kill of one try must not stop the next, nor its Job become the next try's."""
        copied = self.__class__.__new__(self.__class__)
        copied.__dict__.update(self.__dict__)
        copied.__dict__["_ownership"] = dataclasses.replace(self._ownership)
        return copied

    # -- templating and building (operators/building.py; pure apart from reading local files) ------

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
            # Airflow masks a rendered dict only a few levels down, and a Job's env values sit deeper:
            # what the UI stores of these two is the masked copy (the Job was built from the real ones).
            for field in ("full_job_spec", "job_template"):
                if isinstance(getattr(self, field), dict):
                    setattr(self, field, shown(getattr(self, field)))

    def build_manifests(self, context: Context | None = None) -> JobManifests:
        """The ConfigMap and Job this task submits; raises JobSpecError before any API call."""
        return building.task_manifests(self, context)

    # Override points (operators/building.py asks them as it builds; the subclasses' Jobs differ).

    def _default_name_limit(self) -> int:
        return max_job_name_length(["master", "worker"], max_index=9)

    def _read_training_script(self) -> TrainingScript | None:
        """The script shipped with the Job: the file `training_script` names (the decorator's function)."""
        return read_training_script(self.training_script, lambda: building.task_file_folders(self))

    def _log_pods(self, job: dict, main: str) -> list[tuple[str, str | None]]:
        """The pods (and containers) `log_tasks` copies into the task log; the main pod is get_logs'."""
        return building.log_task_pods(job, main, self.log_tasks)

    def _probed_pods(self, job: dict, main: str) -> list[tuple[str, str | None]]:
        """Pods whose output counts for stall_timeout without being copied (a DeepSpeed/mpirun launch's
        ranks run on its workers): none for this operator."""
        return []

    def dry_run(self) -> dict[str, Any]:  # type: ignore[override]
        """Print the manifests (ConfigMap and Job) as YAML and return them, whole (the launch shell
        inlined) but secret env values masked: `kubectl apply --dry-run=server -f -` takes the output and
        asks the cluster's own schema and webhooks. Touches no cluster."""
        manifests = self._manifests or self.build_manifests()
        text = shown_yaml(*manifests.documents(), whole=True)
        print(text)
        *configmap, job = yaml.safe_load_all(text)
        return {"configmap": configmap[0] if configmap else None, "job": job}

    # -- running ------------------------------------------------------------------------------------

    @property
    def hook(self) -> VolcanoHook:
        from airflow_volcano.hooks.volcano import VolcanoHook

        return VolcanoHook(kubernetes_conn_id=self.kubernetes_conn_id)

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_volcano.debug_session import debug_session
        from airflow_volcano.manifest.compatibility import fit_to_volcano
        from airflow_volcano.ownership import claim, sweep_orphans_before_submitting
        from airflow_volcano.ownership.deployment import this_deployment
        from airflow_volcano.ownership.submission import submit_or_reattach
        from airflow_volcano.waiting import wait_worker

        manifests = self._manifests or self.build_manifests(context)
        hook = self.hook
        # What this cluster's Volcano release cannot run is refused here, before submitting.
        for adapted in fit_to_volcano(manifests.job, hook.volcano_features()):
            self.log.info(adapted)
        namespace = manifests.job["metadata"].get("namespace") or hook.get_namespace() or "default"
        ti = self._ownership.ti = context["ti"]
        own = building.task_instance_id(self, context)
        deployment = this_deployment()
        claim(manifests, own, self.on_kill_action, deployment)
        if self.delete_orphaned_jobs:
            sweep_orphans_before_submitting(hook, namespace, own, ti, deployment, self.log)
        try:
            self._ownership.stop_if_killed(self.on_kill)
            ref = submit_or_reattach(hook, manifests, namespace, if_job_exists=IfJobExists(self.if_job_exists),
                                     state_store=context.get("task_state_store"), on_found=self._ownership.watching)
            self._ownership.watching(ref)
            self._ownership.stop_if_killed(self.on_kill)
            self._link_urls = publish(ti, hook, ref, manifests.job, self.kubernetes_conn_id, self.log.info)
            if self.debug:
                limits = dataclasses.replace(building.wait_limits(self), job_timeout=None)
                return debug_session(hook, ref, manifests.job, limits, seconds("debug_timeout", self.debug_timeout))
            if self.deferrable:
                self._defer(ref, context, manifests.job)
            copies = self._log_copies(ref, manifests.job)
            outcome = wait_worker.wait_for_job(hook, ref, building.wait_limits(self), logs=copies,
                                               probed=self._probed_pods(manifests.job, ref.main_task),
                                               report=self.log.info)
            return self._finalize(hook, ref, outcome, context, copies)
        except TaskDeferred:
            raise
        except BaseException as error:  # AirflowTaskTimeout (execution_timeout) is a BaseException too
            self._settle_after_failure(error)
            raise

    def _settle_after_failure(self, error: BaseException) -> None:
        """The task is failing with its Job submitted: kept for a later try, else deleted if it still runs."""
        self._ownership.settle_after_failure(lambda: self.hook, error, self.on_kill_action, self.log)

    def _log_copies(self, ref: JobRef, job: dict, cursors: dict[str, LogCursor] | None = None) -> list[PodLogCopy]:
        """The main pod's log (get_logs) first, then every pod of log_tasks (pod_logs.log_copies)."""
        from airflow_volcano.observability.pod_logs import log_copies

        pods = ([(ref.main_pod, ref.main_pod_container)] if self.get_logs else []) + \
            self._log_pods(job, ref.main_task)
        return log_copies(self.log, pods, cursors)

    def _finalize(self, hook: VolcanoHook, ref: JobRef, outcome: WaitOutcome, context: Context,
                  copies: list[PodLogCopy]) -> dict[str, Any]:
        from airflow_volcano.ownership.finalize import finalize
        from airflow_volcano.status import job_state

        ti = context["ti"]
        main = next((copy for copy in copies if copy.pod == ref.main_pod), None)
        self._lineage_run = {"uid": ref.uid, "namespace": ref.namespace, "name": ref.name,
                             "phase": outcome.phase, "restarts": job_state(outcome.job or {}).retry_count}
        try:
            done = finalize(hook, ref, outcome, on_finish_action=OnFinishAction(self.on_finish_action),
                            push_xcom=lambda key, value: ti.xcom_push(key=key, value=value), main_log=main,
                            metric_tags={"dag_id": ti.dag_id, "task_id": ti.task_id},
                            links=links_by_name(self._link_urls))
        except VolcanoJobError as error:
            self._lineage_run["failure"] = str(error).splitlines()[0]
            raise
        fill_model_asset_events(self.outlets, context, done, uid=ref.uid, say=self.log.info)
        return done

    # -- OpenLineage (called by the OpenLineage provider's listener, when it is installed) -----------

    def get_openlineage_facets_on_start(self) -> Any:
        """The Volcano Job to run (job facet `volcanoJob`), the datasets the task declared."""
        return self._openlineage()

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """As on start, with the run facet `volcanoRun`: the Job's uid, phase and restarts."""
        return self._openlineage(self._lineage_run)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """As on complete, with the failure's first line."""
        return self._openlineage(self._lineage_run)

    def _openlineage(self, run: dict[str, Any] | None = None) -> Any:
        from airflow_volcano.observability.lineage import operator_lineage

        return operator_lineage(inlets=self.inlets, outlets=self.outlets, checkpoint_dir=self.checkpoint_dir,
                                job=self._manifests.job if self._manifests is not None else None,
                                operator=type(self).__name__, launcher=getattr(self, "launcher", None), run=run)

    def _defer(self, ref: JobRef, context: Context, job: dict) -> None:
        from airflow_volcano.triggers.job import VolcanoJobTrigger

        deadline = None
        if self.execution_timeout is not None and context.get("ti") is not None:
            start = getattr(context["ti"], "start_date", None)
            if start is not None:
                deadline = (start + self.execution_timeout).timestamp()
        trigger = VolcanoJobTrigger(
            ref.to_dict(), self.kubernetes_conn_id, limits=building.wait_limits(self).to_dict(), deadline=deadline,
            get_logs=self.get_logs, on_kill_action=self.on_kill_action,
            log_pods=[[pod, container] for pod, container in self._log_pods(job, ref.main_task)],
            probe_pods=[[pod, container] for pod, container in self._probed_pods(job, ref.main_task)],
        )
        # Marked failed or cleared since the last heartbeat: Airflow would refuse the deferral (ownership.py).
        self._ownership.stop_if_ended_on_server(ref, self.on_kill, self.on_kill_action, self.log)
        self.log.info("Deferring: the triggerer waits for Volcano Job %s/%s; this worker slot is free",
                      ref.namespace, ref.name)
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resume after the trigger fired: the same finalize as the synchronous path."""
        from airflow_volcano.observability.pod_logs import read_remaining_log
        from airflow_volcano.waiting.events import Verdict, WaitOutcome

        outcome, ref = WaitOutcome.from_event(event)
        self._ownership.ref, self._ownership.ti = ref, context["ti"]
        self.log.info("Resumed: the trigger reports Volcano Job %s/%s %s", ref.namespace, ref.name, outcome.describe())
        hook = self.hook
        hook.note_credentials_accepted()  # they created the Job: a 401 now is an expired token, retried
        try:
            job = hook.get_job(ref.name, ref.namespace)
            if job is not None:  # the values the Job's annotation names, whatever this process rendered
                register_secrets(job)
            self._link_urls = job_link_urls(hook.connection_extra, ref, job or {"metadata": {"name": ref.name}})
            # What the trigger had not copied yet (its last copy, and any pod it could not read).
            copies = self._log_copies(ref, job or {"metadata": {"name": ref.name}},
                                      {ref.main_pod: outcome.log_cursor, **outcome.log_cursors})
            for copy in copies:
                read_remaining_log(hook, ref.namespace, copy)
            if job is None and outcome.verdict is Verdict.FINISHED:
                raise VolcanoJobError(f"Volcano Job {ref.namespace}/{ref.name} no longer exists")
            main_copied = bool(copies) and copies[0].pod == ref.main_pod
            outcome = dataclasses.replace(outcome, job=job if job is not None else outcome.job,
                                          log_cursor=copies[0].cursor if main_copied else outcome.log_cursor)
            return self._finalize(hook, ref, outcome, context, copies)
        except BaseException as error:
            self._settle_after_failure(error)
            raise

    def on_kill(self) -> None:
        """Delete the Job when a user kills the task, or when no later try will reattach to it; a worker
        stopping, or a timeout, with a try left keeps it for that try (ownership.kill_keeps_job)."""
        self._ownership.kill(lambda: self.hook, self.on_kill_action, self.log)


VolcanoJobOperator.template_fields = templated_fields(VolcanoJobOperator)

