"""VolcanoHook: every call airflow-volcano makes to the cluster.

Built on the cncf-kubernetes `KubernetesHook` and its `kubernetes` connection. Each hook gets its
own client `Configuration`, so loading a kubeconfig never touches the process-wide default that
other hooks and operators in the same worker use. Objects come back as plain JSON dicts, the
shape the pure layer (`airflow_volcano.status`) reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import cached_property
from typing import Any, ClassVar, TypeVar

import aiohttp
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes_asyncio import client as async_client
from kubernetes_asyncio import watch as async_watch
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException
from urllib3.exceptions import HTTPError as Urllib3HTTPError

from airflow_volcano.compat import conf
from airflow_volcano.constants import (
    COMMAND_GROUP,
    COMMAND_PLURAL,
    COMMAND_VERSION,
    JOB_API_VERSION,
    JOB_GROUP,
    JOB_NAME_LABEL,
    JOB_PLURAL,
    JOB_VERSION,
    PODGROUP_GROUP,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
    TASK_LABEL,
)
from airflow_volcano.exceptions import VolcanoApiError, WatchExpired
from airflow_volcano.logs import LOG_CHUNK_BYTES
from airflow_volcano.manifest.compatibility import VERSION_OPTION, VolcanoFeatures


def log_request(container: str | None, since_seconds: int | None, **options: Any) -> dict[str, Any]:
    """The arguments of a pod log read, either client: with timestamps (the cursor needs them) and
    undecoded (the client's own decoding mangles non-UTF-8 logs); options left out when unset."""
    wanted = {"container": container, "since_seconds": since_seconds, **options}
    return {"timestamps": True, "_preload_content": False} | {key: value for key, value in wanted.items() if value}


def event_selector(name: str) -> str:
    """The field selector of the events about one object of the namespace."""
    return f"involvedObject.name={name}"


def podgroup_name(job: dict) -> str:
    """The name Volcano's job controller gives a Job's PodGroup."""
    return f"{job['metadata']['name']}-{job['metadata'].get('uid', '')}"


def owned_by(podgroup: dict, job: dict) -> bool:
    owners = (podgroup.get("metadata") or {}).get("ownerReferences") or []
    return any(owner.get("uid") == job["metadata"].get("uid") for owner in owners)

def restart_command(job: dict) -> dict:
    """A Volcano Command asking the Job controller for a gang restart of `job`: as the RestartJob
    policy action does, it counts against the Job's retry budget (maxRetry). Owned by the Job."""
    metadata = job["metadata"]
    target = {"apiVersion": JOB_API_VERSION, "kind": "Job", "name": metadata["name"], "uid": metadata["uid"]}
    return {
        "apiVersion": f"{COMMAND_GROUP}/{COMMAND_VERSION}", "kind": "Command",
        "metadata": {"generateName": f"{metadata['name'][:40]}-restart-", "namespace": metadata["namespace"],
                     "ownerReferences": [{**target, "controller": True}]},
        "action": "RestartJob", "target": target,
    }


RETRIABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# A restarting apiserver serves requests before its RBAC cache is warm and answers 401/403 for a
# moment: right after losing the connection, those are retried too (never otherwise, so a missing
# permission still fails at once).
AUTH_WARMUP_SECONDS = 30.0
T = TypeVar("T")


# `call(..., if_absent=...)`: what a 404 means for that call (the object is not there), instead of an error.
REQUIRED: Any = object()


def not_found(error: BaseException) -> bool:
    return isinstance(error, ApiException | AsyncApiException) and error.status == 404


def refused_credentials(error: BaseException) -> bool:
    """A 401: the credentials are no longer valid (an expired token), worth reading once more."""
    return isinstance(error, ApiException | AsyncApiException) and error.status == 401


def is_transient(error: BaseException) -> bool:
    """Errors worth another try: throttling, server errors, dropped or refused connections."""
    if isinstance(error, ApiException | AsyncApiException):
        return error.status in RETRIABLE_STATUS or error.status == 0
    return isinstance(error, Urllib3HTTPError | aiohttp.ClientError | ConnectionError | TimeoutError)


# The longest Retry-After honoured: an apiserver (or a proxy) asking for an hour must not park a task.
MAX_RETRY_AFTER_SECONDS = 30.0


def retry_after(error: BaseException) -> float | None:
    headers = getattr(error, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return None if seconds is None or seconds != seconds else max(0.0, seconds)


def retry_delay(error: BaseException, backoff: float) -> float:
    """How long to wait before retrying after `error`: the back-off, or the server's Retry-After if
    longer, capped at MAX_RETRY_AFTER_SECONDS. Both hooks wait (and log) exactly this."""
    return max(backoff, min(retry_after(error) or 0.0, MAX_RETRY_AFTER_SECONDS))


def backoff_delays(attempts: int, base: float = 0.5, cap: float = 10.0, until: float | None = None) -> Iterator[float]:
    """Exponential backoff with full jitter (so many workers do not retry in step): `attempts`
    delays, and more until the monotonic time `until` if one is given."""
    attempt = 0
    while attempt < attempts or (until is not None and time.monotonic() < until):
        yield random.uniform(0, min(cap, base * 2**min(attempt, 16)))
        attempt += 1


ABSENT, RELOAD = "absent", "reload"  # what Attempts.after may say besides a delay


class Attempts:
    """One API call's attempts, the one policy both hooks follow so that they cannot drift. After
    each failure `after(error)` says: ABSENT (a 404 where the caller gave `if_absent`), RELOAD (a
    401: read the credentials again, once), or how long to wait before the next attempt (transient
    errors, `retries` times or for `retry_for` seconds, the delay logged as waited); anything else
    is raised, an API error as VolcanoApiError."""

    def __init__(self, hook: Any, what: str, *, retry_for: float | None = None,
                 if_absent: Any = REQUIRED) -> None:
        self.hook, self.what, self.if_absent = hook, what, if_absent
        self.delays = backoff_delays(getattr(hook, "retries", 6),
                                     until=None if retry_for is None else time.monotonic() + retry_for)
        self.reloaded = False

    def after(self, error: Exception) -> float | str:
        if self.if_absent is not REQUIRED and not_found(error):
            return ABSENT
        if refused_credentials(error) and not self.reloaded:
            self.reloaded = True
            return RELOAD
        delay = next(self.delays, None) if self.hook.retriable(error) else None
        if delay is None:
            if isinstance(error, ApiException | AsyncApiException):
                raise VolcanoApiError.from_api_exception(self.what, error) from None
            raise error
        delay = retry_delay(error, delay)
        self.hook.log.warning("%s failed (%s); retrying in %.1fs", self.what, _short(error), delay)
        return delay


class ConnectionLossAware:
    """Which errors are worth retrying, for both hooks: the transient ones, and 401/403 in the
    seconds after a connection was lost (a restarted apiserver warming its RBAC cache).

    The loss is remembered for the whole process: in a triggerer, the shared watch is often the
    only one to see the apiserver go away, and every trigger's next call may meet the cold cache."""

    _connection_lost_at: float = float("-inf")

    def note_connection_lost(self) -> None:
        ConnectionLossAware._connection_lost_at = time.monotonic()

    def retriable(self, error: BaseException) -> bool:
        is_api_error = isinstance(error, ApiException | AsyncApiException)
        if is_transient(error):
            if not is_api_error:
                self.note_connection_lost()
            return True
        return (is_api_error and error.status in (401, 403)
                and time.monotonic() - self._connection_lost_at < AUTH_WARMUP_SECONDS)


class VolcanoHook(ConnectionLossAware, KubernetesHook):
    """Create, find, watch and clean up Volcano Jobs and read what explains them. Every API error
    that stays after retries is raised as `VolcanoApiError`.

    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param retries: how many times a transient failure (429, 5xx, a dropped connection) is retried.
    """

    conn_name_attr = "kubernetes_conn_id"
    default_conn_name = "kubernetes_default"
    conn_type = "kubernetes"
    hook_name = "Volcano (Kubernetes)"

    def __init__(self, kubernetes_conn_id: str | None = default_conn_name, retries: int = 6, **kwargs: Any) -> None:
        kwargs.setdefault("client_configuration", client.Configuration())
        super().__init__(kubernetes_conn_id=kubernetes_conn_id, **kwargs)
        self.retries = retries

    # -- plumbing ---------------------------------------------------------------------------------

    @cached_property
    def custom_objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

    def call(self, what: str, fn: Callable[[], T], *, retry_for: float | None = None, if_absent: Any = REQUIRED) -> T:
        """Run one API call, retrying transient failures with backoff (`retries` times, or for
        `retry_for` seconds if longer); a 404 returns `if_absent` if one is given; an API error that
        stays is raised as VolcanoApiError (status, reason, the apiserver's message; never headers)."""
        attempts = Attempts(self, what, retry_for=retry_for, if_absent=if_absent)
        while True:
            try:
                return fn()
            except Exception as error:  # noqa: BLE001 - Attempts.after raises what is not retried
                step = attempts.after(error)
                if step is ABSENT:
                    return if_absent
                if step is RELOAD:
                    self.reload_credentials()
                else:
                    time.sleep(step)

    def reload_credentials(self) -> None:
        """Build the client again from the connection: a token that expired (a rotated token file, an
        exec plugin's short-lived token) is read anew, as kubectl does after a 401."""
        self.log.info("The apiserver refused the connection's credentials; reading them again")
        for cached in ("api_client", "core_v1_client", "custom_objects"):
            self.__dict__.pop(cached, None)

    def connection_extra(self, name: str) -> Any:
        """One field of the connection's extras (None if absent, or if there is no connection)."""
        try:
            return self._get_field(name)
        except Exception:  # noqa: BLE001 - no connection (in-cluster defaults): no extras
            return None

    def to_dict(self, obj: Any) -> dict:
        return self.api_client.sanitize_for_serialization(obj)

    # -- what the cluster's Volcano can do ----------------------------------------------------------

    # Per connection, once per process: the Job CRD changes only when Volcano is upgraded.
    _learned_features: ClassVar[dict[str, VolcanoFeatures]] = {}

    def volcano_features(self) -> VolcanoFeatures:
        """The cluster's Volcano release (manifest.compatibility): the connection extra
        `volcano_version`, else the `[volcano] volcano_version` setting, else the Job CRD's schema."""
        if configured := self.connection_extra(VERSION_OPTION):
            return VolcanoFeatures.from_version(configured, f"connection extra {VERSION_OPTION}")
        if configured := conf.get("volcano", VERSION_OPTION, fallback=""):
            return VolcanoFeatures.from_version(configured, f"setting [volcano] {VERSION_OPTION}")
        key = self.conn_id or ""
        if key not in self._learned_features:
            self._learned_features[key] = self._features_from_job_schema()
        return self._learned_features[key]

    def _features_from_job_schema(self) -> VolcanoFeatures:
        # The apiserver's OpenAPI document, which every authenticated user may read (system:discovery).
        path = f"/openapi/v3/apis/{JOB_GROUP}/{JOB_VERSION}"
        kind = ".".join(reversed(JOB_GROUP.split("."))) + f".{JOB_VERSION}.Job"  # sh.volcano.batch.v1alpha1.Job

        def read() -> dict:
            response = self.api_client.call_api(path, "GET", header_params={"Accept": "application/json"},
                                                auth_settings=["BearerToken"], _preload_content=False,
                                                _return_http_data_only=True, _request_timeout=30)
            return json.loads(response.data)

        try:
            document = self.call(f"read {path}", read, if_absent=None)
        except VolcanoApiError as error:
            return VolcanoFeatures.unknown(f"{path} could not be read: {error}")
        schema = ((document or {}).get("components") or {}).get("schemas", {}).get(kind)
        if schema is None:
            return VolcanoFeatures.unknown(f"{path} has no schema {kind}")
        return VolcanoFeatures.from_job_schema(schema, "the Job CRD's schema")

    # -- Jobs -------------------------------------------------------------------------------------

    def create_job(self, namespace: str, body: dict) -> dict:
        """Create a Job. A 409 means a Job of that name exists: it is returned, and the caller
        decides (by its labels) whether it is ours, e.g. after a create whose answer was lost."""
        name = body["metadata"]["name"]
        try:
            return self.call(
                f"create Job {namespace}/{name}",
                lambda: self.custom_objects.create_namespaced_custom_object(
                    JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, body),
            )
        except VolcanoApiError as error:
            if error.status != 409:
                raise
            existing = self.get_job(name, namespace)
            if existing is None:
                raise
            return existing

    def get_job(self, name: str, namespace: str) -> dict | None:
        return self.call(
            f"get Job {namespace}/{name}",
            lambda: self.custom_objects.get_namespaced_custom_object(JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL,
                                                                     name),
            if_absent=None,
        )

    def list_jobs(self, namespace: str, label_selector: str) -> list[dict]:
        result = self.call(
            f"list Jobs in {namespace}",
            lambda: self.custom_objects.list_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, label_selector=label_selector
            ),
        )
        return list(result.get("items") or [])

    def delete_job(self, name: str, namespace: str, *, retry_for: float | None = None) -> bool:
        """Delete a Job and, through owner references, its pods, PodGroup and ConfigMaps (retrying
        transient failures for `retry_for` seconds if given). Returns False if it was already gone."""
        def delete() -> bool:
            self.custom_objects.delete_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name,
                body=client.V1DeleteOptions(propagation_policy="Background"))
            return True

        return self.call(f"delete Job {namespace}/{name}", delete, retry_for=retry_for, if_absent=False)

    def label_job(self, name: str, namespace: str, labels: dict[str, str]) -> None:
        """Add labels to a Job (nothing if it is gone)."""
        self.call(
            f"label Job {namespace}/{name}",
            lambda: self.custom_objects.patch_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name, {"metadata": {"labels": labels}}),
            if_absent=None,
        )

    def wait_job_deleted(self, name: str, namespace: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.get_job(name, namespace) is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"Volcano Job {namespace}/{name} was not deleted within {timeout:.0f}s")
            time.sleep(0.5)

    def watch_job(
        self, name: str, namespace: str, *, resource_version: str | None, timeout_seconds: int
    ) -> Iterator[dict]:
        """Yield the Job each time it changes, from `resource_version`, for up to `timeout_seconds`
        on one request. Ends early on deletion, 410 Gone or a dropped or refused stream (the wait
        engine backs off and re-reads the Job); raises what retrying cannot fix. The triggers' shared
        watch (triggers/job_watch.py) resumes, re-lists and backs off the same way."""
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.custom_objects.list_namespaced_custom_object,
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL,
                field_selector=f"metadata.name={name}", resource_version=resource_version or "",
                timeout_seconds=max(1, timeout_seconds), _request_timeout=(10, max(1, timeout_seconds) + 10),
            ):
                if event["type"] == "DELETED":
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    yield event["object"]
        except ApiException as error:
            if error.status != 410 and not self.retriable(error):
                raise VolcanoApiError.from_api_exception(f"watch Job {namespace}/{name}", error) from None
            self.log.info("watch of Job %s/%s ended (%s); re-reading the Job", namespace, name, _short(error))
        except Exception as error:  # noqa: BLE001 - a dropped connection ends the watch
            if not self.retriable(error) and not isinstance(error, ValueError):
                raise
            self.note_connection_lost()
            self.log.info("watch of Job %s/%s interrupted (%s); re-reading the Job", namespace, name, _short(error))
        finally:
            stream.stop()

    # -- what explains a Job ----------------------------------------------------------------------

    def watch_job_pods(self, job_name: str, namespace: str, *, timeout_seconds: int,
                       stop: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """The Job's pods as they are now, then each change (a deleted pod's last state too), for up
        to `timeout_seconds` on one request or until `stop()` says so; raises as the client does."""
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.core_v1_client.list_namespaced_pod, namespace, label_selector=f"{JOB_NAME_LABEL}={job_name}",
                timeout_seconds=max(1, timeout_seconds), _request_timeout=(10, max(1, timeout_seconds) + 10),
            ):
                yield self.to_dict(event["object"])
                if stop():
                    return
        finally:
            stream.stop()

    def list_job_pods(self, job_name: str, namespace: str, task: str | None = None) -> list[dict]:
        selector = f"{JOB_NAME_LABEL}={job_name}" + (f",{TASK_LABEL}={task}" if task else "")
        pods = self.call(
            f"list pods of Job {namespace}/{job_name}",
            lambda: self.core_v1_client.list_namespaced_pod(namespace, label_selector=selector),
        )
        return [self.to_dict(pod) for pod in pods.items]

    def get_pod(self, name: str, namespace: str) -> dict | None:  # type: ignore[override]
        pod = self.call(f"get pod {namespace}/{name}", lambda: self.core_v1_client.read_namespaced_pod(name, namespace),
                        if_absent=None)
        return None if pod is None else self.to_dict(pod)

    def pod_log_chunks(
        self, name: str, namespace: str, *, container: str | None = None, since_seconds: int | None = None,
        tail_lines: int | None = None, chunk_bytes: int = LOG_CHUNK_BYTES,
    ) -> Iterator[bytes]:
        """The log (with timestamps) to its end as of now, not followed, as raw bytes in chunks of at
        most `chunk_bytes` (one in memory at a time however much was written; undecoded: the
        client's own decoding mangles non-UTF-8 logs, and a chunk may end inside a character)."""
        kwargs = log_request(container, since_seconds, tail_lines=tail_lines)
        response = self.call(
            f"read log of pod {namespace}/{name}",
            lambda: self.core_v1_client.read_namespaced_pod_log(name, namespace, **kwargs),
        )
        try:
            yield from response.stream(chunk_bytes, decode_content=True)
        finally:
            response.release_conn()

    def stream_pod_log(
        self, name: str, namespace: str, *, container: str | None = None, since_seconds: int | None = None
    ) -> Any:
        """An open, following log stream (urllib3 response); the caller reads and closes it."""
        return self.core_v1_client.read_namespaced_pod_log(
            name, namespace, **log_request(container, since_seconds, follow=True))

    def list_events(self, namespace: str, names: set[str]) -> list[dict]:
        """Events about the named objects (the Job, some of its pods, its PodGroup): one read each,
        selected by the apiserver, never the namespace's every event."""
        events = []
        for name in sorted(names):
            found = self.call(f"list events of {namespace}/{name}", lambda name=name: (
                self.core_v1_client.list_namespaced_event(namespace, field_selector=event_selector(name))))
            events += [self.to_dict(event) for event in found.items]
        return events

    def get_podgroup(self, job: dict) -> dict | None:
        """The PodGroup Volcano made for this Job: one GET by its name (`<job>-<uid>`), else (a
        Volcano naming it otherwise) the namespace's PodGroups searched for its owner reference."""
        namespace, name = job["metadata"]["namespace"], podgroup_name(job)
        podgroup = self.call(
            f"get PodGroup {namespace}/{name}",
            lambda: self.custom_objects.get_namespaced_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL, name),
            if_absent=None,
        )
        if podgroup is not None and owned_by(podgroup, job):
            return podgroup
        result = self.call(
            f"list PodGroups in {namespace}",
            lambda: self.custom_objects.list_namespaced_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL
            ),
        )
        return next((podgroup for podgroup in result.get("items") or [] if owned_by(podgroup, job)), None)

    # -- the training script's ConfigMap ----------------------------------------------------------

    def create_configmap(self, namespace: str, body: dict, *, replace_if: Callable[[dict], bool]) -> dict:
        """Create the script ConfigMap. One of that name already there (a create whose answer was
        lost, an earlier try) is replaced only if `replace_if` says it is ours; otherwise the 409 is
        raised: someone else's ConfigMap is never overwritten."""
        name = body["metadata"]["name"]
        try:
            created = self.call(
                f"create ConfigMap {namespace}/{name}",
                lambda: self.core_v1_client.create_namespaced_config_map(namespace, body),
            )
        except VolcanoApiError as error:
            if error.status != 409:
                raise
            existing = self.call(f"get ConfigMap {namespace}/{name}",
                                 lambda: self.core_v1_client.read_namespaced_config_map(name, namespace))
            if not replace_if(self.to_dict(existing)):
                raise
            created = self.call(
                f"replace ConfigMap {namespace}/{name}",
                lambda: self.core_v1_client.replace_namespaced_config_map(name, namespace, body),
            )
        return self.to_dict(created)

    def set_configmap_owner(self, name: str, namespace: str, job: dict) -> None:
        """Make the Job own the ConfigMap, so deleting the Job (or its TTL) removes it too."""
        owner = {
            "apiVersion": JOB_API_VERSION,
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "blockOwnerDeletion": False,
        }
        self.call(
            f"set owner of ConfigMap {namespace}/{name}",
            lambda: self.core_v1_client.patch_namespaced_config_map(
                name, namespace, {"metadata": {"ownerReferences": [owner]}}
            ),
        )

    def delete_configmap(self, name: str, namespace: str) -> bool:
        """Delete a ConfigMap; returns False if it was already gone."""
        def delete() -> bool:
            self.core_v1_client.delete_namespaced_config_map(name, namespace)
            return True

        return self.call(f"delete ConfigMap {namespace}/{name}", delete, if_absent=False)

    def delete_lost_pod(self, name: str, namespace: str) -> bool:
        """Delete a pod whose node stopped answering, with no grace period (its kubelet cannot
        confirm: a graceful delete would leave it Terminating for good). False if it was already gone."""
        def delete() -> bool:
            self.core_v1_client.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            return True

        return self.call(f"delete pod {namespace}/{name}", delete, if_absent=False)

    def annotate_pod(self, name: str, namespace: str, annotations: dict[str, str]) -> bool:
        """Add annotations to a pod; False if it is gone."""
        def patch() -> bool:
            self.core_v1_client.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})
            return True

        return self.call(f"annotate pod {namespace}/{name}", patch, if_absent=False)

    def restart_job(self, job: dict) -> None:
        """Ask Volcano for a gang restart of the Job (see `restart_command`)."""
        body = restart_command(job)
        self.call(f"restart Job {body['metadata']['namespace']}/{job['metadata']['name']}",
                  lambda: self.custom_objects.create_namespaced_custom_object(
                      COMMAND_GROUP, COMMAND_VERSION, body["metadata"]["namespace"], COMMAND_PLURAL, body))


async def _checked_body(response: Any) -> bytes:
    """The body of a raw response (`_preload_content=False`). The client raises on an error status
    only when it reads the body itself: without this, a 503's Status JSON would pass for a log or
    an empty list."""
    try:
        data = await response.read()
    finally:
        response.release()
    if not 200 <= response.status <= 299:
        error = AsyncApiException(status=response.status, reason=response.reason)
        error.body, error.headers = data.decode("utf-8", errors="replace"), response.headers
        raise error
    return data


def _list_call(api: Any, resource: str, namespace: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The list (and watch) call of a resource the triggerer watches: Volcano Jobs or pods."""
    if resource == "pods":
        return async_client.CoreV1Api(api).list_namespaced_pod, (namespace,)
    jobs = async_client.CustomObjectsApi(api).list_namespaced_custom_object
    return jobs, (JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL)


def _short(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {error.reason}"
    return f"{type(error).__name__}: {str(error)[:200]}"


class AsyncVolcanoHook(ConnectionLossAware, AsyncKubernetesHook):
    """The trigger's side of VolcanoHook: the same calls on kubernetes_asyncio, same JSON dicts.

    The triggerer resolves the connection by its id, as cncf-kubernetes' own triggers do: no
    credential travels in a trigger's arguments.

    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param retries: how many times a transient failure (429, 5xx, a dropped connection) is retried.
    """

    def __init__(self, kubernetes_conn_id: str | None = VolcanoHook.default_conn_name, retries: int = 6) -> None:
        super().__init__(kubernetes_conn_id=kubernetes_conn_id)
        self.retries = retries
        self._shared: tuple[Any, Any] | None = None  # (its context, the client) while shared_client() is open

    @contextlib.asynccontextmanager
    async def get_conn(self) -> AsyncIterator[Any]:
        if self._shared is not None:
            yield self._shared[1]
            return
        async with super().get_conn() as api:
            yield api

    @contextlib.asynccontextmanager
    async def shared_client(self) -> AsyncIterator[AsyncVolcanoHook]:
        """Every call made through this hook meanwhile uses one client (one connection pool, one TLS
        context) instead of one each: the triggerer's triggers of one connection share it."""
        self._shared = await self._open_client()
        try:
            yield self
        finally:
            shared, self._shared = self._shared, None
            await shared[0].__aexit__(None, None, None)

    async def _open_client(self) -> tuple[Any, Any]:
        opening = AsyncKubernetesHook.get_conn(self)
        return opening, await opening.__aenter__()

    async def reload_credentials(self) -> None:
        """Load the connection again and, if one client is shared, replace it: a token that expired
        (a rotated token file, an exec plugin's short-lived token) is read anew, as kubectl does."""
        self.log.info("The apiserver refused the connection's credentials; reading them again")
        self._config_loaded = False
        self.client_configuration = None
        if self._shared is not None:
            old, self._shared = self._shared, await self._open_client()
            await old[0].__aexit__(None, None, None)

    async def call(self, what: str, fn: Callable[[Any], Awaitable[T]], *, if_absent: Any = REQUIRED) -> T:
        """As VolcanoHook.call: the same attempts, on the event loop."""
        attempts = Attempts(self, what, if_absent=if_absent)
        while True:
            try:
                async with self.get_conn() as api:
                    return await fn(api)
            except Exception as error:  # noqa: BLE001 - Attempts.after raises what is not retried
                step = attempts.after(error)
                if step is ABSENT:
                    return if_absent
                if step is RELOAD:
                    await self.reload_credentials()
                else:
                    await asyncio.sleep(step)

    async def get_job(self, name: str, namespace: str) -> dict | None:
        async def get(api: Any) -> dict:
            return await async_client.CustomObjectsApi(api).get_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name)

        return await self.call(f"get Job {namespace}/{name}", get, if_absent=None)

    async def list_page(self, resource: str, namespace: str, *, limit: int, continue_token: str | None = None,
                        label_selector: str | None = None) -> tuple[list[dict], str, str | None]:
        """One page of the namespace's `resource` ("jobs": Volcano Jobs, or "pods"): (objects as
        dicts, the list's resourceVersion, the next page's token)."""
        async def page(api: Any) -> dict:
            function, args = _list_call(api, resource, namespace)
            kwargs: dict[str, Any] = {"limit": limit, "_preload_content": False}
            if continue_token:
                kwargs["_continue"] = continue_token
            if label_selector:
                kwargs["label_selector"] = label_selector
            return json.loads(await _checked_body(await function(*args, **kwargs)))

        body = await self.call(f"list {resource} in {namespace}", page)
        metadata = body.get("metadata") or {}
        return body.get("items") or [], metadata.get("resourceVersion", ""), metadata.get("continue") or None

    async def watch(self, resource: str, namespace: str, *, resource_version: str, timeout_seconds: int,
                    label_selector: str | None = None) -> AsyncIterator[tuple[str, dict]]:
        """Every `resource` object of the namespace as it changes: (ADDED/MODIFIED/DELETED/BOOKMARK,
        object as a dict), for up to `timeout_seconds` on one request from `resource_version`. Ends
        early on a dropped or refused stream (resume from the last resourceVersion seen); raises
        WatchExpired on 410."""
        kwargs: dict[str, Any] = {"label_selector": label_selector} if label_selector else {}
        try:
            async with self.get_conn() as api:
                function, args = _list_call(api, resource, namespace)
                async with async_watch.Watch(return_type="object").stream(  # dicts, not client models
                    function, *args, resource_version=resource_version, allow_watch_bookmarks=True,
                    timeout_seconds=timeout_seconds, _request_timeout=timeout_seconds + 10, **kwargs,
                ) as events:
                    async for event in events:
                        yield event["type"], event["object"]
        except AsyncApiException as error:
            if error.status == 410:
                raise WatchExpired(f"resourceVersion {resource_version} of {resource} in {namespace}") from None
            if not self.retriable(error):
                raise VolcanoApiError.from_api_exception(f"watch {resource} in {namespace}", error) from None
            self.log.info("watch of %s in %s ended (%s)", resource, namespace, _short(error))
        except (aiohttp.ClientError, TimeoutError) as error:
            self.note_connection_lost()
            self.log.info("watch of %s in %s interrupted (%s)", resource, namespace, _short(error))

    async def list_job_pods(self, job_name: str, namespace: str) -> list[dict]:
        async def pods(api: Any) -> list[dict]:
            result = await async_client.CoreV1Api(api).list_namespaced_pod(
                namespace, label_selector=f"{JOB_NAME_LABEL}={job_name}"
            )
            return [api.sanitize_for_serialization(pod) for pod in result.items]

        return await self.call(f"list pods of Job {namespace}/{job_name}", pods)

    async def list_events(self, namespace: str, names: set[str]) -> list[dict]:
        """As VolcanoHook.list_events: one selected read per object."""
        events = []
        for name in sorted(names):
            async def read(api: Any, name: str = name) -> list[dict]:
                result = await async_client.CoreV1Api(api).list_namespaced_event(
                    namespace, field_selector=event_selector(name))
                return [api.sanitize_for_serialization(event) for event in result.items]

            events += await self.call(f"list events of {namespace}/{name}", read)
        return events

    async def get_podgroup(self, job: dict) -> dict | None:
        """As VolcanoHook.get_podgroup: a GET by name, else a search by owner."""
        namespace, name = job["metadata"]["namespace"], podgroup_name(job)

        async def by_name(api: Any) -> dict:
            return await async_client.CustomObjectsApi(api).get_namespaced_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL, name)

        async def podgroups(api: Any) -> dict:
            return await async_client.CustomObjectsApi(api).list_namespaced_custom_object(
                PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL
            )

        podgroup = await self.call(f"get PodGroup {namespace}/{name}", by_name, if_absent=None)
        if podgroup is not None and owned_by(podgroup, job):
            return podgroup
        items = (await self.call(f"list PodGroups in {namespace}", podgroups)).get("items") or []
        return next((podgroup for podgroup in items if owned_by(podgroup, job)), None)

    async def pod_log_chunks(
        self, name: str, namespace: str, *, container: str | None, since_seconds: int | None, chunk_bytes: int,
        tail_lines: int | None = None,
    ) -> AsyncIterator[bytes]:
        """The log (with timestamps) from `since_seconds` ago (its last `tail_lines` lines, if given)
        to its end as of now, not followed, as raw bytes in chunks of at most `chunk_bytes` as they
        arrive: one chunk in memory at a time however much was written, and no decoding here (a
        chunk may end inside a character)."""
        kwargs = log_request(container, since_seconds, **({"tail_lines": tail_lines} if tail_lines else {}))
        try:
            async with self.get_conn() as api:
                response = await async_client.CoreV1Api(api).read_namespaced_pod_log(name, namespace, **kwargs)
                try:
                    if not 200 <= response.status <= 299:
                        await _checked_body(response)  # raises with the apiserver's message
                    async for chunk in response.content.iter_chunked(chunk_bytes):
                        yield chunk
                finally:
                    response.release()
        except AsyncApiException as error:
            raise VolcanoApiError.from_api_exception(f"read log of pod {namespace}/{name}", error) from None

    async def delete_job(self, name: str, namespace: str) -> bool:
        """As VolcanoHook.delete_job: False if it was already gone."""
        async def delete(api: Any) -> bool:
            await async_client.CustomObjectsApi(api).delete_namespaced_custom_object(
                JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name, propagation_policy="Background")
            return True

        return await self.call(f"delete Job {namespace}/{name}", delete, if_absent=False)

    async def delete_configmap(self, name: str, namespace: str) -> bool:
        """As VolcanoHook.delete_configmap: False if it was already gone."""
        async def delete(api: Any) -> bool:
            await async_client.CoreV1Api(api).delete_namespaced_config_map(name, namespace)
            return True

        return await self.call(f"delete ConfigMap {namespace}/{name}", delete, if_absent=False)

    async def delete_lost_pod(self, name: str, namespace: str) -> bool:
        """As VolcanoHook.delete_lost_pod: False if it was already gone."""
        async def delete(api: Any) -> bool:
            await async_client.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            return True

        return await self.call(f"delete pod {namespace}/{name}", delete, if_absent=False)

    async def annotate_pod(self, name: str, namespace: str, annotations: dict[str, str]) -> bool:
        """As VolcanoHook.annotate_pod: False if it is gone."""
        async def patch(api: Any) -> bool:
            await async_client.CoreV1Api(api).patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}})
            return True

        return await self.call(f"annotate pod {namespace}/{name}", patch, if_absent=False)

    async def restart_job(self, job: dict) -> None:
        """As VolcanoHook.restart_job."""
        body = restart_command(job)

        async def create(api: Any) -> None:
            await async_client.CustomObjectsApi(api).create_namespaced_custom_object(
                COMMAND_GROUP, COMMAND_VERSION, body["metadata"]["namespace"], COMMAND_PLURAL, body)

        await self.call(f"restart Job {body['metadata']['namespace']}/{job['metadata']['name']}", create)
