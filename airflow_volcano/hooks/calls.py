"""Every call the provider makes to the Kubernetes API, described once.

A `Call` says what it is (the words of errors and retry warnings), which client API and method (the
same names in `kubernetes` and `kubernetes_asyncio`: both are generated from the apiserver's OpenAPI
document), its arguments, what a 404 means, and how the answer becomes the plain JSON value the
provider reads. `VolcanoHook.run` and `AsyncVolcanoHook.run` carry a Call out through the one retry
policy (`hooks.retry`); neither hook describes a call of its own, so the two cannot drift.

A `Program` is a generator that yields Calls (and `Sleep`s) and receives each answer, or the error
(as VolcanoApiError) thrown in where it yielded: what takes several calls (a PodGroup read by name,
else searched for; a create that finds the object already there) is written once here and driven
by either hook (`hook.drive(program)`). Pure: no client is imported, no clock is read.
"""

from __future__ import annotations

import calendar
import email.utils
import math
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from airflow_volcano.constants import (
    DEPLOYMENT_LABEL,
    JOB_GROUP,
    JOB_NAME_LABEL,
    JOB_PLURAL,
    JOB_VERSION,
    PODGROUP_GROUP,
    PODGROUP_PLURAL,
    PODGROUP_VERSION,
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
    TASK_LABEL,
    TRY_NUMBER_LABEL,
)
from airflow_volcano.exceptions import VolcanoApiError
from airflow_volcano.hooks.retry import REQUIRED
from airflow_volcano.job_ref import owning_try
from airflow_volcano.ownership.deployment import deployment_of
from airflow_volcano.waiting.queueing import Priorities, QueueSnapshot

T = TypeVar("T")
# Turns a client's answer into the provider's value; `to_dict` is the client's own serializer
# (models to the apiserver's JSON).
Shape = Callable[[Any, Callable[[Any], Any]], Any]
Api = Literal["core", "custom", "scheduling", "authorization", "client"]


def as_is(answer: Any, to_dict: Callable[[Any], Any]) -> Any:
    return answer


def as_dict(answer: Any, to_dict: Callable[[Any], Any]) -> Any:
    return to_dict(answer)


def items(answer: Any, to_dict: Callable[[Any], Any]) -> list[dict]:
    """The objects of a list answer, as dicts (a model list's `.items`, or a custom object list's)."""
    found = answer.get("items") if isinstance(answer, Mapping) else answer.items
    return [to_dict(item) for item in found or []]


def done(answer: Any, to_dict: Callable[[Any], Any]) -> bool:
    """For a delete or a patch: it happened (a 404 answers the Call's `absent`, False)."""
    return True


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call. `api`: `core` (CoreV1Api), `custom` (CustomObjectsApi), `scheduling`
    (SchedulingV1Api: PriorityClasses), `authorization` (AuthorizationV1Api: the preflight's access
    reviews) or `client` (the ApiClient itself, for a raw path). `absent`:
    the value a 404 answers (REQUIRED: a 404 is an error).
    `raw`: the answer is the response's body as bytes (a bounded pod log read, a document), undecoded;
    a log to copy whole is streamed instead (the hooks' `pod_log_chunks`), from the same description.
    `header`: the answer is that header of the response (raw calls), not its body."""

    what: str
    api: Api
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    shape: Shape = as_is
    absent: Any = REQUIRED
    retry_for: float | None = None
    raw: bool = False
    header: str | None = None

    @property
    def sent_kwargs(self) -> dict[str, Any]:
        """The keyword arguments the client method is called with: `kwargs`, with REQUEST_TIMEOUT unless
        the call sets its own."""
        return {"_request_timeout": REQUEST_TIMEOUT, **self.kwargs}


# (connect, read) seconds of each call that sets no timeout of its own. Neither client has a default: a
# connection that goes silent (a proxy holding it, a half-open TCP connection) would block its caller for
# good, a worker's wait or the panel's read; timed out, it is a dropped connection, retried as one.
REQUEST_TIMEOUT = (10, 60)
# A followed log may rightly be silent for as long as its container is: only its connection is bounded.
FOLLOWED_LOG_TIMEOUT = (10, None)


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Call[Any] | Sleep
Program = Generator[Step, Any, T]


# -- Jobs -----------------------------------------------------------------------------------------

def _job_args(namespace: str, *rest: Any) -> tuple[Any, ...]:
    return (JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, *rest)


def get_job(name: str, namespace: str) -> Call[dict | None]:
    return Call(f"get Job {namespace}/{name}", "custom", "get_namespaced_custom_object",
                _job_args(namespace, name), absent=None)


# Jobs are listed this many at a time (with full specs, a namespace's Jobs can be large).
LIST_PAGE = 100


def page(answer: Any, to_dict: Callable[[Any], Any]) -> tuple[list[dict], str | None]:
    """One page of a list answer: its objects, and the next page's token (None: the last page)."""
    return items(answer, to_dict), (answer.get("metadata") or {}).get("continue") or None


def list_jobs(namespace: str, label_selector: str) -> Program[list[dict]]:
    """The namespace's Jobs the selector selects, page by page (LIST_PAGE each)."""
    found: list[dict] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"label_selector": label_selector, "limit": LIST_PAGE}
        if token:
            kwargs["_continue"] = token
        jobs, token = yield Call(f"list Jobs in {namespace}", "custom", "list_namespaced_custom_object",
                                 _job_args(namespace), kwargs, shape=page)
        found += jobs
        if token is None:
            return found


def _delete_job(name: str, namespace: str, retry_for: float | None, uid: str | None,
                resource_version: str | None = None) -> Call[bool]:
    options: dict[str, Any] = {"propagation_policy": "Background"}
    if uid:
        options["body"] = {"preconditions": {"uid": uid, **({"resourceVersion": resource_version}
                                                              if resource_version else {})}}
    return Call(f"delete Job {namespace}/{name}", "custom", "delete_namespaced_custom_object",
                _job_args(namespace, name), options, shape=done, absent=False, retry_for=retry_for)


def delete_job(name: str, namespace: str, *, retry_for: float | None = None, uid: str | None = None) -> Program[bool]:
    """Delete a Job; its pods, PodGroup, Service and the script's ConfigMap go with it (owner
    references). With `uid`: only that Job, never one of the same name made since (the apiserver's
    precondition). False if it was gone (or replaced)."""
    try:
        deleted: bool = yield _delete_job(name, namespace, retry_for, uid)
        return deleted
    except VolcanoApiError as error:
        if uid and error.status == 409:  # "Precondition failed: UID in precondition ...": another Job now
            return False
        raise


# How often a compare-and-set on a Job (adopt, a kill's delete) reads it again after it changed meanwhile
# (its status changes with every pod's: a conflict is no reason to give up).
OWNERSHIP_ATTEMPTS = 8


def adopt_job(job: dict, try_number: int, deployment: str | None = None) -> Program[dict | None]:
    """A reattaching try takes the Job over: its try-number label becomes this try's (and, on a Job of an
    earlier release, which has none, the deployment label its deployment's), only as the Job was read
    (its resourceVersion), so an earlier try's kill cannot land on it after this try took it, and this try
    cannot take a Job such a kill is deleting. The Job as adopted; None if it is gone or being deleted
    (this try then waits for it to go and submits anew)."""
    metadata = job["metadata"]
    name, namespace, uid = metadata["name"], metadata["namespace"], metadata.get("uid")
    current: dict | None = job
    for _ in range(OWNERSHIP_ATTEMPTS):
        if current is None or current["metadata"].get("uid") != uid or current["metadata"].get("deletionTimestamp"):
            return None
        labels = {TRY_NUMBER_LABEL: str(try_number)}
        if deployment and not deployment_of(current):
            labels[DEPLOYMENT_LABEL] = deployment
        if owning_try(current) == try_number and len(labels) == 1:
            return current
        patch = {"metadata": {"resourceVersion": current["metadata"].get("resourceVersion"), "labels": labels}}
        try:
            adopted: dict | None = yield Call(f"adopt Job {namespace}/{name}", "custom",
                                              "patch_namespaced_custom_object", _job_args(namespace, name, patch),
                                              absent=None)
            return adopted
        except VolcanoApiError as error:
            if error.status != 409:  # changed since it was read: read it again
                raise
        current = yield get_job(name, namespace)
    raise VolcanoApiError(f"adopt Job {namespace}/{name}", 409, "Conflict",
                          f"it kept changing during {OWNERSHIP_ATTEMPTS} attempts to take it over")


def delete_owned_job(name: str, namespace: str, uid: str | None, try_number: int | None,
                     *, retry_for: float | None = None) -> Program[str]:
    """A kill's delete: the Job of `uid`, only while this try owns it (a later try that reattached to it
    owns it now: left to that try), compared and deleted as one (its resourceVersion). Returns "deleted",
    "gone" (or its name is another Job's now) or "adopted" (a later try took it)."""
    if not uid or try_number is None:
        return "deleted" if (yield from delete_job(name, namespace, uid=uid, retry_for=retry_for)) else "gone"
    for _ in range(OWNERSHIP_ATTEMPTS):
        try:
            job = yield get_job(name, namespace)
        except VolcanoApiError as error:
            if error.status != 403:
                raise
            # An identity that may delete Jobs but not read them (its Role cut down): the uid alone. Only
            # a later try of the same identity could own it otherwise, and that try could not read it either.
            return "deleted" if (yield from delete_job(name, namespace, uid=uid, retry_for=retry_for)) else "gone"
        if job is None or job["metadata"].get("uid") != uid:
            return "gone"
        owner = owning_try(job)
        if owner is not None and owner > try_number:
            return "adopted"
        try:
            deleted = yield _delete_job(name, namespace, retry_for, uid, job["metadata"].get("resourceVersion"))
        except VolcanoApiError as error:
            if error.status != 409:  # changed since it was read (adopted?): read it again
                raise
            continue
        return "deleted" if deleted else "gone"
    raise VolcanoApiError(f"delete Job {namespace}/{name}", 409, "Conflict",
                          f"it kept changing during {OWNERSHIP_ATTEMPTS} attempts to delete it")


def label_job(name: str, namespace: str, labels: dict[str, str]) -> Call[bool]:
    return _patch_job_metadata("label", name, namespace, "labels", labels)


def annotate_job(name: str, namespace: str, annotations: Mapping[str, str | None], *,
                 uid: str | None = None) -> Call[bool]:
    """Set (or, with None, remove) annotations of a Job (of that uid only, if given)."""
    return _patch_job_metadata("annotate", name, namespace, "annotations", annotations, uid=uid)


def _patch_job_metadata(verb: str, name: str, namespace: str, field: str,
                        values: Mapping[str, str | None], *, uid: str | None = None) -> Call[bool]:
    """A merge patch of one map of the Job's metadata; False if the Job is gone. A uid in the patch is a
    precondition: the apiserver refuses the patch for a Job of the same name with another uid."""
    metadata: dict[str, Any] = {field: dict(values)} | ({"uid": uid} if uid else {})
    return Call(f"{verb} Job {namespace}/{name}", "custom", "patch_namespaced_custom_object",
                _job_args(namespace, name, {"metadata": metadata}), shape=done, absent=False)


def _create_job(namespace: str, body: dict) -> Call[dict]:
    return Call(f"create Job {namespace}/{body['metadata']['name']}", "custom", "create_namespaced_custom_object",
                _job_args(namespace, body))


def create_job(namespace: str, body: dict) -> Program[dict]:
    """Create a Job. A 409 means a Job of that name exists: it is returned, and the caller decides (by
    its labels) whether it is ours, e.g. after a create whose answer was lost."""
    try:
        created: dict = yield _create_job(namespace, body)
        return created
    except VolcanoApiError as error:
        if error.status != 409:
            raise
        existing = yield get_job(body["metadata"]["name"], namespace)
        if existing is None:
            raise
        return existing


# -- pods -----------------------------------------------------------------------------------------

def job_pod_selector(job_name: str, task: str | None = None) -> str:
    return f"{JOB_NAME_LABEL}={job_name}" + (f",{TASK_LABEL}={task}" if task else "")


def list_job_pods(job_name: str, namespace: str, task: str | None = None) -> Call[list[dict]]:
    return Call(f"list pods of Job {namespace}/{job_name}", "core", "list_namespaced_pod", (namespace,),
                {"label_selector": job_pod_selector(job_name, task)}, shape=items)


def get_pod(name: str, namespace: str) -> Call[dict | None]:
    return Call(f"get pod {namespace}/{name}", "core", "read_namespaced_pod", (name, namespace), shape=as_dict,
                absent=None)


def _delete_pod(name: str, namespace: str, uid: str, grace_seconds: int | None) -> Call[bool]:
    options: dict[str, Any] = {"preconditions": {"uid": uid}}
    if grace_seconds is not None:
        options["gracePeriodSeconds"] = grace_seconds
    return Call(f"delete pod {namespace}/{name}", "core", "delete_namespaced_pod", (name, namespace),
                {"body": options}, shape=done, absent=False)


def delete_pod(name: str, namespace: str, uid: str, *, grace_seconds: int | None = None) -> Program[bool]:
    """Delete exactly this pod (a uid precondition: never a replacement that took its name since it
    was seen). False if it is gone or was replaced."""
    try:
        deleted: bool = yield _delete_pod(name, namespace, uid, grace_seconds)
        return deleted
    except VolcanoApiError as error:
        if error.status == 409:  # "Precondition failed: UID in precondition ..."
            return False
        raise


def annotate_pod(name: str, namespace: str, annotations: dict[str, str]) -> Call[bool]:
    return Call(f"annotate pod {namespace}/{name}", "core", "patch_namespaced_pod",
                (name, namespace, {"metadata": {"annotations": annotations}}), shape=done, absent=False)


def since_time(since: float) -> str:
    """A log read's `sinceTime` (RFC 3339, whole seconds, rounded down): the kubelet compares it with the
    timestamps it wrote itself, so the node's clock, whatever it says, is the only clock involved. (A
    relative `sinceSeconds` is counted back from the node's now with the reader's own idea of how long
    ago `since` was: a node clock ahead of the reader's skipped lines.) The lines of that second shown
    already are dropped by the cursor."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(math.floor(since)))


def read_pod_log(name: str, namespace: str, *, container: str | None, since: float | None = None,
                 tail_lines: int | None = None, limit_bytes: int | None = None, follow: bool = False) -> Call[bytes]:
    """The pod's log (with timestamps), undecoded, from the time `since` (epoch seconds on the node's
    clock, as its log's timestamps are; None: from its start): as bytes from `run` (bound it with
    `tail_lines` or `limit_bytes`), or streamed (`pod_log_chunks`; followed with `follow`). Sent as the
    apiserver's raw call: the generated clients have no `sinceTime`."""
    query = [("timestamps", "true")] + [(key, str(value).lower() if isinstance(value, bool) else str(value))
                                        for key, value in (("container", container), ("tailLines", tail_lines),
                                                           ("limitBytes", limit_bytes), ("follow", follow))
                                        if value]
    if since is not None:
        query.append(("sinceTime", since_time(since)))
    return Call(f"read log of pod {namespace}/{name}", "client", "call_api",
                ("/api/v1/namespaces/{namespace}/pods/{name}/log", "GET"),
                {"path_params": {"namespace": namespace, "name": name}, "query_params": query,
                 "header_params": {"Accept": "*/*"}, "auth_settings": ["BearerToken"], "_preload_content": False,
                 "_return_http_data_only": True, **({"_request_timeout": FOLLOWED_LOG_TIMEOUT} if follow else {})},
                raw=True)


# -- what explains a Job ----------------------------------------------------------------------------

def event_selector(name: str) -> str:
    """The field selector of the events about one object of the namespace."""
    return f"involvedObject.name={name}"


def list_events(namespace: str, names: set[str]) -> Program[list[dict]]:
    """Events about the named objects (the Job, some of its pods, its PodGroup): one read each,
    selected by the apiserver, never the namespace's every event."""
    events: list[dict] = []
    for name in sorted(names):
        events += yield Call(f"list events of {namespace}/{name}", "core", "list_namespaced_event", (namespace,),
                             {"field_selector": event_selector(name)}, shape=items)
    return events


# -- why a Job waits: its queue, the queue's other Jobs, their priorities ------------------------------------

def get_queue(name: str) -> Call[dict | None]:
    """A Volcano Queue (cluster-scoped: deploy/queue-reader.yaml grants reading them)."""
    return Call(f"get Queue {name}", "custom", "get_cluster_custom_object",
                (QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL, name), absent=None)


def list_podgroups(namespace: str | None) -> Call[list[dict]]:
    """Every namespace's PodGroups (None), or one namespace's; from the apiserver's watch cache
    (resourceVersion 0), which a report of a waiting Job reads often enough."""
    if namespace is None:
        return Call("list PodGroups of every namespace", "custom", "list_cluster_custom_object",
                    (PODGROUP_GROUP, PODGROUP_VERSION, PODGROUP_PLURAL), {"resource_version": "0"}, shape=items)
    return Call(f"list PodGroups in {namespace}", "custom", "list_namespaced_custom_object",
                (PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL), {"resource_version": "0"},
                shape=items)


def list_priority_classes() -> Call[list[dict]]:
    return Call("list PriorityClasses", "scheduling", "list_priority_class", (), {"resource_version": "0"},
                shape=items)


def queue_snapshot(queue: str, namespace: str) -> Program[QueueSnapshot]:
    """What a waiting report reads of the queue `queue`, for a Job of `namespace`. Never raises: a
    read refused (no deploy/queue-reader.yaml) or failing makes the snapshot say why it knows less."""
    try:
        found = yield get_queue(queue)
    except VolcanoApiError as error:
        return QueueSnapshot(queue, unreadable=error.brief())
    if found is None:
        return QueueSnapshot(queue)
    scope: str | None = None
    try:
        podgroups = yield list_podgroups(None)
    except VolcanoApiError:  # no cluster-wide list: the namespace's Jobs at least
        scope = namespace
        try:
            podgroups = yield list_podgroups(namespace)
        except VolcanoApiError as error:
            return QueueSnapshot(queue, unreadable=error.brief())
    try:
        priorities = Priorities.of((yield list_priority_classes()))
    except VolcanoApiError:
        priorities = Priorities()
    return QueueSnapshot(queue, found, tuple(podgroups), priorities, scope=scope)


def podgroup_name(job: dict) -> str:
    """The name Volcano's job controller gives a Job's PodGroup."""
    return f"{job['metadata']['name']}-{job['metadata'].get('uid', '')}"


def owned_by(obj: dict, owner_uid: str | None) -> bool:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return owner_uid is not None and any(owner.get("uid") == owner_uid for owner in owners)


def get_podgroup(job: dict) -> Program[dict | None]:
    """The PodGroup Volcano made for this Job: one GET by its name (`<job>-<uid>`), else (a Volcano
    naming it otherwise) the namespace's PodGroups searched for its owner reference."""
    namespace, name, uid = job["metadata"]["namespace"], podgroup_name(job), job["metadata"].get("uid")
    podgroup = yield Call(f"get PodGroup {namespace}/{name}", "custom", "get_namespaced_custom_object",
                          (PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL, name), absent=None)
    if podgroup is not None and owned_by(podgroup, uid):
        return podgroup
    found = yield Call(f"list PodGroups in {namespace}", "custom", "list_namespaced_custom_object",
                       (PODGROUP_GROUP, PODGROUP_VERSION, namespace, PODGROUP_PLURAL), shape=items)
    return next((podgroup for podgroup in found if owned_by(podgroup, uid)), None)


# -- the training script's ConfigMap ----------------------------------------------------------------

def create_configmap(namespace: str, body: dict, *, replace_if: Callable[[dict], bool]) -> Program[dict]:
    """Create the script ConfigMap. One of that name already there (a create whose answer was lost, an
    earlier try) is replaced only if `replace_if` says it is ours; otherwise the 409 is raised:
    someone else's ConfigMap is never overwritten."""
    name = body["metadata"]["name"]
    try:
        created: dict = yield Call(f"create ConfigMap {namespace}/{name}", "core", "create_namespaced_config_map",
                                   (namespace, body), shape=as_dict)
        return created
    except VolcanoApiError as error:
        if error.status != 409:
            raise
        existing = yield Call(f"get ConfigMap {namespace}/{name}", "core", "read_namespaced_config_map",
                              (name, namespace), shape=as_dict)
        if not replace_if(existing):
            raise
        replaced: dict = yield Call(f"replace ConfigMap {namespace}/{name}", "core",
                                    "replace_namespaced_config_map", (name, namespace, body), shape=as_dict)
        return replaced


def ensure_configmap(namespace: str, body: dict) -> Program[bool]:
    """Create the script ConfigMap unless one of that name is there (an earlier try made it); whether
    it was created."""
    try:
        yield Call(f"create ConfigMap {namespace}/{body['metadata']['name']}", "core", "create_namespaced_config_map",
                   (namespace, body), shape=done)
    except VolcanoApiError as error:
        if error.status != 409:
            raise
        return False
    return True


def delete_configmap(name: str, namespace: str, uid: str | None = None) -> Call[bool]:
    """Delete a ConfigMap (with `uid`: only that one, never one of the same name made since)."""
    options = {"body": {"preconditions": {"uid": uid}}} if uid else {}
    return Call(f"delete ConfigMap {namespace}/{name}", "core", "delete_namespaced_config_map", (name, namespace),
                options, shape=done, absent=False)


def delete_script_configmap(name: str, namespace: str, job_uid: str | None) -> Program[bool]:
    """Delete a Job's script ConfigMap, which it owns (the garbage collector deletes it with the Job; a
    cluster without one would leave it). With `job_uid`, only the ConfigMap that Job owns, exactly as
    read: a later try's ConfigMap of the same name is not touched. False if there is none to delete."""
    if not job_uid:
        deleted: bool = yield delete_configmap(name, namespace)
        return deleted
    found = yield Call(f"get ConfigMap {namespace}/{name}", "core", "read_namespaced_config_map", (name, namespace),
                       shape=as_dict, absent=None)
    if found is None or not owned_by(found, job_uid):
        return False
    try:
        deleted = yield delete_configmap(name, namespace, uid=found["metadata"].get("uid"))
    except VolcanoApiError as error:
        if error.status == 409:  # replaced since it was read: not this Job's any more
            return False
        raise
    return deleted


# -- the apiserver's clock -------------------------------------------------------------------------------

def _read_path(what: str, path: str, **call: Any) -> Call[Any]:
    """A GET of one of the apiserver's own documents (not an API object: `/version`, discovery, OpenAPI),
    its body undecoded (`raw`); `call`: the rest of the Call (absent, header)."""
    return Call(what, "client", "call_api", (path, "GET"),
                {"header_params": {"Accept": "application/json"}, "auth_settings": ["BearerToken"],
                 "_preload_content": False, "_return_http_data_only": True, "_request_timeout": 30},
                raw=True, **call)


def read_server_date() -> Call[str | None]:
    """The `Date` header of a small answer of the apiserver's (`/version`, which every client may read):
    its clock, to the second."""
    return _read_path("read the apiserver's clock", "/version", header="Date")


def server_time(date: str | None) -> float | None:
    """The apiserver's epoch time from its `Date` header (whole seconds, so half a second is added: the
    middle of the second it names); None if there is none or it does not parse."""
    try:
        parsed = email.utils.parsedate_tz(date) if date else None
    except (TypeError, ValueError):
        return None
    if parsed is None:
        return None
    return float(calendar.timegm(parsed[:9]) - (parsed[9] or 0)) + 0.5


# -- the cluster's Volcano release -------------------------------------------------------------------

def read_version() -> Call[bytes]:
    """The apiserver's `/version` document (every client may read it)."""
    return _read_path("read the apiserver's version", "/version")


def review_access(review: dict) -> Call[dict]:
    """Ask whether this identity may do what a SelfSubjectAccessReview describes (creates nothing)."""
    attributes = review["spec"]["resourceAttributes"]
    return Call(f"ask whether this identity may {attributes['verb']} {attributes['resource']}", "authorization",
                "create_self_subject_access_review", (review,), shape=as_dict)


def read_discovery(group: str, version: str) -> Call[bytes | None]:
    """The resources an API group version serves (`/apis/<group>/<version>`: discovery, which every
    authenticated user may read); None when the apiserver does not serve it."""
    return _read_path(f"read /apis/{group}/{version}", f"/apis/{group}/{version}", absent=None)


def read_openapi(path: str) -> Call[bytes | None]:
    """A document of the apiserver's OpenAPI (every authenticated user may read it: system:discovery)."""
    return _read_path(f"read {path}", path, absent=None)
