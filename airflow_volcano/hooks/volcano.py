"""VolcanoHook and AsyncVolcanoHook: the only code that talks to the cluster.

Built on the cncf-kubernetes hooks and their `kubernetes` connection. Each hook's clients use a
configuration of the hook's own, loaded from its connection, never the process-wide default that
other hooks and operators in the same worker or triggerer may load: two connections in one process
never share credentials. cncf-kubernetes does not see to that on every release the provider supports
(its floor is what Airflow 3.1.7's own package set holds): its sync hook loads an in-cluster
connection into the process-wide default only (every release) and before 10.15 built the client on
that default, not on the configuration it had loaded the connection into (a kubeconfig connection
reached no apiserver); before 10.17.1 its async hook did both (a trigger could call with another
connection's credentials). So VolcanoHook loads an in-cluster connection itself and rebuilds a client
cncf-kubernetes built on the default; AsyncVolcanoHook, before 10.17.1, loads an in-cluster
connection and builds its client itself.
Objects come back as plain JSON dicts, the shape the pure layer (`airflow_volcano.status`) reads.

What each API call is, is written once in `hooks.calls`; each hook only carries Calls out (`run`,
and `drive` for a program of several) through the one retry policy of `hooks.retry`. What differs
between the two is how they wait: the worker watches its one Job (`watch_job`) and follows logs on
threads; the triggerer watches a namespace for every trigger (`watch`, triggers/job_watch.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from functools import cached_property
from typing import Any, ClassVar, TypeVar

import aiohttp
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook, KubernetesHook
from kubernetes import client, config, watch
from kubernetes.config import ConfigException
from kubernetes_asyncio import client as async_client
from kubernetes_asyncio import config as async_config
from kubernetes_asyncio import watch as async_watch
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException
from kubernetes_asyncio.config import ConfigException as AsyncConfigException

from airflow_volcano.compat import conf
from airflow_volcano.constants import (
    DEFAULT_CONN_ID,
    JOB_GROUP,
    JOB_PLURAL,
    JOB_VERSION,
    PODGROUP_GROUP,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
)
from airflow_volcano.exceptions import (
    ApiserverUnreachable,
    KubernetesConnectionError,
    VolcanoApiError,
    WatchExpired,
)
from airflow_volcano.hooks import calls
from airflow_volcano.hooks.calls import Call, Program, Sleep
from airflow_volcano.hooks.retry import (
    REQUIRED,
    Attempts,
    ClientRetry,
    ConnectionLossAware,
    Retry,
    api_error,
    refused_credentials,
    short,
    status_of,
)
from airflow_volcano.manifest.compatibility import VERSION_OPTION, VolcanoFeatures
from airflow_volcano.observability.logs import LOG_CHUNK_BYTES

T = TypeVar("T")


def _not_json(what: str, line: Any, hook: Any) -> VolcanoApiError:
    """A watch stream's line that is not a JSON event: the apiserver's plain-text answer, such as the
    "404 page not found" of a resource it no longer serves (Volcano's CRDs removed or being upgraded)."""
    text = str(line)[:200]
    status = 404 if text.startswith("404") else 0
    return VolcanoApiError(what, status, "Not Found" if status else "not a watch event", text,
                           not_served=status == 404, server=hook.server_address(), conn_id=hook.conn_id)


# cncf-kubernetes 10.17.1 gave the async hook a configuration of its own (its `client_configuration`).
CNCF_ASYNC_HOOK_HAS_OWN_CONFIGURATION = "client_configuration" in inspect.signature(AsyncKubernetesHook).parameters


def _flag(value: Any) -> bool:
    """A connection's boolean extra as cncf-kubernetes reads it: True, or the text "true"."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


MERGE_PATCH = "application/merge-patch+json"


def _api(client_module: Any, api_client: Any, kind: str) -> Any:
    if kind == "core":
        return client_module.CoreV1Api(api_client)
    if kind == "custom":
        return client_module.CustomObjectsApi(api_client)
    if kind == "scheduling":
        return client_module.SchedulingV1Api(api_client)
    if kind == "authorization":
        return client_module.AuthorizationV1Api(api_client)
    return api_client


class VolcanoHook(ConnectionLossAware, KubernetesHook):
    """Create, find, watch and clean up Volcano Jobs and read what explains them. Every API error
    that stays after retries is raised as `VolcanoApiError`.

    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param retries: how many times a transient failure (429, 5xx, a dropped connection) is retried.
    """

    conn_name_attr = "kubernetes_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "kubernetes"
    hook_name = "Volcano (Kubernetes)"

    def __init__(self, kubernetes_conn_id: str | None = default_conn_name, retries: int = 6, **kwargs: Any) -> None:
        configuration = kwargs.setdefault("client_configuration", client.Configuration())
        configuration.retries = ClientRetry(total=3, connect=0)  # under this hook's own retries (hooks.retry)
        super().__init__(kubernetes_conn_id=kubernetes_conn_id, **kwargs)
        self.retries = retries

    def get_conn(self) -> client.ApiClient:
        """The connection's client, on this hook's own configuration: cncf-kubernetes' client where it
        is, else one built here (the module's docstring says when it is not). A configuration that
        cannot be loaded is said naming the connection (KubernetesConnectionError), not as the client's
        ConfigException."""
        try:
            return self._client_of_connection()
        except ConfigException as error:
            raise KubernetesConnectionError(self.conn_id, str(error)) from None

    def _client_of_connection(self) -> client.ApiClient:
        if self.client_configuration is None:
            self.client_configuration = client.Configuration()
        own = self.client_configuration
        if self._in_cluster_only():  # not through cncf-kubernetes: it would load the process-wide default
            config.load_incluster_config(client_configuration=own)
            self._is_in_cluster = True
            return self._client_on(own, client.ApiClient)
        api = super().get_conn()  # the connection loaded into `own`
        if api.configuration is own:
            return api
        api.close()  # cncf-kubernetes < 10.15: a client on the process-wide default
        return self._client_on(own, type(api))

    def _client_on(self, own: client.Configuration, kind: type[client.ApiClient]) -> client.ApiClient:
        """A client on `own`, unverified if the connection says so (which cncf-kubernetes < 10.15 set
        on the process-wide default only)."""
        if _flag(self._coalesce_param(self.disable_verify_ssl, self.connection_extra("disable_verify_ssl"))):
            own.verify_ssl = False
        return kind(configuration=own)

    def _in_cluster_only(self) -> bool:
        """The connection says in_cluster and names no kubeconfig (one that does is cncf-kubernetes'
        to refuse, before it loads anything)."""
        return bool(self._coalesce_param(self.in_cluster, self.connection_extra("in_cluster"))) and not (
            self.config_file or self.config_dict or self.connection_extra("kube_config_path")
            or self.connection_extra("kube_config"))

    # -- carrying calls out -----------------------------------------------------------------------

    def run(self, call: Call[T]) -> T:
        """One API call, retrying transient failures with back-off (`retries` times, or for the call's
        `retry_for` seconds); a 404 returns the call's `absent` if it has one; an API error that stays
        is raised as VolcanoApiError (status, reason, the apiserver's message; never headers)."""
        def once() -> Any:
            answer = self._send(call)
            if not call.raw:
                return call.shape(answer, self.to_dict)
            try:
                data = answer.data  # read whole, header or not: a pooled connection must not hold an unread body
                return answer.headers.get(call.header) if call.header else data
            finally:
                answer.release_conn()

        return self._attempts(call, once)

    def _send(self, call: Call[Any]) -> Any:
        return getattr(_api(client, self.api_client, call.api), call.method)(*call.args, **call.sent_kwargs)

    def _attempts(self, call: Call[Any], once: Callable[[], Any]) -> Any:
        """`once()` until it succeeds, as the retry policy says (AsyncVolcanoHook._attempts is the async side)."""
        attempts = Attempts(self, call.what, retry_for=call.retry_for, if_absent=call.absent)
        while True:
            try:
                answer = once()
            except Exception as error:  # noqa: BLE001 - Attempts.after raises what is not retried
                step = attempts.after(error)
                if not isinstance(step, Retry):  # ABSENT
                    return call.absent
                time.sleep(step.delay)
                if step.reload:
                    self.reload_credentials()
            else:
                self.note_credentials_accepted()
                return answer

    def drive(self, program: Program[T]) -> T:
        """Run a program of calls (hooks.calls), handing it each answer, or each error where it asked."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                step = program.throw(error) if error is not None else program.send(answer)
            except StopIteration as finished:
                return finished.value
            answer, error = None, None
            if isinstance(step, Sleep):
                time.sleep(step.seconds)
                continue
            try:
                answer = self.run(step)
            except Exception as failure:  # noqa: BLE001 - the program decides
                error = failure

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

    def to_dict(self, obj: Any) -> Any:
        return self.api_client.sanitize_for_serialization(obj)

    @cached_property
    def custom_objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api_client)

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
        path = f"/openapi/v3/apis/{JOB_GROUP}/{JOB_VERSION}"
        kind = ".".join(reversed(JOB_GROUP.split("."))) + f".{JOB_VERSION}.Job"  # sh.volcano.batch.v1alpha1.Job
        try:
            body = self.run(calls.read_openapi(path))
        except ApiserverUnreachable:
            raise  # nothing else would be answered either
        except VolcanoApiError as error:
            return VolcanoFeatures.unknown(f"{path} could not be read: {error}")
        document = json.loads(body) if body is not None else None
        schema = ((document or {}).get("components") or {}).get("schemas", {}).get(kind)
        if schema is None:
            return VolcanoFeatures.unknown(f"{path} has no schema {kind}")
        return VolcanoFeatures.from_job_schema(schema, "the Job CRD's schema")

    # -- the calls, by name (each described in hooks.calls) ------------------------------------------

    def create_job(self, namespace: str, body: dict) -> dict:
        return self.drive(calls.create_job(namespace, body))

    def get_job(self, name: str, namespace: str) -> dict | None:
        return self.run(calls.get_job(name, namespace))

    def list_jobs(self, namespace: str, label_selector: str) -> list[dict]:
        return self.drive(calls.list_jobs(namespace, label_selector))

    def delete_job(self, name: str, namespace: str, *, retry_for: float | None = None, uid: str | None = None) -> bool:
        """Delete a Job (only the one of `uid`, if given) and, through owner references, its pods, PodGroup
        and ConfigMaps; False if it was already gone (or its name is another Job's now)."""
        return self.drive(calls.delete_job(name, namespace, retry_for=retry_for, uid=uid))

    def label_job(self, name: str, namespace: str, labels: dict[str, str]) -> bool:
        return self.run(calls.label_job(name, namespace, labels))

    def annotate_job(self, name: str, namespace: str, annotations: Mapping[str, str | None]) -> bool:
        return self.run(calls.annotate_job(name, namespace, annotations))

    def list_job_pods(self, job_name: str, namespace: str, task: str | None = None) -> list[dict]:
        return self.run(calls.list_job_pods(job_name, namespace, task))

    def get_pod(self, name: str, namespace: str) -> dict | None:
        return self.run(calls.get_pod(name, namespace))

    def list_events(self, namespace: str, names: set[str]) -> list[dict]:
        return self.drive(calls.list_events(namespace, names))

    def get_podgroup(self, job: dict) -> dict | None:
        return self.drive(calls.get_podgroup(job))

    def get_queue(self, name: str) -> dict | None:
        return self.run(calls.get_queue(name))

    def create_configmap(self, namespace: str, body: dict, *, replace_if: Callable[[dict], bool]) -> dict:
        return self.drive(calls.create_configmap(namespace, body, replace_if=replace_if))

    def ensure_configmap(self, namespace: str, body: dict) -> bool:
        return self.drive(calls.ensure_configmap(namespace, body))

    def delete_script_configmap(self, name: str, namespace: str, job_uid: str | None) -> bool:
        return self.drive(calls.delete_script_configmap(name, namespace, job_uid))

    def wait_job_deleted(self, name: str, namespace: str, uid: str | None = None, timeout: float = 120) -> None:
        """Until the Job (the one of `uid`, if given) no longer exists."""
        deadline = time.monotonic() + timeout
        while (job := self.get_job(name, namespace)) is not None and (not uid or job["metadata"].get("uid") == uid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"Volcano Job {namespace}/{name} was not deleted within {timeout:.0f}s")
            time.sleep(0.5)

    # -- streams: logs and watches ------------------------------------------------------------------

    def pod_log_chunks(
        self, name: str, namespace: str, *, container: str | None = None, since: float | None = None,
        tail_lines: int | None = None, chunk_bytes: int = LOG_CHUNK_BYTES,
    ) -> Iterator[bytes]:
        """The log (with timestamps) from the epoch time `since` to its end as of now, not followed, as
        raw bytes in chunks of at most `chunk_bytes` (one in memory at a time however much was written;
        undecoded: a chunk may end inside a character)."""
        call = calls.read_pod_log(name, namespace, container=container, since=since, tail_lines=tail_lines)
        response = self._attempts(call, lambda: self._send(call))
        try:
            yield from response.stream(chunk_bytes, decode_content=True)
        finally:
            response.release_conn()

    def stream_pod_log(
        self, name: str, namespace: str, *, container: str | None = None, since: float | None = None
    ) -> Any:
        """An open log stream followed from the epoch time `since` (urllib3 response); the caller reads
        and closes it."""
        call = calls.read_pod_log(name, namespace, container=container, since=since, follow=True)
        return self._attempts(call, lambda: self._send(call))

    def watch_job(
        self, name: str, namespace: str, *, resource_version: str | None, timeout_seconds: int
    ) -> Generator[tuple[str, dict], None, None]:
        """Yield (ADDED/MODIFIED/DELETED, Job) each time a Job of this name changes, from
        `resource_version`, for up to `timeout_seconds` (the caller tells its own Job by uid: a Job of
        that name deleted before it is not). A Job unchanged for longer than the apiserver keeps history
        has a version too old to watch from (410 Gone): the watch then starts again from now, whose first
        event is the Job as it is, so a quiet Job is never left unwatched. Ends early on a dropped or
        refused stream, or a resource not served (the wait engine backs off and re-reads the Job); raises
        what retrying cannot fix. The triggers' shared watch (triggers/job_watch.py) re-lists on 410."""
        ends = time.monotonic() + max(1, timeout_seconds)
        version = resource_version or ""
        while True:
            seconds = max(1, round(ends - time.monotonic()))
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.custom_objects.list_namespaced_custom_object,
                    JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL,
                    field_selector=f"metadata.name={name}", resource_version=version,
                    timeout_seconds=seconds, _request_timeout=(10, seconds + 10),
                ):
                    if not isinstance(event, dict):  # a line that is not JSON ("404 page not found"): as a 404
                        self.log.info("watch of Job %s/%s ended (%s); re-reading the Job", namespace, name,
                                      _not_json(f"watch Job {namespace}/{name}", event, self).brief())
                        return
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        yield event["type"], event["object"]
                return
            except Exception as error:  # noqa: BLE001 - a dropped, refused or expired watch ends it
                if api_error(error) and status_of(error) == 410 and version and time.monotonic() < ends:
                    version = ""
                    continue
                if api_error(error):
                    if refused_credentials(error) and self.credentials_accepted:
                        self.reload_credentials()  # the re-read after the engine's back-off retries them
                    elif status_of(error) not in (404, 410) and not self.retriable(error):
                        raise VolcanoApiError.from_api_exception(f"watch Job {namespace}/{name}", error,
                                                                 self.server_address(), self.conn_id) from None
                elif not self.retriable(error) and not isinstance(error, ValueError):
                    raise
                else:
                    self.note_connection_lost()
                self.log.info("watch of Job %s/%s ended (%s); re-reading the Job", namespace, name, short(error))
                return
            finally:
                stream.stop()

    def watch_job_pods(self, job_name: str, namespace: str, *, timeout_seconds: int,
                       stop: Callable[[], bool] = lambda: False) -> Iterator[dict]:
        """The Job's pods as they are now, then each change (a deleted pod's last state too), for up
        to `timeout_seconds` on one request or until `stop()` says so; raises as the client does."""
        stream = watch.Watch()
        try:
            for event in stream.stream(
                self.core_v1_client.list_namespaced_pod, namespace, label_selector=calls.job_pod_selector(job_name),
                timeout_seconds=max(1, timeout_seconds), _request_timeout=(10, max(1, timeout_seconds) + 10),
            ):
                yield self.to_dict(event["object"])
                if stop():
                    return
        finally:
            stream.stop()


async def _checked(response: Any) -> Any:
    """A raw response (`_preload_content=False`) with a success status, else its error raised as the
    client's ApiException with the body read (the client raises only when it reads the body itself:
    without this, a 503's Status JSON would pass for a log or an empty list). Never its headers in
    the text: they stay on the exception for Retry-After."""
    if 200 <= response.status <= 299:
        return response
    try:
        data = await response.read()
    finally:
        response.release()
    error = AsyncApiException(status=response.status, reason=response.reason)
    error.body, error.headers = data.decode("utf-8", errors="replace"), response.headers
    raise error


def _list_call(api: Any, resource: str, namespace: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The list (and watch) call of a resource the triggerer watches: Volcano Jobs or pods of a namespace;
    Volcano Queues, every namespace's PodGroups (namespace ""), PriorityClasses."""
    custom = async_client.CustomObjectsApi(api)
    if resource == "pods":
        return async_client.CoreV1Api(api).list_namespaced_pod, (namespace,)
    if resource == "queues":
        return custom.list_cluster_custom_object, (QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL)
    if resource == "podgroups":
        if not namespace:
            return custom.list_cluster_custom_object, (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL)
        return custom.list_namespaced_custom_object, (PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL)
    if resource == "priorityclasses":
        return async_client.SchedulingV1Api(api).list_priority_class, ()
    return custom.list_namespaced_custom_object, (JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL)


# The triggers sharing a client all meet a refused token at once: it is read again once in this time.
SHARED_RELOAD_SECONDS = 1.0


class AsyncVolcanoHook(ConnectionLossAware, AsyncKubernetesHook):
    """The triggerer's side of VolcanoHook: the same calls (`run`, `drive`) on kubernetes_asyncio,
    the same JSON dicts, the same retry policy.

    The triggerer resolves the connection by its id, as cncf-kubernetes' own triggers do: no
    credential travels in a trigger's arguments.

    :param kubernetes_conn_id: the cncf-kubernetes `kubernetes` connection.
    :param retries: how many times a transient failure (429, 5xx, a dropped connection) is retried.
    """

    def __init__(self, kubernetes_conn_id: str | None = VolcanoHook.default_conn_name, retries: int = 6) -> None:
        super().__init__(kubernetes_conn_id=kubernetes_conn_id)
        self.retries = retries
        self._config_loaded = False  # cncf-kubernetes' own flag from 10.12.3; this hook's in-cluster one before
        self._shared: tuple[Any, Any] | None = None  # (its context, the client) while shared_client() is open
        self._reloaded_at = float("-inf")
        self._retired: list[tuple[Any, Any]] = []  # clients replaced by reload_credentials, still in use

    @contextlib.asynccontextmanager
    async def get_conn(self) -> AsyncIterator[Any]:
        if self._shared is not None:
            yield self._shared[1]
            return
        async with self._new_client() as api:
            yield api

    def _new_client(self) -> AbstractAsyncContextManager[Any]:
        """A client of the connection on this hook's own configuration: cncf-kubernetes' own from 10.17.1,
        before it one built here (the module's docstring says why)."""
        if CNCF_ASYNC_HOOK_HAS_OWN_CONFIGURATION:
            return AsyncKubernetesHook.get_conn(self)
        return self._client_on_own_configuration()

    @contextlib.asynccontextmanager
    async def _client_on_own_configuration(self) -> AsyncIterator[Any]:
        if self.client_configuration is None:
            self.client_configuration = async_client.Configuration()
        if not await self._in_cluster_only():
            unused = await self._load_config()  # into self.client_configuration; before 10.12.3 it also
            if unused is not None:  # returned a client on the process-wide default
                await unused.close()
        elif not self._config_loaded:
            try:
                async_config.load_incluster_config(client_configuration=self.client_configuration)
            except AsyncConfigException as error:
                raise KubernetesConnectionError(self.conn_id, str(error)) from None
            self._is_in_cluster = self._config_loaded = True
        api = async_client.ApiClient(configuration=self.client_configuration)
        try:
            yield api
        finally:
            await api.close()

    async def _in_cluster_only(self) -> bool:
        """As VolcanoHook._in_cluster_only, read as the async hook reads the connection."""
        return bool(self._coalesce_param(self.in_cluster, await self._get_field("in_cluster"))) and not (
            self.config_dict or await self._get_field("kube_config_path") or await self._get_field("kube_config"))

    @contextlib.asynccontextmanager
    async def shared_client(self) -> AsyncIterator[AsyncVolcanoHook]:
        """Every call made through this hook meanwhile uses one client (one connection pool, one TLS
        context) instead of one each: the triggerer's triggers of one connection share it."""
        self._shared = await self._open_client()
        try:
            yield self
        finally:
            shared, self._shared = self._shared, None
            retired, self._retired = self._retired, []
            for client in (shared, *retired):
                await client[0].__aexit__(None, None, None)

    async def _load_config(self) -> Any:
        try:
            return await super()._load_config()  # before cncf-kubernetes 10.12.3, a client
        except (ConfigException, AsyncConfigException) as error:
            raise KubernetesConnectionError(self.conn_id, str(error)) from None

    async def _open_client(self) -> tuple[Any, Any]:
        opening = self._new_client()
        return opening, await opening.__aenter__()

    async def reload_credentials(self) -> None:
        """Load the connection again and, if one client is shared, replace it: a token that expired
        (a rotated token file, an exec plugin's short-lived token) is read anew, as kubectl does."""
        if time.monotonic() - self._reloaded_at < SHARED_RELOAD_SECONDS:
            return  # another trigger's call just did: its calls would fail on the client closed under them
        self._reloaded_at = time.monotonic()
        self.log.info("The apiserver refused the connection's credentials; reading them again")
        self._config_loaded = False
        self.client_configuration = None
        if self._shared is not None:
            # The old client is closed with the shared one, not now: the watches open on it keep
            # streaming (closing it under them left them hanging, silent, until their timeout).
            self._retired.append(self._shared)
            self._shared = await self._open_client()

    # -- carrying calls out -----------------------------------------------------------------------

    async def _attempts(self, what: str, once: Callable[[], Awaitable[Any]], *, retry_for: float | None = None,
                        absent: Any = REQUIRED) -> Any:
        """`once()` until it succeeds, as the retry policy says (the async side of VolcanoHook.run)."""
        attempts = Attempts(self, what, retry_for=retry_for, if_absent=absent)
        while True:
            try:
                answer = await once()
            except Exception as error:  # noqa: BLE001 - Attempts.after raises what is not retried
                step = attempts.after(error)
                if not isinstance(step, Retry):  # ABSENT
                    return absent
                await asyncio.sleep(step.delay)
                if step.reload:
                    await self.reload_credentials()
            else:
                self.note_credentials_accepted()
                return answer

    async def run(self, call: Call[T]) -> T:
        """As VolcanoHook.run, on the event loop."""
        kwargs = call.sent_kwargs
        if call.method == "patch_namespaced_custom_object":
            # kubernetes_asyncio sends a dict body as a JSON patch (a list of operations) unless told; the
            # sync client knows only merge patches for custom objects (and before v36 refuses the argument).
            kwargs.setdefault("_content_type", MERGE_PATCH)

        async def once() -> Any:
            async with self.get_conn() as api:
                answer = await getattr(_api(async_client, api, call.api), call.method)(*call.args, **kwargs)
                if not call.raw:
                    return call.shape(answer, api.sanitize_for_serialization)
                response = await _checked(answer)
                try:
                    data = await response.read()
                    return response.headers.get(call.header) if call.header else data
                finally:
                    response.release()

        return await self._attempts(call.what, once, retry_for=call.retry_for,
                                    absent=call.absent)

    async def drive(self, program: Program[T]) -> T:
        """As VolcanoHook.drive, on the event loop."""
        answer: Any = None
        error: Exception | None = None
        while True:
            try:
                step = program.throw(error) if error is not None else program.send(answer)
            except StopIteration as finished:
                return finished.value
            answer, error = None, None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            try:
                answer = await self.run(step)
            except Exception as failure:  # noqa: BLE001 - the program decides
                error = failure

    # -- streams: logs and the shared watches -------------------------------------------------------

    async def pod_log_chunks(
        self, name: str, namespace: str, *, container: str | None, since: float | None,
        chunk_bytes: int = LOG_CHUNK_BYTES, tail_lines: int | None = None,
    ) -> AsyncIterator[bytes]:
        """The log (with timestamps) from the epoch time `since` (its last `tail_lines` lines, if given)
        to its end as of now, not followed, as raw bytes in chunks of at most `chunk_bytes` as they
        arrive: one chunk in memory at a time however much was written, and no decoding here (a
        chunk may end inside a character). Opening it is retried like any call; a stream that drops
        midway ends it (the cursor resumes at the next read)."""
        call = calls.read_pod_log(name, namespace, container=container, since=since, tail_lines=tail_lines)
        async with self.get_conn() as api:
            async def once() -> Any:
                return await _checked(await getattr(_api(async_client, api, call.api), call.method)(
                    *call.args, **call.sent_kwargs))

            response = await self._attempts(call.what, once)
            try:
                async for chunk in response.content.iter_chunked(chunk_bytes):
                    yield chunk
            finally:
                response.release()

    async def list_page(self, resource: str, namespace: str, *, limit: int, continue_token: str | None = None,
                        label_selector: str | None = None) -> tuple[list[dict], str, str | None]:
        """One page of the namespace's `resource` ("jobs": Volcano Jobs, or "pods"): (objects as
        dicts, the list's resourceVersion, the next page's token)."""
        async def page() -> dict:
            async with self.get_conn() as api:
                function, args = _list_call(api, resource, namespace)
                kwargs: dict[str, Any] = {"limit": limit, "_preload_content": False}
                if continue_token:
                    kwargs["_continue"] = continue_token
                if label_selector:
                    kwargs["label_selector"] = label_selector
                response = await _checked(await function(*args, **kwargs))
                try:
                    return json.loads(await response.read())
                finally:
                    response.release()

        body = await self._attempts(f"list {resource} in {namespace}", page)
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
                        if not isinstance(event, dict):  # a line that is not JSON: "404 page not found"
                            raise _not_json(f"watch {resource} in {namespace}", event, self)
                        yield event["type"], event["object"]
        except AsyncApiException as error:
            if error.status == 410:
                raise WatchExpired(f"resourceVersion {resource_version} of {resource} in {namespace}") from None
            if not self.retriable(error):
                raise VolcanoApiError.from_api_exception(f"watch {resource} in {namespace}", error,
                                                         self.server_address(), self.conn_id) from None
            self.log.info("watch of %s in %s ended (%s)", resource, namespace, short(error))
        except (aiohttp.ClientError, TimeoutError) as error:
            self.note_connection_lost()
            self.log.info("watch of %s in %s interrupted (%s)", resource, namespace, short(error))
